# -*- test-case-name: tests.app.test_demo -*-
"""``--demo``: two simulated nodes behind every facade, one healthy and one that freezes every other time."""

from __future__ import annotations

import io
from typing import Any, cast

import pytest
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web.server import Site
from twisted.web.test.requesthelper import DummyChannel, DummyRequest

from nvpair_tw.app._demo import DEMO_MODELS, DEMO_PORTS, demo_nodes
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.simulated._engine import Behaviour, SimulatedEngine
from nvpair_tw.testing import MemoryCluster


def _started(engines: list[str]) -> tuple[MemoryReactorClock, Any, dict[str, list[Node]]]:
    reactor = MemoryReactorClock()
    nodes: dict[str, list[Node]] = {}
    services = demo_nodes(cast(IProxyReactor, reactor), engines, nodes)
    services.startService()
    return reactor, services, nodes


def _engines_by_port(reactor: MemoryReactorClock) -> dict[tuple[int, str], SimulatedEngine]:
    found: dict[tuple[int, str], SimulatedEngine] = {}
    for port, factory, _backlog, interface in reactor.tcpServers:
        assert isinstance(factory, Site)
        assert isinstance(factory.resource, SimulatedEngine)
        found[(port, interface)] = factory.resource
    return found


def test_demo_nodes_join_every_engine() -> None:
    """Each facade gets ``demo-healthy`` and ``demo-flaky`` on loopback, after any nodes it had."""
    reactor = MemoryReactorClock()
    own = Node(id="gpu-1", url="http://10.0.0.5:11434")
    nodes: dict[str, list[Node]] = {"ollama": [own]}
    demo_nodes(cast(IProxyReactor, reactor), ["ollama", "omlx"], nodes)
    healthy = Node(id="demo-healthy", url="http://127.0.0.1:11501", source="flag")
    flaky = Node(id="demo-flaky", url="http://127.0.0.1:11502", source="flag")
    assert nodes == {"ollama": [own, healthy, flaky], "omlx": [healthy, flaky]}


def test_demo_engines_listen_on_loopback_demo_ports() -> None:
    """Starting the demo service listens on 127.0.0.1 at the two demo ports, once each."""
    reactor, services, _nodes = _started(["ollama", "lmstudio"])
    try:
        assert sorted(_engines_by_port(reactor)) == [
            (DEMO_PORTS["healthy"], "127.0.0.1"),
            (DEMO_PORTS["flaky"], "127.0.0.1"),
        ]
    finally:
        services.stopService()


def _post_chat(engine: SimulatedEngine) -> Any:
    """Render one streaming ``POST /api/chat`` on a simulated engine; return the request."""
    request: Any = DummyRequest([b"api", b"chat"])
    request.method = b"POST"
    request.path = request.uri = b"/api/chat"
    request.channel = DummyChannel()
    request.transport = StringTransport()
    request.content = io.BytesIO(b'{"model": "llama3", "stream": true}')
    engine.render(request)
    return request


def test_flaky_engine_alternates_frozen_and_healthy() -> None:
    """The flaky node freezes on odd inference requests and answers on even ones; the other never fails."""
    reactor, services, _nodes = _started(["ollama"])
    try:
        engines = _engines_by_port(reactor)
        flaky = engines[(DEMO_PORTS["flaky"], "127.0.0.1")]
        healthy = engines[(DEMO_PORTS["healthy"], "127.0.0.1")]
        assert [flaky.policy(n, b"/api/chat") for n in (1, 2, 3, 4)] == [
            Behaviour.FROZEN,
            Behaviour.HEALTHY,
            Behaviour.FROZEN,
            Behaviour.HEALTHY,
        ]
        assert [bool(_post_chat(flaky).written) for _ in range(4)] == [False, True, False, True]
        assert all(_post_chat(healthy).written for _ in range(3))
        assert tuple(flaky.models) == tuple(healthy.models) == DEMO_MODELS
    finally:
        services.stopService()


def test_stopping_the_demo_cancels_timers_and_closes_frozen_requests() -> None:
    """Stopping the demo leaves no stream timer behind and aborts requests the flaky node froze."""
    reactor, services, _nodes = _started(["ollama"])
    engines = _engines_by_port(reactor)
    frozen = _post_chat(engines[(DEMO_PORTS["flaky"], "127.0.0.1")])
    _post_chat(engines[(DEMO_PORTS["healthy"], "127.0.0.1")])
    assert [call for call in reactor.getDelayedCalls() if call.active()]
    services.stopService()
    assert [call for call in reactor.getDelayedCalls() if call.active()] == []
    assert isinstance(frozen.transport, StringTransport)
    assert frozen.transport.disconnecting


def test_demo_walkthrough_through_a_facade_in_memory() -> None:
    """The README's demo story on the demo's own clock: the first chat waits one 5 s header
    deadline on ``demo-flaky`` and is answered by ``demo-healthy``; the next goes straight to
    ``demo-healthy``; once the cooldown has passed ``demo-flaky`` answers again. The chats are
    non-streaming, so each answer arrives whole once its 20 tokens (2 s) are generated (§6.5)."""
    reactor, services, nodes = _started(["ollama"])
    engines = _engines_by_port(reactor)
    by_id = {
        "demo-healthy": engines[(DEMO_PORTS["healthy"], "127.0.0.1")],
        "demo-flaky": engines[(DEMO_PORTS["flaky"], "127.0.0.1")],
    }
    cluster = MemoryCluster(
        reactor,
        {node.id: by_id[node.id] for node in nodes["ollama"]},
        settings=Settings(response_header_timeout=5.0),
    )
    chat = {"model": "llama3", "messages": [], "stream": False}
    try:
        first = cluster.request("POST", "/api/chat", json=chat)
        cluster.advance(4.9)
        assert not first.called
        cluster.advance(0.1)
        assert not first.called  # failed over at 5 s; demo-healthy is generating
        cluster.advance(2.0)
        answered = cluster.result(first)
        assert answered.header("x-nvpair-node") == "demo-healthy"
        assert answered.headers_at == pytest.approx(7.0)  # 5 s deadline + 2 s of generation
        second = cluster.request("POST", "/api/chat", json=chat)
        cluster.advance(2.0)
        assert cluster.result(second).header("x-nvpair-node") == "demo-healthy"
        [cooling] = cluster.named("node/cooldown")
        assert cooling["node_id"] == "demo-flaky"
        cluster.advance(cooling["coolingUntil"] / 1000 - reactor.seconds())
        pending = cluster.request("POST", "/api/chat", json=chat)
        cluster.advance(2.0)
        again = cluster.result(pending)
        assert again.header("x-nvpair-node") == "demo-flaky"
        assert again.headers_at == pytest.approx(12.0)
    finally:
        cluster.stop()
        services.stopService()
    assert [call for call in reactor.getDelayedCalls() if call.active()] == []
