# -*- test-case-name: tests.test_events -*-
"""The in-process event bus: typed workload, request and node events for their consumers.

Delivery is synchronous and deterministic (no timers). A consumer that cannot keep up pauses its
subscription; events then queue up to a bound, past which the bus drops the subscriber, so a slow
or broken consumer never slows the publisher or starves the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from attrs import define, field, frozen, setters
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from nvpair_tw.events._kinds import BusEvent
from nvpair_tw.logs import LevelledLogger

__all__ = ["Event", "EventBus", "Subscription"]


@frozen
class Event:
    """One published event: its wire name, its typed value and the publish time.

    Consumers read ``value``'s attributes (match on its class); ``payload`` is its wire object,
    for those that send it (the control channel, ``GET /events``, the log).
    """

    name: str
    value: BusEvent
    time: float

    @property
    def payload(self) -> Mapping[str, Any]:
        """The event's JSON object as sent (docs/behaviour.md §7)."""
        return self.value.to_json()


_new_event = object.__new__
_set_name, _set_value, _set_time = (
    Event.__dict__[slot].__set__ for slot in ("name", "value", "time")
)
"""An `Event`'s slots, set as its ``__init__`` sets them but without the call: attrs' ``__init__``
of a frozen class sets each field through ``object.__setattr__`` in a Python frame, and the bus
makes six events a request (`EventBus.publish`). The value is the same, frozen."""


def _check_max_pending(_: object, __: object, value: int) -> None:
    if value < 0:
        raise ValueError(f"max_pending must be >= 0, not {value}")


@define(eq=False, on_setattr=setters.NO_OP)
class Subscription:
    """One subscriber's place on the bus: live, paused (queueing) or gone.

    ``dropped`` is ``None`` unless the bus dropped the subscriber (overflow or a raising sink),
    then it says why. ``pending`` is the number of queued events.
    """

    log = LevelledLogger()

    name: str
    _bus: EventBus
    _sink: Callable[[Event], None]
    _on_dropped: Callable[[str], None] | None
    _max_pending: int = field(validator=_check_max_pending)
    _kinds: frozenset[type[BusEvent]] | None = None
    _queue: deque[Event] = field(init=False, factory=deque)
    _paused: bool = field(init=False, default=False)
    _draining: bool = field(init=False, default=False)
    _closed: bool = field(init=False, default=False)
    dropped: str | None = field(init=False, default=None)

    @property
    def pending(self) -> int:
        """How many events wait in this subscriber's queue."""
        return len(self._queue)

    @property
    def active(self) -> bool:
        """Whether this subscription still receives events."""
        return not self._closed

    def takes(self, kind: type[BusEvent]) -> bool:
        """Whether events of ``kind`` (or of a subclass of one of its kinds) are handed to this
        subscriber."""
        kinds = self._kinds
        return kinds is None or any(issubclass(kind, taken) for taken in kinds)

    def pause(self) -> None:
        """The consumer cannot take more right now: queue events (bounded) until ``resume``."""
        self._paused = True

    def resume(self) -> None:
        """Deliver the queued events in order, then receive live again."""
        self._paused = False
        self._drain()

    def close(self) -> None:
        """Unsubscribe; queued events are discarded."""
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._bus._remove(self)

    def _offer(self, event: Event) -> None:
        """``event`` for a subscription that is paused, in a delivery or closed (the bus hands
        every other event straight to the sink, `EventBus._dispatch`): queued, bounded."""
        if self._closed:
            return
        if len(self._queue) >= self._max_pending and (self._paused or self._draining):
            self._drop(f"more than {self._max_pending} events pending")
            return
        self._queue.append(event)
        self._drain()

    def _drain(self) -> None:
        if self._draining:
            return  # an outer _drain delivers it after the event in hand
        self._draining = True
        try:
            while self._queue and not self._paused and not self._closed:
                event = self._queue.popleft()
                try:
                    self._sink(event)
                except Exception as e:
                    self._drop(f"sink raised {type(e).__name__}", Failure())
        finally:
            self._draining = False

    def _drop(self, reason: str, failure: Failure | None = None) -> None:
        """Stop handing events to this subscriber; a sink that raised (a bug of the proxy's) is
        logged with its traceback."""
        if self._closed:
            return
        self.dropped = reason
        self.close()
        message = "event subscriber {subscriber} dropped: {reason}"
        if failure is not None:
            self.log.bug(message, failure, subscriber=self.name, reason=reason)
        else:
            self.log.warn(message, subscriber=self.name, reason=reason)
        if self._on_dropped is not None:
            try:
                self._on_dropped(reason)
            except Exception:
                self.log.bug(
                    "on_dropped of event subscriber {subscriber} raised",
                    Failure(),
                    LogLevel.error,
                    subscriber=self.name,
                )


@define(eq=False, on_setattr=setters.NO_OP)
class EventBus:
    """Publishes events to subscribers in subscription order, each in publish order.

    ``max_pending`` is the default bound on a paused subscriber's queue.
    """

    _clock: IReactorTime
    _max_pending: int = field(default=1000, validator=_check_max_pending)
    _subscriptions: list[Subscription] = field(init=False, factory=list)
    _outbox: deque[Event] = field(init=False, factory=deque)
    _dispatching: bool = field(init=False, default=False)
    _routes: dict[type[BusEvent], tuple[Subscription, ...]] = field(init=False, factory=dict)
    """Per kind of event, the subscriptions that take it, in subscription order (made on the
    first publish of the kind, forgotten when a subscription comes or goes)."""

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The live subscriptions, in subscription order."""
        return tuple(self._subscriptions)

    def publish(self, value: BusEvent) -> Event:
        """Deliver an event to every live subscription; never raises because of a subscriber.

        A publish from inside a sink is delivered after the event in hand has reached everyone,
        so every subscriber sees the same order.
        """
        event = _new_event(Event)  # Event(value.name, value, now), without its __init__
        _set_name(event, value.name)
        _set_value(event, value)
        _set_time(event, self._clock.seconds())
        outbox = self._outbox
        if self._dispatching:
            outbox.append(event)
            return event
        self._dispatching = True
        try:
            if outbox:  # left behind by a publish that failed part-way: they go first
                outbox.append(event)
            else:
                self._dispatch(event)
            while outbox:
                self._dispatch(outbox.popleft())
        finally:
            self._dispatching = False
        return event

    def _dispatch(self, event: Event) -> None:
        """Offer ``event`` to the subscriptions that take its kind, in subscription order (the
        list is kept per kind until a subscription comes or goes)."""
        kind = type(event.value)
        routes = self._routes.get(kind)
        if routes is None:
            routes = self._routes[kind] = tuple(s for s in self._subscriptions if s.takes(kind))
        for subscription in routes:
            if subscription._paused or subscription._draining or subscription._closed:
                subscription._offer(event)
                continue
            # Nothing waits before it (a queue fills only while paused or in a delivery): handed
            # to the sink as `_drain` would, without its calls. Nothing can queue meanwhile: a
            # publish from inside a sink waits in the outbox until this delivery is over.
            subscription._draining = True
            try:
                subscription._sink(event)
            except Exception as e:
                subscription._drop(f"sink raised {type(e).__name__}", Failure())
            finally:
                subscription._draining = False

    def subscribe(
        self,
        sink: Callable[[Event], None],
        *,
        name: str,
        on_dropped: Callable[[str], None] | None = None,
        max_pending: int | None = None,
        kinds: Iterable[type[BusEvent]] | None = None,
    ) -> Subscription:
        """Add a subscriber; ``max_pending`` (default: the bus's) bounds its queue while paused;
        ``kinds``: the only events it is handed (None: every one), so a publish costs nothing
        for the subscribers that do not read its kind."""
        subscription = Subscription(
            name,
            self,
            sink,
            on_dropped,
            self._max_pending if max_pending is None else max_pending,
            None if kinds is None else frozenset(kinds),
        )
        self._subscriptions.append(subscription)
        self._routes.clear()
        return subscription

    def wants(self, kind: type[BusEvent]) -> bool:
        """Whether any subscriber takes events of ``kind`` (else publishing one is wasted work)."""
        return any(s.takes(kind) for s in self._subscriptions)

    def _remove(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
            self._routes.clear()
