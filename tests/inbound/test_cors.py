"""Tests for nvpair_tw.inbound._cors: origins, the grant, and a node's own CORS headers replaced
(docs/behaviour.md §13.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from attrs import define
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from nvpair_tw.core import Settings
from nvpair_tw.inbound._cors import grant, parse_origin
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

ORIGIN = "http://localhost:3000"


@pytest.mark.parametrize(
    ("text", "origin"),
    [
        ("https://chat.example", "https://chat.example"),
        ("http://localhost:3000/", "http://localhost:3000"),
        (" https://a.example:8443 ", "https://a.example:8443"),
    ],
)
def test_an_origin_is_scheme_host_and_port(text: str, origin: str) -> None:
    assert parse_origin(text) == origin


@pytest.mark.parametrize(
    "text", ["*", "chat.example", "ftp://x", "https://x/path", "https://", "http://a b"]
)
def test_anything_else_is_refused_with_the_reason(text: str) -> None:
    with pytest.raises(ValueError, match=r"origin"):
        parse_origin(text)


def test_the_grant_replaces_a_nodes_and_adds_origin_to_vary() -> None:
    """A node's ``*`` gives way to the one allowed origin; ``Vary`` keeps what it had."""
    headers = Headers({b"access-control-allow-origin": [b"*"], b"vary": [b"Accept-Encoding"]})
    grant(headers, ORIGIN.encode())
    assert headers.getRawHeaders(b"access-control-allow-origin") == [ORIGIN.encode()]
    assert headers.getRawHeaders(b"vary") == [b"Accept-Encoding, Origin"]
    grant(headers, ORIGIN.encode())
    assert headers.getRawHeaders(b"vary") == [b"Accept-Encoding, Origin"]


@define
class PermissiveEngine(SimulatedEngine):
    """An engine that answers every request with its own ``Access-Control-Allow-Origin: *``."""

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        request.setHeader(b"access-control-allow-origin", b"*")
        return super().render(request)


def test_a_relayed_answer_carries_the_proxys_grant_not_the_nodes(
    memory_cluster: Callable[..., Any],
) -> None:
    """What a node says about CORS is replaced for an allowed origin: the page's origin, never
    ``*``, whatever the node was configured with."""
    clock = Clock()
    cluster: MemoryCluster = memory_cluster(
        clock,
        {"a": PermissiveEngine(clock)},
        settings=Settings(cors_origins=(ORIGIN,)),
    )
    cluster.flush()
    chat = {"model": "llama3", "messages": [], "stream": True}
    answer = cluster.fetch("POST", "/api/chat", json=chat, headers={"Origin": ORIGIN})
    assert answer.status == 200
    assert answer.headers.getRawHeaders(b"access-control-allow-origin") == [ORIGIN.encode()]
    plain = cluster.fetch("POST", "/api/chat", json=chat)
    assert plain.headers.getRawHeaders(b"access-control-allow-origin") == [b"*"]  # as without CORS
