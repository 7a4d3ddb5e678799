"""Tests for nvpair_tw.ops._control: the JSON-RPC method table, the line protocol, and end-to-end steering.

Protocol details run reactor-free (a runtime on ``task.Clock``, ``StringTransport``); routing
behaviour runs a real control client over a unix socket against an in-process proxy with simulated
engines, and checks where requests actually go.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
import treq
from attrs import define, field
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.endpoints import UNIXClientEndpoint, connectProtocol
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import connectionDone
from twisted.internet.stdio import StandardIO
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import NodeCooldown, NodeCordon, NodeUncordon
from nvpair_tw.logs import current_level, set_level
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._board import StatusBoard
from nvpair_tw.ops._control import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_LINE_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ControlFactory,
    ControlMethods,
    ControlProtocol,
    StdioControlService,
    control_service,
    forwarded,
)
from nvpair_tw.runtime._process import Runtime, build_runtime
from nvpair_tw.runtime._service import ListenerService
from nvpair_tw.selection._admission import Slot, Waiter
from nvpair_tw.selection._speed import Sample
from nvpair_tw.testing import (
    EngineHandle,
    MemoryCluster,
    ProxyHandle,
    SimulatedEngine,
    start_engine,
    start_proxy,
)

LLAMA = ("llama3:latest",)

_Test = TypeVar("_Test", bound=Callable[..., Any])


def ensure_deferred(test: _Test) -> _Test:
    """pytest-twisted's ``ensureDeferred``, typed (the package ships no annotations)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


# --- reactor-free: the method table -------------------------------------------------------------


def _runtime(nodes: Mapping[str, Sequence[Node]] | None = None) -> Runtime:
    clock = Clock()
    clock.advance(1_700_000_000)
    nodes = nodes if nodes is not None else {"ollama": [Node("a", "http://10.0.0.1:11434", LLAMA)]}
    return build_runtime(cast(IProxyReactor, clock), Settings(), list(nodes), nodes=nodes)


def _ask(methods: ControlMethods, method: str, params: Any = None, **extra: Any) -> Any:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method, **extra}
    if params is not None:
        message["params"] = params
    return methods.handle_line(json.dumps(message).encode())


def _error_of(response: Any) -> tuple[int, str]:
    assert response is not None and "error" in response, response
    return response["error"]["code"], response["error"]["message"]


def test_malformed_line_is_a_parse_error_with_null_id() -> None:
    """A line that is not JSON (or not UTF-8) answers -32700 with id null."""
    methods = ControlMethods(_runtime())
    for line in (b"{nope", b"\xff\xfe{", b'{"jsonrpc": "2.0", "id": 1'):
        response = methods.handle_line(line)
        assert isinstance(response, dict) and response["id"] is None
        assert _error_of(response)[0] == PARSE_ERROR


def test_blank_lines_are_ignored() -> None:
    """An empty or whitespace line gets no answer."""
    assert ControlMethods(_runtime()).handle_line(b"  \r") is None


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b"3", "object"),
        (b'"x"', "object"),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "nodes/list"}]', "batch"),
        (b"POST / HTTP/1.1", "not JSON"),
        (b"Host: 127.0.0.1:7070", "not JSON"),
    ],
)
def test_lines_that_are_not_json_objects_answer_32700(line: bytes, needle: str) -> None:
    """Non-objects, batches and HTTP request lines or headers are not JSON-RPC: -32700, id null."""
    response = ControlMethods(_runtime()).handle_line(line)
    code, message = _error_of(response)
    assert code == PARSE_ERROR and needle in message
    assert isinstance(response, dict) and response["id"] is None


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b'{"jsonrpc": "1.0", "id": 1, "method": "nodes/list"}', "jsonrpc"),
        (b'{"id": 1, "method": "nodes/list"}', "jsonrpc"),
        (b'{"jsonrpc": "2.0", "id": true, "method": "nodes/list"}', "id"),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "nodes/list"}', "id"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', "method"),
        (b'{"jsonrpc": "2.0", "id": 1}', "method"),
    ],
)
def test_invalid_requests_answer_32600(line: bytes, needle: str) -> None:
    """A wrong jsonrpc, a bad id or method type answer -32600 naming the problem."""
    code, message = _error_of(ControlMethods(_runtime()).handle_line(line))
    assert code == INVALID_REQUEST
    assert needle in message


def test_invalid_request_keeps_a_valid_id() -> None:
    """A wrong jsonrpc version is answered under the request's own id."""
    response = ControlMethods(_runtime()).handle_line(
        b'{"jsonrpc": "1.0", "id": "q", "method": "x"}'
    )
    assert isinstance(response, dict) and response["id"] == "q"


def test_unknown_method_and_unknown_engine_prefix_answer_32601() -> None:
    """An unknown method is -32601; an engine prefix this proxy does not serve names the engines it does."""
    methods = ControlMethods(_runtime())
    assert _error_of(_ask(methods, "nodes/explode"))[0] == METHOD_NOT_FOUND
    code, message = _error_of(_ask(methods, "lmstudio:nodes/list"))
    assert code == METHOD_NOT_FOUND
    assert "lmstudio" in message and "ollama" in message
    assert _error_of(_ask(methods, "discovery:other"))[0] == METHOD_NOT_FOUND


def test_one_facade_takes_the_prefix_or_not() -> None:
    """With one facade, nodes/list and ollama:nodes/list answer the same."""
    methods = ControlMethods(_runtime())
    assert _ask(methods, "nodes/list")["result"] == _ask(methods, "ollama:nodes/list")["result"]


def test_several_facades_need_the_engine_prefix_for_engine_scoped_methods() -> None:
    """Unprefixed engine-scoped methods are -32602 saying to prefix ENGINE:; process-wide ones work."""
    runtime = _runtime(
        {
            "ollama": [Node("a", "http://10.0.0.1:11434", LLAMA)],
            "lmstudio": [Node("b", "http://10.0.0.1:1234", ("qwen",))],
        }
    )
    methods = ControlMethods(runtime)
    code, message = _error_of(_ask(methods, "nodes/list"))
    assert code == INVALID_PARAMS and "ENGINE:" in message
    assert [n["id"] for n in _ask(methods, "lmstudio:nodes/list")["result"]["nodes"]] == ["b"]
    assert _ask(methods, "lmstudio:node/select", {"id": "b"})["result"] == {"id": "b"}
    assert runtime.facades["lmstudio"].pin == "b" and runtime.facades["ollama"].pin is None
    assert _ask(methods, "workload/cancel", {"id": 99})["result"] == {"accepted": False}


def test_nodes_list_reports_inventory_source_and_cooldown() -> None:
    """nodes/list gives id, url, sorted models, loaded (null: unknown), source, coolingUntil
    (ms epoch or null), slots, the node's busy-wait count, its cordon (null: none), its
    learnt rates per model (docs/behaviour.md §15.1) and its prompt caches' capacity per model
    (§5.3.1)."""
    runtime = _runtime(
        {
            "ollama": [
                Node("b", "http://10.0.0.2:11434", ("zeta", "alpha")),
                Node("a", "http://10.0.0.1:1"),
            ]
        }
    )
    facade = runtime.facades["ollama"]
    facade.stalls.cool("b", "header timeout")
    facade.progress.busy_waited("b")
    facade.progress.busy_waited("b")
    facade.speeds.learn("b", "alpha", Sample(decode_rate=57.7, prefill_rate=900.0, load_seconds=2))
    for root in (b"A", b"B", b"C", b"D"):
        facade.caches.note("b", "alpha", root, 5000)
    oldest = facade.caches.place("b", "alpha", b"A")
    assert oldest is not None
    facade.caches.judge("b", "alpha", oldest, 0, 6000)  # found cold: b keeps 3
    result = _ask(ControlMethods(runtime), "nodes/list")["result"]
    until = 1000 * (1_700_000_000 + runtime.settings.cooldown)
    assert result == {
        "nodes": [
            {
                "id": "a",
                "url": "http://10.0.0.1:1",
                "models": [],
                "loaded": None,
                "source": "flag",
                "kind": "ollama",
                "coolingUntil": None,
                "slots": 0,
                "slotsInUse": 0,
                "busyWaits": 0,
                "cordon": None,
                "rates": {},
                "caches": {},
                "contexts": {},
            },
            {
                "id": "b",
                "url": "http://10.0.0.2:11434",
                "models": ["alpha", "zeta"],
                "loaded": None,
                "source": "flag",
                "kind": "ollama",
                "coolingUntil": int(until),
                "slots": 0,
                "slotsInUse": 0,
                "busyWaits": 2,
                "cordon": None,
                "rates": {
                    "alpha": {
                        "decodeTokensPerSecond": 57.7,
                        "prefillTokensPerSecond": 900.0,
                        "loadSeconds": 2.0,
                        "samples": 1,
                    }
                },
                "caches": {"alpha": {"conversations": 3, "source": "learnt", "recent": 4}},
                "contexts": {},
            },
        ],
        "queueDepth": 0,
    }
    facade.stalls.stop()  # type: ignore[attr-defined]


def test_nodes_list_reports_loaded_models_or_null_when_unknown() -> None:
    """``loaded`` is what the node's last residency poll reported, sorted; [] when it answered with
    nothing loaded; null when unknown (no endpoint, failed poll, static node)."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, models=("llama3:latest", "qwen:7b"), loaded=["qwen:7b", "b:1"]),
        "b": SimulatedEngine(clock, loaded=[]),
        "c": SimulatedEngine(clock),
        "d": SimulatedEngine(clock, loaded=["llama3:latest"]),
    }
    cluster = MemoryCluster(
        clock,
        engines,
        nodes={
            "ollama": [
                *(Node(i, f"http://{i}.node.test:11434") for i in "abc"),
                "d",  # static: not polled
            ]
        },
    )
    try:
        cluster.flush()
        result = _ask(ControlMethods(cluster.runtime), "nodes/list")["result"]
        assert {n["id"]: n["loaded"] for n in result["nodes"]} == {
            "a": ["b:1", "qwen:7b"],
            "b": [],
            "c": None,
            "d": None,
        }
    finally:
        cluster.stop()


def test_nodes_list_and_the_status_data_show_the_context_each_model_is_served_with() -> None:
    """``contexts``: per model the node has loaded, the context it serves it with, as the node
    names the model (docs/behaviour.md §15.3): a llama.cpp router's from ``/props?model=``, an
    LM Studio 0.4 node's loaded instance's, a one-model llama-server's for what it lists; {} when
    the node says none (a static list is never polled)."""
    clock = Clock()
    engines = {
        "r": SimulatedEngine(
            clock, ("a", "b"), loaded=["a"], kind="openai", models_max=1, loaded_context=8192
        ),
        "s": SimulatedEngine(clock, ("smol",), kind="openai", context_length=4096, slots=2),
        "l": SimulatedEngine(
            clock, ("qwen", "phi"), loaded=["qwen"], kind="lmstudio", loaded_context=16384
        ),
        "t": SimulatedEngine(clock, ("fixed",), kind="openai"),
    }
    polled = [Node(i, f"http://{i}.node.test:11434", kind="openai") for i in ("r", "s")]
    cluster = MemoryCluster(
        clock,
        engines,
        facades=["openai", "lmstudio"],
        nodes={
            "openai": [*polled, "t"],
            "lmstudio": [Node("l", "http://l.node.test:11434", kind="lmstudio")],
        },
    )
    try:
        cluster.flush()
        methods = ControlMethods(cluster.runtime)
        listed = {
            n["id"]: n["contexts"]
            for engine in ("openai", "lmstudio")
            for n in _ask(methods, f"{engine}:nodes/list")["result"]["nodes"]
        }
        assert listed == {"r": {"a": 8192}, "s": {"smol": 4096}, "t": {}, "l": {"qwen": 16384}}
        board = StatusBoard(cluster.runtime).state(lambda _engine: True)
        shown = {n["id"]: n["contexts"] for f in board["facades"] for n in f["nodes"]}
        assert shown == listed
    finally:
        cluster.stop()


def test_nodes_list_reports_slots_slots_in_use_and_queue_depth() -> None:
    """nodes/list shows each node's slots (its own, or the default 0 = unlimited), how many this
    facade holds now, and how many requests wait in the facade's queue."""
    one = Node("a", "http://10.0.0.1:11434", LLAMA, slots=1)
    runtime = _runtime({"ollama": [one, Node("b", "http://10.0.0.2:11434", LLAMA)]})
    admission = runtime.facades["ollama"].admission
    held = admission.admit([one])
    waiting = admission.admit([one])
    result = _ask(ControlMethods(runtime), "nodes/list")["result"]
    assert [(n["id"], n["slots"], n["slotsInUse"]) for n in result["nodes"]] == [
        ("a", 1, 1),
        ("b", 0, 0),
    ]
    assert result["queueDepth"] == 1
    assert isinstance(waiting, Waiter)
    waiting.bound.cancel()
    waiting.bound.addErrback(lambda _: None)
    assert isinstance(held, Slot)
    held.release()
    result = _ask(ControlMethods(runtime), "nodes/list")["result"]
    assert result["queueDepth"] == 0 and result["nodes"][0]["slotsInUse"] == 0


@pytest.mark.parametrize(
    ("method", "params", "field_name"),
    [
        ("node/select", {}, "id"),
        ("node/select", {"id": 3}, "id"),
        ("node/add-manual", {"id": "m", "url": 5}, "url"),
        ("node/add-manual", {"id": "m", "url": "http://h:1", "models": "llama3"}, "models"),
        ("node/add-manual", {"url": "http://h:1"}, "id"),
        ("node/remove-manual", {"id": ""}, "id"),
        ("discovery:nodes", {"nodes": {}}, "nodes"),
        ("discovery:nodes", {"nodes": [{"id": "d", "url": "ftp://x"}]}, "nodes[0].url"),
        ("discovery:nodes", {"nodes": [{"id": "d", "url": "http://"}]}, "nodes[0].url"),
        ("node/add-manual", {"id": "m", "url": "javascript:alert(1)"}, "url"),
        ("node/add-manual", {"id": "m", "url": "unix:/run/x.sock"}, "url"),
        ("node/add-manual", {"id": "m", "url": "http:///path-only"}, "url"),
        ("node/add-manual", {"id": "m", "url": "http://a\nb:1"}, "url"),
        ("node/set-priority", {"nodes": []}, "generation"),
        ("node/set-priority", {"generation": 1, "nodes": "a"}, "nodes"),
        ("node/set-priority", {"generation": 1, "nodes": [""]}, "nodes[0]"),
        (
            "node/set-priority",
            {"generation": 1, "nodes": ["a"], "ranks": [{"id": "a"}, {"id": "b", "pending": "2"}]},
            "ranks[1].pending",
        ),
        ("node/model-owners", {"model": ""}, "model"),
        ("workload/cancel", {"id": "3"}, "id"),
        ("log/set-level", {"level": "loud"}, "level"),
        ("nodes/list", [1, 2], "params"),
    ],
)
def test_bad_params_answer_32602_naming_the_field(
    method: str, params: Any, field_name: str
) -> None:
    """Each malformed parameter answers -32602 with a message naming the field."""
    code, message = _error_of(_ask(ControlMethods(_runtime()), method, params))
    assert code == INVALID_PARAMS
    assert field_name in message


def test_a_rejected_url_is_never_echoed() -> None:
    """A bad node URL (it may carry a password) is not repeated in the error message."""
    url = "gopher://user:s3cret@host"
    _, message = _error_of(
        _ask(ControlMethods(_runtime()), "node/add-manual", {"id": "m", "url": url})
    )
    assert "s3cret" not in message and "url" in message


def test_notifications_get_no_answer_even_when_they_fail() -> None:
    """A request without an id runs (or fails) silently, as JSON-RPC notifications do."""
    runtime = _runtime()
    methods = ControlMethods(runtime)
    line = json.dumps({"jsonrpc": "2.0", "method": "node/select", "params": {"id": "a"}})
    assert methods.handle_line(line.encode()) is None
    assert runtime.facades["ollama"].pin == "a"
    bad = json.dumps({"jsonrpc": "2.0", "method": "node/select", "params": {"id": "zz"}})
    assert methods.handle_line(bad.encode()) is None
    assert runtime.facades["ollama"].pin == "a"


def test_select_empty_id_returns_to_automatic() -> None:
    """node/select "" clears the pin; node/selected is the same method."""
    runtime = _runtime()
    methods = ControlMethods(runtime)
    assert _ask(methods, "node/selected", {"id": "a"})["result"] == {"id": "a"}
    assert _ask(methods, "node/select", {"id": ""})["result"] == {"id": ""}
    assert runtime.facades["ollama"].pin is None


def test_set_priority_counts_ranks_applied_and_zero_when_stale() -> None:
    """count is the number of distinct ranked nodes applied, 0 for a generation not newer; values clamp."""
    runtime = _runtime()
    methods = ControlMethods(runtime)
    ranks = [
        {"id": "a", "pending": -4, "gpuPressure": 9},
        {"id": "b", "pending": 2, "gpuPressure": 1},
    ]
    params = {"generation": 5, "nodes": ["b", "a"], "ranks": ranks}
    assert _ask(methods, "node/set-priority", params)["result"] == {"count": 2}
    ledger = runtime.shared.ledger
    assert (ledger.pending("a"), ledger.gpu_pressure("a")) == (0, 3)
    stale = {
        "generation": 5,
        "nodes": ["a"],
        "ranks": [{"id": "a", "pending": 1, "gpuPressure": 0}],
    }
    assert _ask(methods, "node/set-priority", stale)["result"] == {"count": 0}
    assert ledger.snapshot.nodes == ("b", "a")


def test_set_level_changes_the_process_level() -> None:
    """log/set-level applies at once and answers the level in force."""
    before = current_level()
    try:
        response = _ask(ControlMethods(_runtime()), "log/set-level", {"level": "WARNING"})
        assert response["result"] == {"level": "warn"}
        assert current_level() is LogLevel.warn
    finally:
        set_level(before)


def test_only_workload_request_and_node_events_are_forwarded() -> None:
    """workload:*, proxy/request and node/* go to control clients; other names do not."""
    assert all(map(forwarded, ["workload:started", "proxy/request", "node/cooldown", "node/x"]))
    assert not any(map(forwarded, ["proxy/other", "admin/x", "workloads"]))


# --- reactor-free: one connection over StringTransport ------------------------------------------


def _connected(
    runtime: Runtime | None = None, max_pending: int | None = None
) -> tuple[ControlFactory, ControlProtocol, StringTransport]:
    factory = ControlFactory(
        runtime if runtime is not None else _runtime(), max_pending=max_pending
    )
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 4000))
    transport = StringTransport()
    protocol.makeConnection(transport)
    return factory, protocol, transport


def _lines(transport: StringTransport) -> list[dict[str, Any]]:
    out = [json.loads(line) for line in transport.value().splitlines()]
    transport.clear()
    return out


@pytest.mark.parametrize("first", [b"garbage", b"POST / HTTP/1.1", b"[]", b"Host: x"])
def test_a_line_that_is_not_json_rpc_closes_the_connection_before_the_next_line(
    first: bytes,
) -> None:
    """-32700, then the connection closes: a request after it in the same read is not acted on."""
    factory, protocol, transport = _connected()
    add = {"jsonrpc": "2.0", "id": 2, "method": "node/add-manual"}
    add["params"] = {"id": "evil", "url": "http://10.6.6.6:11434"}
    protocol.dataReceived(first + b"\r\n" + json.dumps(add).encode() + b"\n")
    [response] = _lines(transport)
    assert response["error"]["code"] == PARSE_ERROR and response["id"] is None
    assert transport.disconnecting
    assert factory.runtime.facades["ollama"].directory.get("evil") is None


def test_an_invalid_request_is_answered_and_the_connection_goes_on() -> None:
    """A JSON object that is not a valid request is -32600; the next line is served."""
    _, protocol, transport = _connected()
    protocol.dataReceived(
        b'{"id":1,"method":"x"}\n{"jsonrpc":"2.0","id":2,"method":"nodes/list"}\n'
    )
    first, second = _lines(transport)
    assert first["error"]["code"] == INVALID_REQUEST
    assert second["id"] == 2 and second["result"]["nodes"][0]["id"] == "a"
    assert not transport.disconnecting


def test_over_long_line_is_refused_and_the_connection_closed() -> None:
    """A line over the cap answers -32600 and closes the connection; later data is ignored."""
    _, protocol, transport = _connected()
    protocol.dataReceived(b"x" * (MAX_LINE_BYTES + 1))
    [response] = _lines(transport)
    assert response["error"]["code"] == INVALID_REQUEST and "longer" in response["error"]["message"]
    assert transport.disconnecting
    protocol.dataReceived(b'\n{"jsonrpc":"2.0","id":2,"method":"nodes/list"}\n')
    assert transport.value() == b""


def test_events_are_sent_as_notifications() -> None:
    """A forwarded bus event arrives as a JSON-RPC notification, its wire object the params."""
    factory, _, transport = _connected()
    bus = factory.runtime.shared.bus
    bus.publish(NodeCooldown("ollama", "a", "stall", 5))
    params = {"engine": "ollama", "node_id": "a", "reason": "stall", "coolingUntil": 5}
    assert _lines(transport) == [{"jsonrpc": "2.0", "method": "node/cooldown", "params": params}]


def test_paused_transport_queues_events_and_stops_reading() -> None:
    """While the transport is full events queue and requests are not read; resume delivers in order."""
    factory, protocol, transport = _connected(max_pending=5)
    assert transport.producer is protocol and transport.streaming
    protocol.pauseProducing()
    assert transport.producerState == "paused"
    bus = factory.runtime.shared.bus
    for n in range(3):
        bus.publish(NodeUncordon("ollama", str(n)))
    assert transport.value() == b""
    protocol.resumeProducing()
    assert transport.producerState == "producing"
    assert [m["params"]["node_id"] for m in _lines(transport)] == ["0", "1", "2"]


def test_client_that_never_drains_is_dropped_past_the_bound() -> None:
    """Past the bound the subscription is dropped, the connection aborted and unsubscribed."""
    factory, protocol, transport = _connected(max_pending=3)
    bus = factory.runtime.shared.bus
    subscribers = len(bus.subscriptions)
    protocol.pauseProducing()
    for n in range(5):
        bus.publish(NodeUncordon("ollama", str(n)))
    assert transport.disconnected
    assert len(bus.subscriptions) == subscribers - 1
    protocol.connectionLost(Failure(connectionDone))
    assert protocol not in factory.connections


def test_disconnect_unsubscribes() -> None:
    """connectionLost closes the connection's bus subscription."""
    factory, protocol, _ = _connected()
    bus = factory.runtime.shared.bus
    subscribers = len(bus.subscriptions)
    protocol.connectionLost(Failure(connectionDone))
    assert len(bus.subscriptions) == subscribers - 1
    assert factory.connections == set()


def test_control_service_picks_listener_or_stdio_and_rejects_bad_descriptions() -> None:
    """An endpoint string gives a listener, "stdio" a stdio session, a bad string a clear ValueError."""
    runtime = _runtime()
    clock = runtime.reactor
    assert isinstance(control_service(clock, runtime, "unix:/tmp/x.sock"), ListenerService)
    assert isinstance(control_service(clock, runtime, "stdio"), StdioControlService)
    with pytest.raises(ValueError, match="--control"):
        control_service(clock, runtime, "carrier-pigeon:coop=3")


# --- over real sockets --------------------------------------------------------------------------


class Client(LineOnlyReceiver):
    """A test control client: sends requests, collects every line, waits for matching messages."""

    delimiter = b"\n"
    MAX_LENGTH = 1 << 24

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self.messages: list[dict[str, Any]] = []
        self._waiters: list[tuple[Callable[[dict[str, Any]], bool], Deferred[dict[str, Any]]]] = []
        self._ids = 0
        self.lost: Deferred[None] = Deferred()

    def lineReceived(self, line: bytes) -> None:
        message = json.loads(line)
        self.messages.append(message)
        for waiter in list(self._waiters):
            predicate, waiting = waiter
            if predicate(message):
                self._waiters.remove(waiter)
                if not waiting.called:
                    waiting.callback(message)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.callback(None)

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> Deferred[dict[str, Any]]:
        """The first message (seen or future) matching ``predicate``; fails after 10 s."""
        for message in self.messages:
            if predicate(message):
                return succeed(message)
        waiting: Deferred[dict[str, Any]] = Deferred()
        self._waiters.append((predicate, waiting))
        return waiting.addTimeout(10, self._reactor)

    def event(self, name: str, where: Callable[[Any], bool] = lambda _: True) -> Deferred[Any]:
        """The params of the first notification ``name`` matching ``where``."""
        return self.wait_for(lambda m: m.get("method") == name and where(m["params"])).addCallback(
            lambda m: m["params"]
        )

    def send(self, message: Mapping[str, Any]) -> None:
        self.sendLine(json.dumps(message).encode())

    async def call(self, method: str, params: Any = None) -> dict[str, Any]:
        """Send a request and return the whole response (``result`` or ``error``)."""
        self._ids += 1
        request_id = self._ids
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
        return await self.wait_for(lambda m: m.get("id") == request_id and "method" not in m)

    async def result(self, method: str, params: Any = None) -> Any:
        response = await self.call(method, params)
        assert "result" in response, response
        return response["result"]


@define
class Harness:
    """Simulated engines, a proxy, a control listener on a unix socket and its clients."""

    reactor: Any
    engines: list[EngineHandle]
    proxy: ProxyHandle
    factory: ControlFactory
    port: IListeningPort
    directory: str
    clients: list[Client] = field(factory=list)
    http: treq.client.HTTPClient = field(default=None)

    @property
    def runtime(self) -> Runtime:
        return self.proxy.runtime

    async def client(self) -> Client:
        endpoint = UNIXClientEndpoint(self.reactor, os.path.join(self.directory, "ctl.sock"))
        client = cast(Client, await connectProtocol(endpoint, Client(self.reactor)))
        self.clients.append(client)
        return client

    async def generate(self, model: str = "llama3", stream: bool = False) -> tuple[int, str | None]:
        """POST /api/generate (short prompt: no affinity); (status, serving node)."""
        body = json.dumps({"model": model, "prompt": "hi", "stream": stream}).encode()
        response = await self.http.post(self.proxy.url() + "/api/generate", data=body)
        await treq.content(response)
        node = response.headers.getRawHeaders(b"x-nvpair-node", [b""])[0].decode() or None
        return response.code, node

    async def stop(self) -> None:
        for client in self.clients:
            if client.transport is not None and not client.lost.called:
                client.transport.resumeProducing()  # type: ignore[attr-defined]
                client.transport.loseConnection()
            await client.lost
        await maybeDeferred(self.port.stopListening)
        await self.proxy.stop()
        for engine in self.engines:
            await engine.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


async def _harness(
    reactor: Any,
    nodes: Callable[[list[str]], list[Node]],
    engines: Sequence[SimulatedEngine],
    *,
    max_pending: int | None = None,
) -> Harness:
    handles = [await start_engine(reactor, engine) for engine in engines]
    proxy = await start_proxy(reactor, {"ollama": nodes([h.url for h in handles])}, Settings())
    factory = ControlFactory(proxy.runtime, max_pending=max_pending)
    directory = tempfile.mkdtemp(prefix="nvctl")
    port = reactor.listenUNIX(os.path.join(directory, "ctl.sock"), factory)
    http = treq.client.HTTPClient(
        Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
    )
    return Harness(reactor, handles, proxy, factory, port, directory, http=http)


def _two_owners_and_other(urls: list[str]) -> list[Node]:
    return [
        Node("a", urls[0], LLAMA),
        Node("b", urls[1], ("llama3",)),
        Node("c", urls[2], ("phi3",)),
    ]


@pytest.fixture
def three_engines(reactor: Any) -> Iterator[list[SimulatedEngine]]:
    yield [SimulatedEngine(reactor, models=()) for _ in range(3)]


@ensure_deferred
async def test_select_pins_ignores_ineligible_pin_and_rejects_unknown_id(
    reactor: Any, three_engines: list[SimulatedEngine]
) -> None:
    """A pin sends requests to the pinned node; an ineligible pin is ignored; an unknown id is -32602."""
    h = await _harness(reactor, _two_owners_and_other, three_engines)
    try:
        ctl = await h.client()
        assert await h.generate() == (200, "a")
        assert await ctl.result("node/select", {"id": "b"}) == {"id": "b"}
        assert await h.generate() == (200, "b")
        assert await ctl.result("node/select", {"id": "c"}) == {"id": "c"}
        status, node = await h.generate()
        assert status == 200 and node in ("a", "b")
        assert await h.generate("phi3") == (200, "c")
        response = await ctl.call("node/select", {"id": "nowhere"})
        assert response["error"] == {"code": INVALID_PARAMS, "message": 'node "nowhere" not found'}
        await ctl.result("node/select", {"id": ""})
        assert await h.generate() == (200, "a")
    finally:
        await h.stop()


@ensure_deferred
async def test_set_priority_reorders_and_stale_generation_is_ignored(
    reactor: Any, three_engines: list[SimulatedEngine]
) -> None:
    """A snapshot listing b first sends requests to b; an older generation changes nothing."""
    h = await _harness(reactor, _two_owners_and_other, three_engines)
    try:
        ctl = await h.client()
        assert await h.generate() == (200, "a")
        ranks = [
            {"id": "b", "pending": 0, "gpuPressure": 0},
            {"id": "a", "pending": 0, "gpuPressure": 0},
        ]
        snapshot = {"generation": 2, "nodes": ["b", "a"], "ranks": ranks}
        assert await ctl.result("node/set-priority", snapshot) == {"count": 2}
        assert await h.generate() == (200, "b")
        stale = {"generation": 1, "nodes": ["a", "b"], "ranks": list(reversed(ranks))}
        assert await ctl.result("node/set-priority", stale) == {"count": 0}
        assert await h.generate() == (200, "b")
        busy_b = {
            "generation": 3,
            "nodes": ["b", "a"],
            "ranks": [{"id": "b", "pending": 5, "gpuPressure": 3}],
        }
        assert await ctl.result("node/set-priority", busy_b) == {"count": 1}
        assert await h.generate() == (200, "a")
    finally:
        await h.stop()


@ensure_deferred
async def test_manual_and_discovered_nodes_change_routing_without_restart(
    reactor: Any, three_engines: list[SimulatedEngine]
) -> None:
    """node/add-manual, node/remove-manual and a discovery:nodes notification change where models go."""
    h = await _harness(reactor, lambda urls: [Node("a", urls[0], LLAMA)], three_engines)
    try:
        ctl = await h.client()
        assert (await h.generate("mistral"))[0] == 404
        manual = {"id": "m", "url": h.engines[1].url, "models": ["mistral"]}
        assert await ctl.result("node/add-manual", manual) == {"added": True}
        assert await ctl.result("node/add-manual", manual) == {"added": False}
        assert await h.generate("mistral") == (200, "m")
        assert h.engines[1].engine.inference_count == 1
        assert await ctl.result("node/remove-manual", {"id": "m"}) == {"removed": True}
        assert await ctl.result("node/remove-manual", {"id": "m"}) == {"removed": False}
        assert (await h.generate("mistral"))[0] == 404

        discovered = [{"id": "d", "url": h.engines[2].url, "models": ["phi3"]}]
        ctl.send({"jsonrpc": "2.0", "method": "discovery:nodes", "params": {"nodes": discovered}})
        listed = (await ctl.result("nodes/list"))["nodes"]
        assert [(n["id"], n["source"], n["models"]) for n in listed] == [
            ("a", "flag", ["llama3:latest"]),
            ("d", "discovery", ["phi3"]),
        ]
        assert await h.generate("phi3") == (200, "d")
        ctl.send({"jsonrpc": "2.0", "method": "discovery:nodes", "params": {"nodes": []}})
        assert [n["id"] for n in (await ctl.result("nodes/list"))["nodes"]] == ["a"]
        assert (await h.generate("phi3"))[0] == 404
        assert not any("result" in m and m.get("id") is None for m in ctl.messages)
    finally:
        await h.stop()


@ensure_deferred
async def test_model_owners_agree_with_where_requests_go(
    reactor: Any, three_engines: list[SimulatedEngine]
) -> None:
    """The owners of a model are exactly the nodes its requests reach, with the engine's matching."""
    h = await _harness(reactor, _two_owners_and_other, three_engines)
    try:
        ctl = await h.client()
        assert await ctl.result("node/model-owners", {"model": "llama3"}) == {"nodes": ["a", "b"]}
        assert await ctl.result("node/model-owners", {"model": "phi3:latest"}) == {"nodes": ["c"]}
        assert await ctl.result("node/model-owners", {"model": "mistral"}) == {"nodes": []}
        served = set()
        for first in ("a", "b"):
            await ctl.result("node/select", {"id": first})
            served.add((await h.generate("llama3"))[1])
        await ctl.result("node/select", {"id": ""})
        for generation, order in enumerate((["b", "a", "c"], ["c", "a", "b"]), start=1):
            await ctl.result(
                "node/set-priority", {"generation": generation, "nodes": order, "ranks": []}
            )
            served.add((await h.generate("llama3"))[1])
        assert served == {"a", "b"}
        assert await h.generate("phi3:latest") == (200, "c")
        assert (await h.generate("mistral"))[0] == 404
    finally:
        await h.stop()


@ensure_deferred
async def test_workload_cancel_aborts_a_live_stream(reactor: Any) -> None:
    """workload/cancel stops a running stream; its terminal event says cancelled by request."""
    slow = SimulatedEngine(reactor, models=(), chunks=200, chunk_delay=0.05)
    h = await _harness(reactor, lambda urls: [Node("a", urls[0], LLAMA)], [slow])
    try:
        ctl = await h.client()
        body = json.dumps({"model": "llama3", "prompt": "hi"}).encode()
        response = await h.http.post(h.proxy.url() + "/api/generate", data=body)
        assert response.code == 200
        started = await ctl.event("workload:started")
        workload_id = started["workload"]["id"]
        assert await ctl.result("workload/cancel", {"id": workload_id}) == {"accepted": True}
        ended = await ctl.event("workload:errored", lambda p: p["workload"]["id"] == workload_id)
        assert ended["workload"]["state"] == "cancelled"
        assert ended["workload"]["error"] == "cancelled by request"
        with pytest.raises(ResponseFailed):
            await treq.content(response)
        assert await ctl.result("workload/cancel", {"id": workload_id}) == {"accepted": False}
        assert not any(m.get("method") == "workload:completed" for m in ctl.messages)
    finally:
        await h.stop()


@ensure_deferred
async def test_notifications_arrive_for_a_request(reactor: Any) -> None:
    """A control client sees workload:started, workload:completed and proxy/request for a request."""
    h = await _harness(
        reactor, lambda urls: [Node("a", urls[0], LLAMA)], [SimulatedEngine(reactor)]
    )
    try:
        ctl = await h.client()
        assert await h.generate() == (200, "a")
        started = await ctl.event("workload:started")
        completed = await ctl.event("workload:completed")
        record = await ctl.event("proxy/request")
        assert (
            started["workload"]["scheduledOn"] == "a" and started["workload"]["model"] == "llama3"
        )
        assert completed["workload"]["id"] == started["workload"]["id"]
        assert (record["path"], record["status"], record["node_id"]) == ("/api/generate", 200, "a")
        assert "hi" not in json.dumps(ctl.messages)
    finally:
        await h.stop()


@ensure_deferred
async def test_malformed_line_over_the_unix_socket_closes_the_connection(reactor: Any) -> None:
    """Over a unix socket too, garbage is answered -32700 and the connection is closed."""
    h = await _harness(
        reactor, lambda urls: [Node("a", urls[0], LLAMA)], [SimulatedEngine(reactor)]
    )
    try:
        ctl = await h.client()
        ctl.sendLine(b"{this is not json")
        parse = await ctl.wait_for(lambda m: "error" in m)
        assert parse["error"]["code"] == PARSE_ERROR and parse["id"] is None
        await ctl.lost
    finally:
        await h.stop()


@ensure_deferred
async def test_client_that_never_reads_is_dropped_without_affecting_requests(reactor: Any) -> None:
    """A non-reading client is dropped once its bounded queue overflows; readers and requests go on."""
    h = await _harness(
        reactor,
        lambda urls: [Node("a", urls[0], LLAMA)],
        [SimulatedEngine(reactor)],
        max_pending=50,
    )
    try:
        stuck = await h.client()
        stuck.transport.pauseProducing()  # type: ignore[union-attr]
        reader = await h.client()
        await reader.result("nodes/list")
        bus = h.runtime.shared.bus
        before = len(bus.subscriptions)
        blob = "x" * 16384
        published = 0
        for _ in range(1000):
            if len(bus.subscriptions) < before:
                break
            for _ in range(3):
                published += 1
                bus.publish(NodeCordon("ollama", str(published), blob, None, "control"))
            await deferLater(reactor, 0, lambda: None)
        assert len(bus.subscriptions) == before - 1
        assert len(h.factory.connections) <= 2
        assert await h.generate() == (200, "a")
        await reader.event("proxy/request")
        seen = [m["params"]["node_id"] for m in reader.messages if m.get("method") == "node/cordon"]
        assert seen == [str(n) for n in range(1, published + 1)]
        stuck.transport.resumeProducing()  # type: ignore[union-attr]
        await stuck.lost
        assert len(h.factory.connections) == 1
    finally:
        await h.stop()


@ensure_deferred
async def test_stdio_session_serves_requests(reactor: Any) -> None:
    """--control stdio serves JSON-RPC on the given input and output descriptors."""
    runtime = _runtime()
    to_proxy = os.pipe()
    from_proxy = os.pipe()
    session = StdioControlService(
        reactor, ControlFactory(runtime), stdin=to_proxy[0], stdout=from_proxy[1]
    )
    session.startService()
    client = Client(reactor)
    cast(Any, StandardIO)(client, stdin=from_proxy[0], stdout=to_proxy[1], reactor=reactor)
    try:
        assert [n["id"] for n in (await client.result("nodes/list"))["nodes"]] == ["a"]
    finally:
        await session.stopService()
        for fd in (from_proxy[1], to_proxy[0]):  # StandardIO never closes its descriptors
            os.close(fd)
        await client.lost
        for fd in (from_proxy[0], to_proxy[1]):
            os.close(fd)
