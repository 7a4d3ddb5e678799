# -*- test-case-name: tests.test_events -*-
"""Every event on the bus as a log line (docs/behaviour.md §7): its wire name and wire object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.logger import Logger, LogLevel

from nvpair_tw.core import format_duration
from nvpair_tw.events._bus import Event, EventBus, Subscription
from nvpair_tw.events._kinds import (
    FAN_OUT_PROGRESS,
    NODE_COOLDOWN,
    NODE_COOLDOWN_ENDED,
    NODE_CORDON,
    NODE_UNCORDON,
    PROXY_REQUEST,
    REQUEST_PHASE,
    WORKLOAD_COMPLETED,
    WORKLOAD_ERRORED,
    WORKLOAD_QUEUED,
    WORKLOAD_STARTED,
)
from nvpair_tw.logs import starts_log

__all__ = ["log_events"]


# One info line per request (its proxy/request record); a workload's start and completion are debug,
# its failure or cancellation info, a cooldown a warning.
_LEVELS: Mapping[str, LogLevel] = {
    NODE_COOLDOWN: LogLevel.warn,
    WORKLOAD_QUEUED: LogLevel.debug,
    WORKLOAD_STARTED: LogLevel.debug,
    WORKLOAD_COMPLETED: LogLevel.debug,
    REQUEST_PHASE: LogLevel.debug,
    FAN_OUT_PROGRESS: LogLevel.debug,
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
    NODE_COOLDOWN: (
        "{event} {engine} {node_id}: {reason}; tried last for {cooling_for}",
        ("engine", "node_id", "reason", "cooling_for"),
    ),
    NODE_COOLDOWN_ENDED: (
        "{event} {engine} {node_id}: ready again ({why})",
        ("engine", "node_id", "why"),
    ),
    NODE_CORDON: ("{event} {engine} {node_id}: {reason}", ("engine", "node_id", "reason")),
    NODE_UNCORDON: ("{event} {engine} {node_id}", ("engine", "node_id")),
    FAN_OUT_PROGRESS: ("{event} {id} {engine} {path}", ("id", "engine", "path")),
}

# A renewed cooldown: the node still gave no answer when the last one ended (§6.3).
_RENEWED_COOLDOWN: tuple[str, tuple[str, ...]] = (
    "{event} {engine} {node_id}: still no answer ({reason}); tried last for another {cooling_for}",
    ("engine", "node_id", "reason", "cooling_for"),
)
# A cooldown another proxy of the fleet saw (§6.6) says so at the end of its line.
_FROM_PEER = " (seen by a {origin} proxy)"

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
    elif name == NODE_COOLDOWN and fields.get("renewed"):
        fmt, needed = _RENEWED_COOLDOWN
    else:
        fmt, needed = _FORMATS.get(name, ("{event}", ()))
    if not all(map(fields.__contains__, needed)):
        return "{event}"
    return fmt + _FROM_PEER if name == NODE_COOLDOWN and fields.get("origin") else fmt


def _derived(name: str, fields: Mapping[str, Any], time: float) -> Mapping[str, Any]:
    """What a line says that the wire object holds in another form: how long a cooldown lasts
    (``coolingUntil`` is in ms since the epoch, ``time`` the publish time in seconds)."""
    until = fields.get("coolingUntil")
    if name != NODE_COOLDOWN or not isinstance(until, int | float):
        return {}
    return {"cooling_for": format_duration(round(max(0.0, until / 1000 - time), 2))}


_RESERVED = frozenset({"format", "event"})


def _preformatted(name: str, fields: Mapping[str, Any], time: float) -> str:
    """The event's line, already rendered, as a format with no fields (braces doubled), from its
    ``fields`` (``event`` among them).

    Twisted would parse the format and flatten its fields again for every event; rendered here
    once, the line is the same and the observers find nothing to parse. A payload the format
    cannot render keeps the format itself, for Twisted to report as it always has.
    """
    derived = _derived(name, fields, time)
    known = {**fields, **derived} if derived else fields
    fmt = _format(name, known)
    try:
        text = fmt.format_map(known)
    except Exception:
        return fmt
    return text.replace("{", "{{").replace("}", "}}")


def _fields(name: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A log event's fields: ``event``, then the payload's but those whose name would clash
    with the logger's own (``log_*``, ``format``, ``event``)."""
    if _RESERVED.isdisjoint(payload) and not starts_log(list(payload)):
        return {"event": name, **payload}
    kept = {k: v for k, v in payload.items() if k not in _RESERVED and not k.startswith("log_")}
    return {"event": name, **kept}


def log_events(bus: EventBus, log: Logger) -> Subscription:
    """Subscribe a sink that emits each event through ``log`` as a structured event.

    The event name is the ``event`` field and the payload's fields are the other fields (keys that
    would clash with the logger's own, ``log_*`` and ``format``, are left out); the message is
    rendered once, here (`_preformatted`); every node event's line names its facade and node.
    ``node/cooldown`` logs at warn, a workload's queueing, start and completion at debug, everything else at info. With a
    :class:`~nvpair_tw.logs.LevelledLogger`, events below its level are skipped before any work,
    and the event's fields become the log event without another copy.
    """

    enabled = getattr(log, "enabled", None)
    emit_fields = getattr(log, "emit_fields", None)

    def sink(event: Event) -> None:
        name = event.name
        level = _LEVELS.get(name, LogLevel.info)
        if enabled is not None and not enabled(level):
            return
        fields = _fields(name, event.payload)
        line = _preformatted(name, fields, event.time)
        if emit_fields is not None:
            emit_fields(level, line, fields)
        else:
            log.emit(level, line, **fields)

    return bus.subscribe(sink, name="log")
