# -*- test-case-name: tests.app.test_wiring -*-
"""From a configuration to the service tree: own URLs, listeners per engine, nodes, admin, control."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from twisted.application.service import IService, IServiceCollection, MultiService
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.web.http_headers import Headers
from zope.interface import provider

from nvpair_tw.app._config import Config
from nvpair_tw.app._wiring import assemble
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.inbound._ingress import parse_ingress
from nvpair_tw.nodes._directory import Node
from nvpair_tw.runtime._process import Runtime
from nvpair_tw.runtime._service import ListenerService, RuntimeService
from nvpair_tw.tap import Options


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``NVPAIR_*`` variable of the outer shell leaks into option parsing."""
    for name in list(os.environ):
        if name.startswith("NVPAIR_"):
            monkeypatch.delenv(name)


def built(*args: str) -> tuple[MemoryReactorClock, MultiService]:
    """Parse ``args`` and assemble them on a fake reactor (nothing is started; no usage file:
    a fake reactor has no threads to write it with)."""
    options = Options(environ={})
    options.parseOptions([*args, "--usage-db", "none"])
    reactor = MemoryReactorClock()
    return reactor, assemble(cast(IProxyReactor, reactor), options.config)


def services(top: IService) -> Iterator[IService]:
    """Every service in a tree, depth first."""
    yield top
    if IServiceCollection.providedBy(top):
        for child in cast(Any, top):
            yield from services(child)


def listeners(top: IService) -> dict[str, str]:
    """Label → endpoint description of every listener in the tree."""
    return {s.label: s.description for s in services(top) if isinstance(s, ListenerService)}


def runtime_of(top: IService) -> Runtime:
    """The runtime the tree runs."""
    (found,) = [s for s in services(top) if isinstance(s, RuntimeService)]
    return found.runtime


def test_each_engine_gets_its_facade_listener() -> None:
    """One listener per ``--engine``, on its ``--listen`` or default endpoint, plus the admin listener."""
    _reactor, top = built("-e", "ollama", "-e", "lmstudio", "--listen", "lmstudio=tcp:1300")
    assert listeners(top) == {
        "ollama facade": "tcp:11435:interface=127.0.0.1",
        "lmstudio facade": "tcp:1300",
        "admin": "tcp:9180:interface=127.0.0.1",
    }
    assert sorted(runtime_of(top).facades) == ["lmstudio", "ollama"]


def test_admin_none_and_control_endpoint() -> None:
    """``--admin none`` leaves the admin listener out; ``--control ENDPOINT`` adds a control listener."""
    _reactor, top = built("-e", "omlx", "--admin", "none", "--control", "unix:/tmp/nv-ctl.sock")
    found = listeners(top)
    assert "admin" not in found
    assert found["omlx facade"] == "tcp:8001:interface=127.0.0.1"
    assert "unix:/tmp/nv-ctl.sock:mode=600" in found.values()
    assert len(found) == 2


def test_flag_nodes_reach_their_facades_and_own_listener_is_excluded() -> None:
    """Unscoped nodes go to every facade, scoped ones to one; a node at a facade's own URL is dropped."""
    _reactor, top = built(
        "-e",
        "ollama",
        "-e",
        "lmstudio",
        "--node",
        "gpu1=http://10.0.0.5:11434",
        "--node",
        "lmstudio:gpu2=http://10.0.0.6:1234",
        "--node",
        "ollama:self=http://localhost:11435",
    )
    facades = runtime_of(top).facades
    assert [n.id for n in facades["ollama"].directory.nodes()] == ["gpu1"]
    assert [n.id for n in facades["lmstudio"].directory.nodes()] == ["gpu1", "gpu2"]


def test_settings_reach_the_runtime() -> None:
    """The configuration's settings object is the one the runtime runs with."""
    config = Config(
        engines=("ollama",),
        listen={"ollama": "tcp:0"},
        settings=Settings(response_header_timeout=3),
    )
    top = assemble(cast(IProxyReactor, MemoryReactorClock()), config)
    assert runtime_of(top).settings is config.settings
    assert runtime_of(top).settings.cooldown == 3.0


def test_a_hand_built_configuration_assembles_without_option_parsing() -> None:
    """``Config`` is plain data: defaults mean no admin, no control, loopback-only ingress."""
    node = Node("gpu1", "http://10.0.0.5:11434", source="flag")
    config = Config(engines=("ollama",), listen={"ollama": "tcp:0"}, nodes={"ollama": (node,)})
    top = assemble(cast(IProxyReactor, MemoryReactorClock()), config)
    assert listeners(top) == {"ollama facade": "tcp:0"}
    assert list(runtime_of(top).facades["ollama"].directory.nodes()) == [node]
    gate = runtime_of(top).shared.ingress
    assert gate is not None and not gate.keys_configured


def test_assembling_the_demo_leaves_the_configuration_unchanged() -> None:
    """The demo nodes are added to the runtime, not written back into the configuration value."""
    node = Node("gpu1", "http://10.0.0.5:11434", source="flag")
    config = Config(
        engines=("ollama",), listen={"ollama": "tcp:0"}, nodes={"ollama": (node,)}, demo=True
    )
    top = assemble(cast(IProxyReactor, MemoryReactorClock()), config)
    assert len(list(runtime_of(top).facades["ollama"].directory.nodes())) == 3
    assert config.nodes == {"ollama": (node,)}


def test_the_parsed_ingress_becomes_the_live_gate_on_the_given_reactor() -> None:
    """The gate is built in assembly from the configuration's ingress value and the reactor."""
    config = Config(
        engines=("ollama",),
        listen={"ollama": "tcp:0"},
        ingress=parse_ingress({"NVPAIR_PROXY_API_KEYS": "k-0123456789abcdef"}),
    )
    reactor = MemoryReactorClock()
    gate = runtime_of(assemble(cast(IProxyReactor, reactor), config)).shared.ingress
    assert gate is not None
    assert gate.clock is reactor and gate.keys_configured
    remote = IPv4Address("TCP", "192.0.2.7", 5000)
    assert gate.check(remote, Headers({b"x-api-key": [b"k-0123456789abcdef"]})) is None
    assert gate.check(remote, Headers()) is not None


def test_demo_adds_simulated_nodes_and_their_listeners() -> None:
    """``--demo`` puts both demo nodes behind the facade and listens for them."""
    _reactor, top = built("-e", "ollama", "--demo", "--admin", "none")
    ids = [n.id for n in runtime_of(top).facades["ollama"].directory.nodes()]
    assert ids == ["demo-fast", "demo-slow"]
    found = listeners(top)
    assert found["demo node demo-fast"] == "tcp:11501:interface=127.0.0.1"
    assert found["demo node demo-slow"] == "tcp:11502:interface=127.0.0.1"


def test_assembling_starts_nothing(tmp_path: Path) -> None:
    """Assembly only builds: no port is opened and no timer is scheduled until the service starts."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    reactor, top = built(
        "-e", "ollama", "-e", "omlx", "--control", "tcp:0:interface=127.0.0.1",
        "--control-token", str(token),
    )  # fmt: skip
    assert not top.running
    assert reactor.tcpServers == []
    assert reactor.getDelayedCalls() == []


def test_every_listening_port_reaches_the_self_loop_check() -> None:
    """Facade, admin and control listeners report their ports to the runtime's self-loop check
    (docs/behaviour.md §14.3), so a node at one of them is this process."""
    _reactor, top = built("-e", "ollama", "--admin", "tcp:9181:interface=127.0.0.1")
    top.startService()
    guard = runtime_of(top).self_guard
    assert {port for _, port in guard.listening} == {11435, 9181}
    assert guard.excludes("http://localhost:9181") and not guard.excludes("http://10.0.0.5:9181")
    top.stopService()


def test_the_demo_nodes_are_other_servers_to_the_self_loop_check() -> None:
    """``--demo``'s simulated nodes listen in this process but are nodes, not the proxy: their
    ports never reach the self-loop check, so neither is dropped as "this process" (issue 37:
    both were, and every demo request was a 502 ``no-model-owner``)."""
    _reactor, top = built("-e", "ollama", "--demo", "--admin", "tcp:9181:interface=127.0.0.1")
    top.startService()
    guard = runtime_of(top).self_guard
    assert {port for _, port in guard.listening} == {11435, 9181}
    nodes = runtime_of(top).facades["ollama"].directory.nodes()
    assert nodes and not any(guard.excludes(node.url) for node in nodes)
    top.stopService()


def test_each_facade_tells_the_runtime_where_clients_reach_it_once_it_listens() -> None:
    """Before the listeners start the runtime knows no address; once they listen, each facade's
    is the URL a client uses (the status page shows it), the admin listener's is not among them."""
    _reactor, top = built("-e", "ollama", "-e", "openai", "--listen", "openai=tcp:1300")
    runtime = runtime_of(top)
    assert runtime.facade_urls == {}
    top.startService()
    assert runtime.facade_urls == {  # the fake reactor's ports are on every interface
        "ollama": "http://127.0.0.1:11435 (every interface)",
        "openai": "http://127.0.0.1:1300 (every interface)",
    }
    top.stopService()


def test_the_assembled_tree_starts_and_stops_cleanly() -> None:
    """Started on a fake reactor every listener binds; stopping leaves no timer behind."""
    reactor, top = built("-e", "ollama", "-e", "lmstudio", "--listen", "lmstudio=tcp:1300")
    top.startService()
    bound = sorted((port, interface) for port, _f, _b, interface in reactor.tcpServers)
    assert bound == [(1300, ""), (9180, "127.0.0.1"), (11435, "127.0.0.1")]
    stopped: list[object] = []
    top.stopService().addBoth(stopped.append)
    for _ in range(100):
        if stopped:
            break
        reactor.advance(0.5)
    assert stopped
    assert [c for c in reactor.getDelayedCalls() if c.active()] == []


def test_state_gives_the_runtime_a_fleet_store_and_shared_state() -> None:
    """``--state`` reaches the runtime: a store, shared trackers and tables, the ledger followed."""
    from nvpair_tw.fleet._store import SharedAffinityTable, SharedStallTracker

    _reactor, top = built("-e", "ollama", "--state", "redis://:pw@127.0.0.1:6390/2")
    runtime = runtime_of(top)
    assert (
        runtime.fleet is not None and str(runtime.fleet.config) == "redis://:***@127.0.0.1:6390/2"
    )
    facade = runtime.facades["ollama"]
    assert isinstance(facade.stalls, SharedStallTracker)
    assert isinstance(facade.affinity, SharedAffinityTable)
    assert runtime.shared.ledger.on_change is not None
    _reactor, top = built("-e", "ollama")
    assert runtime_of(top).fleet is None


@pytest.mark.parametrize(
    ("extra", "noted"),
    [([], True), (["--default-slots", "2"], False), (["--node", "gpu=http://a:1"], True)],
)
def test_batch_keys_without_slots_get_one_start_up_note(
    tmp_path: Path, extra: list[str], noted: bool
) -> None:
    """docs/behaviour.md §16.3: with unlimited slots nothing queues, so a key's ``priority =
    "batch"`` changes nothing, and the start says so once; with slots it says nothing."""
    keys = tmp_path / "keys.toml"
    keys.write_text("[[key]]\nname = 'nightly'\nkey = 'sk-nightly-1'\npriority = 'batch'\n")
    keys.chmod(0o600)
    events: list[LogEvent] = []

    @provider(ILogObserver)
    def observe(event: LogEvent) -> None:
        events.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        built("-e", "ollama", "--keys", str(keys), *extra)
    finally:
        globalLogPublisher.removeObserver(observe)
    notes = [formatEvent(e) for e in events if "priorities change nothing" in formatEvent(e)]
    assert notes == (
        [
            '1 key has priority = "batch", but every node has unlimited slots: nothing queues, so'
            " priorities change nothing; set slots = N on the nodes (or --default-slots)"
            " (docs/behaviour.md §16.3)"
        ]
        if noted
        else []
    )
