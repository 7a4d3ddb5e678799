"""The facade over real loopback sockets: routing kinds, the relay, errors the proxy makes."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq
from twisted.web.client import Agent, HTTPConnectionPool

from nvpair_tw.nodes import Node
from nvpair_tw.settings import Settings
from nvpair_tw.testing import Behaviour, SimulatedEngine, always, start_engine, start_proxy

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()


def client(reactor: Any) -> treq.client.HTTPClient:
    return treq.client.HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


@pytest_twisted.ensureDeferred
async def test_streaming_chat_is_relayed_intact_with_node_headers(reactor: Any) -> None:
    """A healthy node's NDJSON stream reaches the client byte for byte, naming the node and request."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=5))
    proxy = await start_proxy(
        reactor, {"ollama": [Node("a", engine.url, ("llama3:latest",))]}, Settings()
    )
    try:
        response = await client(reactor).post(proxy.url() + "/api/chat", data=CHAT)
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
