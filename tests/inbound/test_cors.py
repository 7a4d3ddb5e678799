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
    ``*``, whatever the node was configured with; a request without an origin gets none of the
    node's CORS headers either (§14.5)."""
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
    assert not plain.headers.hasHeader(b"access-control-allow-origin")  # §14.5: the proxy's


@define
class CredentialedEngine(SimulatedEngine):
    """An engine that grants every origin, with credentials."""

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        request.setHeader(b"access-control-allow-origin", b"https://evil.example")
        request.setHeader(b"access-control-allow-credentials", b"true")
        return super().render(request)


def test_an_origin_not_allowed_gets_no_cors_header_from_a_node(
    memory_cluster: Callable[..., Any],
) -> None:
    """The finding (§14.5): with ``--cors-origin https://ok.example``, a page on
    ``https://evil.example`` received the node's ``Allow-Origin`` and ``Allow-Credentials:
    true``. Now the node's CORS headers are removed and ``ok.example`` alone gets a grant."""
    clock = Clock()
    cluster: MemoryCluster = memory_cluster(
        clock,
        {"a": CredentialedEngine(clock)},
        settings=Settings(cors_origins=("https://ok.example",)),
    )
    cluster.flush()
    chat = {"model": "llama3", "messages": [], "stream": False}
    evil = cluster.fetch("POST", "/api/chat", json=chat, headers={"Origin": "https://evil.example"})
    # A foreign Origin makes a loopback caller remote (§14.2): refused, and still no grant.
    assert (evil.status, evil.json()["code"]) == (403, "host-not-allowed")
    assert [n for n, _ in evil.headers.getAllRawHeaders() if n.lower().startswith(b"access-")] == []
    ok = cluster.fetch("POST", "/api/chat", json=chat, headers={"Origin": "https://ok.example"})
    assert ok.headers.getRawHeaders(b"access-control-allow-origin") == [b"https://ok.example"]
    assert not ok.headers.hasHeader(b"access-control-allow-credentials")
