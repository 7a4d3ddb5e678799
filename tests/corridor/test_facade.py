"""The facade in memory (``MemoryCluster``): routing kinds, the relay, errors the proxy makes."""

from __future__ import annotations

import json
from collections.abc import Callable

from twisted.internet.task import Clock

from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()

Make = Callable[..., MemoryCluster]


def one_node(memory_cluster: Make, chunks: int = 3) -> MemoryCluster:
    """An Ollama facade over one simulated node ``a`` advertising llama3:latest."""
    clock = Clock()
    return memory_cluster(clock, {"a": SimulatedEngine(clock, chunks=chunks)})


def engine_a(cluster: MemoryCluster) -> SimulatedEngine:
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    return engine


def test_streaming_chat_is_relayed_intact_with_node_headers(memory_cluster: Make) -> None:
    """A healthy node's NDJSON stream reaches the client byte for byte, naming the node and request."""
    cluster = one_node(memory_cluster, chunks=5)
    direct = cluster.fetch("POST", "/api/chat", data=CHAT, node="a")
    response = cluster.fetch("POST", "/api/chat", data=CHAT)
    assert response.status == 200 and response.complete
    assert response.body == direct.body
    lines = response.body.splitlines()
    assert len(lines) == 6 and json.loads(lines[-1])["done"] is True
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"a"]
    assert response.headers.getRawHeaders(b"x-nvpair-request-id")
    assert cluster.received("a") == [CHAT, CHAT]


def test_requests_during_shutdown_get_a_503_json_error(memory_cluster: Make) -> None:
    """Once the drain has begun, a request gets 503 JSON and no node sees it."""
    cluster = one_node(memory_cluster)
    cluster.runtime.shared.draining = True
    response = cluster.fetch("POST", "/api/chat", data=CHAT)
    assert response.status == 503 and response.json()["code"] == "shutting-down"
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert engine_a(cluster).received == []


def test_unowned_model_gets_404_without_contacting_any_node(memory_cluster: Make) -> None:
    """The capability gate answers 404 in Ollama's words when every inventory is known and none
    lists the model (docs/behaviour.md §4.2), naming the models the caller may use; no engine is
    contacted."""
    cluster = one_node(memory_cluster)
    response = cluster.fetch("POST", "/api/chat", json={"model": "mistral", "messages": []})
    assert response.status == 404
    assert response.json() == {
        "error": 'model "mistral" not found, try pulling it first'
        " (models you may use: llama3:latest)",
        "code": "model-not-found",
    }
    assert response.headers.getRawHeaders(b"x-content-type-options") == [b"nosniff"]
    assert engine_a(cluster).received == []


def test_pass_through_commits_on_headers_and_keeps_query(memory_cluster: Make) -> None:
    """A non-model route is forwarded verbatim (method, path, query) and answered by the first node."""
    cluster = one_node(memory_cluster)
    response = cluster.fetch("GET", "/api/other?verbose=1")
    assert response.status == 200 and response.json() == {"version": "0.0.0-simulated"}
    assert engine_a(cluster).received[-1].path == b"/api/other?verbose=1"
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"a"]


def test_a_known_length_is_relayed_as_content_length(memory_cluster: Make) -> None:
    """A non-streamed answer keeps its Content-Length framing instead of becoming chunked."""
    cluster = one_node(memory_cluster)
    response = cluster.fetch("GET", "/api/other")
    assert response.length == len(response.body) == len(b'{"version": "0.0.0-simulated"}')
    assert response.headers.getRawHeaders(b"transfer-encoding") is None
