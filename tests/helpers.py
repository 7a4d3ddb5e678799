"""Helpers the test modules share, each written once: a bounded wait for a condition on the running
reactor.

``eventually`` is the only poll of the suite's reactor tests: every wait for something that has no
event of its own to await ends, failing the test with what it waited for, after ``within`` seconds
of the reactor's time.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

POLL_INTERVAL = 0.005
"""Seconds between two looks at the condition."""


class NotReached(AssertionError):
    """``eventually``'s condition did not hold within its bound."""


async def eventually(
    reactor: IReactorTime,
    check: Callable[[], object],
    within: float = 10.0,
    what: str = "condition",
) -> None:
    """Look at ``check()`` every ``POLL_INTERVAL`` seconds until it is true; raise ``NotReached``
    naming ``what`` once ``within`` seconds of ``reactor`` time have passed without it."""
    deadline = reactor.seconds() + within
    while not check():
        if reactor.seconds() >= deadline:
            raise NotReached(f"{what} not reached within {within:g} s")
        await deferLater(reactor, POLL_INTERVAL, lambda: None)
