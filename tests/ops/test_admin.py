"""Tests for nvpair_tw.ops._admin: health, readiness, the state snapshot, the page and the event stream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest_twisted
import treq
from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyRequest

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import (
    Attempt,
    AttemptOutcome,
    EventBus,
    NodeCooldown,
    NodeCooldownEnded,
    NodeUncordon,
    ProxyRequest,
)
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import (
    AdminService,
    EventStream,
    StreamState,
    admin_resource,
    readiness,
)
from nvpair_tw.ops._board import StatusBoard
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.ops._throughput import Throughput
from nvpair_tw.runtime._process import Runtime, build_runtime
from nvpair_tw.selection._admission import Slot, Waiter
from nvpair_tw.selection._speed import Sample
from nvpair_tw.testing import start_proxy
from tests.helpers import proxy_request

STATIC = ("llama3:latest",)


_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


def _runtime(nodes: list[Node]) -> tuple[MemoryReactorClock, Runtime]:
    clock = MemoryReactorClock()
    clock.advance(1_700_000_000)
    return clock, build_runtime(
        cast(IProxyReactor, clock), Settings(), ["ollama"], nodes={"ollama": nodes}
    )


def _client(runtime: Runtime, listening: bool = True) -> Any:
    board = StatusBoard(runtime)
    root = admin_resource(
        runtime, ProxyMetrics(runtime), board, lambda _engine: listening, lambda _r: None
    )
    return StubTreq(root)


def _get(client: Any, path: str) -> tuple[int, Any, bytes]:
    d = client.get("http://admin" + path)
    client.flush()
    response = cast(Any, _result(d))
    body = cast(bytes, _result(treq.content(response)))
    return response.code, response.headers, body


def _result(d: Deferred[Any]) -> object:
    results: list[object] = []
    d.addBoth(results.append)
    assert results, "the deferred has not fired"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


def test_healthz_answers_ok() -> None:
    """/healthz is 200 {"status": "ok"} whatever the nodes look like."""
    _, runtime = _runtime([])
    code, headers, body = _get(_client(runtime, listening=False), "/healthz")
    assert code == 200
    assert json.loads(body) == {"status": "ok"}
    assert headers.getRawHeaders(b"content-type") == [b"application/json"]


def test_readyz_is_503_with_reason_when_no_inventory_is_known() -> None:
    """Listening but no node has answered its model list: 503 not-ready naming why."""
    _, runtime = _runtime([Node("a", "http://127.0.0.1:1")])
    code, _, body = _get(_client(runtime), "/readyz")
    assert code == 503
    assert json.loads(body) == {"error": "no node has a known inventory yet", "code": "not-ready"}


def test_readyz_is_503_when_a_facade_is_not_listening() -> None:
    """An inventory is known but the facade is not listening: 503 naming the facade."""
    _, runtime = _runtime([Node("a", "http://127.0.0.1:1", STATIC)])
    code, _, body = _get(_client(runtime, listening=False), "/readyz")
    assert code == 503
    assert json.loads(body) == {"error": "ollama facade is not listening", "code": "not-ready"}


def test_readyz_is_200_when_listening_and_an_inventory_is_known() -> None:
    """Every facade listening and one known inventory: ready."""
    _, runtime = _runtime([Node("a", "http://127.0.0.1:1"), Node("b", "http://x:1", STATIC)])
    code, _, body = _get(_client(runtime), "/readyz")
    assert code == 200
    assert json.loads(body) == {"status": "ready"}


def test_default_readiness_follows_the_facade_sites_listening_ports() -> None:
    """Without an injected check, a facade is listening while its Site has a port."""
    _, runtime = _runtime([Node("a", "http://127.0.0.1:1", STATIC)])
    service = AdminService(
        cast(IProxyReactor, MemoryReactorClock()), runtime, "tcp:0:interface=127.0.0.1"
    )
    assert readiness(runtime, service.listening) == "ollama facade is not listening"
    site = runtime.site_for("ollama")
    site.doStart()  # what a listening port does to its factory
    assert readiness(runtime, service.listening) is None
    site.doStop()
    assert readiness(runtime, service.listening) == "ollama facade is not listening"
    service.metrics.close()
    service.board.close()


def test_state_snapshot_shows_nodes_cooldowns_in_flight_and_failovers() -> None:
    """/api/state: each node's inventory, in-flight count, cooldown (until, reason), last success,
    and the recent failovers."""
    _, runtime = _runtime(
        [Node("a", "http://127.0.0.1:1", STATIC), Node("b", "http://127.0.0.1:2")]
    )
    client = _client(runtime)
    facade = runtime.facades["ollama"]
    facade.stalls.cool("b", "no response headers within 120s")
    workload = runtime.shared.workloads.create("ollama", "llama3")
    workload.running("a")
    runtime.shared.bus.publish(
        proxy_request(
            id="r-9",
            engine="ollama",
            node_id="a",
            path="/api/chat",
            status=200,
            attempts=(
                Attempt("b", AttemptOutcome.STALL, 120000),
                Attempt("a", AttemptOutcome.COMMITTED, 5),
            ),
        )
    )
    code, _, body = _get(client, "/api/state")
    state = json.loads(body)
    assert code == 200
    now = 1_700_000_000_000
    assert state["now"] == now
    [ollama] = state["facades"]
    assert ollama["engine"] == "ollama" and ollama["listening"] is True
    a, b = ollama["nodes"]
    assert a["id"] == "a" and a["models"] == ["llama3:latest"] and a["inventoryKnown"] is True
    assert a["inFlight"] == 1 and a["reservations"] == 0 and a["cooling"] is None
    assert a["lastSuccess"] == now
    assert b["inventoryKnown"] is False and b["inFlight"] == 0 and b["lastSuccess"] is None
    assert b["cooling"] == {"until": now + 120_000, "reason": "no response headers within 120s"}
    assert [w["id"] for w in state["workloads"]] == [workload.id]
    [failover] = state["failovers"]
    assert failover["id"] == "r-9" and [x["outcome"] for x in failover["attempts"]] == [
        "stall",
        "committed",
    ]
    facade.stalls.clear("b")


def test_state_snapshot_shows_slots_queue_depth_busy_waits_and_residency() -> None:
    """/api/state: each node's slots and slots in use (0 = unlimited), busy waits, loaded models
    (None when unknown) and learnt rates (§15.1); each facade's queue depth."""
    _, runtime = _runtime(
        [
            Node("a", "http://127.0.0.1:1", STATIC, slots=1),
            Node("b", "http://127.0.0.1:2", slots=3),
            Node("c", "http://127.0.0.1:3", STATIC),
        ]
    )
    client = _client(runtime)
    facade = runtime.facades["ollama"]
    a, b = facade.directory.get("a"), facade.directory.get("b")
    assert a is not None and b is not None
    holding = facade.admission.admit([a])
    queued = facade.admission.admit([a])
    assert isinstance(holding, Slot) and isinstance(queued, Waiter)
    queued.bound.addErrback(lambda failure: failure.trap(CancelledError))
    facade.progress.busy_waited("a")
    facade.progress.busy_waited("a")
    facade.inventory.record_models(b, frozenset({"llama3:latest", "qwen:7b"}), 1_700_000_000.0)
    facade.inventory.record_loaded(b, frozenset({"qwen:7b"}), 1_700_000_000.0)
    _, _, body = _get(client, "/api/state")
    [ollama] = json.loads(body)["facades"]
    assert ollama["queueDepth"] == 1
    shown = {
        n["id"]: (n["slotsInUse"], n["slots"], n["busyWaits"], n["loaded"]) for n in ollama["nodes"]
    }
    assert shown == {"a": (1, 1, 2, None), "b": (0, 3, 0, ["qwen:7b"]), "c": (0, 0, 0, None)}
    facade.speeds.learn("c", "llama3", Sample(decode_rate=10.3))
    _, _, body = _get(client, "/api/state")
    [ollama] = json.loads(body)["facades"]
    rates = {n["id"]: n["rates"] for n in ollama["nodes"]}
    assert rates["a"] == {} and rates["c"]["llama3"]["decodeTokensPerSecond"] == 10.3
    queued.bound.cancel()
    holding.release()
    _, _, body = _get(client, "/api/state")
    [ollama] = json.loads(body)["facades"]
    assert ollama["queueDepth"] == 0 and ollama["nodes"][0]["slotsInUse"] == 0


def _inference(node: str, completion: int | None, engine: str = "ollama") -> ProxyRequest:
    return proxy_request(
        id="r",
        engine=engine,
        node_id=node,
        path="/api/chat",
        status=200,
        attempts=(Attempt(node, AttemptOutcome.COMMITTED, 5),),
        model="llama3",
        prompt_tokens=7,
        completion_tokens=completion,
        tokens_per_s=40.0,
        duration_ms=500,
    )


def test_state_throughput_counts_completion_tokens_per_node_in_10s_buckets() -> None:
    """/api/state ``throughput``: each node's completion tokens per second in 10 s buckets of the
    last 15 minutes (90 points, oldest first, zero-filled), counted in the bucket of the request's
    end on the runtime's clock; records without counts (or not inference) add nothing."""
    clock, runtime = _runtime([Node("a", "http://127.0.0.1:1", STATIC), Node("b", "http://x:1")])
    client = _client(runtime)
    bus = runtime.shared.bus
    bus.publish(_inference("a", 120))
    clock.advance(3)  # 1_700_000_003: still the bucket starting at ..._000
    bus.publish(_inference("a", 30))
    clock.advance(10)  # ..._013: the next bucket
    bus.publish(_inference("b", 50))
    bus.publish(_inference("b", None))  # an engine that gave no counts
    bus.publish(proxy_request(id="m", engine="ollama", node_id="a", status=200))
    _, _, body = _get(client, "/api/state")
    throughput = json.loads(body)["throughput"]
    assert throughput["bucketSeconds"] == 10
    newest = 1_700_000_010_000
    assert throughput["since"] == newest - 89 * 10_000
    a, b = throughput["series"]
    assert (a["engine"], a["node"], b["node"]) == ("ollama", "a", "b")
    assert len(a["points"]) == len(b["points"]) == 90
    assert [t for t, _ in a["points"]] == [throughput["since"] + 10_000 * i for i in range(90)]
    assert a["points"][-2:] == [[newest - 10_000, 15.0], [newest, 0.0]]
    assert b["points"][-2:] == [[newest - 10_000, 0.0], [newest, 5.0]]
    assert sum(rate for _, rate in a["points"][:-2]) == 0


def test_throughput_drops_buckets_older_than_15_minutes() -> None:
    """Buckets leave the window 15 minutes on (a node with none left has no series), and however
    long it runs the board keeps at most 90 buckets a node."""
    clock, runtime = _runtime([Node("a", "http://127.0.0.1:1", STATIC)])
    board = StatusBoard(runtime)
    bus = runtime.shared.bus
    bus.publish(_inference("a", 100))
    clock.advance(890)  # the bucket of t=0 is the oldest of the window
    [a] = board.state(lambda _e: True)["throughput"]["series"]
    assert a["points"][0][1] == 10.0
    clock.advance(10)
    assert board.state(lambda _e: True)["throughput"]["series"] == []
    assert board.throughput.kept() == 0
    for _ in range(1000):
        clock.advance(5)
        bus.publish(_inference("a", 1))
        bus.publish(_inference("b", 1, engine="openai"))
    assert board.throughput.kept() == 2 * 90
    board.close()


def test_throughput_series_is_bounded_by_its_window() -> None:
    """A ``Throughput`` of 3 buckets of 2 s: points per bucket start, oldest dropped on add."""
    series = Throughput(bucket=2.0, buckets=3)
    series.add(0.5, "ollama", "a", 4)
    series.add(1.9, "ollama", "a", 2)
    series.add(4.0, "ollama", "a", 8)
    assert series.to_json(4.5) == {
        "bucketSeconds": 2.0,
        "since": 0,
        "series": [
            {"engine": "ollama", "node": "a", "points": [[0, 3.0], [2000, 0.0], [4000, 4.0]]}
        ],
    }
    series.add(6.0, "ollama", "a", 2)
    assert series.kept() == 2
    assert series.to_json(6.0)["series"][0]["points"] == [[2000, 0.0], [4000, 4.0], [6000, 1.0]]


def test_unknown_paths_and_methods_get_json_errors() -> None:
    """An unknown path is a JSON 404; a POST to a GET resource is a JSON 405."""
    _, runtime = _runtime([])
    client = _client(runtime)
    code, _, body = _get(client, "/nope")
    assert code == 404 and json.loads(body)["code"] == "not-found"
    d = client.post("http://admin/healthz", data=b"")
    client.flush()
    response = cast(Any, _result(d))
    assert response.code == 405
    assert json.loads(cast(bytes, _result(treq.content(response))))["code"] == "method-not-allowed"


def test_status_page_and_script_are_served_with_a_strict_policy() -> None:
    """/ is the HTML page loading status.js; both carry a CSP that allows only our own script."""
    _, runtime = _runtime([])
    client = _client(runtime)
    code, headers, page = _get(client, "/")
    assert code == 200
    assert headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
    assert b'<script src="status.js"></script>' in page
    policy = headers.getRawHeaders(b"content-security-policy")[0]
    assert b"script-src 'self'" in policy
    code, headers, script = _get(client, "/status.js")
    assert code == 200 and b"EventSource" in script
    assert b"innerHTML" not in script


class FakeRequest(DummyRequest):
    """A DummyRequest that keeps a push producer (the real channel pauses and resumes it)."""

    def __init__(self) -> None:
        super().__init__([b""])
        self.transport = StringTransport()
        self.producer: Any = None

    def registerProducer(self, prod: Any, s: Any) -> None:
        self.producer = prod

    def unregisterProducer(self) -> None:
        self.producer = None


def _stream(**kwargs: Any) -> tuple[Clock, EventBus, FakeRequest, EventStream]:
    clock = Clock()
    bus = EventBus(clock)
    request = FakeRequest()
    stream = EventStream(cast(Request, request), bus, clock, **kwargs)
    stream.start()
    return clock, bus, request, stream


def test_each_bus_event_is_one_sse_frame() -> None:
    """Every bus event becomes one event:/data: frame with the JSON payload."""
    _, bus, request, _ = _stream()
    assert request.responseHeaders.getRawHeaders(b"content-type") == [
        b"text/event-stream; charset=utf-8"
    ]
    request.written.clear()
    bus.publish(NodeCooldown("ollama", "a", "r\nx", 5))
    assert request.written == [
        b"event: node/cooldown\n"
        b'data: {"engine":"ollama","node_id":"a","reason":"r\\nx","coolingUntil":5}\n\n'
    ]


def test_paused_stream_queues_events_and_resumes_in_order() -> None:
    """While the transport pushes back the events wait; resume delivers them in order."""
    _, bus, request, _ = _stream()
    request.written.clear()
    request.producer.pauseProducing()
    bus.publish(NodeUncordon("ollama", "one"))
    bus.publish(NodeUncordon("ollama", "two"))
    assert request.written == []
    request.producer.resumeProducing()
    assert [w.split(b"\n")[1] for w in request.written] == [
        b'data: {"engine":"ollama","node_id":"one"}',
        b'data: {"engine":"ollama","node_id":"two"}',
    ]


def test_stream_that_falls_behind_is_dropped_and_disconnected() -> None:
    """Past max_pending queued events the subscriber is dropped and the connection aborted."""
    _, bus, request, stream = _stream(max_pending=3)
    request.producer.pauseProducing()
    for i in range(4):
        bus.publish(NodeUncordon("ollama", f"e{i}"))
    assert request.transport.disconnecting or request.transport.disconnected  # type: ignore[attr-defined]
    assert bus.subscriptions == ()
    assert stream.state is StreamState.CLOSED


def test_keepalive_every_interval_and_timer_cancelled_on_disconnect() -> None:
    """A comment line every keep-alive interval; the client leaving cancels timer and subscription."""
    clock, bus, request, _ = _stream(keepalive=15)
    request.written.clear()
    clock.advance(15)
    clock.advance(15)
    assert request.written == [b": keep-alive\n\n", b": keep-alive\n\n"]
    request.processingFailed(Failure(ConnectionError("gone")))
    assert clock.getDelayedCalls() == []
    assert bus.subscriptions == ()


def test_close_finishes_the_stream_and_unsubscribes() -> None:
    """Stopping the admin ends each stream cleanly: finished, no timer, no subscription."""
    clock, bus, request, stream = _stream()
    closed: list[EventStream] = []
    stream._on_closed = closed.append
    stream.close()
    assert request.finished == 1
    assert clock.getDelayedCalls() == [] and bus.subscriptions == ()
    assert closed == [stream]


class _Frames(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.waiting: list[tuple[bytes, Deferred[None]]] = []
        self.lost: Deferred[None] = Deferred()

    def wait_for(self, marker: bytes) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self.waiting.append((marker, d))
        self._check()
        return d

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        self._check()

    def _check(self) -> None:
        for marker, d in list(self.waiting):
            if marker in self.data:
                self.waiting.remove((marker, d))
                d.callback(None)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.callback(None)


@on_reactor
async def test_events_endpoint_streams_bus_events_over_http(reactor: Any) -> None:
    """GET /events over a socket: frames arrive live; stopping the admin ends the stream cleanly."""
    proxy = await start_proxy(reactor, {"ollama": [Node("a", "http://127.0.0.1:1", STATIC)]})
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        response = await Agent(reactor, pool=pool).request(
            b"GET", f"http://127.0.0.1:{port}/events".encode()
        )
        assert response.code == 200
        frames = _Frames()
        response.deliverBody(frames)
        await frames.wait_for(b"retry: 3000\n\n")
        assert len(admin.streams) == 1
        proxy.runtime.shared.bus.publish(NodeCooldownEnded("ollama", "a", "expired"))
        await frames.wait_for(b"event: node/cooldown-ended\n")
        ready = await treq.client.HTTPClient(Agent(reactor, pool=pool)).get(
            f"http://127.0.0.1:{port}/readyz"
        )
        assert ready.code == 200
        await treq.content(ready)
    finally:
        await admin.stopService()
    await frames.lost
    assert admin.streams == set()
    await proxy.stop()
