# -*- test-case-name: tests.app.test_demo -*-
"""``--demo``: two simulated Ollama machines behind every facade, ``demo-fast`` (50 tokens/s) that
hangs once for a stretch and ``demo-slow`` (12 tokens/s), and the README's story on their clock."""

from __future__ import annotations

from typing import Any, cast

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.web.server import Site

from nvpair_tw.app._demo import DEMO_MODELS, DEMO_NODES, DEMO_PORTS, STUCK_FOR, demo_nodes
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.simulated import Pace
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
DEADLINE = 5.0


def _started(engines: list[str]) -> tuple[MemoryReactorClock, Any, dict[str, list[Node]]]:
    reactor = MemoryReactorClock()
    nodes: dict[str, list[Node]] = {}
    services = demo_nodes(cast(IProxyReactor, reactor), engines, nodes)
    services.startService()
    return reactor, services, nodes


def _engines(reactor: MemoryReactorClock) -> dict[str, SimulatedEngine]:
    """The demo's engines by node id, found by the loopback port each listens on."""
    ids = {port: node_id for node_id, port in DEMO_PORTS.items()}
    found: dict[str, SimulatedEngine] = {}
    for port, factory, _backlog, interface in reactor.tcpServers:
        assert isinstance(factory, Site) and isinstance(factory.resource, SimulatedEngine)
        assert interface == "127.0.0.1"
        found[ids[port]] = factory.resource
    return found


def test_demo_nodes_join_every_engine() -> None:
    """Each facade gets ``demo-fast`` and ``demo-slow`` on loopback, after any nodes it had."""
    reactor = MemoryReactorClock()
    own = Node(id="gpu-1", url="http://10.0.0.5:11434")
    nodes: dict[str, list[Node]] = {"ollama": [own]}
    demo_nodes(cast(IProxyReactor, reactor), ["ollama", "omlx"], nodes)
    fast = Node(id="demo-fast", url="http://127.0.0.1:11501", source="flag")
    slow = Node(id="demo-slow", url="http://127.0.0.1:11502", source="flag")
    assert nodes == {"ollama": [own, fast, slow], "omlx": [fast, slow]}


def test_demo_engines_are_ollama_machines_of_unequal_speed_on_loopback() -> None:
    """Starting the demo listens on 127.0.0.1 at the two demo ports, each a simulated Ollama with
    both demo models loaded, at 50 and 12 tokens/s."""
    reactor, services, _nodes = _started(["ollama", "lmstudio"])
    try:
        engines = _engines(reactor)
        assert sorted(engines) == ["demo-fast", "demo-slow"]
        assert {e.kind for e in engines.values()} == {"ollama"}
        assert all(
            tuple(e.loaded or ()) == tuple(e.models) == DEMO_MODELS for e in engines.values()
        )
        speeds = {i: e.pace.decode for i, e in engines.items() if isinstance(e.pace, Pace)}
        assert speeds == {"demo-fast": 50.0, "demo-slow": 12.0}
        assert [n.id for n in DEMO_NODES] == ["demo-fast", "demo-slow"]
    finally:
        services.stopService()


def test_stopping_the_demo_cancels_timers_and_closes_stuck_requests() -> None:
    """Stopping the demo leaves no timer behind (the stretch's end included) and aborts the
    request ``demo-fast`` got stuck on."""
    reactor, services, nodes = _started(["ollama"])
    engines = _engines(reactor)
    cluster = MemoryCluster(reactor, engines, facades=())  # type: ignore[arg-type]
    stuck = cluster.request("POST", "/api/chat", json=CHAT, node="demo-fast")
    cluster.request("POST", "/api/chat", json=CHAT, node="demo-slow")
    cluster.advance(0.01)
    assert engines["demo-fast"].frozen and engines["demo-fast"].open_requests
    services.stopService()
    cluster.advance(0.01)
    assert stuck.called  # cut
    cluster.stop()
    assert [call for call in reactor.getDelayedCalls() if call.active()] == []
    assert nodes["ollama"]


def test_demo_fast_hangs_on_its_first_request_for_a_stretch_then_answers() -> None:
    """``demo-fast``'s first request is never answered, and for :data:`STUCK_FOR` seconds nothing
    else is either, its model list included; after, it answers (the stuck request stays lost)."""
    reactor, services, _nodes = _started(["ollama"])
    engines = _engines(reactor)
    cluster = MemoryCluster(reactor, engines, facades=())  # type: ignore[arg-type]
    try:
        first = cluster.request("POST", "/api/chat", json=CHAT, node="demo-fast")
        cluster.advance(1.0)
        tags = cluster.request("GET", "/api/tags", node="demo-fast")
        cluster.advance(STUCK_FOR - 1.5)
        assert not first.called and not tags.called
        cluster.advance(1.0)
        assert cluster.fetch("GET", "/api/tags", node="demo-fast").status == 200
        later = cluster.request("POST", "/api/chat", json=CHAT, node="demo-fast")
        cluster.advance(1.0)
        assert cluster.result(later).complete and not first.called and not tags.called
    finally:
        cluster.stop()
        services.stopService()


def _chat(cluster: MemoryCluster) -> tuple[str | None, float]:
    """One streamed chat through the facade, run to its end: who answered, and how long its
    headers took."""
    started = cluster.clock.seconds()
    pending = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(DEADLINE + 4)
    answered = cluster.result(pending)
    assert answered.complete
    return answered.header("x-nvpair-node"), answered.headers_at - started


def test_the_readme_story_on_the_demo_clock() -> None:
    """The README's demo, in memory: the first chat waits one 5 s deadline on ``demo-fast`` and
    ``demo-slow`` answers it; the next go straight to ``demo-slow``; ``demo-fast``'s first
    question (at 10 s) is not answered, so its cooldown is renewed once; the second (at 20 s) is,
    and from then on ``demo-fast`` serves, measured at 50 tokens/s against 12."""
    reactor, services, _nodes = _started(["ollama"])
    engines = _engines(reactor)
    cluster = MemoryCluster(reactor, engines, settings=Settings(response_header_timeout=DEADLINE))  # type: ignore[arg-type]
    try:
        node, took = _chat(cluster)
        assert node == "demo-slow"
        assert took == pytest.approx(DEADLINE + 0.02 + 5 / 150 + 1 / 12, abs=0.01)
        assert _chat(cluster)[0] == "demo-slow"  # t = 9: demo-fast is cooling
        cluster.advance(20.5 - cluster.clock.seconds())
        cooldowns = cluster.named("node/cooldown")
        assert [(c["node_id"], c.get("renewed", False)) for c in cooldowns] == [
            ("demo-fast", False),
            ("demo-fast", True),
        ]
        [ended] = cluster.named("node/cooldown-ended")
        assert (ended["node_id"], ended["why"]) == ("demo-fast", "expired")
        served = [_chat(cluster) for _ in range(3)]
        assert [node for node, _ in served] == ["demo-fast"] * 3
        assert all(took == pytest.approx(0.02 + 5 / 800 + 1 / 50, abs=0.01) for _, took in served)
        speeds = cluster.facade().speeds
        decode = {n: speeds.to_json(n)["llama3"]["decodeTokensPerSecond"] for n in engines}
        assert decode == {"demo-fast": pytest.approx(50.0), "demo-slow": pytest.approx(12.0)}
    finally:
        cluster.stop()
        services.stopService()
    assert [call for call in reactor.getDelayedCalls() if call.active()] == []
