# -*- test-case-name: tests.selection.test_stalls -*-
"""The per-facade stall cooldown (docs/behaviour.md §6.3).

A node that stalled (no headers within the deadline, or silence past an enabled first-body timeout) is
*cooling* for one response-header timeout: ordering puts it behind its ready peers, never excludes it.
Expiry or a successful response from the node ends the cooldown. With a *probe* (the node's own
inventory question, docs/behaviour.md §6.3 "paid once until it answers"), expiry first asks the node:
no response headers within the probe's bound renews the cooldown (``renewed``), any answer ends it, so
a node frozen for an hour costs one client request one deadline, once. A peer's cooldown is not
probed here: the proxy that saw the stall probes and shares the outcome; meanwhile this one holds the
cooldown for the probe's bound plus :data:`PEER_HOLD_MARGIN` and then lets it expire. Nothing is persisted; with
``--state`` :mod:`nvpair_tw.fleet._store` shares cooldowns with a fleet's other proxies through
:meth:`StallTracker.install` and :meth:`StallTracker.end` (docs/behaviour.md §6.6).
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import Interface, implementer

__all__ = [
    "PEER_HOLD_MARGIN",
    "Cooldown",
    "CooldownListener",
    "IStallTracker",
    "NeverCools",
    "Probe",
    "StallTracker",
]

PEER_HOLD_MARGIN = 1.0
"""Seconds a peer's cooldown is held past its end beyond the probe's own bound: time for the
prober's renewal (or its end) to reach this proxy through the store, so the node never looks ready
here between the two."""


@frozen
class Cooldown:
    """One cooling node: until when (clock seconds), why, where the stall was seen (``"local"``,
    or ``"peer"`` for a cooldown another proxy of the fleet shared), and whether it is a renewal
    (the node still gave no answer to the probe at the previous cooldown's expiry)."""

    node_id: str
    until: float
    reason: str
    origin: str = "local"
    renewed: bool = False


class IStallTracker(Interface):
    """What the attempt loop and ordering need from the cooldown state (a seam for tests)."""

    def cool(node_id: str, reason: str) -> None:
        """The node stalled: demote it for one cooldown period."""

    def clear(node_id: str) -> None:
        """The node answered successfully: restore it now."""

    def cooling() -> frozenset[str]:
        """Node ids cooling right now."""

    def cooldown(node_id: str) -> Cooldown | None:
        """The node's cooldown, if it is cooling."""


CooldownListener = Callable[[str, Cooldown | None, str], None]

Probe = Callable[[str], "Deferred[bool]"]
"""Ask a node (by id) its cheap question: fires True when it answered (response headers, whatever
the status) within the probe's own bound, False when it did not. It never fails."""


@define
class _Entry:
    """A cooling node: its cooldown, and the one pending thing that ends or renews it: the expiry
    timer, then (once it fired) the probe or, for a peer's cooldown, the hold timer."""

    cooldown: Cooldown
    timer: IDelayedCall | None
    probing: Deferred[bool] | None = None

    def cancel(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        if self.probing is not None:
            probing, self.probing = self.probing, None
            probing.cancel()


@implementer(IStallTracker)
class StallTracker:
    """Cooldowns of one facade, each ended by its own timer or by a success."""

    def __init__(
        self,
        clock: IReactorTime,
        period: float,
        on_change: CooldownListener | None = None,
        *,
        probe: Probe | None = None,
        probe_bound: float = 0.0,
    ) -> None:
        self._clock = clock
        self._period = period
        self._entries: dict[str, _Entry] = {}
        self._on_change = on_change
        self._probe = probe
        self._probe_bound = probe_bound

    @property
    def period(self) -> float:
        """How long a stall cools its node (one response-header timeout)."""
        return self._period

    def cool(self, node_id: str, reason: str) -> None:
        self.install(node_id, reason, self._period)

    def install(
        self,
        node_id: str,
        reason: str,
        period: float,
        origin: str = "local",
        *,
        renewed: bool = False,
    ) -> Cooldown:
        """Cool ``node_id`` for ``period`` seconds from now (replacing any cooldown it has)."""
        previous = self._entries.pop(node_id, None)
        if previous is not None:
            previous.cancel()
        cooldown = Cooldown(node_id, self._clock.seconds() + period, reason, origin, renewed)
        timer = self._clock.callLater(period, self._expire, node_id)
        self._entries[node_id] = _Entry(cooldown, timer)
        if self._on_change is not None:
            self._on_change(node_id, cooldown, reason)
        return cooldown

    def clear(self, node_id: str) -> None:
        self.end(node_id, "success")

    def _expire(self, node_id: str) -> None:
        entry = self._entries.get(node_id)
        if entry is None:
            return
        entry.timer = None
        if self._probe is None:
            self.end(node_id, "expired")
        elif entry.cooldown.origin != "local":
            # the proxy that saw the stall probes and shares the outcome; wait for it that long
            hold = self._probe_bound + PEER_HOLD_MARGIN
            entry.timer = self._clock.callLater(hold, self.end, node_id, "expired")
        else:
            entry.probing = self._probe(node_id)
            entry.probing.addBoth(self._probed, entry)

    def _probed(self, outcome: object, entry: _Entry) -> None:
        """The probe's outcome: ``True`` is an answer; ``False`` (or a probe that failed) is none."""
        if self._entries.get(entry.cooldown.node_id) is not entry or entry.probing is None:
            return  # replaced or ended (the probe cancelled) while the probe ran
        entry.probing = None
        node_id = entry.cooldown.node_id
        if outcome is True:
            self.answered(node_id)
        else:
            self.renewed(self.install(node_id, entry.cooldown.reason, self._period, renewed=True))

    def answered(self, node_id: str) -> None:
        """The probe had an answer from the cooling node: its cooldown ends (``expired``)."""
        self.end(node_id, "expired")

    def renewed(self, cooldown: Cooldown) -> None:
        """The probe had no answer: ``cooldown`` is the next period (a hook for the fleet)."""

    def end(self, node_id: str, why: str) -> bool:
        """End ``node_id``'s cooldown now, telling the listener ``why``; False if it was not cooling."""
        entry = self._entries.pop(node_id, None)
        if entry is None:
            return False
        entry.cancel()
        if self._on_change is not None:
            self._on_change(node_id, None, why)
        return True

    def cooling(self) -> frozenset[str]:
        return frozenset(self._entries)

    def cooldown(self, node_id: str) -> Cooldown | None:
        entry = self._entries.get(node_id)
        return entry.cooldown if entry is not None else None

    def stop(self) -> None:
        """Cancel every timer (service shutdown); cooling state is process-local and simply dropped."""
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            entry.cancel()


@implementer(IStallTracker)
class NeverCools:
    """A tracker that never demotes: the negative control for the cooldown tests (not a user option)."""

    def cool(self, node_id: str, reason: str) -> None:
        pass

    def clear(self, node_id: str) -> None:
        pass

    def cooling(self) -> frozenset[str]:
        return frozenset()

    def cooldown(self, node_id: str) -> Cooldown | None:
        return None
