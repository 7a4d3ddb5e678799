"""``model/load`` and ``model/unload`` on a llama.cpp router (docs/behaviour.md §13.3, §17.2), and
LM Studio 0.4's native routes through the lmstudio facade (§17.1), over simulated engines in memory
on one ``task.Clock``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.ops._control import ControlMethods
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster


def _ask(cluster: MemoryCluster, method: str, params: dict[str, Any]) -> Any:
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    pending = ControlMethods(cluster.runtime).handle_line(line.encode())
    assert isinstance(pending, Deferred)
    cluster.flush()
    assert pending.called
    result: Any = pending.result
    return result["result"]


def _router_cluster(
    memory_cluster: Callable[..., MemoryCluster], engine: SimulatedEngine, clock: Clock
) -> MemoryCluster:
    node = Node("r", "http://r.node.test:11434", kind="openai")
    cluster = memory_cluster(clock, {"r": engine}, facades=["openai"], nodes={"openai": [node]})
    cluster.flush()
    return cluster


def test_a_router_loads_and_unloads_through_its_own_api(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """An ``openai`` node that answered as a router is loaded with ``POST /models/load`` and
    unloaded with ``POST /models/unload``, ``{"model"}``; the residency follows at once."""
    clock = Clock()
    engine = SimulatedEngine(clock, models=("a", "b"), loaded=[], kind="openai", models_max=2)
    cluster = _router_cluster(memory_cluster, engine, clock)
    assert cluster.facade().inventory.resident("r", "a") is False
    loaded = _ask(cluster, "model/load", {"model": "a"})
    assert loaded == {"model": "a", "nodes": {"r": {"status": "loaded"}}}
    assert cluster.facade().inventory.resident("r", "a") is True
    unloaded = _ask(cluster, "model/unload", {"model": "a"})
    assert unloaded["nodes"] == {"r": {"status": "unloaded"}}
    assert cluster.facade().inventory.resident("r", "a") is False
    posts = [(r.path, json.loads(r.body)) for r in engine.received if r.method == b"POST"]
    assert posts == [(b"/models/load", {"model": "a"}), (b"/models/unload", {"model": "a"})]


def test_a_one_model_llama_server_has_no_load_api(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    clock = Clock()
    engine = SimulatedEngine(clock, models=("a",), kind="openai")
    cluster = _router_cluster(memory_cluster, engine, clock)
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "model/load", "params": {"model": "a"}})
    answer = ControlMethods(cluster.runtime).handle_line(line.encode())
    assert isinstance(answer, dict) and answer["error"]["code"] == -32602


def test_the_lmstudio_facade_serves_v1_chat_and_lists_v1_models(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """§17.1: ``POST /api/v1/chat`` is gated on its model and sent to the LM Studio node that has
    it; ``GET /api/v1/models`` merges every node's records by ``key``."""
    clock = Clock()
    engines = {
        "m": SimulatedEngine(clock, models=("qwen",), loaded=["qwen"], kind="lmstudio"),
        "n": SimulatedEngine(clock, models=("phi",), loaded=[], kind="lmstudio"),
    }
    nodes = [Node(i, f"http://{i}.node.test:11434", kind="lmstudio") for i in engines]
    cluster = memory_cluster(clock, engines, facades=["lmstudio"], nodes={"lmstudio": nodes})
    cluster.flush()
    chat = {"model": "phi", "input": "hello"}
    pending = cluster.request("POST", "/api/v1/chat", json=chat)
    cluster.flush()
    answer = cluster.result(pending)
    assert (answer.status, answer.header("x-nvpair-node")) == (200, "n")
    assert json.loads(answer.body)["output"][0]["type"] == "message"
    missing = cluster.request("POST", "/api/v1/chat", json={"model": "nope", "input": "x"})
    cluster.flush()
    assert cluster.result(missing).status == 404
    listed = cluster.request("GET", "/api/v1/models")
    cluster.flush()
    models = json.loads(cluster.result(listed).body)["models"]
    assert sorted(m["key"] for m in models) == ["phi", "qwen"]
