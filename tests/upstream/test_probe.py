"""Tests for nvpair_tw.upstream._probe: the expiry probe over real loopback sockets, on both
upstream agents; its bound runs on an injected ``task.Clock``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest_twisted
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from nvpair_tw.upstream import node_answers

TIMEOUT = 3.0


class Node(Protocol):
    """A node that answers the request with ``head`` then ``body`` (or stays silent for ``b""``),
    and says when the request arrived and when the connection is gone."""

    def __init__(self, head: bytes, body: bytes, seen: Deferred[bytes], gone: Deferred[None]):
        self._head, self._body, self._seen, self._gone = head, body, seen, gone

    def dataReceived(self, data: bytes) -> None:
        if not self._seen.called:
            self._seen.callback(data)
            if self._head and self.transport is not None:
                self.transport.write(self._head + self._body)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self._gone.called:
            self._gone.callback(None)


class Nodes(Factory):
    def __init__(self, head: bytes = b"", body: bytes = b"") -> None:
        self.seen: Deferred[bytes] = Deferred()
        self.gone: Deferred[None] = Deferred()
        self._head, self._body = head, body

    def buildProtocol(self, addr: Any) -> Node:
        return Node(self._head, self._body, self.seen, self.gone)


def _probe(http: HTTPClient, clock: Clock, port: int) -> Deferred[bool]:
    url = f"http://127.0.0.1:{port}/api/tags"
    return Deferred.fromCoroutine(node_answers(http, clock, url, timeout=TIMEOUT))


@pytest_twisted.ensureDeferred
async def test_any_status_is_an_answer(http: HTTPClient, listen: Callable[[Any], int]) -> None:
    """A node that says 503 is not frozen: the probe reports an answer."""
    nodes = Nodes(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\n", b"busy")
    clock = Clock()
    assert await _probe(http, clock, listen(nodes)) is True
    request = await nodes.seen
    assert request.startswith(b"GET /api/tags HTTP/1.1\r\n")
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_the_answer_is_the_head_and_the_body_is_never_read(
    http: HTTPClient, listen: Callable[[Any], int]
) -> None:
    """Headers then a body that never ends: the probe answers at the head and tears the
    connection down instead of waiting for the body."""
    nodes = Nodes(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n", b'{"models": [')
    clock = Clock()
    assert await _probe(http, clock, listen(nodes)) is True
    await nodes.gone
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_a_silent_node_is_no_answer_at_the_bound(
    http: HTTPClient, listen: Callable[[Any], int]
) -> None:
    """A node that takes the request and never answers: pending until the bound, then ``False``."""
    nodes = Nodes()
    clock = Clock()
    probe = _probe(http, clock, listen(nodes))
    await nodes.seen
    clock.advance(TIMEOUT - 0.001)
    assert not probe.called
    clock.advance(0.001)
    assert await probe is False
    await nodes.gone  # the abandoned request's connection is closed
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_a_refused_connection_is_no_answer(
    http: HTTPClient, listen: Callable[[Any], int], reactor: Any
) -> None:
    """Nothing listening: no headers, so no answer; the bound's timer is cancelled."""
    port = reactor.listenTCP(0, Nodes(), interface="127.0.0.1")
    number = port.getHost().port
    await port.stopListening()
    clock = Clock()
    assert await _probe(http, clock, number) is False
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_an_unusable_url_is_no_answer(http: HTTPClient) -> None:
    """A URL the client refuses synchronously is no answer, not an exception."""
    clock = Clock()
    probe = Deferred.fromCoroutine(node_answers(http, clock, "not a url", timeout=TIMEOUT))
    assert await probe is False
    assert clock.getDelayedCalls() == []
