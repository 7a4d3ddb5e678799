"""The test harnesses themselves: ``MemoryCluster`` (in memory, on one Clock) and the loopback
``ProxyCluster``. The simulated engine has its own module, tests/test_simulated.py."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseNeverReceived
from twisted.web.resource import Resource

import nvpair_tw
from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import ProxyRequest
from nvpair_tw.nodes._directory import Node
from nvpair_tw.simulated._engine import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import Clusters, MemoryCluster, ProxyCluster

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()
ONE_SHOT = {"model": "llama3", "messages": [], "stream": False}

Make = Callable[..., MemoryCluster]


def test_memory_cluster_serves_a_healthy_chat_and_records_events(memory_cluster: Make) -> None:
    """A chat through the in-memory facade reaches the engine byte for byte and is answered whole."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, chunks=2)})
    response = cluster.fetch("POST", "/api/chat", data=CHAT)
    assert response.status == 200 and response.complete
    assert response.header("x-nvpair-node") == "a"
    assert [json.loads(line)["done"] for line in response.body.splitlines()] == [False] * 2 + [True]
    assert cluster.received("a") == [CHAT]
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["node_id"]) == (200, "a")
    assert clock.seconds() == 0.0  # no time passed: nothing waited
    [typed] = cluster.values(ProxyRequest)
    assert (typed.status, typed.node_id, typed.model) == (200, "a", "llama3")


def test_memory_cluster_stream_arrives_chunk_by_chunk_as_the_clock_moves(
    memory_cluster: Make,
) -> None:
    """A node sending a frame a second is relayed a frame a second: time moves only on advance."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, chunks=3, chunk_delay=1.0)})
    response = cluster.result(cluster.request("POST", "/api/chat", data=CHAT))
    assert response.status == 200 and len(response.chunks) == 1 and response.ended is None
    cluster.advance(0.5)
    assert len(response.chunks) == 1
    cluster.advance(0.5)
    assert len(response.chunks) == 2 and response.ended is None
    cluster.advance(2.0)
    assert response.arrivals == [0.0, 1.0, 2.0, 3.0] and response.ended is None
    assert json.loads(response.chunks[-1]) == {"done": True, "done_reason": "stop"}
    cluster.advance(1.0)  # the engine ends its response one chunk delay after the last frame
    assert response.complete


def test_memory_cluster_frozen_node_costs_exactly_the_header_deadline_then_fails_over(
    memory_cluster: Make,
) -> None:
    """A frozen first node holds the request until the deadline on the clock, not a tick less;
    the next node then answers and the frozen one is recorded as a stall and cooled down."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, policy=always(Behaviour.FROZEN)),
        "b": SimulatedEngine(clock),
    }
    settings = Settings(response_header_timeout=30.0)
    cluster = memory_cluster(clock, engines, settings=settings)
    cluster.facade().pin = "a"
    pending = cluster.request("POST", "/api/chat", json=ONE_SHOT)
    cluster.advance(29.999)
    assert not pending.called and cluster.received("a") and not cluster.received("b")
    cluster.advance(0.001)
    response = cluster.result(pending)
    assert response.headers_at == 30.0 and response.header("x-nvpair-node") == "b"
    assert response.complete and response.json()["done"] is True
    [record] = cluster.named("proxy/request")
    assert [(a["node_id"], a["outcome"], a["ms"]) for a in record["attempts"]] == [
        ("a", "stall", 30000),
        ("b", "committed", 0),
    ]
    assert [e["node_id"] for e in cluster.named("node/cooldown")] == ["a"]


def test_memory_cluster_truncates_the_client_when_a_node_drops_mid_stream(
    memory_cluster: Make,
) -> None:
    """A committed stream cut by the node reaches the client truncated, never looking complete."""
    clock = Clock()
    engine = SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM), chunks=4)
    cluster = memory_cluster(clock, {"a": engine})
    response = cluster.fetch("POST", "/api/chat", data=CHAT)
    assert response.status == 200 and response.truncated
    assert len(response.body.splitlines()) == 2
    [record] = cluster.named("proxy/request")
    assert record["error"] == "upstream dropped mid-stream"


def test_memory_cluster_refuses_a_node_nobody_serves_and_fails_over_at_once(
    memory_cluster: Make,
) -> None:
    """A node URL with no engine behind it is a refused connection: the next node answers, at t=0."""
    clock = Clock()
    gone = Node("gone", "http://gone.node.test:11434", ("llama3:latest",))
    cluster = memory_cluster(clock, {"b": SimulatedEngine(clock)}, nodes={"ollama": [gone, "b"]})
    cluster.facade().pin = "gone"
    response = cluster.fetch("POST", "/api/chat", json=ONE_SHOT)
    assert response.header("x-nvpair-node") == "b" and clock.seconds() == 0.0
    [record] = cluster.named("proxy/request")
    assert [a["node_id"] for a in record["attempts"]] == ["gone", "b"]
    refused = cluster.network.connect("gone.node.test", 11434, Factory.forProtocol(Protocol))
    failures: list[Failure] = []
    refused.addErrback(failures.append)
    assert failures[0].check(ConnectionRefusedError)


def test_memory_cluster_client_hang_up_reaches_the_node(memory_cluster: Make) -> None:
    """Cancelling a request before its headers cuts the client connection: the facade records a
    499 and closes the request it had open on the (frozen) node."""
    clock = Clock()
    engine = SimulatedEngine(clock, policy=always(Behaviour.FROZEN))
    cluster = memory_cluster(clock, {"a": engine})
    pending = cluster.request("POST", "/api/chat", data=CHAT)
    cluster.advance(5)
    assert cluster.network.open == 2  # client to facade, facade to node
    pending.cancel()
    failures: list[Failure] = []
    pending.addErrback(failures.append)
    [failure] = failures
    assert isinstance(failure.value, ResponseNeverReceived)
    assert failure.value.reasons[0].check(CancelledError)
    cluster.flush()
    [record] = cluster.named("proxy/request")
    assert record["status"] == 499
    assert cluster.network.open == 0


def test_memory_cluster_routes_each_facade_and_serves_any_resource(memory_cluster: Make) -> None:
    """Every facade gets every engine; a plain Resource serves as a node with no advertised model."""

    class Version(Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> bytes:
            return b'{"version": "plain"}'

    clock = Clock()
    cluster = memory_cluster(clock, {"plain": Version()}, facades=("ollama", "lmstudio"))
    assert cluster.facade_url("lmstudio") == "http://lmstudio.facade.test:1235"
    assert cluster.node("plain") == Node("plain", "http://plain.node.test:11434", ())
    for facade in ("ollama", "lmstudio"):
        response = cluster.fetch("GET", "/api/other", facade=facade)
        assert response.json() == {"version": "plain"}
        assert response.header("x-nvpair-node") == "plain"


def test_memory_cluster_refuses_an_engine_on_another_clock() -> None:
    """Every engine must run on the cluster's clock, or its timers would never move."""
    with pytest.raises(ValueError, match="another clock"):
        MemoryCluster(Clock(), {"a": SimulatedEngine(Clock())})


def test_memory_cluster_fetch_and_result_say_when_the_clock_must_move(
    memory_cluster: Make,
) -> None:
    """``result`` without headers yet, and ``fetch`` of an unfinished body, are assertion errors."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        {
            "slow": SimulatedEngine(clock, header_delay=1.0),
            "trickle": SimulatedEngine(clock, chunk_delay=1.0),
        },
        facades=(),
    )
    pending = cluster.request("POST", "/api/chat", data=CHAT, node="slow")
    with pytest.raises(AssertionError, match="no response headers yet"):
        cluster.result(pending)
    with pytest.raises(AssertionError, match="still waiting on the clock"):
        cluster.fetch("POST", "/api/chat", data=CHAT, node="trickle")
    cluster.advance(5)
    assert cluster.result(pending).complete


def test_memory_cluster_stop_leaves_no_timer_and_no_connection(memory_cluster: Make) -> None:
    """After ``stop`` the clock holds no timer (pools, idle channels, stream timers all gone)."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, chunk_delay=1.0, chunks=50)})
    response = cluster.result(cluster.request("POST", "/api/chat", data=CHAT))
    cluster.fetch("GET", "/api/version")  # leaves a keep-alive node connection in the pool
    assert clock.getDelayedCalls()
    cluster.stop()
    assert clock.getDelayedCalls() == [] and cluster.network.open == 0
    assert response.truncated


@pytest_twisted.ensureDeferred
async def test_proxy_cluster_serves_through_the_proxy_and_records_events(
    reactor: Any, clusters: Clusters
) -> None:
    """A cluster over named engines answers via the proxy, records bus events and engine bodies."""
    cluster = clusters(ProxyCluster)
    await cluster.start({"left": SimulatedEngine(reactor), "right": SimulatedEngine(reactor)})
    code, content, response = await cluster.post(CHAT)
    assert code == 200 and content
    node = response.headers.getRawHeaders(b"x-nvpair-node")
    assert node in ([b"left"], [b"right"])
    index = 0 if node == [b"left"] else 1
    assert cluster.received(index) == [CHAT] and cluster.received(1 - index) == []
    assert cluster.facade.engine == "ollama"
    assert [n.id for n in cluster.facade.directory.nodes()] == ["left", "right"]
    [record] = cluster.named("proxy/request")
    assert record["status"] == 200 and record["node_id"] == node[0].decode()


@pytest_twisted.ensureDeferred
async def test_clusters_stop_every_cluster_last_made_first(reactor: Any) -> None:
    """``Clusters.stop`` stops each cluster it made, newest first, and forgets them."""
    order: list[str] = []

    class Named(ProxyCluster):
        async def stop(self) -> None:
            order.append(self.engine_name)
            await super().stop()

    made = Clusters(reactor)
    first, second = made(Named), made(Named)
    first.engine_name, second.engine_name = "first", "second"
    await made.stop()
    assert order == ["second", "first"] and made.made == []


def test_no_production_module_imports_the_test_doubles() -> None:
    """``nvpair_tw.testing`` is for tests only: no other package module (nor the plugin) imports it."""
    root = Path(nvpair_tw.__file__).parent
    sources = [p for p in root.rglob("*.py") if p.name != "testing.py"]
    sources += list((root.parent / "twisted" / "plugins").glob("*.py"))
    offenders = []
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if "nvpair_tw.testing" in names:
                offenders.append(source.name)
    assert len(sources) > 30 and offenders == []
