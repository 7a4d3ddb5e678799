"""What the node client's tests share: a scripted node over loopback (a Twisted ``Protocol``
that answers each request head with bytes the test chose), a body collector, producers, and
chunked streams with the cuts of their reads (Hypothesis)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IConsumer, IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from nvpair_tw.upstream._attempt import (
    ReplayBodyProducer,
)

__all__ = [
    "CHUNKED_HEAD",
    "SECRET",
    "Collect",
    "Loopback",
    "Reply",
    "ScriptedNode",
    "ServerConnection",
    "StuckProducer",
    "answer",
    "chunked",
    "chunked_streams",
    "failure_of",
    "fetch",
    "length_reply",
    "split",
    "url",
]

SECRET = b"PROMPT-SECRET-91c2"


# ---- a scripted node over loopback --------------------------------------------------------------

Reply = Callable[["ServerConnection", bytes], None]


class ServerConnection(Protocol):
    """Reads request heads (and Content-Length bodies) and answers each with ``node.reply``."""

    def __init__(self, node: ScriptedNode) -> None:
        self.node = node
        self.buffer = b""
        self.lost: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.node.accepted += 1
        self.node.connections.append(self)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.node.requests.append(head + b"\r\n\r\n" + rest[:length])
            self.node.reply(self, head)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        assert self.transport is not None
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
        self.lost.callback(None)


class ScriptedNode(Factory):
    """Counts accepted connections; every request head goes to ``reply``."""

    noisy = False

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.accepted = 0
        self.connections: list[ServerConnection] = []
        self.requests: list[bytes] = []

    def buildProtocol(self, addr: Any) -> ServerConnection:
        return ServerConnection(self)


def answer(raw: bytes, *, close: bool = False) -> Reply:
    """A reply that writes ``raw`` in one write (and closes the connection when ``close``)."""

    def reply(connection: ServerConnection, head: bytes) -> None:
        connection.write(raw)
        if close:
            connection.close()

    return reply


def chunked(payloads: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def length_reply(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


@implementer(IAgentEndpointFactory)
class Loopback:
    """Plain TCP4 endpoints (a refusal fails at once)."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        return TCP4ClientEndpoint(self._reactor, uri.host.decode(), uri.port, timeout=5)


class Collect(Protocol):
    """A body protocol recording each ``dataReceived`` call and the end."""

    def __init__(self, on_data: Callable[[Collect, bytes], None] | None = None) -> None:
        self.calls: list[bytes] = []
        self.done: Deferred[None] = Deferred()
        self.ended: Failure | None = None
        self._on_data = on_data

    def dataReceived(self, data: bytes) -> None:
        self.calls.append(data)
        if self._on_data is not None:
            self._on_data(self, data)

    def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
        self.ended = reason
        self.done.callback(None)

    @property
    def body(self) -> bytes:
        return b"".join(self.calls)


def url(port: int, path: bytes = b"/") -> bytes:
    return b"http://127.0.0.1:%d%s" % (port, path)


async def fetch(
    agent: IAgent,
    port: int,
    method: bytes = b"GET",
    headers: Headers | None = None,
    body: bytes | None = None,
) -> tuple[IResponse, Collect, Failure]:
    """One request; the response, its collected body and how the body ended."""
    producer = ReplayBodyProducer(body, lambda: None) if body is not None else None
    response = await agent.request(method, url(port), headers, producer)
    collect = Collect()
    response.deliverBody(collect)
    await collect.done
    assert collect.ended is not None
    return response, collect, collect.ended


def failure_of(deferred: Deferred[Any]) -> Failure:
    failures: list[Failure] = []
    deferred.addErrback(failures.append)
    [failure] = failures
    return failure


@implementer(IBodyProducer)
class StuckProducer:
    """Writes a little, then never finishes (or fails when ``fail`` is set)."""

    length = 100

    def __init__(self, fail: bool = False) -> None:
        self.done: Deferred[None] = Deferred()
        self.stopped = False
        self._fail = fail

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(b"x" * 10)
        if self._fail:
            return Deferred.fromCoroutine(self._broken())
        return self.done

    async def _broken(self) -> None:
        raise RuntimeError("producer broke")

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def stopProducing(self) -> None:
        self.stopped = True


# ---- chunked decoding under any split -----------------------------------------------------------


@st.composite
def chunked_streams(draw: st.DrawFn) -> tuple[bytes, bytes, list[int]]:
    payloads = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=12))
    pieces = []
    for payload in payloads:
        extension = draw(st.sampled_from([b"", b";name=value"]))
        size = b"%x" % len(payload)
        pieces.append(draw(st.sampled_from([size, size.upper()])) + extension + b"\r\n")
        pieces.append(payload + b"\r\n")
    trailer = draw(st.sampled_from([b"", b"X-Trailer: t\r\n"]))
    stream = b"".join(pieces) + b"0\r\n" + trailer + b"\r\n"
    cuts = draw(st.lists(st.integers(0, len(stream)), max_size=20))
    return stream, b"".join(payloads), sorted(cuts)


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]
