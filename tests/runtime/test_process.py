"""The process assembly: shared pieces, one facade per engine, sites, cooldown events and stop.

Reactor-free: everything runs on a ``MemoryReactorClock`` (connections are only recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.corridor._facade import FacadeResource
from nvpair_tw.events import Event
from nvpair_tw.inbound._ingress import parse_ingress
from nvpair_tw.nodes import SelfGuard
from nvpair_tw.nodes._directory import Node
from nvpair_tw.runtime._process import SELF_CHECK_INTERVAL, Runtime, build_runtime
from nvpair_tw.selection._stalls import IStallTracker, NeverCools
from nvpair_tw.upstream._agent import NodeAgent
from nvpair_tw.upstream._protocol import NodeClientProtocol
from tests.nodes.test_self import FakePort, ResolvingReactor

ENGINES = ["ollama", "lmstudio"]
NODES = {
    "ollama": [Node("a", "http://127.0.0.1:1001")],
    "lmstudio": [Node("m", "http://127.0.0.1:1002")],
}


def _runtime(
    settings: Settings | None = None, **kw: Any
) -> tuple[MemoryReactorClock, Runtime, list[Event]]:
    """A runtime on a memory reactor, with every bus event recorded."""
    clock = MemoryReactorClock()
    runtime = build_runtime(
        cast(IProxyReactor, clock), settings or Settings(), ENGINES, nodes=NODES, **kw
    )
    events: list[Event] = []
    runtime.shared.bus.subscribe(events.append, name="test")
    return clock, runtime, events


def _named(events: list[Event], name: str) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in events if e.name == name]


def test_one_facade_per_engine_sharing_ledger_workloads_and_bus() -> None:
    """Each engine gets a facade; all share one Shared; each has its own stalls and affinity."""
    _, runtime, _ = _runtime()
    ollama, lmstudio = runtime.facades["ollama"], runtime.facades["lmstudio"]
    assert list(runtime.facades) == ENGINES
    assert (ollama.engine, lmstudio.engine) == ("ollama", "lmstudio")
    assert ollama.shared is lmstudio.shared is runtime.shared
    assert runtime.shared.ledger is not None and runtime.shared.workloads is not None
    assert ollama.stalls is not lmstudio.stalls
    assert ollama.affinity is not lmstudio.affinity
    assert [n.id for n in ollama.directory.nodes()] == ["a"]
    assert [n.id for n in lmstudio.directory.nodes()] == ["m"]


def test_ingress_defaults_to_loopback_only_with_an_empty_environment() -> None:
    """No environment given: no keys, loopback callers pass and others are refused."""
    _, runtime, _ = _runtime()
    ingress = runtime.shared.ingress
    assert ingress is not None and not ingress.keys_configured
    assert ingress.check(IPv4Address("TCP", "127.0.0.1", 5000), Headers()) is None
    refused = ingress.check(IPv4Address("TCP", "192.0.2.7", 5000), Headers())
    assert refused is not None and (refused.status, refused.code) == (403, "loopback-only")


def test_ingress_reads_the_given_environment() -> None:
    """An API key in the environment passed in opens the gate to keyed remote callers."""
    _, runtime, _ = _runtime(environ={"NVPAIR_PROXY_API_KEYS": "sekrit-1"})
    ingress = runtime.shared.ingress
    assert ingress is not None and ingress.keys_configured


def test_ingress_is_built_from_the_parsed_configuration() -> None:
    """A parsed ``IngressConfig`` becomes the live gate, its timer on the runtime's reactor."""
    config = parse_ingress({"NVPAIR_PROXY_API_KEYS": "sekrit-1"})
    clock, runtime, _ = _runtime(ingress=config)
    ingress = runtime.shared.ingress
    assert ingress is not None and ingress.keys_configured and ingress.clock is clock
    remote = IPv4Address("TCP", "192.0.2.7", 5000)
    assert ingress.check(remote, Headers({b"x-api-key": [b"sekrit-1"]})) is None


def test_ingress_and_environ_together_are_refused() -> None:
    """The test shorthand ``environ`` and a parsed ``ingress`` cannot both be given."""
    with pytest.raises(TypeError, match="not both"):
        _runtime(ingress=parse_ingress({}), environ={})


def test_site_for_builds_each_site_once_with_the_settings_limits() -> None:
    """The same site is returned on every call; each engine has its own, limited by the settings."""
    _, runtime, _ = _runtime(Settings(max_body_size=1234, max_connections=7))
    site = runtime.site_for("ollama")
    assert runtime.site_for("ollama") is site
    assert runtime.site_for("lmstudio") is not site
    assert (site.max_body_size, site.limits.max_connections) == (1234, 7)
    assert isinstance(site.resource, FacadeResource)


def test_rejection_below_the_facade_publishes_a_request_record() -> None:
    """A 413 from the site still ends in a ``proxy/request`` record of that engine, with no node."""
    clock, runtime, events = _runtime()
    clock.advance(3)
    site = runtime.site_for("lmstudio")
    assert site.on_reject is not None
    site.on_reject(413, "body-too-large", "POST", "/api/chat?x=1")
    [record] = _named(events, "proxy/request")
    assert {k: record[k] for k in ("engine", "method", "path", "status", "node_id", "error")} == {
        "engine": "lmstudio",
        "method": "POST",
        "path": "/api/chat",
        "status": 413,
        "node_id": None,
        "error": "body-too-large",
    }
    assert record["attempts"] == [] and record["id"]


def test_cooldown_announces_cooling_until_in_milliseconds_then_renewal() -> None:
    """Cooling publishes ``node/cooldown`` with ``coolingUntil`` in ms. At expiry the node is asked
    its inventory question first; on this memory reactor nothing ever answers, so after the probe's
    bound (min(header timeout, 10 s) = 2.5 s) the cooldown is renewed, announced with ``renewed``
    (docs/behaviour.md §6.3); it does not end."""
    clock, runtime, events = _runtime(Settings(response_header_timeout=2.5))
    clock.advance(10)
    runtime.facades["ollama"].stalls.cool("a", "no response headers within 2.5s")
    assert _named(events, "node/cooldown") == [
        {
            "engine": "ollama",
            "node_id": "a",
            "reason": "no response headers within 2.5s",
            "coolingUntil": 12500,
        }
    ]
    clock.advance(2.5)
    assert [(host, port) for host, port, *_ in clock.tcpClients][-1:] == [("127.0.0.1", 1001)]
    clock.advance(2.5)
    assert _named(events, "node/cooldown")[1:] == [
        {
            "engine": "ollama",
            "node_id": "a",
            "reason": "no response headers within 2.5s",
            "coolingUntil": 17500,
            "renewed": True,
        }
    ]
    assert _named(events, "node/cooldown-ended") == []
    runtime.facades["ollama"].stalls.clear("a")


def test_cooldown_ended_by_success_says_why() -> None:
    """A success clears the cooldown at once and says ``success``."""
    _, runtime, events = _runtime()
    stalls = runtime.facades["lmstudio"].stalls
    stalls.cool("m", "stall")
    stalls.clear("m")
    assert _named(events, "node/cooldown-ended") == [
        {"engine": "lmstudio", "node_id": "m", "why": "success"}
    ]


def test_stall_tracker_factory_is_used_per_engine() -> None:
    """An injected factory builds each facade's tracker and gets that engine's announcer."""
    made: dict[str, tuple[IStallTracker, Callable[[str, Any, str], None]]] = {}

    def factory(engine: str, announce: Callable[[str, Any, str], None]) -> IStallTracker:
        made[engine] = (NeverCools(), announce)
        return made[engine][0]

    _, runtime, events = _runtime(stall_tracker=factory)
    assert sorted(made) == sorted(ENGINES)
    for engine in ENGINES:
        assert runtime.facades[engine].stalls is made[engine][0]
    made["lmstudio"][1]("m", None, "expired")
    assert _named(events, "node/cooldown-ended") == [
        {"engine": "lmstudio", "node_id": "m", "why": "expired"}
    ]


class CachedConnection:
    """An idle pooled connection: records the abort the pool makes when it is closed."""

    state = "QUIESCENT"

    def __init__(self) -> None:
        self.aborts = 0
        self.aborted: Deferred[None] = Deferred()

    def abort(self) -> Deferred[None]:
        self.aborts += 1
        return self.aborted


def test_stop_cancels_polls_and_cooldown_timers_and_closes_the_pool() -> None:
    """After start, a cooldown and an idle pooled connection there are timers; stop aborts the
    connection, leaves no timer, and fires once the connection is closed."""
    clock, runtime, _ = _runtime()
    runtime.start()
    runtime.facades["ollama"].stalls.cool("a", "stall")
    idle = CachedConnection()
    runtime.pool._putConnection((b"http", b"127.0.0.1", 1001), idle)
    assert clock.getDelayedCalls() != []
    closed = runtime.stop()
    assert idle.aborts == 1 and not closed.called
    idle.aborted.callback(None)
    assert closed.called
    assert clock.getDelayedCalls() == []
    assert runtime.facades["ollama"].stalls.cooling() == frozenset()


def test_the_native_upstream_client_is_the_default_for_attempts_and_reads() -> None:
    """``--upstream-client native`` (the default): attempts and control-plane reads share one
    NodeAgent; ``twisted``: both go through Twisted's Agent over the runtime's pool."""
    _, native, _ = _runtime()
    assert isinstance(native.native, NodeAgent)
    assert native.shared.client.agent is native.native
    assert native.shared.http._agent is native.native
    _, stock, _ = _runtime(Settings(upstream_client="twisted"))
    assert stock.native is None
    assert isinstance(stock.shared.client.agent, Agent)
    assert stock.shared.client.agent._pool is stock.pool
    assert stock.shared.http._agent is stock.shared.client.agent


def test_the_native_client_keeps_connections_alive_like_the_pool() -> None:
    """One keep-alive policy: the NodeAgent takes the pool's idle limit and idle expiry."""
    _, runtime, _ = _runtime()
    assert runtime.native is not None
    assert runtime.native.max_idle_per_host == runtime.pool.maxPersistentPerHost == 32
    assert runtime.native.idle_seconds == runtime.pool.cachedConnectionTimeout == 4


def test_an_unknown_upstream_client_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown upstream client"):
        _runtime(Settings(upstream_client="curl"))


def test_stop_closes_the_native_clients_idle_connections() -> None:
    """Stop closes the NodeAgent's idle connections too, and fires once they are gone."""
    _, runtime, _ = _runtime()
    assert runtime.native is not None
    idle = NodeClientProtocol(runtime.native._release, runtime.native._lost)
    transport = StringTransport()
    idle.makeConnection(transport)
    runtime.native._keys[idle] = (b"http", b"127.0.0.1", 1001)
    runtime.native._release(idle)  # what a complete response does
    assert runtime.native.idle_count() == 1
    closed = runtime.stop()
    assert transport.disconnecting and not closed.called
    idle.connectionLost(Failure(ConnectionDone()))
    assert closed.called


def test_a_node_name_that_resolves_to_this_process_stops_being_a_candidate() -> None:
    """Each node name on one of this process's ports is resolved again every
    ``SELF_CHECK_INTERVAL`` (docs/behaviour.md §14.3): once it resolves to loopback, the node is
    never a candidate; the check stops with the runtime."""
    clock = MemoryReactorClock()
    nodes = {"ollama": [Node("me", "http://proxy.example:11435"), Node("o", "http://10.0.0.9:1")]}
    runtime = build_runtime(cast(IProxyReactor, clock), Settings(), ["ollama"], nodes=nodes)
    resolving = ResolvingReactor()
    runtime.self_guard = SelfGuard(resolving)  # type: ignore[arg-type]
    runtime.shared.self_guard = runtime.self_guard
    runtime.self_guard.listened(FakePort(IPv4Address("TCP", "127.0.0.1", 11435)))  # type: ignore[arg-type]
    runtime.start()
    facade = runtime.facades["ollama"]
    assert [n.id for n in facade.serving()] == ["me", "o"]
    clock.advance(SELF_CHECK_INTERVAL)
    assert [name for _, name, _ in resolving.nameResolver.asked] == ["proxy.example"]
    resolving.nameResolver.answer("127.0.0.1")
    assert [n.id for n in facade.serving()] == ["o"]
    runtime.stop()
    assert not [c for c in clock.getDelayedCalls() if c.active() and "SelfGuard" in repr(c)]
