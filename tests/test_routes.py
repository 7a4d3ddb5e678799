"""Issue 14 through the facade: per-node credentials, model-routed and aggregated routes, LM Studio's
REST API, ``/v1/responses`` and ``X-NVPair-Node`` (docs/behaviour.md §2.1, §3), on simulated
engines in memory (``MemoryCluster``) and over loopback (``ProxyCluster``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from zope.interface import implementer

from nvpair_tw.admin import StatusBoard
from nvpair_tw.control import ControlMethods
from nvpair_tw.nodes import Node
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]

CANARY_A = "cnry-nodekey-a-4e1f9c"
CANARY_B = "cnry-nodekey-b-7a20d3"
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}


def host(node_id: str) -> str:
    """The base URL ``MemoryCluster`` serves engine ``node_id`` at (ids that are host names)."""
    return f"http://{node_id}.node.test:11434"


def authorizations(engine: SimulatedEngine) -> set[bytes]:
    """Every ``Authorization`` value the engine received."""
    return {value for r in engine.received for value in r.headers.get(b"authorization", [])}


@implementer(ILogObserver)
class LogLines:
    """Every log event while installed, rendered."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)

    def texts(self) -> list[str]:
        return [str(formatEvent(e)) + repr(e) for e in self.events]


@pytest.fixture
def log_lines() -> Iterator[LogLines]:
    lines = LogLines()
    globalLogPublisher.addObserver(lines)
    yield lines
    globalLogPublisher.removeObserver(lines)


# --- per-node credentials (SPEC §3) -------------------------------------------------------------


def keyed_cluster(make: Make, clock: Clock, **kw: Any) -> MemoryCluster:
    """Nodes a and b each requiring their own bearer key, polled for inventory."""
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",), api_key=CANARY_A, **kw),
        "b": SimulatedEngine(clock, ("llama3:latest", "qwen:latest"), api_key=CANARY_B, **kw),
    }
    nodes = [Node("a", host("a"), api_key=CANARY_A), Node("b", host("b"), api_key=CANARY_B)]
    cluster = make(clock, engines, nodes={"ollama": nodes})
    cluster.flush()
    return cluster


def test_each_node_is_sent_only_its_own_key_on_every_kind_of_request(memory_cluster: Make) -> None:
    """Inventory polls, inference (the client's own Authorization replaced), pass-through and the
    model-list fan-out all reach each keyed node with its own key, and only with it."""
    clock = Clock()
    cluster = keyed_cluster(memory_cluster, clock)
    facade = cluster.facade()
    assert facade.inventory.models("b") == {"llama3:latest", "qwen:latest"}  # the polls succeeded
    qwen = cluster.fetch(
        "POST", "/api/chat", json={**CHAT, "model": "qwen"}, headers={"authorization": "Bearer x"}
    )
    assert (qwen.status, qwen.header("x-nvpair-node")) == (200, "b")
    tags = cluster.fetch("GET", "/api/tags")
    assert tags.status == 200 and len(tags.json()["models"]) == 2
    version = cluster.fetch("GET", "/api/version")
    assert version.status == 200
    a, b = cluster.engines["a"], cluster.engines["b"]
    assert isinstance(a, SimulatedEngine) and isinstance(b, SimulatedEngine)
    assert authorizations(a) == {f"Bearer {CANARY_A}".encode()}
    assert authorizations(b) == {f"Bearer {CANARY_B}".encode()}
    assert {r.path for r in b.received} >= {b"/api/tags", b"/api/chat"}


def test_a_node_without_a_key_still_gets_the_clients_authorization(memory_cluster: Make) -> None:
    """Only a node with its own credential has the client's header replaced."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock)})
    response = cluster.fetch("POST", "/api/chat", json=CHAT, headers={"authorization": "Bearer c"})
    assert response.status == 200
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    assert authorizations(engine) == {b"Bearer c"}


def test_url_userinfo_becomes_basic_authorization_and_is_never_sent_in_the_url(
    memory_cluster: Make,
) -> None:
    """``http://user:pass@host`` reaches the node as ``Authorization: Basic`` on inference and on
    the inventory poll."""
    clock = Clock()
    engine = SimulatedEngine(clock, api_key=None)
    cluster = memory_cluster(
        clock,
        {"a": engine},
        nodes={"ollama": [Node("a", "http://us%40r:p%3Ass@a.node.test:11434")]},
    )
    cluster.flush()
    assert cluster.fetch("POST", "/api/chat", json=CHAT).status == 200
    assert authorizations(engine) == {b"Basic dXNAcjpwOnNz"}  # base64("us@r:p:ss")
    assert all(b"@" not in r.path for r in engine.received)
    assert {r.path for r in engine.received} == {b"/api/tags", b"/api/chat"}


def test_no_node_key_or_userinfo_reaches_logs_events_nodes_list_or_the_status_page(
    memory_cluster: Make, log_lines: LogLines
) -> None:
    """Canary keys (and a URL password) appear in no log line, event, ``nodes/list`` answer or
    ``/api/state`` snapshot, through success, a 401 and a failed poll."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, api_key=CANARY_A),
        "b": SimulatedEngine(clock, api_key="another"),  # b refuses its key: a 401, a failed poll
    }
    nodes = [
        Node("a", host("a"), api_key=CANARY_A),
        Node("b", f"http://u:{CANARY_B}@b.node.test:11434"),
    ]
    cluster = memory_cluster(clock, engines, nodes={"ollama": nodes})
    cluster.flush()
    cluster.fetch("POST", "/api/chat", json=CHAT)
    cluster.fetch("GET", "/api/tags")
    cluster.fetch("GET", "/api/version", headers={"x-nvpair-node": "b"})
    listed = ControlMethods(cluster.runtime).call("nodes/list", {})
    board = StatusBoard(cluster.runtime)
    state = board.state(lambda _engine: True)
    board.close()
    texts = [
        *log_lines.texts(),
        *(json.dumps(dict(e.payload)) + repr(e) for e in cluster.events),
        json.dumps(listed),
        json.dumps(state),
        repr(cluster.facade().directory.nodes()),
    ]
    assert any("inventory poll of b failed" in t for t in texts)  # the failure was logged
    assert [u["url"] for u in listed["nodes"]] == [host("a"), host("b")]
    basic = base64.b64encode(f"u:{CANARY_B}".encode()).decode()
    for canary in (CANARY_A, CANARY_B, basic):
        assert not [t for t in texts if canary in t], canary
