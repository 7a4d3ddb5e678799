"""The facade over real loopback sockets: routing kinds, the relay, errors the proxy makes."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq

from nvpair_tw.nodes import Node
from nvpair_tw.settings import Settings
from nvpair_tw.testing import SimulatedEngine, http_client, start_engine, start_proxy

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest_twisted.ensureDeferred
async def test_streaming_chat_is_relayed_intact_with_node_headers(reactor: Any) -> None:
    """A healthy node's NDJSON stream reaches the client byte for byte, naming the node and request."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=5))
    proxy = await start_proxy(
        reactor, {"ollama": [Node("a", engine.url, ("llama3:latest",))]}, Settings()
    )
    try:
        response = await http_client(reactor).post(proxy.url() + "/api/chat", data=CHAT)
        body = await treq.content(response)
        assert response.code == 200
        lines = body.splitlines()
        assert len(lines) == 6 and json.loads(lines[-1])["done"] is True
        assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"a"]
        assert response.headers.getRawHeaders(b"x-nvpair-request-id")
        assert engine.engine.received[0].body == CHAT
    finally:
        await proxy.stop()
        await engine.stop()


@pytest_twisted.ensureDeferred
async def test_requests_during_shutdown_get_a_503_json_error(reactor: Any) -> None:
    """Once the drain has begun, a request on an open keep-alive connection gets 503 and no node sees it."""
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor, {"ollama": [Node("a", engine.url, ("llama3:latest",))]}, Settings()
    )
    try:
        proxy.runtime.shared.draining = True
        response = await http_client(reactor).post(proxy.url() + "/api/chat", data=CHAT)
        body = json.loads(await treq.content(response))
        assert response.code == 503 and body["code"] == "shutting-down"
        assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
        assert engine.engine.received == []
    finally:
        await proxy.stop()
        await engine.stop()


@pytest_twisted.ensureDeferred
async def test_unowned_model_gets_502_without_contacting_any_node(reactor: Any) -> None:
    """The capability gate answers 502 JSON when no inventory lists the model; no engine is contacted."""
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor, {"ollama": [Node("a", engine.url, ("llama3:latest",))]}, Settings()
    )
    try:
        data = json.dumps({"model": "mistral", "messages": []}).encode()
        response = await http_client(reactor).post(proxy.url() + "/api/chat", data=data)
        body = json.loads(await treq.content(response))
        assert response.code == 502
        assert body == {
            "error": "no available node advertises the requested model",
            "code": "no-model-owner",
        }
        assert response.headers.getRawHeaders(b"x-content-type-options") == [b"nosniff"]
        assert engine.engine.received == []
    finally:
        await proxy.stop()
        await engine.stop()


@pytest_twisted.ensureDeferred
async def test_pass_through_commits_on_headers_and_keeps_query(reactor: Any) -> None:
    """A non-model route is forwarded verbatim (method, path, query) and answered by the first node."""
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor, {"ollama": [Node("a", engine.url, ("llama3:latest",))]}, Settings()
    )
    try:
        response = await http_client(reactor).get(proxy.url() + "/api/version?verbose=1")
        body = json.loads(await treq.content(response))
        assert response.code == 200 and body == {"version": "0.0.0-simulated"}
        assert engine.engine.received[-1].path == b"/api/version?verbose=1"
        assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"a"]
    finally:
        await proxy.stop()
        await engine.stop()


@pytest_twisted.ensureDeferred
async def test_a_known_length_is_relayed_as_content_length(reactor: Any) -> None:
    """A non-streamed answer keeps its Content-Length framing instead of becoming chunked."""
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor, {"ollama": [Node("a", engine.url, ("llama3:latest",))]}, Settings()
    )
    try:
        response = await http_client(reactor).get(proxy.url() + "/api/version")
        body = await treq.content(response)
        assert response.length == len(body) == len(b'{"version": "0.0.0-simulated"}')
        assert response.headers.getRawHeaders(b"transfer-encoding") is None
    finally:
        await proxy.stop()
        await engine.stop()
