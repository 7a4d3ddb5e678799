"""Tests for nvpair_tw.upstream._nodeclient: the upstream hop's own HTTP/1.1 client.

Network behaviour runs over loopback against small scripted servers (a Twisted ``Protocol`` that
answers each request head with bytes the test chose); framing edge cases that depend on how bytes
are split across reads drive the protocol over a ``StringTransport``, where the split is exact.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IConsumer, IPushProducer, IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss, _DataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgent, IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair_tw.core import IllegalCall
from nvpair_tw.upstream._attempt import (
    ReplayBodyProducer,
    describe_failure,
    is_cancellation,
    make_pool,
)
from nvpair_tw.upstream._agent import NodeAgent
from nvpair_tw.upstream._http1 import BadResponse, ChunkedDecoder
from nvpair_tw.upstream._protocol import ClientRequest, ClientState, NodeClientProtocol

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


@pytest_twisted.async_yield_fixture()
async def agent(reactor: Any) -> AsyncIterator[NodeAgent]:
    """A NodeAgent over loopback on the real reactor; idle connections closed afterwards."""
    made = NodeAgent(reactor, Loopback(reactor))
    yield made
    await made.close().addTimeout(5, reactor)  # bounded: a broken client fails, never hangs


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


# ---- coalescing ---------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_many_tiny_chunks_in_one_write_reach_the_body_in_one_call(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """500 tiny chunks written at once (well under one socket read) are one ``dataReceived``."""
    events = [b"data: %d\n\n" % i for i in range(500)]
    node = ScriptedNode(answer(CHUNKED_HEAD + chunked(events)))
    port = listen(node)
    response, collect, ended = await fetch(agent, port)
    assert response.length is UNKNOWN_LENGTH
    assert ended.check(ResponseDone)
    assert collect.calls == [b"".join(events)]


@pytest_twisted.ensureDeferred
async def test_content_length_body_is_one_call_per_read_and_ends_done(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """A Content-Length body arriving with its head is one call; the length is announced."""
    body = b"x" * 5000
    port = listen(ScriptedNode(answer(length_reply(body))))
    response, collect, ended = await fetch(agent, port)
    assert (response.code, response.length, response.version) == (200, 5000, (b"HTTP", 1, 1))
    assert collect.calls == [body]
    assert ended.check(ResponseDone)


@pytest_twisted.ensureDeferred
async def test_sse_burst_costs_one_call_per_read_natively_and_one_per_chunk_on_twisted(
    reactor: Any, agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """The point of the client: a 1,000-event SSE burst is a handful of ``dataReceived`` calls
    through NodeAgent, 1,000 through Twisted's Agent (one per HTTP chunk)."""
    events = [b'data: {"token": %d}\n\n' % i for i in range(1000)]
    port = listen(ScriptedNode(answer(CHUNKED_HEAD + chunked(events))))
    pool = make_pool(reactor)
    stock = Agent.usingEndpointFactory(reactor, Loopback(reactor), pool=pool)
    try:
        _, native, _ = await fetch(agent, port)
        _, twisted, _ = await fetch(stock, port)
    finally:
        await pool.closeCachedConnections()
    assert native.body == twisted.body == b"".join(events)
    assert len(twisted.calls) == 1000
    assert len(native.calls) <= 3  # ~23 KB: one or two socket reads


def test_body_bytes_before_deliver_body_are_handed_over_in_one_call() -> None:
    """Body data of several reads buffered before ``deliverBody`` reaches the protocol at once,
    then the end; a second ``deliverBody`` is illegal."""
    protocol, _, released = connected()
    responses: list[IResponse] = []
    send(protocol).addCallback(responses.append)
    protocol.dataReceived(CHUNKED_HEAD + b"a\r\n" + b"a" * 10 + b"\r\n")
    protocol.dataReceived(b"a\r\n" + b"b" * 10 + b"\r\n0\r\n\r\n")
    assert released == [protocol]  # complete: the connection is idle again before delivery
    [response] = responses
    collect = Collect()
    response.deliverBody(collect)
    assert collect.calls == [b"a" * 10 + b"b" * 10]
    assert collect.ended is not None and collect.ended.check(ResponseDone)
    with pytest.raises(IllegalCall):
        response.deliverBody(Collect())


# ---- other framings -----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\n\r\nhello",
    ],
    ids=["http-1.0", "no-length"],
)
async def test_close_delimited_body_ends_with_potential_data_loss_and_is_not_reused(
    agent: NodeAgent, listen: Callable[[Any], int], raw: bytes
) -> None:
    """HTTP/1.0, or no length at all: the body is read to the close (PotentialDataLoss for
    no length), and the connection is never reused."""
    node = ScriptedNode(answer(raw, close=True))
    port = listen(node)
    _, first, ended = await fetch(agent, port)
    assert first.body == b"hello"
    if b"Content-Length" in raw:
        assert ended.check(ResponseDone)
    else:
        assert ended.check(PotentialDataLoss)
    await fetch(agent, port)
    assert node.accepted == 2


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    ("method", "raw"),
    [
        (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n"),
        (b"GET", b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n"),
        (b"GET", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"),
    ],
    ids=["head", "204", "304"],
)
async def test_bodyless_answers_end_at_once_and_keep_the_connection(
    agent: NodeAgent, listen: Callable[[Any], int], method: bytes, raw: bytes
) -> None:
    """HEAD, 204 and 304 have no body whatever the framing headers say; the connection is reused."""
    node = ScriptedNode(answer(raw))
    port = listen(node)
    response, collect, ended = await fetch(agent, port, method)
    assert (response.length, collect.calls) == (0, [])
    assert ended.check(ResponseDone)
    await fetch(agent, port, method)
    assert node.accepted == 1


@pytest_twisted.ensureDeferred
async def test_interim_100_continue_is_skipped(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """1xx interim heads are read past; the final response is what the request gets."""
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX: y\r\n\r\n" + length_reply(
        b"ok"
    )
    port = listen(ScriptedNode(answer(raw)))
    response, collect, _ = await fetch(agent, port, b"POST", body=b"{}")
    assert (response.code, response.phrase, collect.body) == (200, b"OK", b"ok")
    assert not response.headers.hasHeader(b"x")


# ---- the request ------------------------------------------------------------------------------


class CountingProducer(ReplayBodyProducer):
    """The replayed body, counting how often the transport paused it."""

    pauses = 0

    def pauseProducing(self) -> None:
        self.pauses += 1
        super().pauseProducing()


@pytest_twisted.ensureDeferred
async def test_request_carries_host_headers_and_content_length_and_reports_written(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """The request line, Host, the caller's headers and Content-Length from the producer; the
    replayed body's ``on_written`` fires once the last byte is handed over."""
    node = ScriptedNode(answer(length_reply(b"ok")))
    port = listen(node)
    body = b"z" * 4_000_000  # more than the socket buffers: the producer is paused and resumed
    written: list[int] = []
    producer = CountingProducer(body, lambda: written.append(1))
    response = await agent.request(
        b"POST", url(port, b"/api/chat?x=1"), Headers({b"x-trace": [b"abc"]}), producer
    )
    collect = Collect()
    response.deliverBody(collect)
    await collect.done
    [request] = node.requests
    head, _, sent = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/chat?x=1 HTTP/1.1"
    assert set(lines[1:]) == {
        b"Host: 127.0.0.1:%d" % port,
        b"X-Trace: abc",
        b"Content-Length: 4000000",
    }
    assert sent == body
    assert written == [1]
    assert producer.pauses > 0  # the transport pushed back and the body still arrived whole
    assert response.request.method == b"POST"
    assert response.request.absoluteURI == url(port, b"/api/chat?x=1")


def test_unknown_length_request_bodies_are_refused() -> None:
    """Nothing in the proxy sends a body of unknown length; such a request fails at once."""

    @implementer(IBodyProducer)
    class Unknown:
        length = UNKNOWN_LENGTH

        def startProducing(self, consumer: IConsumer) -> Deferred[None]:
            return succeed(None)

        def pauseProducing(self) -> None: ...

        def resumeProducing(self) -> None: ...

        def stopProducing(self) -> None: ...

    made = NodeAgent(Clock(), Loopback(Clock()))
    failure = failure_of(made.request(b"POST", b"http://127.0.0.1:1/", None, Unknown()))
    assert failure.check(ValueError)


@pytest.mark.parametrize(
    ("method", "target"),
    [
        (b"GET X", b"http://127.0.0.1:1/"),
        (b"GET", b"http://127.0.0.1:1/a b"),
        (b"GET", b"ftp://h/"),
    ],
)
def test_invalid_method_target_or_scheme_fails_the_request(method: bytes, target: bytes) -> None:
    made = NodeAgent(Clock(), Loopback(Clock()))
    assert failure_of(made.request(method, target)).check(ValueError)


# ---- keep-alive -------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_complete_response_leaves_the_connection_for_the_next_request(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """Sequential requests to one node share one connection (chunked and Content-Length)."""
    node = ScriptedNode(answer(CHUNKED_HEAD + chunked([b"a", b"b"])))
    port = listen(node)
    for _ in range(3):
        _, collect, ended = await fetch(agent, port)
        assert collect.body == b"ab" and ended.check(ResponseDone)
    assert node.accepted == 1
    assert agent.idle_count((b"http", b"127.0.0.1", port)) == 1


@pytest_twisted.ensureDeferred
async def test_node_connections_send_without_waiting_for_acks(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """``TCP_NODELAY`` on every node connection (the idle one is inspected after its answer)."""
    port = listen(ScriptedNode(answer(CHUNKED_HEAD + chunked([b"a"]))))
    await fetch(agent, port)
    [connection] = agent._idle[(b"http", b"127.0.0.1", port)]
    handle = connection.transport.getHandle()  # type: ignore[union-attr]
    assert handle.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("side", ["response", "request"])
async def test_connection_close_from_either_side_is_not_reused(
    agent: NodeAgent, listen: Callable[[Any], int], side: str
) -> None:
    extra = b"Connection: close\r\n" if side == "response" else b""
    node = ScriptedNode(answer(length_reply(b"ok", extra)))
    port = listen(node)
    headers = Headers({b"connection": [b"close"]}) if side == "request" else None
    for _ in range(2):
        await fetch(agent, port, headers=headers)
    assert node.accepted == 2
    assert agent.idle_count() == 0


@pytest_twisted.ensureDeferred
async def test_a_body_stopped_early_closes_the_connection(
    reactor: Any, agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """A body protocol that stops producing mid-stream aborts the connection (the node sees it
    lost) and the body ends with a ResponseFailed; the next request dials anew."""

    def reply(connection: ServerConnection, head: bytes) -> None:
        connection.write(CHUNKED_HEAD + b"1\r\na\r\n")  # and never finishes

    node = ScriptedNode(reply)
    port = listen(node)
    response = await agent.request(b"GET", url(port))
    collect = Collect(lambda c, d: IPushProducer(c.transport).stopProducing())
    response.deliverBody(collect)
    await collect.done
    assert collect.ended is not None and collect.ended.check(ResponseFailed)
    await node.connections[0].lost.addTimeout(5, reactor)
    node.reply = answer(length_reply(b"ok"))
    await fetch(agent, port)
    assert node.accepted == 2


@pytest_twisted.ensureDeferred
async def test_idle_connections_expire_on_the_injected_clock(
    reactor: Any, listen: Callable[[Any], int]
) -> None:
    """An idle connection is closed after ``idle_seconds`` on the agent's clock; reuse cancels
    the expiry."""
    clock = Clock()
    made = NodeAgent(clock, Loopback(reactor), idle_seconds=4)
    node = ScriptedNode(answer(length_reply(b"ok")))
    port = listen(node)
    await fetch(made, port)
    [expiry] = clock.getDelayedCalls()
    assert expiry.getTime() == 4
    clock.advance(3)
    await fetch(made, port)  # reused: the old expiry is cancelled, a new one armed
    assert not expiry.active()
    assert node.accepted == 1
    [renewed] = clock.getDelayedCalls()
    clock.advance(4)
    assert not renewed.active()
    await node.connections[0].lost.addTimeout(5, reactor)
    assert made.idle_count() == 0


@pytest_twisted.ensureDeferred
async def test_at_most_max_idle_per_host_connections_are_kept(
    reactor: Any, listen: Callable[[Any], int]
) -> None:
    made = NodeAgent(reactor, Loopback(reactor), max_idle_per_host=1)
    node = ScriptedNode(answer(length_reply(b"ok")))
    port = listen(node)
    first, second = made.request(b"GET", url(port)), made.request(b"GET", url(port))
    for response in [await first, await second]:
        collect = Collect()
        response.deliverBody(collect)
        await collect.done
    assert node.accepted == 2
    assert made.idle_count() == 1
    await made.close()
    await node.connections[0].lost.addTimeout(5, reactor)
    await node.connections[1].lost.addTimeout(5, reactor)


@pytest_twisted.ensureDeferred
async def test_an_idle_connection_the_node_closes_is_dropped(
    reactor: Any, agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    node = ScriptedNode(answer(length_reply(b"ok")))
    port = listen(node)
    await fetch(agent, port)
    assert agent.idle_count() == 1
    node.connections[0].close()
    while agent.idle_count():
        await deferLater(reactor, 0.001, lambda: None)
    _, collect, _ = await fetch(agent, port)
    assert collect.body == b"ok" and node.accepted == 2


@pytest_twisted.ensureDeferred
async def test_close_waits_for_the_idle_connections_to_be_gone(
    reactor: Any, listen: Callable[[Any], int]
) -> None:
    made = NodeAgent(reactor, Loopback(reactor))
    node = ScriptedNode(answer(length_reply(b"ok")))
    port = listen(node)
    await fetch(made, port)
    await made.close()
    assert made.idle_count() == 0
    assert node.connections[0].transport is not None
    await node.connections[0].lost.addTimeout(5, reactor)


# ---- cuts and garbage ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    "raw",
    [CHUNKED_HEAD + b"5\r\nhel", length_reply(b"hello")[:-2]],
    ids=["mid-chunk", "short-content-length"],
)
async def test_a_cut_body_fails_with_data_loss(
    agent: NodeAgent, listen: Callable[[Any], int], raw: bytes
) -> None:
    port = listen(ScriptedNode(answer(raw, close=True)))
    _, collect, ended = await fetch(agent, port)
    assert isinstance(ended.value, ResponseFailed)
    assert any(reason.check(_DataLoss) for reason in ended.value.reasons)
    assert collect.body in (b"hel",)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    "raw",
    [
        SECRET + b" is not a status line\r\n\r\n",
        b"HTTP/1.1 2000 " + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: " + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + SECRET * 2000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 600 + b"\r\n",
    ],
    ids=["status", "code", "header", "content-length", "long-line", "too-many-headers"],
)
async def test_a_malformed_head_fails_without_its_bytes_in_the_description(
    agent: NodeAgent, listen: Callable[[Any], int], raw: bytes
) -> None:
    port = listen(ScriptedNode(answer(raw)))
    with pytest.raises(ResponseFailed) as raised:
        await agent.request(b"GET", url(port))
    [reason] = raised.value.reasons
    assert reason.check(BadResponse)
    text = describe_failure(Failure(raised.value))
    assert text.startswith("ResponseFailed(BadResponse")
    assert SECRET.decode() not in text


@pytest_twisted.ensureDeferred
async def test_malformed_chunk_framing_fails_the_body(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    port = listen(ScriptedNode(answer(CHUNKED_HEAD + b"zz\r\n" + SECRET + b"\r\n")))
    _, _, ended = await fetch(agent, port)
    assert isinstance(ended.value, ResponseFailed)
    assert SECRET.decode() not in describe_failure(ended)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"", ResponseNeverReceived), (b"HTTP/1.1 200 OK\r\n", ResponseFailed)],
    ids=["nothing", "part-of-a-head"],
)
async def test_a_connection_lost_before_the_head_fails_the_request(
    agent: NodeAgent, listen: Callable[[Any], int], raw: bytes, kind: type[Exception]
) -> None:
    port = listen(ScriptedNode(answer(raw, close=True)))
    with pytest.raises(kind) as raised:
        await agent.request(b"GET", url(port))
    assert not is_cancellation(Failure(raised.value))


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


@pytest_twisted.ensureDeferred
async def test_a_connection_lost_while_writing_is_a_transmission_failure(
    agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    class Hangup(Protocol):
        def dataReceived(self, data: bytes) -> None:
            assert self.transport is not None
            self.transport.loseConnection()

    port = listen(Factory.forProtocol(Hangup))
    producer = StuckProducer()
    with pytest.raises(RequestTransmissionFailed):
        await agent.request(b"POST", url(port), None, producer)
    assert producer.stopped


@pytest_twisted.ensureDeferred
async def test_a_failing_producer_is_a_generation_failure(
    reactor: Any, agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    node = ScriptedNode(answer(b""))
    port = listen(node)
    with pytest.raises(RequestGenerationFailed) as raised:
        await agent.request(b"POST", url(port), None, StuckProducer(fail=True))
    assert raised.value.reasons[0].check(RuntimeError)
    while not node.connections:
        await deferLater(reactor, 0.001, lambda: None)
    await node.connections[0].lost.addTimeout(5, reactor)


# ---- cancellation -------------------------------------------------------------------------------


@implementer(IAgentEndpointFactory)
class NeverConnects:
    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        return cast(IStreamClientEndpoint, self)

    def connect(self, factory: Any) -> Deferred[Any]:
        return Deferred()


def test_cancelling_while_connecting_is_a_cancellation() -> None:
    made = NodeAgent(Clock(), NeverConnects())
    attempt = made.request(b"GET", b"http://10.0.0.1:1/")
    attempt.cancel()
    failure = failure_of(attempt)
    assert failure.check(CancelledError)
    assert is_cancellation(failure)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("state", ["writing", "awaiting-headers"])
async def test_cancelling_before_the_head_aborts_and_is_a_cancellation(
    reactor: Any, agent: NodeAgent, listen: Callable[[Any], int], state: str
) -> None:
    node = ScriptedNode(answer(b""))  # silent
    port = listen(node)
    producer = StuckProducer() if state == "writing" else None
    attempt = agent.request(b"POST", url(port), None, producer)
    while not node.connections or (state != "writing" and not node.requests):
        await deferLater(reactor, 0.001, lambda: None)
    attempt.cancel()
    with pytest.raises(ResponseNeverReceived) as raised:
        await attempt
    assert is_cancellation(Failure(raised.value))
    await node.connections[0].lost.addTimeout(5, reactor)
    if producer is not None:
        assert producer.stopped


# ---- backpressure -------------------------------------------------------------------------------


@implementer(IPushProducer)
class Flood(Protocol):
    """Answers with a large Content-Length body, written as fast as its transport takes it."""

    TOTAL = 32 * 1024 * 1024
    BLOCK = b"f" * 65536

    def __init__(self) -> None:
        self.sent = 0
        self.paused = False

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        if self.sent == 0 and b"\r\n\r\n" in data:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.TOTAL)
            cast(IConsumer, self.transport).registerProducer(self, True)
            self.resumeProducing()

    def resumeProducing(self) -> None:
        assert self.transport is not None
        self.paused = False
        while not self.paused and self.sent < self.TOTAL:
            self.sent += len(self.BLOCK)
            self.transport.write(self.BLOCK)
        if self.sent >= self.TOTAL:
            cast(IConsumer, self.transport).unregisterProducer()

    def pauseProducing(self) -> None:
        self.paused = True

    def stopProducing(self) -> None:
        self.paused = True


@pytest_twisted.ensureDeferred
async def test_a_paused_body_stops_the_client_reading_until_resumed(
    reactor: Any, agent: NodeAgent, listen: Callable[[Any], int]
) -> None:
    """The body protocol pausing its transport takes the socket out of the reactor's readers (no
    ``dataReceived`` while paused, however much the node pushes); resuming reads the rest."""
    flood = Flood()
    port = listen(Factory.forProtocol(lambda: flood))
    paused_calls: list[int] = []
    state = {"paused": False}

    def on_data(collect: Collect, data: bytes) -> None:
        if state["paused"]:
            paused_calls.append(len(data))
        elif len(collect.calls) == 1:
            state["paused"] = True
            IPushProducer(collect.transport).pauseProducing()

    response = await agent.request(b"GET", url(port))
    collect = Collect(on_data)
    response.deliverBody(collect)
    while not state["paused"]:
        await deferLater(reactor, 0.001, lambda: None)
    [client] = [p for p in agent._keys]  # the one connection
    assert client.transport not in reactor.getReaders()
    # Let the node push until the sockets are full: its kernel buffer takes no more.
    assert flood.transport is not None
    server_socket = cast(Any, flood.transport).getHandle()
    waited = 0
    while not (flood.paused and not select.select([], [server_socket], [], 0)[1]):
        assert not collect.done.called and waited < 10_000, "the client kept reading"
        await deferLater(reactor, 0.001, lambda: None)
        waited += 1
    assert paused_calls == []
    state["paused"] = False
    IPushProducer(collect.transport).resumeProducing()
    assert client.transport in reactor.getReaders()
    await collect.done.addTimeout(30, reactor)
    assert collect.ended is not None and collect.ended.check(ResponseDone)
    assert len(collect.body) == Flood.TOTAL


# ---- states -------------------------------------------------------------------------------------


def connected() -> tuple[NodeClientProtocol, StringTransport, list[NodeClientProtocol]]:
    released: list[NodeClientProtocol] = []
    protocol = NodeClientProtocol(released.append, lambda p: None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, released


def send(protocol: NodeClientProtocol, method: bytes = b"GET") -> Deferred[IResponse]:
    request = ClientRequest(method, b"http://n/", Headers())
    return protocol.request(b"%s / HTTP/1.1\r\nHost: n\r\n\r\n" % method, request, None, True)


def state_of(protocol: NodeClientProtocol) -> ClientState:
    return protocol.state  # read afresh (mypy would keep the narrowed value of the property)


def test_states_walk_idle_awaiting_body_and_back_to_idle() -> None:
    protocol, transport, released = connected()
    assert state_of(protocol) is ClientState.IDLE
    responses: list[IResponse] = []
    send(protocol).addCallback(responses.append)
    assert state_of(protocol) is ClientState.AWAITING_HEADERS
    assert transport.value().startswith(b"GET / HTTP/1.1\r\n")
    with pytest.raises(IllegalCall):
        send(protocol)
    protocol.dataReceived(CHUNKED_HEAD + b"1\r\na\r\n")
    assert state_of(protocol) is ClientState.BODY
    [response] = responses
    assert verifyObject(IResponse, response)
    protocol.dataReceived(b"0\r\n\r\n")
    assert state_of(protocol) is ClientState.IDLE and released == [protocol]
    protocol.connectionLost(Failure(ConnectionDone()))
    assert state_of(protocol) is ClientState.CLOSED


def test_bytes_on_an_idle_connection_close_it() -> None:
    protocol, transport, _ = connected()
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\n")
    assert transport.disconnecting


def test_leftover_bytes_after_a_response_forbid_reuse() -> None:
    protocol, transport, released = connected()
    send(protocol)
    protocol.dataReceived(length_reply(b"ok") + b"HTTP/1.1 200 OK\r\n")
    assert released == [] and transport.disconnecting


def test_the_response_arriving_before_the_body_is_written_forbids_reuse() -> None:
    protocol, transport, released = connected()
    producer = StuckProducer()
    request = ClientRequest(b"POST", b"http://n/", Headers())
    protocol.request(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n", request, producer, True)
    assert state_of(protocol) is ClientState.WRITING
    protocol.dataReceived(length_reply(b"no"))
    assert producer.stopped and released == [] and transport.disconnecting


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


def _split(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


@given(chunked_streams())
@settings(max_examples=300, deadline=None)
def test_any_split_of_a_chunked_stream_yields_the_same_body(
    case: tuple[bytes, bytes, list[int]],
) -> None:
    """However the reads cut the framing, the body protocol sees exactly the payload bytes, then
    ResponseDone, and the connection goes back idle."""
    stream, payload, cuts = case
    protocol, _, released = connected()
    responses: list[IResponse] = []
    send(protocol).addCallback(responses.append)
    protocol.dataReceived(CHUNKED_HEAD)
    [response] = responses
    collect = Collect()
    response.deliverBody(collect)
    for piece in _split(stream, cuts):
        protocol.dataReceived(piece)
    assert collect.body == payload
    assert collect.ended is not None and collect.ended.check(ResponseDone)
    assert released == [protocol]


@given(chunked_streams())
@settings(max_examples=200, deadline=None)
def test_decoder_returns_the_payload_and_what_follows_the_last_chunk(
    case: tuple[bytes, bytes, list[int]],
) -> None:
    """The decoder alone: any split gives the payload, and the bytes after the end are handed
    back (they make the connection unusable)."""
    stream, payload, cuts = case
    decoder = ChunkedDecoder()
    got = []
    after: bytes | None = None
    for piece in _split(stream + b"NEXT", [*cuts, len(stream)]):
        if after is not None:
            break
        data, after = decoder.feed(piece)
        got.append(data)
    assert b"".join(got) == payload
    assert after is not None


def test_a_chunk_size_that_is_not_hex_is_refused() -> None:
    for bad in [b"-1\r\n", b"0x5\r\n", b"\r\n", b"1" * 17 + b"\r\n", b"5\r\nhelloX\r\n"]:
        with pytest.raises(BadResponse):
            ChunkedDecoder().feed(bad)


# ---- quiet ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_connections_log_nothing(reactor: Any, listen: Callable[[Any], int]) -> None:
    """No "Starting/Stopping factory" line per connection (one per inventory poll)."""
    port = listen(ScriptedNode(answer(length_reply(b"ok"))))
    events: list[LogEvent] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    try:
        made = NodeAgent(reactor, Loopback(reactor))
        await fetch(made, port)
        await made.close()
        await deferLater(reactor, 0, lambda: None)
    finally:
        globalLogPublisher.removeObserver(observer)
    assert [e for e in events if "factory" in json.dumps(str(e.get("log_format")))] == []
