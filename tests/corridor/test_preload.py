"""docs/behaviour.md §17.6: Ollama's prompt-less ``/api/generate`` for nodes of another kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]
MODEL = "smollm2"


def sent(engine: SimulatedEngine) -> list[tuple[bytes, Any]]:
    return [(r.path, json.loads(r.body)) for r in engine.received if r.method == b"POST"]


def engine(cluster: MemoryCluster, node_id: str) -> SimulatedEngine:
    found = cluster.engines[node_id]
    assert isinstance(found, SimulatedEngine)
    return found


def test_a_preload_for_an_openai_node_is_answered_at_once(memory_cluster: Make) -> None:
    """A kind without a load API: ``done: true``, ``done_reason: "load"``, no node contacted."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": SimulatedEngine(clock, (MODEL,), kind="openai")})
    got = cluster.fetch("POST", "/api/generate", json={"model": MODEL, "keep_alive": "5m"})
    assert got.status == 200
    answer = got.json()
    assert answer == {
        "model": MODEL,
        "created_at": "1970-01-01T00:00:00Z",
        "response": "",
        "done": True,
        "done_reason": "load",
    }
    assert sent(engine(cluster, "b")) == []


def test_an_unload_for_an_openai_node_says_unload(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": SimulatedEngine(clock, (MODEL,), kind="openai")})
    for keep_alive in (0, "0", "0s"):
        got = cluster.fetch(
            "POST", "/api/generate", json={"model": MODEL, "keep_alive": keep_alive}
        )
        assert got.json()["done_reason"] == "unload"


def test_a_preload_for_an_lmstudio_node_goes_through_its_load_api(memory_cluster: Make) -> None:
    clock = Clock()
    studio = SimulatedEngine(clock, (MODEL,), kind="lmstudio", loaded=())
    cluster = memory_cluster(clock, {"l": studio})
    got = cluster.fetch("POST", "/api/generate", json={"model": MODEL})
    assert got.status == 200 and got.json()["done_reason"] == "load"
    assert got.header("x-nvpair-node") == "l"
    assert sent(studio) == [(b"/api/v1/models/load", {"model": MODEL})]
    got = cluster.fetch("POST", "/api/generate", json={"model": MODEL, "keep_alive": 0})
    assert got.json()["done_reason"] == "unload"
    assert sent(studio)[-1] == (b"/api/v1/models/unload", {"instance_id": MODEL})


def test_a_prompt_still_goes_down_the_corridor_translated(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": SimulatedEngine(clock, (MODEL,), kind="openai")})
    got = cluster.fetch("POST", "/api/generate", json={"model": MODEL, "prompt": "hi"})
    assert got.status == 200
    assert [path for path, _ in sent(engine(cluster, "b"))] == [b"/v1/chat/completions"]


def test_a_preload_with_an_ollama_owner_is_the_ollama_nodes(memory_cluster: Make) -> None:
    """A node that speaks the route natively answers it itself."""
    clock = Clock()
    engines = {
        "b": SimulatedEngine(clock, (MODEL,), kind="openai"),
        "a": SimulatedEngine(clock, (MODEL,), kind="ollama"),
    }
    cluster = memory_cluster(clock, engines)
    got = cluster.fetch("POST", "/api/generate", json={"model": MODEL})
    assert got.status == 200 and got.header("x-nvpair-node") == "a"
    assert sent(engine(cluster, "a")) == [(b"/api/generate", {"model": MODEL})]
    assert sent(engine(cluster, "b")) == []


def test_a_named_node_without_the_model_is_left_to_the_corridors_gate(
    memory_cluster: Make,
) -> None:
    """``X-NVPair-Node`` naming a node that lacks the model: not answered here (§14.2's gate)."""
    clock = Clock()
    engines = {
        "b": SimulatedEngine(clock, (MODEL,), kind="openai"),
        "c": SimulatedEngine(clock, ("other",), kind="openai"),
    }
    cluster = memory_cluster(clock, engines)
    named = cluster.fetch(
        "POST", "/api/generate", json={"model": MODEL}, headers={"x-nvpair-node": "c"}
    )
    assert "done_reason" not in named.body.decode()
    got = cluster.fetch(
        "POST", "/api/generate", json={"model": MODEL}, headers={"x-nvpair-node": "b"}
    )
    assert got.json()["done_reason"] == "load" and got.header("x-nvpair-node") == "b"


def test_a_failed_load_api_moves_on_and_none_left_is_502(memory_cluster: Make) -> None:
    clock = Clock()
    studio = SimulatedEngine(clock, (MODEL,), kind="lmstudio", loaded=())
    down = Node("down", "http://down.node.test:11434", (MODEL,), kind="lmstudio")
    cluster = memory_cluster(clock, {"l": studio}, nodes={"ollama": [down, "l"]})
    got = cluster.fetch("POST", "/api/generate", json={"model": MODEL})
    assert got.status == 200 and got.header("x-nvpair-node") == "l"
    alone = memory_cluster(clock, {"l": studio}, nodes={"ollama": [down]})
    refused = alone.fetch("POST", "/api/generate", json={"model": MODEL})
    assert refused.status == 502 and refused.json()["code"] == "load-failed"
