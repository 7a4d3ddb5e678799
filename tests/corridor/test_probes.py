"""docs/behaviour.md §17.6: the facade answers "is the engine there?" itself, never one node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from twisted.internet.task import Clock

from nvpair_tw.corridor._probes import OLLAMA_API_VERSION, VERSION_WAIT
from nvpair_tw.nodes import Node
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]
MODEL = "smollm2"
ALICE = "sk-alice-0123456789"


def openai_node(clock: Clock, **kw: object) -> SimulatedEngine:
    return SimulatedEngine(clock, (MODEL,), kind="openai", **kw)  # type: ignore[arg-type]


def ollama_node(clock: Clock, **kw: object) -> SimulatedEngine:
    return SimulatedEngine(clock, (MODEL,), kind="ollama", **kw)  # type: ignore[arg-type]


def test_head_and_get_root_say_ollama_is_running_without_any_node(memory_cluster: Make) -> None:
    """The CLI's heartbeat is answered by the facade even when the only node is frozen."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": ollama_node(clock, frozen=True)})
    got = cluster.fetch("GET", "/")
    assert got.status == 200 and got.body == b"Ollama is running"
    assert got.header("content-type") == "text/plain; charset=utf-8"
    head = cluster.fetch("HEAD", "/")
    assert head.status == 200 and head.body == b""
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    assert [r.path for r in engine.received] == []


def test_version_is_the_first_answering_ollama_node(memory_cluster: Make) -> None:
    """An ollama-kind node's version is the facade's; an openai node is not asked."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock), "a": ollama_node(clock)})
    got = cluster.fetch("GET", "/api/version")
    assert got.status == 200 and got.json() == {"version": "0.0.0-simulated"}
    b = cluster.engines["b"]
    assert isinstance(b, SimulatedEngine)
    assert b.received == []


def test_version_without_an_ollama_node_is_the_documented_constant(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    got = cluster.fetch("GET", "/api/version")
    assert got.status == 200 and got.json() == {"version": OLLAMA_API_VERSION}


def test_version_with_every_ollama_node_frozen_is_answered_within_two_seconds(
    memory_cluster: Make,
) -> None:
    """A frozen node cannot hold ``/api/version``: the constant comes at :data:`VERSION_WAIT`."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": ollama_node(clock, frozen=True)})
    pending = cluster.request("GET", "/api/version")
    cluster.advance(VERSION_WAIT - 0.1)
    assert not pending.called
    cluster.advance(0.2)
    got = cluster.result(pending)
    assert got.status == 200 and got.json() == {"version": OLLAMA_API_VERSION}


def test_openai_health_is_ok_while_a_node_is_usable(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)}, facades=("openai",))
    got = cluster.fetch("GET", "/health")
    assert got.status == 200 and got.json() == {"status": "ok"}


def test_openai_health_is_503_when_every_node_is_cordoned(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)}, facades=("openai",))
    facade = cluster.facade("openai")
    for node in facade.directory.nodes():
        facade.cordons.cordon(node.id, "maintenance")
    got = cluster.fetch("GET", "/health")
    assert got.status == 503 and got.json()["code"] == "no-usable-node"
    b = cluster.engines["b"]
    assert isinstance(b, SimulatedEngine)
    assert b.received == []


def test_other_unknown_routes_of_the_openai_facade_stay_404(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)}, facades=("openai",))
    assert cluster.fetch("GET", "/healthz").status == 404
    assert cluster.fetch("GET", "/").status == 404


def test_openai_health_is_503_when_no_node_has_answered_a_poll(memory_cluster: Make) -> None:
    """A polled node that never answered its inventory poll is not usable."""
    clock = Clock()
    engine = openai_node(clock, frozen=True)
    polled = Node("b", "http://b.node.test:11434", kind="openai")
    cluster = memory_cluster(clock, {"b": engine}, facades=("openai",), nodes={"openai": [polled]})
    got = cluster.fetch("GET", "/health")
    assert got.status == 503 and got.json()["code"] == "no-usable-node"


def test_probes_come_after_the_key_check_and_any_role_may_read_them(
    memory_cluster: Make, tmp_path: Path
) -> None:
    """docs/behaviour.md §14.2: a ``user`` key may read the probes (recorded under its name);
    a prompt-less generate outside its scope is still 403 before anything answers it."""
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[key]]\nname = "alice"\nkey = "{ALICE}"\nmodels = ["llama3*"]\n')
    keys.chmod(0o600)
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)}, keys_file=str(keys), environ={})
    alice = {"Authorization": f"Bearer {ALICE}"}
    assert cluster.fetch("HEAD", "/", headers=alice).status == 200
    assert cluster.fetch("GET", "/api/version", headers=alice).status == 200
    preload = cluster.fetch("POST", "/api/generate", json={"model": MODEL}, headers=alice)
    assert preload.status == 403 and preload.json()["code"] == "model-not-allowed"
    records = [e.payload for e in cluster.events if e.name == "proxy/request"]
    assert [(r["key"], r["status"]) for r in records] == [
        ("alice", 200),
        ("alice", 200),
        ("alice", 403),
    ]
