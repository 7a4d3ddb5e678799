# -*- test-case-name: tests.selection.test_reservations -*-
"""The process-wide reservation ledger and the scheduler priority snapshot (docs/behaviour.md §5.4).

The scheduler pushes a generation-stamped snapshot (priority list plus per-node baselines); every
facade in the process reserves the node it forwards to so that concurrent requests spread out
before the next snapshot arrives. A newer snapshot replaces the baselines and forgets every
reservation, so a release stamped with an older generation is dropped.

With ``--state`` (docs/behaviour.md §6.6) :mod:`nvpair_tw.fleet._store` follows this process's counts through
``on_change`` and feeds the other proxies' counts in with :meth:`ReservationLedger.set_peers`, so
``reservations`` (and every load figure built on it) is fleet-wide; the snapshot stays this
process's own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from attrs import define, field, frozen

__all__ = [
    "Booking",
    "Companion",
    "PrioritySnapshot",
    "Rank",
    "Reservation",
    "ReservationLedger",
    "make_rank",
]

MAX_GPU_PRESSURE = 3
INITIAL_GENERATION = -1


@frozen
class Rank:
    """One node's scheduler baseline: queued requests and GPU pressure (0 idle … 3 saturated)."""

    id: str
    pending: int
    gpu_pressure: int


def make_rank(id: str, pending: int, gpu_pressure: int) -> Rank:
    """A `Rank` with ``pending`` clamped to >= 0 and ``gpu_pressure`` to 0..3."""
    return Rank(
        id=id,
        pending=max(0, pending),
        gpu_pressure=min(MAX_GPU_PRESSURE, max(0, gpu_pressure)),
    )


def _read_only(ranks: Mapping[str, Rank]) -> Mapping[str, Rank]:
    return MappingProxyType(dict(ranks))


@frozen
class PrioritySnapshot:
    """The last applied scheduler snapshot: its generation, priority list and baselines by id."""

    generation: int
    nodes: tuple[str, ...]
    ranks: Mapping[str, Rank] = field(converter=_read_only)


EMPTY_SNAPSHOT = PrioritySnapshot(generation=INITIAL_GENERATION, nodes=(), ranks={})


@frozen
class Reservation:
    """One request's hold on a node, stamped with the snapshot generation it was taken under.

    ``serial`` identifies the hold, so releasing the same reservation twice releases it once.
    """

    node_id: str
    generation: int
    serial: int


@define
class ReservationLedger:
    """Baselines plus live reservations; shared by every facade in one process."""

    _snapshot: PrioritySnapshot = field(init=False, default=EMPTY_SNAPSHOT)
    _applied: bool = field(init=False, default=False)
    _live: dict[int, Reservation] = field(init=False, factory=dict)
    _counts: dict[str, int] = field(init=False, factory=dict)
    _serials: itertools.count[int] = field(init=False, factory=itertools.count)
    _peers: dict[str, int] = field(init=False, factory=dict)
    on_change: Callable[[], None] | None = field(init=False, default=None)
    """Called after this process's own counts changed (the fleet store publishes them)."""

    @property
    def snapshot(self) -> PrioritySnapshot:
        """The last applied snapshot (generation -1 and empty before the first one)."""
        return self._snapshot

    @property
    def in_force(self) -> PrioritySnapshot | None:
        """The scheduler snapshot in force, or None before the first one is applied (docs/behaviour.md §5.2:
        head selection then balances over every eligible node)."""
        return self._snapshot if self._applied else None

    def apply(self, generation: int, nodes: Sequence[str], ranks: Sequence[Rank]) -> bool:
        """Apply a snapshot; return False (and change nothing) if its generation is not newer.

        The first snapshot is always applied. Ranks are clamped; a repeated id keeps its first
        place in the list and its last rank.
        """
        if self._applied and generation <= self._snapshot.generation:
            return False
        clamped = {r.id: make_rank(r.id, r.pending, r.gpu_pressure) for r in ranks}
        self._snapshot = PrioritySnapshot(
            generation=generation, nodes=tuple(dict.fromkeys(nodes)), ranks=clamped
        )
        self._applied = True
        self._live.clear()
        self._counts.clear()
        self._changed()
        return True

    def reserve(self, node_id: str) -> Reservation:
        """Hold ``node_id`` under the current generation."""
        reservation = Reservation(node_id, self._snapshot.generation, next(self._serials))
        self._live[reservation.serial] = reservation
        self._counts[node_id] = self._counts.get(node_id, 0) + 1
        self._changed()
        return reservation

    def move(self, reservation: Reservation, node_id: str) -> Reservation:
        """Release ``reservation`` and hold ``node_id`` instead."""
        self.release(reservation)
        return self.reserve(node_id)

    def release(self, reservation: Reservation) -> None:
        """Drop a hold; stale (older generation), unknown or already released ones are ignored.

        A snapshot forgets every live hold, so a stale reservation is simply no longer known.
        """
        if self._live.get(reservation.serial) is not reservation:
            return  # only this ledger makes them: the same hold is the same value
        del self._live[reservation.serial]
        remaining = self._counts.get(reservation.node_id, 0) - 1
        if remaining > 0:
            self._counts[reservation.node_id] = remaining
        else:
            self._counts.pop(reservation.node_id, None)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def reservations(self, node_id: str) -> int:
        """Live reservations on ``node_id``: this process's since its last snapshot, plus the
        fleet's other proxies' (:meth:`set_peers`; none without ``--state``)."""
        return self._counts.get(node_id, 0) + self._peers.get(node_id, 0)

    def local_counts(self) -> dict[str, int]:
        """This process's own live reservations by node (what it shares with its fleet)."""
        return dict(self._counts)

    def set_peers(self, counts: Mapping[str, int]) -> None:
        """Replace the other proxies' reservation counts by node (negative counts are ignored)."""
        self._peers = {node: n for node, n in counts.items() if n > 0}

    def pending(self, node_id: str) -> int:
        """The scheduler's pending baseline for ``node_id`` (0 when unranked)."""
        rank = self._snapshot.ranks.get(node_id)
        return rank.pending if rank is not None else 0

    def gpu_pressure(self, node_id: str) -> int:
        """The scheduler's GPU pressure for ``node_id`` (0 when unranked)."""
        rank = self._snapshot.ranks.get(node_id)
        return rank.gpu_pressure if rank is not None else 0

    def load(self, node_id: str) -> int:
        """``pending + gpu_pressure + reservations`` for ``node_id``."""
        return self.pending(node_id) + self.gpu_pressure(node_id) + self.reservations(node_id)


class Companion(Protocol):
    """Something else a request holds on the node it targets (an admission slot, §6.4)."""

    def move(self, node_id: str) -> None:
        """Hold ``node_id`` instead."""

    def release(self) -> None:
        """Let go (at most once)."""


@define
class Booking:
    """One request's whole reservation life: taken before the first attempt, moved to the node each
    attempt targets, released once when the request ends.

    A request that reserves nothing (no model) holds an empty booking whose methods do nothing.
    A ``companion`` (an admission slot) moves and is released with the booking.
    """

    _ledger: ReservationLedger | None
    _held: Reservation | None = None
    _companion: Companion | None = None

    @classmethod
    def take(
        cls, ledger: ReservationLedger, node_id: str, companion: Companion | None = None
    ) -> Booking:
        """Reserve ``node_id`` now (``companion`` already holds it)."""
        return cls(ledger, ledger.reserve(node_id), companion)

    @classmethod
    def nothing(cls) -> Booking:
        """A booking that reserves nothing: one for all (its methods change nothing in it), not
        one made per request."""
        return _NOTHING

    @property
    def node_id(self) -> str | None:
        """The node held now, or None (empty or released)."""
        return self._held.node_id if self._held is not None else None

    def move(self, node_id: str) -> None:
        """Hold ``node_id`` instead of the node held now (no-op when it is the same, or empty)."""
        if self._ledger is None or self._held is None or self._held.node_id == node_id:
            return
        self._held = self._ledger.move(self._held, node_id)
        if self._companion is not None:
            self._companion.move(node_id)

    def release(self) -> None:
        """Let go; a second release does nothing."""
        if self._ledger is not None and self._held is not None:
            self._ledger.release(self._held)
        self._held = None
        companion, self._companion = self._companion, None
        if companion is not None:
            companion.release()


_NOTHING = Booking(None)
"""The booking that reserves nothing (:meth:`Booking.nothing`): without a ledger, moving it does
nothing and releasing it sets to None what is None already."""
