# -*- test-case-name: tests.selection.test_stalls -*-
"""The per-facade stall cooldown (docs/behaviour.md §6.3).

A node that stalled (no headers within the deadline, or silence past an enabled first-body timeout) is
*cooling* for one response-header timeout: ordering puts it behind its ready peers, never excludes it.
Expiry or a successful response from the node ends the cooldown. Nothing is persisted; with
``--state`` :mod:`nvpair_tw.fleet._store` shares cooldowns with a fleet's other proxies through
:meth:`StallTracker.install` and :meth:`StallTracker.end` (docs/behaviour.md §6.6).
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, frozen
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import Interface, implementer

__all__ = ["Cooldown", "CooldownListener", "IStallTracker", "NeverCools", "StallTracker"]


@frozen
class Cooldown:
    """One cooling node: until when (clock seconds), why, and where the stall was seen
    (``"local"``, or ``"peer"`` for a cooldown another proxy of the fleet shared)."""

    node_id: str
    until: float
    reason: str
    origin: str = "local"


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


@define
class _Entry:
    cooldown: Cooldown
    timer: IDelayedCall


@implementer(IStallTracker)
class StallTracker:
    """Cooldowns of one facade, each ended by its own timer or by a success."""

    def __init__(
        self,
        clock: IReactorTime,
        period: float,
        on_change: CooldownListener | None = None,
    ) -> None:
        self._clock = clock
        self._period = period
        self._entries: dict[str, _Entry] = {}
        self._on_change = on_change

    @property
    def period(self) -> float:
        """How long a stall cools its node (one response-header timeout)."""
        return self._period

    def cool(self, node_id: str, reason: str) -> None:
        self.install(node_id, reason, self._period)

    def install(self, node_id: str, reason: str, period: float, origin: str = "local") -> Cooldown:
        """Cool ``node_id`` for ``period`` seconds from now (replacing any cooldown it has)."""
        previous = self._entries.pop(node_id, None)
        if previous is not None:
            previous.timer.cancel()
        cooldown = Cooldown(node_id, self._clock.seconds() + period, reason, origin)
        timer = self._clock.callLater(period, self._expire, node_id)
        self._entries[node_id] = _Entry(cooldown, timer)
        if self._on_change is not None:
            self._on_change(node_id, cooldown, reason)
        return cooldown

    def clear(self, node_id: str) -> None:
        self.end(node_id, "success")

    def _expire(self, node_id: str) -> None:
        entry = self._entries.pop(node_id, None)
        if entry is not None and self._on_change is not None:
            self._on_change(node_id, None, "expired")

    def end(self, node_id: str, why: str) -> bool:
        """End ``node_id``'s cooldown now, telling the listener ``why``; False if it was not cooling."""
        entry = self._entries.pop(node_id, None)
        if entry is None:
            return False
        entry.timer.cancel()
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
        for entry in self._entries.values():
            entry.timer.cancel()
        self._entries.clear()


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
