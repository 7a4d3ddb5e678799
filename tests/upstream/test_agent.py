"""Tests for nvpair_tw.upstream._agent: the upstream hop's own HTTP/1.1 client, end to end.

Network behaviour runs over loopback against small scripted servers (a Twisted ``Protocol`` that
answers each request head with bytes the test chose); framing edge cases that depend on how bytes
are split across reads are in test_protocol.py (over a ``StringTransport``) and test_http1.py.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError, Deferred, succeed
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
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from nvpair_tw.upstream._agent import PARSED_KEPT, NodeAgent, _head, _host_value, _url
from nvpair_tw.upstream._attempt import (
    ReplayBodyProducer,
    describe_failure,
    is_cancellation,
    make_pool,
)
from nvpair_tw.upstream._http1 import BadResponse
from nvpair_tw.upstream._protocol import NodeClientProtocol
from tests.helpers import eventually
from tests.upstream.scripted import (
    CHUNKED_HEAD,
    SECRET,
    Collect,
    Loopback,
    ScriptedNode,
    ServerConnection,
    StuckProducer,
    answer,
    chunked,
    failure_of,
    fetch,
    length_reply,
    url,
)


@pytest_twisted.async_yield_fixture()
async def agent(reactor: Any) -> AsyncIterator[NodeAgent]:
    """A NodeAgent over loopback on the real reactor; idle connections closed afterwards."""
    made = NodeAgent(reactor, Loopback(reactor))
    yield made
    await made.close().addTimeout(5, reactor)  # bounded: a broken client fails, never hangs


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
    """An idle connection is closed ``idle_seconds`` after its last use, on the agent's clock;
    reuse schedules no timer of its own: the one sweep comes back for it."""
    clock = Clock()
    made = NodeAgent(clock, Loopback(reactor), idle_seconds=4)
    node = ScriptedNode(answer(length_reply(b"ok")))
    port = listen(node)
    await fetch(made, port)
    [sweep] = clock.getDelayedCalls()
    assert sweep.getTime() == 4
    clock.advance(3)
    await fetch(made, port)  # reused at 3: idle again from 3, the sweep left as it was
    assert clock.getDelayedCalls() == [sweep] and node.accepted == 1
    clock.advance(1)
    assert made.idle_count() == 1  # idle for 1 s only at the sweep: it comes back at 7
    [again] = clock.getDelayedCalls()
    assert again.getTime() == 7
    clock.advance(3)
    await node.connections[0].lost.addTimeout(5, reactor)
    assert made.idle_count() == 0 and clock.getDelayedCalls() == []


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
    await eventually(reactor, lambda: not agent.idle_count(), what="the closed connection dropped")
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
    await eventually(reactor, lambda: node.connections, what="a connection at the node")
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
    await eventually(
        reactor,
        lambda: node.connections and (state == "writing" or node.requests),
        what=f"the attempt {state}",
    )
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
    await eventually(reactor, lambda: state["paused"], what="the client paused")
    [client] = [p for p in agent._keys]  # the one connection
    assert client.transport not in reactor.getReaders()
    # Let the node push until the sockets are full: its kernel buffer takes no more.
    assert flood.transport is not None
    server_socket = cast(Any, flood.transport).getHandle()
    await eventually(
        reactor,
        lambda: flood.paused and not select.select([], [server_socket], [], 0)[1],
        what="the node's socket full",
    )
    assert not collect.done.called, "the client kept reading"
    assert paused_calls == []
    state["paused"] = False
    IPushProducer(collect.transport).resumeProducing()
    assert client.transport in reactor.getReaders()
    await collect.done.addTimeout(30, reactor)
    assert collect.ended is not None and collect.ended.check(ResponseDone)
    assert len(collect.body) == Flood.TOTAL


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


# ---- the request head and the idle set, deterministically (issue 20) ---------------------------


@pytest.mark.parametrize(
    ("scheme", "host", "port", "value"),
    [
        (b"http", b"h", 80, b"h"),
        (b"https", b"h", 443, b"h"),
        (b"http", b"h", 443, b"h:443"),
        (b"https", b"h", 80, b"h:80"),
        (b"http", b"h", 81, b"h:81"),
        (b"https", b"h", 444, b"h:444"),
        (b"http", b"::1", 8080, b"[::1]:8080"),
        (b"https", b"fe80::1", 443, b"[fe80::1]"),
        (b"http", b"h\xff", 81, b"h\xff:81"),
    ],
)
def test_the_host_header_names_the_node_as_its_url_does(
    scheme: bytes, host: bytes, port: int, value: bytes
) -> None:
    assert _host_value(scheme, host, port) == value


def test_a_given_host_header_is_sent_alone_and_bad_heads_say_why() -> None:
    url = _url(b"http://n:81/p")
    head, persistent = _head(b"GET", url, Headers({b"host": [b"given"]}), None)
    assert head == b"GET /p HTTP/1.1\r\nHost: given\r\n\r\n" and persistent
    with pytest.raises(ValueError, match=r"^invalid request method$"):
        _head(b"G T", url, None, None)
    with pytest.raises(ValueError, match=r"^invalid request target$"):
        _url(b"http://n/a b")
    made, _ = idle_agent()
    assert str(failure_of(made.request(b"GET", b"http://n/a b")).value) == "invalid request target"


def test_an_agent_keeps_a_bounded_number_of_urls_parsed_and_never_a_bad_one() -> None:
    """Parsed URLs are kept for the next request (the same node paths recur), at most
    PARSED_KEPT of them; a URL that fails is checked again each time, never kept."""
    made, _ = idle_agent()
    assert made._parse(b"http://n:81/p?q") is made._parse(b"http://n:81/p?q")
    assert made._parse(b"http://n:81/p?q").target == b"/p?q"
    assert made._parse(b"http://n:81/p?q").host == b"n:81"
    made._parsed.clear()
    for i in range(PARSED_KEPT):
        made._parse(b"http://n/%d" % i)
    assert len(made._parsed) == PARSED_KEPT  # full: every one kept
    made._parse(b"http://n/one-more")
    assert list(made._parsed) == [b"http://n/one-more"]  # one past the bound starts afresh
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^only http and https node URLs$"):
            made._parse(b"ftp://n/")
    assert b"ftp://n/" not in made._parsed


def idle_agent() -> tuple[NodeAgent, Clock]:
    clock = Clock()
    return NodeAgent(clock, Loopback(clock), idle_seconds=4), clock


def idle_one(made: NodeAgent, key: tuple[bytes, bytes, int]) -> StringTransport:
    protocol = NodeClientProtocol(made._release, made._lost)
    transport = StringTransport()
    protocol.makeConnection(transport)
    made._keys[protocol] = key
    made._release(protocol)  # what a complete response does
    return transport


KEY = (b"http", b"127.0.0.1", 1001)


def test_an_expired_connection_leaves_the_idle_set_at_once() -> None:
    made, clock = idle_agent()
    transport = idle_one(made, KEY)
    clock.advance(4)
    assert transport.disconnecting and made.idle_count(KEY) == 0 and made._idle == {}
    assert clock.getDelayedCalls() == []


def test_close_cancels_the_idle_timers_and_fires_with_none() -> None:
    made, clock = idle_agent()
    transports = [idle_one(made, KEY), idle_one(made, KEY)]
    closing = made.close()
    assert clock.getDelayedCalls() == [] and made.idle_count() == 0
    for protocol in list(made._keys):
        protocol.connectionLost(Failure(ConnectionDone()))
    results: list[object] = []
    closing.addCallback(results.append)
    assert results == [None] and all(t.disconnecting for t in transports)


def test_a_lost_idle_connection_leaves_the_others_and_no_trace() -> None:
    made, _ = idle_agent()
    idle_one(made, KEY)
    idle_one(made, KEY)
    first, second = list(made._keys)
    first.connectionLost(Failure(ConnectionDone()))
    assert made.idle_count(KEY) == 1 and first not in made._keys
    second.connectionLost(Failure(ConnectionDone()))
    assert made._idle == {} and made._keys == {} and made._since == {}
    assert made._sweep is None


def test_a_connection_the_agent_never_keyed_is_closed_on_release_and_forgotten_on_loss() -> None:
    made, _ = idle_agent()
    protocol = NodeClientProtocol(made._release, made._lost)
    transport = StringTransport()
    protocol.makeConnection(transport)
    made._release(protocol)
    assert transport.disconnecting and made.idle_count() == 0
    protocol.connectionLost(Failure(ConnectionDone()))  # no key: nothing to forget, no error
    assert made._keys == {}


def test_the_defaults_are_the_pool_policy() -> None:
    made = NodeAgent(Clock(), NeverConnects())
    assert (made.max_idle_per_host, made.idle_seconds) == (32, 4)


def test_https_is_a_node_scheme_and_others_say_they_are_not() -> None:
    made = NodeAgent(Clock(), NeverConnects())
    connecting = made.request(b"GET", b"https://10.0.0.1:1/")
    assert not connecting.called  # connecting, not refused
    connecting.cancel()
    connecting.addErrback(lambda _: None)
    failure = failure_of(made.request(b"GET", b"ftp://10.0.0.1/"))
    assert str(failure.value) == "only http and https node URLs"

    unknown = ReplayBodyProducer(b"", lambda: None)
    cast(Any, unknown).length = UNKNOWN_LENGTH
    failure = failure_of(made.request(b"POST", b"http://n/", None, unknown))
    assert str(failure.value) == "a request body of unknown length is not supported"


@pytest.mark.parametrize(
    ("method", "length"),
    [(b"PUT", b"Content-Length: 0\r\n"), (b"POST", b"Content-Length: 0\r\n"), (b"GET", b"")],
)
def test_bodyless_puts_and_posts_say_so_and_the_host_is_the_url_s(
    method: bytes, length: bytes
) -> None:
    head, _ = _head(method, _url(b"http://n/"), None, None)
    assert head == method + b" / HTTP/1.1\r\nHost: n\r\n" + length + b"\r\n"


def test_an_idle_connection_carries_the_next_request_whole() -> None:
    """The request (its headers, its body) goes to the idle connection, and the response shows
    the request's headers (a fresh ``Headers`` when none were given)."""
    made, _ = idle_agent()
    transport = idle_one(made, KEY)
    [protocol] = made._keys
    headers = Headers({b"x-asked": [b"1"]})
    producer = ReplayBodyProducer(b"hey", lambda: None)
    responses: list[IResponse] = []
    made.request(b"POST", b"http://127.0.0.1:1001/", headers, producer).addCallback(
        responses.append
    )
    assert transport.value().endswith(b"\r\n\r\nhey")
    protocol.dataReceived(length_reply(b"ok"))
    made.request(b"GET", b"http://127.0.0.1:1001/").addCallback(responses.append)
    protocol.dataReceived(length_reply(b"ok"))
    first, second = responses
    assert first.request.headers is headers
    assert isinstance(second.request.headers, Headers)
    assert list(second.request.headers.getAllRawHeaders()) == []


def test_one_sweep_closes_each_idle_connection_idle_seconds_after_its_release() -> None:
    """Connections released at 0, 0.4 and 2.3 close at 4, 4.4 and 6.3: one timer at a time, moved
    to the next connection due, however soon (times that are not exact in binary included)."""
    made, clock = idle_agent()
    early = idle_one(made, KEY)
    clock.advance(0.4)
    middle = idle_one(made, KEY)
    clock.advance(1.9)
    late = idle_one(made, KEY)
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(4 - clock.seconds())
    assert early.disconnecting and not middle.disconnecting and made.idle_count(KEY) == 2
    [sweep] = clock.getDelayedCalls()
    assert sweep.getTime() == 0.4 + 4
    clock.advance(sweep.getTime() - clock.seconds())
    assert middle.disconnecting and not late.disconnecting
    [sweep] = clock.getDelayedCalls()
    clock.advance(sweep.getTime() - clock.seconds())
    assert late.disconnecting and made.idle_count() == 0 and clock.getDelayedCalls() == []


def test_taking_and_giving_back_an_idle_connection_schedules_no_timer() -> None:
    """Every request takes a connection from the idle set and gives it back: no timer moves."""
    made, clock = idle_agent()
    idle_one(made, KEY)
    [sweep] = clock.getDelayedCalls()
    for _ in range(3):
        taken = made._take_idle(KEY)
        assert taken is not None
        made._release(taken)
    assert clock.getDelayedCalls() == [sweep] and made.idle_count(KEY) == 1
