# -*- test-case-name: tests.test_events -*-
"""The in-process event bus: workload, request and node events for the control channel and logs.

Delivery is synchronous and deterministic (no timers). A consumer that cannot keep up pauses its
subscription; events then queue up to a bound, past which the bus drops the subscriber, so a slow
or broken consumer never slows the publisher or starves the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from attrs import define, field, frozen, setters
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, LogLevel

from nvpair_tw.logs import LevelledLogger

__all__ = [
    "NODE_COOLDOWN",
    "NODE_COOLDOWN_ENDED",
    "NODE_CORDON",
    "NODE_UNCORDON",
    "PROXY_REQUEST",
    "WORKLOAD_COMPLETED",
    "WORKLOAD_ERRORED",
    "WORKLOAD_QUEUED",
    "WORKLOAD_STARTED",
    "Event",
    "EventBus",
    "Subscription",
    "log_events",
]

# The names of the events the proxy publishes: the bus, the control channel's notifications,
# ``GET /events`` on the admin listener and the log lines all use them (docs/behaviour.md §7).
WORKLOAD_QUEUED = "workload:queued"
"""A workload waits in the proxy's admission queue, before any dispatch."""
WORKLOAD_STARTED = "workload:started"
"""A workload is dispatched to a node (again each time an attempt moves to another node)."""
WORKLOAD_COMPLETED = "workload:completed"
"""A workload's committed 2xx answer was relayed to the end."""
WORKLOAD_ERRORED = "workload:errored"
"""A workload ended ``failed`` or ``cancelled``."""
PROXY_REQUEST = "proxy/request"
"""The record of one request, rejections included; it follows every request."""
NODE_COOLDOWN = "node/cooldown"
"""A node stalled and is skipped until its cooldown ends."""
NODE_COOLDOWN_ENDED = "node/cooldown-ended"
"""A node's cooldown ended (``why``: ``success`` or ``expired``)."""
NODE_CORDON = "node/cordon"
"""A node was cordoned: it takes no new work (§13.1; ``reason``, ``since``, ``origin``)."""
NODE_UNCORDON = "node/uncordon"
"""A node's cordon was lifted."""


@frozen
class Event:
    """One published event: a name, a JSON-serialisable metadata payload and the publish time."""

    name: str
    payload: Mapping[str, Any]
    time: float


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
        if self._closed:
            return
        if not (self._queue or self._paused or self._draining):
            self._deliver(event)  # nothing waits before it: no queueing needed
            return
        if len(self._queue) >= self._max_pending and (self._paused or self._draining):
            self._drop(f"more than {self._max_pending} events pending")
            return
        self._queue.append(event)
        self._drain()

    def _deliver(self, event: Event) -> None:
        """Hand one event to the sink as `_drain` would (nothing can queue meanwhile: the bus
        holds back a publish made from inside a sink until this delivery is over)."""
        self._draining = True
        try:
            self._sink(event)
        except Exception as e:
            self._drop(f"sink raised {type(e).__name__}")
        finally:
            self._draining = False

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
                    self._drop(f"sink raised {type(e).__name__}")
        finally:
            self._draining = False

    def _drop(self, reason: str) -> None:
        if self._closed:
            return
        self.dropped = reason
        self.close()
        self.log.warn(
            "event subscriber {subscriber} dropped: {reason}", subscriber=self.name, reason=reason
        )
        if self._on_dropped is not None:
            try:
                self._on_dropped(reason)
            except Exception as e:
                self.log.error(
                    "on_dropped of event subscriber {subscriber} raised {error_type}",
                    subscriber=self.name,
                    error_type=type(e).__name__,
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

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The live subscriptions, in subscription order."""
        return tuple(self._subscriptions)

    def publish(self, name: str, payload: Mapping[str, Any]) -> Event:
        """Deliver an event to every live subscription; never raises because of a subscriber.

        A publish from inside a sink is delivered after the event in hand has reached everyone, so
        every subscriber sees the same order.
        """
        event = Event(name, dict(payload), self._clock.seconds())
        self._outbox.append(event)
        if self._dispatching:
            return event
        self._dispatching = True
        try:
            while self._outbox:
                current = self._outbox.popleft()
                for subscription in tuple(self._subscriptions):
                    subscription._offer(current)
        finally:
            self._dispatching = False
        return event

    def subscribe(
        self,
        sink: Callable[[Event], None],
        *,
        name: str,
        on_dropped: Callable[[str], None] | None = None,
        max_pending: int | None = None,
    ) -> Subscription:
        """Add a subscriber; ``max_pending`` (default: the bus's) bounds its queue while paused."""
        subscription = Subscription(
            name,
            self,
            sink,
            on_dropped,
            self._max_pending if max_pending is None else max_pending,
        )
        self._subscriptions.append(subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)


# One info line per request (its proxy/request record); a workload's start and completion are debug,
# its failure or cancellation info, a cooldown a warning.
_LEVELS: Mapping[str, LogLevel] = {
    NODE_COOLDOWN: LogLevel.warn,
    WORKLOAD_QUEUED: LogLevel.debug,
    WORKLOAD_STARTED: LogLevel.debug,
    WORKLOAD_COMPLETED: LogLevel.debug,
}

_FORMATS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    PROXY_REQUEST: (
        "{event} {id} {engine} {method} {path} -> {status} via {node_id} in {duration_ms} ms",
        ("id", "engine", "method", "path", "status", "node_id", "duration_ms"),
    ),
    WORKLOAD_QUEUED: (
        "{event} {workload[id]} {workload[model]} waits for a free slot",
        ("workload",),
    ),
    WORKLOAD_STARTED: (
        "{event} {workload[id]} {workload[model]} on {workload[scheduledOn]}",
        ("workload",),
    ),
    WORKLOAD_COMPLETED: (
        "{event} {workload[id]} {workload[model]} on {workload[scheduledOn]}",
        ("workload",),
    ),
    WORKLOAD_ERRORED: (
        "{event} {workload[id]} {workload[model]} {workload[state]}: {workload[error]}",
        ("workload",),
    ),
    NODE_CORDON: ("{event} {engine} {node_id}: {reason}", ("engine", "node_id", "reason")),
    NODE_UNCORDON: ("{event} {engine} {node_id}", ("engine", "node_id")),
}

# A request no node served (rejected, refused, no owner, ...) says why instead of "via None".
_REQUEST_WITHOUT_NODE: tuple[str, tuple[str, ...]] = (
    "{event} {id} {engine} {method} {path} -> {status} ({error}) in {duration_ms} ms",
    ("id", "engine", "method", "path", "status", "error", "duration_ms"),
)
_REQUEST_WITHOUT_NODE_OR_ERROR: tuple[str, tuple[str, ...]] = (
    "{event} {id} {engine} {method} {path} -> {status} in {duration_ms} ms",
    ("id", "engine", "method", "path", "status", "duration_ms"),
)


def _format(name: str, fields: Mapping[str, Any]) -> str:
    """The log format for an event with these fields; just its name when fields are missing."""
    if name == PROXY_REQUEST and fields.get("node_id") is None:
        if fields.get("error") is None:
            fmt, needed = _REQUEST_WITHOUT_NODE_OR_ERROR
        else:
            fmt, needed = _REQUEST_WITHOUT_NODE
    else:
        fmt, needed = _FORMATS.get(name, ("{event}", ()))
    return fmt if all(k in fields for k in needed) else "{event}"


_RESERVED = frozenset({"format", "event"})


def _preformatted(name: str, fields: Mapping[str, Any]) -> str:
    """The event's line, already rendered, as a format with no fields (braces doubled).

    Twisted would parse the format and flatten its fields again for every event; rendered here
    once, the line is the same and the observers find nothing to parse. A payload the format
    cannot render keeps the format itself, for Twisted to report as it always has.
    """
    fmt = _format(name, fields)
    try:
        text = fmt.format_map({**fields, "event": name})
    except Exception:
        return fmt
    return text.replace("{", "{{").replace("}", "}}")


def log_events(bus: EventBus, log: Logger) -> Subscription:
    """Subscribe a sink that emits each event through ``log`` as a structured event.

    The event name is the ``event`` field and the payload's fields are the other fields (keys that
    would clash with the logger's own, ``log_*`` and ``format``, are left out); the message is
    rendered once, here (`_preformatted`). ``node/cooldown``
    logs at warn, a workload's queueing, start and completion at debug, everything else at info. With a
    :class:`~nvpair_tw.logs.LevelledLogger`, events below its level are skipped before any work.
    """

    enabled = getattr(log, "enabled", None)

    def sink(event: Event) -> None:
        level = _LEVELS.get(event.name, LogLevel.info)
        if enabled is not None and not enabled(level):
            return
        fields = {
            k: v
            for k, v in event.payload.items()
            if k not in _RESERVED and not k.startswith("log_")
        }
        log.emit(level, _preformatted(event.name, fields), event=event.name, **fields)

    return bus.subscribe(sink, name="log")
