"""Tests for nvpair_tw.ops._maintenance: cordon, uncordon and drain (docs/behaviour.md §13.1),
through the control channel's own dispatch, over real facades and simulated engines in memory on
one ``task.Clock``."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair_tw.core import Settings
from nvpair_tw.nodes import Node
from nvpair_tw.ops._control import ControlFactory, ControlMethods
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster
from tests.helpers import eventually

CHAT = {"model": "llama3", "messages": [], "stream": True}


def _ask(cluster: MemoryCluster, method: str, params: dict[str, Any] | None = None) -> Any:
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
    return ControlMethods(cluster.runtime).handle_line(line.encode())


def _result(answer: Any) -> Any:
    assert answer is not None and "result" in answer, answer
    return answer["result"]


def _error(answer: Any) -> tuple[int, str]:
    assert answer is not None and "error" in answer, answer
    return answer["error"]["code"], answer["error"]["message"]


def _two(memory_cluster: Callable[..., MemoryCluster], **engine: Any) -> MemoryCluster:
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, **engine), "b": SimulatedEngine(clock, **engine)}
    cluster = memory_cluster(clock, engines, settings=Settings(response_header_timeout=5.0))
    cluster.facade().pin = "a"  # a first whenever it serves
    cluster.flush()
    return cluster


def _served_by(cluster: MemoryCluster, **kw: Any) -> tuple[int, str | None]:
    """The status and serving node of one streamed chat, at its headers."""
    pending = cluster.request("POST", "/api/chat", json=CHAT, **kw)
    cluster.flush()
    answer = cluster.result(pending)
    return answer.status, answer.header("x-nvpair-node")


def _received(cluster: MemoryCluster) -> int:
    return sum(len(cast(SimulatedEngine, e).received) for e in cluster.engines.values())


def test_a_cordoned_node_takes_no_new_work_and_uncordon_brings_it_back(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """Cordoned, the pinned node is skipped (not even last in line); uncordoned, it serves again;
    both changes are events on the bus."""
    cluster = _two(memory_cluster)
    assert _served_by(cluster) == (200, "a")
    cordon = _result(_ask(cluster, "node/cordon", {"id": "a", "reason": "kernel upgrade"}))
    assert cordon["cordon"]["reason"] == "kernel upgrade"
    assert cordon["cordon"]["origin"] == "control"
    assert _served_by(cluster) == (200, "b")
    assert _result(_ask(cluster, "node/uncordon", {"id": "a"})) == {"id": "a", "uncordoned": True}
    assert _served_by(cluster) == (200, "a")
    [cordoned] = cluster.named("node/cordon")
    assert (cordoned["node_id"], cordoned["reason"]) == ("a", "kernel upgrade")
    [uncordoned] = cluster.named("node/uncordon")
    assert uncordoned["node_id"] == "a"


def test_a_cordoned_node_is_not_a_last_resort(memory_cluster: Callable[..., MemoryCluster]) -> None:
    """Every owner cordoned: 503 ``model-unavailable`` with ``Retry-After`` without contacting a
    node, unlike a cooling node that would still be tried."""
    cluster = _two(memory_cluster)
    _ask(cluster, "node/cordon", {"id": "a"})
    _ask(cluster, "node/cordon", {"id": "b"})
    seen = _received(cluster)
    answer = cluster.fetch("POST", "/api/chat", json=CHAT)
    assert answer.status == 503
    assert json.loads(answer.body)["code"] == "model-unavailable"
    assert answer.header("retry-after") == "1"
    assert _received(cluster) == seen


def test_the_node_header_still_reaches_a_cordoned_node(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """``X-NVPair-Node`` is how maintenance talks to the node: a cordon does not stop it."""
    cluster = _two(memory_cluster)
    _ask(cluster, "node/cordon", {"id": "b"})
    assert _served_by(cluster, headers={"X-NVPair-Node": "b"}) == (200, "b")


def test_cordoned_nodes_leave_model_lists(memory_cluster: Callable[..., MemoryCluster]) -> None:
    """A model only a cordoned node has is not listed: nothing could serve it."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        {
            "a": SimulatedEngine(clock, models=("llama3:latest",)),
            "b": SimulatedEngine(clock, models=("qwen:7b",)),
        },
    )
    cluster.flush()
    _ask(cluster, "node/cordon", {"id": "b"})
    names = [m["name"] for m in json.loads(cluster.fetch("GET", "/api/tags").body)["models"]]
    assert names == ["llama3:latest"]


def test_nodes_list_and_metrics_show_a_cordon(memory_cluster: Callable[..., MemoryCluster]) -> None:
    """``nodes/list`` carries the cordon (reason, since in ms, origin); ``/metrics`` says 1."""
    cluster = _two(memory_cluster)
    cluster.advance(12.5)
    _ask(cluster, "node/cordon", {"id": "a", "reason": "disk swap"})
    nodes = {n["id"]: n for n in _result(_ask(cluster, "nodes/list"))["nodes"]}
    assert nodes["a"]["cordon"] == {"reason": "disk swap", "since": 12500, "origin": "control"}
    assert nodes["b"]["cordon"] is None
    text = ProxyMetrics(cluster.runtime).exposition().decode()
    assert 'nvpair_node_cordoned{engine="ollama",node="a"} 1.0' in text
    assert 'nvpair_node_cordoned{engine="ollama",node="b"} 0.0' in text


def test_an_unknown_node_is_invalid_params(memory_cluster: Callable[..., MemoryCluster]) -> None:
    """Cordon, uncordon and drain name a node of the facade, or answer -32602."""
    cluster = _two(memory_cluster)
    for method in ("node/cordon", "node/uncordon", "node/drain"):
        code, message = _error(_ask(cluster, method, {"id": "zz"}))
        assert code == -32602 and '"zz" not found' in message


def test_drain_answers_at_once_when_nothing_is_in_flight(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """An idle node drains at once: ``drained: true, waited_ms: 0``; the node is cordoned."""
    cluster = _two(memory_cluster)
    pending = _ask(cluster, "node/drain", {"id": "a"})
    assert isinstance(pending, Deferred) and pending.called
    assert _result(pending.result) == {"id": "a", "drained": True, "waited_ms": 0}
    assert _served_by(cluster) == (200, "b")


def test_drain_waits_for_the_stream_in_flight_then_answers(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """A stream running on the node (a chunk a second): the drain answers when it has ended, with
    the time it waited; meanwhile new requests go elsewhere and the stream is whole."""
    cluster = _two(memory_cluster, chunks=4, chunk_delay=1.0)
    streaming = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(0.5)
    pending = _ask(cluster, "node/drain", {"id": "a", "timeout": "1m"})
    assert isinstance(pending, Deferred) and not pending.called
    assert _served_by(cluster)[1] == "b"
    cluster.advance(5)
    answer = cluster.result(streaming)
    assert answer.header("x-nvpair-node") == "a" and answer.ended is not None
    assert b'"done":true' in answer.body.replace(b" ", b"")
    assert pending.called
    drained = _result(pending.result)
    last_byte = answer.arrivals[-1] - 0.5  # from the drain's start
    assert drained["drained"] is True
    assert last_byte * 1000 <= drained["waited_ms"] <= 5000  # before the 5 s the test waited


def test_drain_times_out_with_what_is_still_in_flight(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """A stream longer than the drain's timeout: ``drained: false`` with the count in flight, at
    the timeout and not before; the node stays cordoned and the stream goes on."""
    cluster = _two(memory_cluster, chunks=20, chunk_delay=1.0)
    streaming = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(0.5)
    pending = _ask(cluster, "node/drain", {"id": "a", "timeout": 3})
    cluster.advance(2.9)
    assert not pending.called
    cluster.advance(0.2)
    assert _result(pending.result) == {"id": "a", "drained": False, "inFlight": 1}
    cluster.advance(20)
    assert cluster.result(streaming).ended is not None
    assert _served_by(cluster)[1] == "b"


def test_a_drain_looks_again_on_events_and_keeps_no_timer_but_its_timeout(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """While a stream is in flight the drain adds one timer, at its timeout (no polling), and one
    bus subscription; it answers at the event that ends the stream and takes both away."""
    cluster = _two(memory_cluster, chunks=4, chunk_delay=1.0)
    streaming = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(0.5)
    bus = cluster.runtime.shared.bus
    before, start = set(cluster.clock.getDelayedCalls()), cluster.clock.seconds()
    pending = _ask(cluster, "node/drain", {"id": "a", "timeout": 77})
    added = set(cluster.clock.getDelayedCalls()) - before
    assert [call.getTime() - start for call in added] == [77]
    assert [s.name for s in bus.subscriptions].count("drain a") == 1
    cluster.advance(5)
    assert cluster.result(streaming).ended is not None
    assert _result(pending.result)["drained"] is True
    assert "drain a" not in [s.name for s in bus.subscriptions]
    assert not any(call.active() for call in added)


@pytest_twisted.ensureDeferred
async def test_a_drain_stops_waiting_when_its_control_client_leaves(
    memory_cluster: Callable[..., MemoryCluster], listen: Callable[[Any], int], reactor: Any
) -> None:
    """``node/drain`` over a real control socket, the facade on a ``task.Clock``: the client hangs
    up while the node is busy, and the drain's subscription and timeout go with it."""
    cluster = _two(memory_cluster, chunks=20, chunk_delay=1.0)
    streaming = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(0.5)
    bus = cluster.runtime.shared.bus
    factory = ControlFactory(cluster.runtime)
    client = socket.create_connection(("127.0.0.1", listen(factory)))
    line = {"jsonrpc": "2.0", "id": 1, "method": "node/drain", "params": {"id": "a", "timeout": 77}}
    client.sendall(json.dumps(line).encode() + b"\n")
    draining = lambda: "drain a" in [s.name for s in bus.subscriptions]  # noqa: E731
    await eventually(reactor, draining, what="the drain waiting")
    [timer] = [
        c for c in cluster.clock.getDelayedCalls() if c.getTime() == cluster.clock.seconds() + 77
    ]
    [protocol] = factory.connections
    client.close()
    await protocol.disconnected
    assert not draining() and not timer.active()
    cluster.advance(30)
    assert cluster.result(streaming).ended is not None


def test_drain_refuses_a_bad_timeout(memory_cluster: Callable[..., MemoryCluster]) -> None:
    """A timeout is seconds >= 0 or a duration string; anything else is -32602."""
    cluster = _two(memory_cluster)
    for bad in (-1, "soon", True):
        code, _ = _error(_ask(cluster, "node/drain", {"id": "a", "timeout": bad}))
        assert code == -32602


def test_a_nodes_file_cordon_shows_and_cannot_be_lifted_by_the_control_channel(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """``cordon = true`` in the nodes file cordons the node (origin ``file``); ``node/uncordon``
    says to lift it there."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        {"a": SimulatedEngine(clock), "b": SimulatedEngine(clock)},
        nodes={
            "ollama": [
                Node("a", "http://a.node.test:11434", cordon=True),
                Node("b", "http://b.node.test:11434"),
            ]
        },
    )
    cluster.flush()
    nodes = {n["id"]: n for n in _result(_ask(cluster, "nodes/list"))["nodes"]}
    assert nodes["a"]["cordon"]["origin"] == "file"
    code, message = _error(_ask(cluster, "node/uncordon", {"id": "a"}))
    assert code == -32602 and "nodes file" in message
    assert _served_by(cluster) == (200, "b")


# --- model/load and model/unload (docs/behaviour.md §13.3) ----------------------------------------


def _polled(ids: str, port: int = 11434) -> list[Node]:
    """Nodes whose inventory and residency are polled (not static)."""
    return [Node(i, f"http://{i}.node.test:{port}") for i in ids]


def _loaded(cluster: MemoryCluster) -> dict[str, list[str]]:
    """Each node's residency in nodes/list, after the reads the last call started."""
    cluster.flush()
    nodes = _result(_ask(cluster, "nodes/list"))["nodes"]
    return {n["id"]: n["loaded"] for n in nodes}


def _answered(cluster: MemoryCluster, pending: Any) -> Any:
    assert isinstance(pending, Deferred)
    cluster.flush()
    assert pending.called
    return _result(pending.result)


def test_load_then_unload_on_every_owner_through_ollamas_generate(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """Without ``nodes``, every serving owner: Ollama gets ``/api/generate`` with no prompt (the
    ``keep_alive`` as given), then ``keep_alive: 0``; the residency is read again at once."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, loaded=[]), "b": SimulatedEngine(clock, loaded=[])}
    cluster = memory_cluster(clock, engines, nodes={"ollama": _polled("ab")})
    cluster.flush()
    loaded = _answered(
        cluster, _ask(cluster, "model/load", {"model": "llama3:latest", "keep_alive": "30m"})
    )
    assert loaded == {
        "model": "llama3:latest",
        "nodes": {"a": {"status": "loaded"}, "b": {"status": "loaded"}},
    }
    sent = [json.loads(r.body) for r in engines["a"].received if r.path == b"/api/generate"]
    assert sent == [{"model": "llama3:latest", "keep_alive": "30m"}]
    assert _loaded(cluster) == {"a": ["llama3:latest"], "b": ["llama3:latest"]}
    unloaded = _answered(cluster, _ask(cluster, "model/unload", {"model": "llama3:latest"}))
    assert unloaded["nodes"] == {"a": {"status": "unloaded"}, "b": {"status": "unloaded"}}
    assert _loaded(cluster) == {"a": [], "b": []}


def test_load_on_named_nodes_answers_each_nodes_own_error(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """``nodes`` names where (a cordoned node too); a node that lacks the model answers with its
    own error text and status, the others load."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, loaded=[]),
        "b": SimulatedEngine(clock, models=("qwen:7b",), loaded=[]),
    }
    cluster = memory_cluster(clock, engines, nodes={"ollama": _polled("ab")})
    cluster.flush()
    _ask(cluster, "node/cordon", {"id": "a"})
    answer = _answered(
        cluster, _ask(cluster, "model/load", {"model": "llama3:latest", "nodes": ["a", "b"]})
    )
    assert answer["nodes"]["a"] == {"status": "loaded"}
    assert answer["nodes"]["b"] == {"error": "model 'llama3:latest' not found", "status": 404}


def test_a_node_that_does_not_answer_is_an_error_at_the_timeout(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """A frozen node: its part fails at ``timeout`` with ``timed out``; the answer waits for it."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, loaded=[]), "b": SimulatedEngine(clock, frozen=True)}
    cluster = memory_cluster(
        clock,
        engines,
        nodes={
            "ollama": [Node(i, f"http://{i}.node.test:11434", ("llama3:latest",)) for i in "ab"]
        },
    )
    cluster.flush()
    pending = _ask(
        cluster, "model/load", {"model": "llama3:latest", "nodes": ["a", "b"], "timeout": 5}
    )
    cluster.advance(4.9)
    assert isinstance(pending, Deferred) and not pending.called
    cluster.advance(0.1)
    assert _result(pending.result)["nodes"] == {
        "a": {"status": "loaded"},
        "b": {"error": "timed out"},
    }


def test_lmstudio_loads_and_unloads_through_its_rest_api(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """LM Studio: ``/api/v1/models/load`` ``{model}`` and ``/api/v1/models/unload``
    ``{instance_id}`` (LM Studio 0.4+'s REST API)."""
    clock = Clock()
    engine = SimulatedEngine(clock, models=("qwen2.5-7b-instruct",), loaded=[])
    cluster = memory_cluster(
        clock, {"m": engine}, facades=["lmstudio"], nodes={"lmstudio": _polled("m")}
    )
    cluster.flush()
    model = {"model": "qwen2.5-7b-instruct"}
    assert _answered(cluster, _ask(cluster, "model/load", model))["nodes"] == {
        "m": {"status": "loaded"}
    }
    assert _loaded(cluster) == {"m": ["qwen2.5-7b-instruct"]}
    assert _answered(cluster, _ask(cluster, "model/unload", model))["nodes"] == {
        "m": {"status": "unloaded"}
    }
    paths = [(r.path, json.loads(r.body)) for r in engine.received if r.method == b"POST"]
    assert paths == [
        (b"/api/v1/models/load", {"model": "qwen2.5-7b-instruct"}),
        (b"/api/v1/models/unload", {"instance_id": "qwen2.5-7b-instruct"}),
    ]


def test_an_engine_without_a_load_api_is_invalid_params(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """oMLX has no load or unload API: -32602 naming the engine, no node asked."""
    clock = Clock()
    cluster = memory_cluster(
        clock, {"x": SimulatedEngine(clock)}, facades=["omlx"], nodes={"omlx": ["x"]}
    )
    code, message = _error(_ask(cluster, "model/load", {"model": "llama3:latest"}))
    assert code == -32602 and "omlx" in message


def test_a_method_that_fails_later_answers_internal_error(
    memory_cluster: Callable[..., MemoryCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method answering later whose work fails gets -32603 under its id, like one that fails
    at once; nothing is left unanswered or unhandled."""
    from nvpair_tw.ops import _steering

    cluster = _two(memory_cluster)
    broken: Deferred[Any] = Deferred()
    monkeypatch.setitem(_steering.SCOPED, "node/drain", lambda facade, params: broken)
    pending = _ask(cluster, "node/drain", {"id": "a"})
    assert isinstance(pending, Deferred) and not pending.called
    broken.errback(RuntimeError("a bug"))
    assert pending.called
    assert pending.result == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32603, "message": "internal error"},
    }


def test_each_node_is_loaded_through_its_own_kinds_api(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """§11.1 with §13.3: behind the Ollama facade, an LM Studio node loads through its REST API
    while the Ollama node gets ``/api/generate``."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, models=("m",), loaded=[], kind="ollama"),
        "l": SimulatedEngine(clock, models=("m",), loaded=[], kind="lmstudio"),
    }
    cluster = memory_cluster(clock, engines)
    answer = _answered(cluster, _ask(cluster, "model/load", {"model": "m", "nodes": ["a", "l"]}))
    assert answer["nodes"] == {"a": {"status": "loaded"}, "l": {"status": "loaded"}}
    assert [r.path for r in engines["a"].received if r.method == b"POST"] == [b"/api/generate"]
    assert [r.path for r in engines["l"].received if r.method == b"POST"] == [
        b"/api/v1/models/load"
    ]
