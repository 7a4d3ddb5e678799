# -*- test-case-name: tests.ops.test_maintenance, tests.ops.test_drain -*-
"""Waiting for work to end without polling (docs/behaviour.md §10, §13.1): a condition asked again
at each event on the bus, bounded by one timer, and cancelled by whoever stops waiting.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.events import Event, EventBus

__all__ = ["until_idle"]


def until_idle(
    clock: IReactorTime, bus: EventBus, idle: Callable[[], bool], timeout: float, name: str
) -> Deferred[bool]:
    """Fires ``True`` once ``idle()`` holds, or ``False`` after ``timeout`` seconds.

    ``idle()`` is asked now and again after each event on ``bus`` (a workload's end, a tunnel's
    record: whatever ends work publishes), never on a timer of its own. Cancelling the Deferred
    (its caller left) stops the wait: the subscription, called ``name``, and the timer go at once.
    """
    if idle():
        return succeed(True)
    if timeout <= 0:
        return succeed(False)

    def look(event: Event) -> None:
        if idle():
            finish(True)

    def finish(result: bool) -> None:
        if not done.called:
            stop()
            done.callback(result)

    def stop(_: object = None) -> None:
        subscription.close()
        if timer.active():
            timer.cancel()

    done: Deferred[bool] = Deferred(stop)
    subscription = bus.subscribe(look, name=name)
    timer = clock.callLater(timeout, finish, False)
    return done
