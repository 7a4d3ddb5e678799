"""Tests for nvpair_tw.events: ordering, bounded paused subscribers, drops, re-entrancy, logging."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any, ClassVar

import attrs
import pytest
from twisted.internet.task import Clock
from twisted.logger import (
    Logger,
    LogLevel,
    capturedLogs,
    eventAsJSON,
    eventFromJSON,
    formatEvent,
)

from nvpair_tw.corridor._driver import publish
from nvpair_tw.corridor._record import Facts
from nvpair_tw.corridor._workloads import WorkloadRegistry
from nvpair_tw.events import (
    Attempt,
    AttemptOutcome,
    BusEvent,
    Event,
    EventBus,
    FanOutProgress,
    NodeCooldown,
    NodeCooldownEnded,
    NodeCordon,
    NodeUncordon,
    PartProgress,
    PartState,
    ProxyRequest,
    Subscription,
    WorkloadCompleted,
    WorkloadErrored,
    WorkloadInfo,
    WorkloadQueued,
    WorkloadStarted,
    WorkloadState,
    log_events,
)
from nvpair_tw.logs import LevelledLogger, current_level, set_level
from tests.helpers import proxy_request


def _bus(max_pending: int = 1000) -> tuple[Clock, EventBus]:
    clock = Clock()
    clock.advance(1_700_000_000)
    return clock, EventBus(clock, max_pending=max_pending)


def _names(events: list[Event]) -> list[str]:
    return [e.name for e in events]


@attrs.frozen(slots=False)
class _Raw(BusEvent):
    """A test event: a wire name of the test's choosing and its wire object as given (the bus's
    order and bounds, and what the log makes of objects no proxy event sends)."""

    name: ClassVar[str] = "test/raw"
    wire: dict[str, Any] = attrs.field(factory=dict)

    def _build(self) -> dict[str, Any]:
        return self.wire


def _raw(name: str, wire: dict[str, Any] | None = None) -> BusEvent:
    """A :class:`_Raw` event published as ``name``."""
    kind: type[_Raw] = type("_Named", (_Raw,), {"name": name})
    return kind({} if wire is None else wire)


def test_event_carries_name_payload_and_publish_time() -> None:
    """publish returns the event it delivered, stamped with the injected clock."""
    clock, bus = _bus()
    got: list[Event] = []
    bus.subscribe(got.append, name="a")
    clock.advance(2.5)
    value = NodeUncordon("ollama", "n1")
    event = bus.publish(value)
    assert got == [event]
    assert event == Event("node/uncordon", value, 1_700_000_002.5)
    assert event.payload == {"engine": "ollama", "node_id": "n1"}


def test_a_published_event_is_a_frozen_event_like_one_its_class_makes() -> None:
    """The bus sets an event's slots without its ``__init__``: the value is the same, frozen,
    equal and hashed alike."""
    clock, bus = _bus()
    value = NodeUncordon("ollama", "n1")
    event = bus.publish(value)
    made = Event("node/uncordon", value, clock.seconds())
    assert type(event) is Event and event == made and hash(event) == hash(made)
    assert repr(event) == repr(made)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.time = 0.0  # type: ignore[misc]


def test_every_subscriber_receives_events_in_publish_order() -> None:
    """Each subscriber sees every event, in publish order."""
    _, bus = _bus()
    a: list[Event] = []
    b: list[Event] = []
    bus.subscribe(a.append, name="a")
    bus.subscribe(b.append, name="b")
    for i in range(5):
        bus.publish(_raw(f"e{i}"))
    assert _names(a) == _names(b) == ["e0", "e1", "e2", "e3", "e4"]


def test_subscribers_are_called_in_subscription_order() -> None:
    """For one event, sinks run in the order they subscribed."""
    _, bus = _bus()
    calls: list[str] = []
    bus.subscribe(lambda e: calls.append("first"), name="first")
    bus.subscribe(lambda e: calls.append("second"), name="second")
    bus.publish(_raw("x"))
    assert calls == ["first", "second"]


def test_paused_subscriber_buffers_then_replays_in_order() -> None:
    """A paused subscription queues events and delivers them in order on resume, then goes live."""
    _, bus = _bus()
    got: list[Event] = []
    sub = bus.subscribe(got.append, name="slow")
    bus.publish(_raw("e0"))
    sub.pause()
    bus.publish(_raw("e1"))
    bus.publish(_raw("e2"))
    assert _names(got) == ["e0"]
    assert sub.pending == 2
    sub.resume()
    assert _names(got) == ["e0", "e1", "e2"]
    assert sub.pending == 0
    bus.publish(_raw("e3"))
    assert _names(got) == ["e0", "e1", "e2", "e3"]


def test_sink_pausing_during_replay_keeps_the_rest_queued() -> None:
    """A sink that pauses again during a replay stops it; the rest waits for the next resume."""
    _, bus = _bus()
    got: list[Event] = []

    def sink(event: Event) -> None:
        got.append(event)
        if event.name == "e1":
            sub.pause()

    sub = bus.subscribe(sink, name="s")
    sub.pause()
    for i in range(4):
        bus.publish(_raw(f"e{i}"))
    sub.resume()
    assert _names(got) == ["e0", "e1"]
    assert sub.pending == 2
    sub.resume()
    assert _names(got) == ["e0", "e1", "e2", "e3"]


def test_publish_from_a_replaying_sink_comes_after_the_queue() -> None:
    """An event published by a sink during its replay is delivered after the queued ones."""
    _, bus = _bus()
    got: list[Event] = []

    def sink(event: Event) -> None:
        got.append(event)
        if event.name == "e0":
            bus.publish(_raw("nested"))

    sub = bus.subscribe(sink, name="s")
    sub.pause()
    bus.publish(_raw("e0"))
    bus.publish(_raw("e1"))
    sub.resume()
    assert _names(got) == ["e0", "e1", "nested"]


def test_overflow_drops_the_paused_subscriber_and_others_keep_receiving() -> None:
    """Past max_pending the paused subscriber is dropped with a reason; others are unaffected."""
    _, bus = _bus()
    reasons: list[str] = []
    other: list[Event] = []
    slow = bus.subscribe(lambda e: None, name="slow", on_dropped=reasons.append, max_pending=3)
    bus.subscribe(other.append, name="other")
    slow.pause()
    with capturedLogs() as logs:
        for i in range(3):
            bus.publish(_raw(f"e{i}"))
        assert slow.dropped is None
        assert slow.pending == 3
        bus.publish(_raw("e3"))
        bus.publish(_raw("e4"))
    assert slow.dropped == "more than 3 events pending"
    assert reasons == ["more than 3 events pending"]
    assert slow.pending == 0
    assert slow not in bus.subscriptions
    assert not slow.active
    assert _names(other) == ["e0", "e1", "e2", "e3", "e4"]
    [warning] = logs
    assert warning["log_level"] is LogLevel.warn
    assert warning["subscriber"] == "slow"
    assert "slow" in formatEvent(warning)
    assert "more than 3 events pending" in formatEvent(warning)


def test_raising_sink_is_dropped_and_logged_by_exception_type_only() -> None:
    """A sink that raises is dropped; the log names its exception type, never the event payload."""
    _, bus = _bus()
    reasons: list[str] = []
    other: list[Event] = []

    def broken(event: Event) -> None:
        raise KeyError(event.payload["workload"]["model"])

    broken_sub = bus.subscribe(broken, name="broken", on_dropped=reasons.append)
    bus.subscribe(other.append, name="other")
    with capturedLogs() as logs:
        event = bus.publish(WorkloadStarted(_info(model="CANARY-7f3a")))
        bus.publish(_raw("after"))
    assert broken_sub.dropped == "sink raised KeyError"
    assert reasons == ["sink raised KeyError"]
    assert other[0] is event
    assert _names(other) == ["workload:started", "after"]
    [warning] = logs
    assert warning["subscriber"] == "broken"
    assert "KeyError" in formatEvent(warning)
    assert "CANARY-7f3a" not in repr(warning)


def test_raising_on_dropped_does_not_reach_the_publisher() -> None:
    """An on_dropped callback that raises is logged; the publisher and others carry on."""
    _, bus = _bus()
    other: list[Event] = []

    def on_dropped(reason: str) -> None:
        raise RuntimeError("boom")

    def broken(event: Event) -> None:
        raise ValueError("x")

    bus.subscribe(broken, name="broken", on_dropped=on_dropped)
    bus.subscribe(other.append, name="other")
    with capturedLogs() as logs:
        bus.publish(_raw("e0"))
    assert _names(other) == ["e0"]
    assert [e["log_level"] for e in logs] == [LogLevel.warn, LogLevel.error]
    assert "RuntimeError" in formatEvent(logs[1])


def test_subscriber_that_never_resumes_stays_bounded() -> None:
    """A paused subscriber never holds more than max_pending; once dropped it costs nothing."""
    _, bus = _bus()
    live = [0]

    def count(event: Event) -> None:
        live[0] += 1

    stuck = bus.subscribe(lambda e: None, name="stuck", max_pending=50)
    bus.subscribe(count, name="live")
    stuck.pause()
    high_water = 0
    record = proxy_request(id="r")
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(20_000):
            bus.publish(record)
            high_water = max(high_water, stuck.pending)
            if i == 1_000:
                gc.collect()
                early, _ = tracemalloc.get_traced_memory()
        gc.collect()
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert high_water == 50
    assert stuck.pending == 0
    assert stuck.dropped is not None
    assert [s.name for s in bus.subscriptions] == ["live"]
    assert live == [20_000]
    assert late - early < 16_000  # flat: 19,000 more events retained nothing


def test_reentrant_publish_keeps_the_same_order_for_every_subscriber() -> None:
    """An event published from inside a sink reaches everyone after the event in hand."""
    _, bus = _bus()
    first: list[Event] = []
    second: list[Event] = []

    def republisher(event: Event) -> None:
        first.append(event)
        if event.name == "a":
            bus.publish(_raw("b"))
            bus.publish(_raw("c"))

    bus.subscribe(republisher, name="first")
    bus.subscribe(second.append, name="second")
    bus.publish(_raw("a"))
    bus.publish(_raw("d"))
    assert _names(first) == ["a", "b", "c", "d"]
    assert _names(second) == ["a", "b", "c", "d"]


def test_close_unsubscribes_without_a_drop_reason() -> None:
    """close() stops delivery, discards the queue and leaves dropped unset."""
    _, bus = _bus()
    reasons: list[str] = []
    got: list[Event] = []
    sub = bus.subscribe(got.append, name="s", on_dropped=reasons.append)
    sub.pause()
    bus.publish(_raw("e0"))
    sub.close()
    sub.close()
    sub.resume()
    bus.publish(_raw("e1"))
    assert got == []
    assert sub.dropped is None
    assert reasons == []
    assert bus.subscriptions == ()


def test_subscriber_closing_another_mid_publish_stops_its_delivery() -> None:
    """A subscription closed by an earlier sink does not receive the event in hand."""
    _, bus = _bus()
    got: list[Event] = []
    bus.subscribe(lambda e: victim.close(), name="closer")
    victim = bus.subscribe(got.append, name="victim")
    bus.publish(_raw("e0"))
    assert got == []
    assert victim.pending == 0


def test_negative_max_pending_is_rejected() -> None:
    """A negative queue bound is a clear ValueError, on the bus and per subscription."""
    clock = Clock()
    with pytest.raises(ValueError, match="max_pending must be >= 0"):
        EventBus(clock, max_pending=-1)
    with pytest.raises(ValueError, match="max_pending must be >= 0"):
        EventBus(clock).subscribe(lambda e: None, name="s", max_pending=-1)


def test_bus_default_max_pending_applies_to_subscribers() -> None:
    """Without its own bound a subscription uses the bus's max_pending."""
    _, bus = _bus(max_pending=2)
    sub: Subscription = bus.subscribe(lambda e: None, name="s")
    sub.pause()
    bus.publish(_raw("e0"))
    bus.publish(_raw("e1"))
    assert sub.dropped is None
    bus.publish(_raw("e2"))
    assert sub.dropped == "more than 2 events pending"


def _log_all(*values: BusEvent) -> list[dict[str, Any]]:
    _, bus = _bus()
    log = Logger(namespace="nvpair_tw.test")
    log_events(bus, log)
    with capturedLogs() as logs:
        for value in values:
            bus.publish(value)
    return list(logs)


def test_log_events_emits_request_records_as_structured_info_events() -> None:
    """proxy/request becomes an info event with the name as `event` and the payload fields."""
    record = proxy_request(
        id="r-1",
        engine="ollama",
        node_id="a",
        method="POST",
        path="/api/chat",
        status=200,
        duration_ms=12,
        ttfb_ms=3,
    )
    payload = record.to_json()
    [logged] = _log_all(record)
    assert logged["log_level"] is LogLevel.info
    assert logged["event"] == "proxy/request"
    assert {k: logged[k] for k in payload} == payload
    assert formatEvent(logged) == "proxy/request r-1 ollama POST /api/chat -> 200 via a in 12 ms"


def _request_record(**changes: Any) -> ProxyRequest:
    fields: dict[str, Any] = {
        "id": "r-7",
        "engine": "ollama",
        "node_id": None,
        "method": "POST",
        "path": "/api/chat",
        "status": 503,
        "duration_ms": 2,
        "ttfb_ms": None,
        "error": "shutting-down",
    }
    fields.update(changes)
    return proxy_request(**fields)


def test_the_request_line_is_rendered_once_and_keeps_braces_in_the_path() -> None:
    """The line reaches the observers rendered (nothing left to parse or flatten), braces in the
    path stay literal, and a JSON log reader renders the same line."""
    [logged] = _log_all(_request_record(path="/api/{x}", node_id="a"))
    line = "proxy/request r-7 ollama POST /api/{x} -> 503 via a in 2 ms"
    assert formatEvent(logged) == line
    assert logged["path"] == "/api/{x}"
    decoded = eventFromJSON(eventAsJSON(logged))
    assert "log_flattened" not in decoded
    assert formatEvent(decoded) == line


def test_a_payload_the_line_cannot_render_is_reported_by_twisted_as_before() -> None:
    """A workload payload that is not a mapping keeps its format: Twisted says it cannot format it."""
    [logged] = _log_all(_raw("workload:errored", {"workload": 5}))
    assert logged["workload"] == 5
    assert "Unable to format event" in formatEvent(logged)


def test_request_no_node_served_logs_its_error_instead_of_via_none() -> None:
    """A rejected request's line names why it ended and never says "via None"."""
    [logged] = _log_all(_request_record())
    line = formatEvent(logged)
    assert line == "proxy/request r-7 ollama POST /api/chat -> 503 (shutting-down) in 2 ms"
    assert logged["node_id"] is None


def test_request_without_node_or_error_logs_status_and_duration_only() -> None:
    """With neither a node nor an error the line has no "via" and no "None" in it."""
    [logged] = _log_all(_request_record(status=499, error=None))
    assert formatEvent(logged) == "proxy/request r-7 ollama POST /api/chat -> 499 in 2 ms"


def test_a_published_rejection_record_logs_without_via_none() -> None:
    """A record published with no node (a rejection) logs a full line, not "via None"."""
    clock, bus = _bus()
    log_events(bus, Logger(namespace="nvpair_tw.test"))
    facts = Facts("r-9", "ollama", "GET", "/api/tags", clock.seconds())
    clock.advance(0.004)
    with capturedLogs() as logs:
        publish(bus, facts.record(clock.seconds(), 403, None, "loopback-only"))
    [line] = [formatEvent(e) for e in logs]
    assert line == "proxy/request r-9 ollama GET /api/tags -> 403 (loopback-only) in 4 ms"


def test_log_events_renders_workload_starts_at_debug_and_endings_in_error_at_info() -> None:
    """workload:started logs at debug, workload:errored at info, each with a readable message."""
    started = _info(id=4, model="m", scheduled_on="b")
    errored = _info(
        id=4, model="m", scheduled_on="b", state=WorkloadState.CANCELLED, error="client left"
    )
    logged = _log_all(WorkloadStarted(started), WorkloadErrored(errored))
    assert [e["log_level"] for e in logged] == [LogLevel.debug, LogLevel.info]
    assert logged[0]["workload"] == started.to_json()
    assert formatEvent(logged[0]) == "workload:started 4 m on b"
    assert formatEvent(logged[1]) == "workload:errored 4 m cancelled: client left"


def test_log_events_levels_and_fallback_format_for_other_events() -> None:
    """node/cooldown logs at warn, other events at info; unknown shapes still render their name."""
    logged = _log_all(
        _raw("node/cooldown", {"id": "a"}),
        _raw("node/added", {"id": "b"}),
        _raw("proxy/request", {"id": "r-2"}),
    )
    assert [e["log_level"] for e in logged] == [LogLevel.warn, LogLevel.info, LogLevel.info]
    assert [formatEvent(e) for e in logged] == ["node/cooldown", "node/added", "proxy/request"]
    assert logged[0]["id"] == "a"


_NOW_MS = 1_700_000_000_000  # _bus()'s clock, in ms

_NODE_LINES: list[tuple[BusEvent, str]] = [
    (NodeCooldown("ollama", "gpu2", "no response headers within 4s", _NOW_MS + 4000),
     "node/cooldown ollama gpu2: no response headers within 4s; tried last for 4s"),
    (NodeCooldown("ollama", "gpu2", "no response headers within 4s", _NOW_MS + 4000,
                  renewed=True),
     "node/cooldown ollama gpu2: still no answer (no response headers within 4s); tried last "
     "for another 4s"),
    (NodeCooldown("ollama", "gpu2", "no response headers within 4s", _NOW_MS + 4999,
                  origin="peer"),
     "node/cooldown ollama gpu2: no response headers within 4s; tried last for 5s "
     "(seen by a peer proxy)"),
    (NodeCooldownEnded("ollama", "gpu2", "expired"),
     "node/cooldown-ended ollama gpu2: ready again (expired)"),
    (NodeCooldownEnded("lmstudio", "gpu2", "success"),
     "node/cooldown-ended lmstudio gpu2: ready again (success)"),
    (NodeCordon("ollama", "gpu2", "maintenance", 1500, "control"),
     "node/cordon ollama gpu2: maintenance"),
    (NodeUncordon("ollama", "gpu2"), "node/uncordon ollama gpu2"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "line"), _NODE_LINES)
def test_every_node_event_line_names_its_facade_and_node(value: BusEvent, line: str) -> None:
    """Each node event's log line says which facade and node and why, in words (a cooldown: how
    long the node is tried last, from ``coolingUntil`` and the publish time)."""
    [logged] = _log_all(value)
    assert formatEvent(logged) == line
    assert logged["node_id"] == "gpu2"


def test_every_node_event_kind_has_a_line_of_its_own() -> None:
    """No node event falls back to its bare name: each kind ``events`` publishes is covered above."""
    from nvpair_tw import events

    kinds = {getattr(events, n) for n in events.__all__ if n.startswith("NODE_")}
    assert kinds == {value.name for value, _ in _NODE_LINES}


def test_log_events_leaves_out_payload_keys_that_clash_with_the_logger() -> None:
    """Payload keys like log_level, format or event cannot overwrite the logger's own fields."""
    [logged] = _log_all(
        _raw("node/added", {"log_level": "x", "format": "{y}", "event": "z", "id": "n"})
    )
    assert logged["log_level"] is LogLevel.info
    assert logged["event"] == "node/added"
    assert "format" not in logged
    assert formatEvent(logged) == "node/added"


@pytest.mark.parametrize(
    "clashing", [{"log_trace": "x"}, {"format": "{y}"}, {"event": "z"}, {"log_failure": "w"}]
)
def test_one_clashing_payload_key_is_left_out_alone(clashing: dict[str, Any]) -> None:
    """Each kind of clash alone (a ``log_*`` key, ``format``, ``event``) is left out, and the
    payload's other fields are kept."""
    [logged] = _log_all(_raw("node/added", {**clashing, "id": "n"}))
    assert logged["id"] == "n"
    assert logged["event"] == "node/added"
    assert logged["log_level"] is LogLevel.info
    assert "format" not in logged
    assert "log_trace" not in logged
    assert "log_failure" not in logged


def test_log_events_skips_events_below_a_levelled_loggers_level() -> None:
    """With a LevelledLogger at warn, request records are not logged and cooldowns are."""
    _, bus = _bus()
    log_events(bus, LevelledLogger(namespace="nvpair_tw.test"))
    before = current_level()
    set_level(LogLevel.warn)
    try:
        with capturedLogs() as logs:
            bus.publish(proxy_request(id="r-1"))
            bus.publish(NodeCooldown("ollama", "a", "stall", 0))
    finally:
        set_level(before)
    assert [e["event"] for e in logs] == ["node/cooldown"]


def _info(**changes: Any) -> WorkloadInfo:
    info = WorkloadInfo(
        7, "run", "ollama", "llama3", WorkloadState.RUNNING, "a", 1000, 1500, None, None, 2
    )
    return attrs.evolve(info, **changes)


_INFO_WIRE: dict[str, Any] = {
    "id": 7,
    "runId": "run",
    "engine": "ollama",
    "model": "llama3",
    "state": "running",
    "scheduledOn": "a",
    "createdAt": 1000,
    "startedAt": 1500,
    "completedAt": None,
    "error": None,
    "seq": 2,
}

_REQUEST = ProxyRequest(
    "run-1", "ollama", "a", "POST", "/api/chat", 200, 40, 10, None,
    (Attempt("b", AttemptOutcome.STALL, 20, 1), Attempt("a", AttemptOutcome.COMMITTED, 12)), True, 5,
)  # fmt: skip

_REQUEST_WIRE: dict[str, Any] = {
    "id": "run-1",
    "engine": "ollama",
    "node_id": "a",
    "method": "POST",
    "path": "/api/chat",
    "status": 200,
    "duration_ms": 40,
    "ttfb_ms": 10,
    "error": None,
    "attempts": [
        {"node_id": "b", "outcome": "stall", "ms": 20, "busy_waits": 1},
        {"node_id": "a", "outcome": "committed", "ms": 12, "busy_waits": 0},
    ],
    "cache_affinity": True,
    "queued_ms": 5,
}

_INFERENCE_WIRE: dict[str, Any] = {
    **_REQUEST_WIRE,
    "fan_out": ["a", "b"],
    "fallback_from": "big",
    "key": "alice",
    "model": "llama3",
    "model_local": "llama3:8b",
    "translated": True,
    "prompt_tokens": 12,
    "completion_tokens": 34,
    "cached_tokens": 10,
    "ttft_ms": 7,
    "tokens_per_s": 21.5,
    "warm_node": "a",
    "context_fit": False,
    "predicted_ms": 900,
    "measured_ms": 1000,
}

_WIRES: list[tuple[BusEvent, str, dict[str, Any]]] = [
    (WorkloadQueued(_info(state=WorkloadState.QUEUED)), "workload:queued",
     {"workload": {**_INFO_WIRE, "state": "queued"}}),
    (WorkloadStarted(_info()), "workload:started", {"workload": _INFO_WIRE}),
    (WorkloadCompleted(_info(state=WorkloadState.COMPLETED, completed_at=2000)),
     "workload:completed",
     {"workload": {**_INFO_WIRE, "state": "completed", "completedAt": 2000}}),
    (WorkloadErrored(_info(state=WorkloadState.CANCELLED, completed_at=2000, error="gone")),
     "workload:errored",
     {"workload": {**_INFO_WIRE, "state": "cancelled", "completedAt": 2000, "error": "gone"}}),
    (NodeCooldown("ollama", "a", "stall", 12500), "node/cooldown",
     {"engine": "ollama", "node_id": "a", "reason": "stall", "coolingUntil": 12500}),
    (NodeCooldown("ollama", "a", "stall", 12500, renewed=True, origin="peer"), "node/cooldown",
     {"engine": "ollama", "node_id": "a", "reason": "stall", "coolingUntil": 12500,
      "renewed": True, "origin": "peer"}),
    (NodeCooldownEnded("ollama", "a", "expired"), "node/cooldown-ended",
     {"engine": "ollama", "node_id": "a", "why": "expired"}),
    (NodeCordon("ollama", "a", "maintenance", 1500, "control"), "node/cordon",
     {"engine": "ollama", "node_id": "a", "reason": "maintenance", "since": 1500,
      "origin": "control"}),
    (NodeUncordon("ollama", "a"), "node/uncordon", {"engine": "ollama", "node_id": "a"}),
    (_REQUEST, "proxy/request", _REQUEST_WIRE),
    (attrs.evolve(
        _REQUEST, fan_out=("a", "b"), fallback_from="big", key="alice", model="llama3",
        model_local="llama3:8b", translated=True, prompt_tokens=12, completion_tokens=34,
        ttft_ms=7, tokens_per_s=21.5, context_fit=False, predicted_ms=900, measured_ms=1000,
        cached_tokens=10, warm_node="a",
    ), "proxy/request", _INFERENCE_WIRE),
    (FanOutProgress("fan-out-3", "ollama", "/api/pull", "llama3", 1500, (
        PartProgress("a", PartState.RUNNING, 300, 1000),
        PartProgress("b", PartState.FAILED, error="upstream answered 500"),
    )), "fan-out/progress",
     {"id": "fan-out-3", "engine": "ollama", "path": "/api/pull", "model": "llama3",
      "since": 1500, "nodes": [
          {"node_id": "a", "state": "running", "completed": 300, "total": 1000, "error": None},
          {"node_id": "b", "state": "failed", "completed": 0, "total": 0,
           "error": "upstream answered 500"}]}),
]  # fmt: skip


def test_a_fan_out_has_ended_once_every_part_has_and_logs_at_debug() -> None:
    """A fan-out's progress is its last once no part is asked or running; its line (debug, it
    comes every half second) names the fan-out, facade and path."""
    asked = PartProgress("a", PartState.ASKED)
    running = FanOutProgress("f-1", "ollama", "/api/pull", None, 0, (asked,))
    done = attrs.evolve(running, parts=(PartProgress("a", PartState.CANCELLED),))
    assert not running.ended and done.ended
    assert [s.ended for s in PartState] == [False, False, True, True, True]
    [logged] = _log_all(running)
    assert logged["log_level"] == LogLevel.debug
    assert formatEvent(logged) == "fan-out/progress f-1 ollama /api/pull"


@pytest.mark.parametrize(("value", "name", "wire"), _WIRES)
def test_each_event_sends_its_wire_object_key_for_key_in_order(
    value: BusEvent, name: str, wire: dict[str, Any]
) -> None:
    """Each class's wire name and JSON object are the ones sent before events were typed
    (docs/behaviour.md §7): same keys, same order, same values; published, ``payload`` is it."""
    _, bus = _bus()
    event = bus.publish(value)
    assert (value.name, event.name) == (name, name)
    assert json.dumps(event.payload) == json.dumps(wire)
    assert event.payload is value.to_json()  # made once, shared by whoever sends it


def test_the_publishers_build_the_wire_objects_they_always_sent() -> None:
    """A workload's events and a request's record, published by corridor code, send the objects
    of docs/behaviour.md §7 (compared with literals, in order)."""
    clock, bus = _bus()
    got: list[Event] = []
    bus.subscribe(got.append, name="test")
    registry = WorkloadRegistry(clock, bus, run_id="run")
    workload = registry.create("ollama", "llama3")
    workload.running("a")
    facts = Facts("run-1", "ollama", "POST", "/api/chat", clock.seconds())
    facts.attempts.start("a", clock.seconds())
    clock.advance(0.01)
    facts.first_byte_at = clock.seconds()
    facts.model, facts.model_local, facts.key = "llama3", "llama3:8b", "alice"
    facts.attempts.close(AttemptOutcome.COMMITTED, clock.seconds())
    workload.complete()
    publish(bus, facts.record(clock.seconds(), 200, "a", None))
    started = {
        "id": 1, "runId": "run", "engine": "ollama", "model": "llama3", "state": "running",
        "scheduledOn": "a", "createdAt": 1_700_000_000_000, "startedAt": 1_700_000_000_000,
        "completedAt": None, "error": None, "seq": 1,
    }  # fmt: skip
    completed = {**started, "state": "completed", "completedAt": 1_700_000_000_010, "seq": 2}
    request = {
        "id": "run-1", "engine": "ollama", "node_id": "a", "method": "POST", "path": "/api/chat",
        "status": 200, "duration_ms": 10, "ttfb_ms": 10, "error": None,
        "attempts": [{"node_id": "a", "outcome": "committed", "ms": 10, "busy_waits": 0}],
        "cache_affinity": False, "queued_ms": 0, "key": "alice", "model": "llama3",
        "model_local": "llama3:8b", "translated": False, "prompt_tokens": None,
        "completion_tokens": None, "cached_tokens": None, "ttft_ms": None, "tokens_per_s": None,
    }  # fmt: skip
    assert [(e.name, json.dumps(e.payload)) for e in got] == [
        ("workload:started", json.dumps({"workload": started})),
        ("workload:completed", json.dumps({"workload": completed})),
        ("proxy/request", json.dumps(request)),
    ]
    assert isinstance(got[2].value, ProxyRequest) and got[2].value.model == "llama3"
    assert isinstance(got[0].value, WorkloadStarted) and got[0].value.workload.seq == 1
