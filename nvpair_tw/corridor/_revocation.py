# -*- test-case-name: tests.corridor.test_revocation -*-
"""A key removed or re-scoped loses what it holds (docs/behaviour.md §14.2).

:class:`Holdings` keeps, per named key, how to cancel each of its requests waiting in a facade's
queue; :meth:`Holdings.revoke` cancels them (and the process's tunnels of those keys) when the keys
file changes, within the reload period.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, field

from nvpair_tw.corridor._tunnel import TunnelBook

__all__ = ["Holdings"]

Cancel = Callable[[], None]


@define
class Holdings:
    """What each named key holds that a revocation must end: queued requests and tunnels."""

    tunnels: TunnelBook
    _queued: dict[str, set[Cancel]] = field(factory=dict, init=False)

    def hold(self, key: str, cancel: Cancel) -> Cancel:
        """Remember one queued request of ``key``; returns what forgets it again."""
        held = self._queued.setdefault(key, set())
        held.add(cancel)

        def release() -> None:
            held.discard(cancel)
            if not held and self._queued.get(key) is held:
                del self._queued[key]

        return release

    def queued(self, key: str) -> int:
        """How many requests of ``key`` wait in a queue."""
        return len(self._queued.get(key, ()))

    def revoke(self, keys: frozenset[str]) -> None:
        """Cancel the queued requests and close the tunnels of ``keys``."""
        for key in keys:
            for cancel in list(self._queued.pop(key, ())):
                cancel()
        self.tunnels.revoke(keys)
