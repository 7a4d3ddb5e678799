# -*- test-case-name: tests.corridor.test_attempts -*-
"""Whether the caller of one request is still there, and what to stop when it leaves.

The driver abandons it when the client goes (its connection lost, a write stall, a cancelled
workload, the drain's deadline); the stage in flight (an attempt, a relay, a fan-out, a tunnel's
handshake) names what to stop through :meth:`CallerState.track`.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, field

__all__ = ["CallerState"]


@define
class CallerState:
    """Whether the caller is still there, and what to stop when it leaves.

    Changed only through its methods: :meth:`track` names what is in flight now (an attempt's
    ``cancel`` or a gate's ``stop``), :meth:`abandon` records the departure and stops it.
    """

    _gone: str | None = field(default=None, init=False)
    _stop: Callable[[], object] | None = field(default=None, init=False)

    @property
    def gone(self) -> str | None:
        """Why the caller left, or None while it is there."""
        return self._gone

    def track(self, stop: Callable[[], object] | None) -> None:
        """``stop`` is what to call if the caller leaves now (None: nothing in flight)."""
        self._stop = stop

    def abandon(self, reason: str) -> None:
        """The caller left: stop whatever is in flight; the first reason wins."""
        if self._gone is not None:
            return
        self._gone = reason
        if self._stop is not None:
            # Cancelling an attempt that has ended, or stopping an ended gate, is a no-op.
            self._stop()
