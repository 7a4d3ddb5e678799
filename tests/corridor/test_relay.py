"""Tests for nvpair_tw.corridor._relay: the write-stall guard and progress (with a clock), and the committed
relay over the real in-process proxy and loopback: streaming, backpressure, hang-ups both ways."""

from __future__ import annotations

import gc
import http.client
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair_tw.core import ErrorShape, ProxyBug
from nvpair_tw.core._resolved import Settings
from nvpair_tw.corridor._attempts import CallerState, Committed
from nvpair_tw.corridor._relay import Progress, RelayEnd, RelayOutcome, StallGuard, relay
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.nodes._directory import Node
from nvpair_tw.testing import Clusters, ProxyCluster, ProxyHandle, SimulatedEngine, start_proxy
from nvpair_tw.upstream._attempt import BodyGate, ReplayBodyProducer
from tests.helpers import PumpProducer, RecordingProducer

MODEL = ("llama3:latest",)
REQUEST_BODY = json.dumps({"model": "llama3", "stream": True}).encode()
MiB = 1024 * 1024


# ---- StallGuard with a clock --------------------------------------------------------------------


def guard(budget: float = 30.0) -> tuple[StallGuard, Clock, RecordingProducer, list[None]]:
    clock, upstream, stalls = Clock(), RecordingProducer(), list[None]()
    return StallGuard(clock, upstream, budget, lambda: stalls.append(None)), clock, upstream, stalls


def test_guard_is_a_push_producer() -> None:
    """The guard is what the proxy registers on the client request."""
    assert verifyObject(IPushProducer, guard()[0])


def test_pause_pauses_the_upstream_and_arms_the_budget() -> None:
    """A full client socket pauses the upstream and starts one stall timer (repeat pauses add none)."""
    stall_guard, clock, upstream, _ = guard()
    stall_guard.pauseProducing()
    stall_guard.pauseProducing()
    assert upstream.calls == ["pause", "pause"]
    assert [call.getTime() for call in clock.getDelayedCalls()] == [30.0]


def test_resume_disarms_and_resumes_the_upstream() -> None:
    """The client draining its socket resumes the upstream and cancels the stall timer."""
    stall_guard, clock, upstream, stalls = guard()
    stall_guard.pauseProducing()
    clock.advance(29)
    stall_guard.resumeProducing()
    assert upstream.calls == ["pause", "resume"]
    assert clock.getDelayedCalls() == []
    clock.advance(60)
    assert stalls == []


def test_paused_past_the_budget_fires_on_stall_once() -> None:
    """A client that accepts nothing for the whole budget is declared stalled, once."""
    stall_guard, clock, _, stalls = guard()
    stall_guard.pauseProducing()
    clock.advance(29.999)
    assert stalls == []
    clock.advance(0.001)
    assert stalls == [None]
    assert clock.getDelayedCalls() == []


def test_each_pause_gets_a_fresh_budget() -> None:
    """Budgets do not accumulate across pauses: only one continuous pause counts."""
    stall_guard, clock, _, stalls = guard()
    for _ in range(3):
        stall_guard.pauseProducing()
        clock.advance(20)
        stall_guard.resumeProducing()
    assert stalls == []


def test_stop_and_cancel_leave_no_timer() -> None:
    """stopProducing stops the upstream and disarms; cancel() alone just disarms."""
    stall_guard, clock, upstream, _ = guard()
    stall_guard.pauseProducing()
    stall_guard.cancel()
    assert clock.getDelayedCalls() == []
    stall_guard.pauseProducing()
    stall_guard.stopProducing()
    assert upstream.calls == ["pause", "pause", "stop"]
    assert clock.getDelayedCalls() == []


def test_zero_budget_arms_nothing() -> None:
    """With the stall rule disabled a pause only forwards flow control."""
    stall_guard, clock, upstream, stalls = guard(budget=0)
    stall_guard.pauseProducing()
    assert upstream.calls == ["pause"]
    assert clock.getDelayedCalls() == []
    assert stalls == []


# ---- Progress -----------------------------------------------------------------------------------


def test_progress_counts_and_writes_through() -> None:
    """The wrapped sink writes every chunk unchanged and counts the bytes."""
    written: list[bytes] = []
    progress = Progress("application/json", UNKNOWN_LENGTH)
    sink = progress.wrap(written.append)
    sink(b"abc")
    sink(b"de")
    assert written == [b"abc", b"de"]
    assert progress.sent == 5
    assert not progress.streaming
    assert not progress.complete


def test_progress_is_complete_once_every_content_length_byte_is_sent() -> None:
    """A known-length answer is complete exactly when all its bytes went out."""
    progress = Progress("application/json", 10)
    sink = progress.wrap(lambda _data: None)
    sink(b"x" * 9)
    assert not progress.complete
    sink(b"x")
    assert progress.complete


def test_empty_known_length_answer_is_complete() -> None:
    """``Content-Length: 0`` is complete before any byte."""
    assert Progress(None, 0).complete


@pytest.mark.parametrize(
    ("content_type", "stream", "terminal"),
    [
        ("text/event-stream", b'data: {"x":1}\n\n', b"data: [DONE]\n\n"),
        ("application/x-ndjson", b'{"done":false}\n', b'{"done":true}\n'),
    ],
)
def test_progress_is_complete_once_the_terminal_frame_passes(
    content_type: str, stream: bytes, terminal: bytes
) -> None:
    """A stream of unknown length is complete when its terminal frame has been relayed."""
    progress = Progress(content_type, UNKNOWN_LENGTH)
    sink = progress.wrap(lambda _data: None)
    sink(stream)
    assert progress.streaming and not progress.complete
    sink(terminal)
    assert progress.complete


# ---- the relay over loopback --------------------------------------------------------------------


class HeldStream(Resource):
    """An upstream that sends its first chunk at once and the rest only when the test says so."""

    isLeaf = True
    FIRST = b'{"message":{"content":"chunk one"},"done":false}\n'
    SECOND = b'{"message":{"content":"chunk two"},"done":false}\n'
    LAST = b'{"done":true}\n'

    def __init__(self, content_length: int | None = None) -> None:
        super().__init__()
        self._content_length = content_length
        self.requests: list[Request] = []
        self.sent: list[bytes] = []
        self.lost: Failure | None = None
        self.ended: Deferred[None] = Deferred()

    def render(self, request: Request) -> int:  # type: ignore[override]
        self.requests.append(request)
        request.notifyFinish().addBoth(self._ended)
        request.setHeader(b"content-type", b"application/x-ndjson")
        if self._content_length is not None:
            request.setHeader(b"content-length", b"%d" % self._content_length)
        self.send(self.FIRST)
        return NOT_DONE_YET

    def _ended(self, result: Failure | None) -> None:
        self.lost = result
        self.ended.callback(None)

    def send(self, chunk: bytes) -> None:
        self.sent.append(chunk)
        self.requests[-1].write(chunk)


class Reader(Protocol):
    """A client body protocol: what arrived, waits for a byte count, and how the body ended."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.reason: Failure | None = None
        self.ended: Deferred[None] = Deferred()
        self._waiting: list[tuple[int, Deferred[None]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        ready = [d for n, d in self._waiting if len(self.data) >= n]
        self._waiting = [(n, d) for n, d in self._waiting if len(self.data) < n]
        for waiter in ready:
            waiter.callback(None)

    def until(self, size: int) -> Deferred[None]:
        waiter: Deferred[None] = Deferred()
        self._waiting.append((size, waiter))
        self.dataReceived(b"")
        return waiter

    def connectionLost(self, reason: Failure = ResponseDone) -> None:  # type: ignore[assignment]
        self.reason = reason
        self.ended.callback(None)


class Loopback:
    """One upstream Site behind the in-process proxy, and an HTTP client to the proxy."""

    def __init__(self, reactor: Any, listen: Callable[[Any], int]) -> None:
        self.reactor, self._listen = reactor, listen
        self.proxy: ProxyHandle | None = None
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self._readers: list[Reader] = []
        self._upstream: Resource | None = None

    async def start(self, upstream: Resource, settings: Settings | None = None) -> None:
        self._upstream = upstream
        site = Site(upstream)
        site.noisy = False
        port = self._listen(site)
        nodes = [Node("n0", f"http://127.0.0.1:{port}", MODEL)]
        self.proxy = await start_proxy(self.reactor, {"ollama": nodes}, settings)

    @property
    def port(self) -> int:
        assert self.proxy is not None
        return int(self.proxy.url().rsplit(":", 1)[1])

    async def post(self) -> tuple[IResponse, Reader]:
        assert self.proxy is not None
        pending = Agent(self.reactor, pool=self.pool).request(
            b"POST",
            self.proxy.url().encode() + b"/api/chat",
            Headers({b"content-type": [b"application/json"]}),
            ReplayBodyProducer(REQUEST_BODY, lambda: None),
        )
        response = await bounded(self.reactor, pending)
        reader = Reader()
        self._readers.append(reader)
        response.deliverBody(reader)
        return response, reader

    async def stop(self) -> None:
        """Cut whatever a failed test left open (client bodies, held upstream requests), then stop."""
        for reader in self._readers:
            if reader.transport is not None and not reader.ended.called:
                IPushProducer(reader.transport).stopProducing()
        if isinstance(self._upstream, HeldStream):
            for request in self._upstream.requests:
                transport = getattr(request, "transport", None)  # gone once the request ended
                if transport is not None:
                    transport.abortConnection()
        await self.pool.closeCachedConnections()
        if self.proxy is not None:
            await self.proxy.stop()


@pytest_twisted.async_yield_fixture()
async def loopback(reactor: Any, listen: Callable[[Any], int]) -> AsyncIterator[Loopback]:
    """A proxy in front of one test upstream, stopped after the test."""
    setup = Loopback(reactor, listen)
    yield setup
    await setup.stop()


async def bounded(reactor: Any, waiting: Deferred[Any]) -> Any:
    """Await with a 5 s guard, so a broken relay fails instead of hanging the suite."""
    return await waiting.addTimeout(5, reactor)


@pytest_twisted.ensureDeferred
async def test_chunks_reach_the_client_while_the_upstream_holds_the_rest(
    reactor: Any, loopback: Loopback
) -> None:
    """The committed first chunk, and each later one, is relayed as it comes, not buffered until
    the stream ends: the client has it while the upstream has sent nothing more."""
    upstream = HeldStream()
    await loopback.start(upstream)
    response, reader = await loopback.post()
    await bounded(reactor, reader.until(len(HeldStream.FIRST)))
    assert bytes(reader.data) == HeldStream.FIRST
    assert upstream.sent == [HeldStream.FIRST]
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n0"]
    upstream.send(HeldStream.SECOND)
    await bounded(reactor, reader.until(len(HeldStream.FIRST + HeldStream.SECOND)))
    assert upstream.sent == [HeldStream.FIRST, HeldStream.SECOND]
    assert not reader.ended.called
    upstream.send(HeldStream.LAST)
    upstream.requests[0].finish()
    await bounded(reactor, reader.ended)
    assert reader.reason is not None and reader.reason.check(ResponseDone)
    assert bytes(reader.data) == HeldStream.FIRST + HeldStream.SECOND + HeldStream.LAST


@pytest_twisted.ensureDeferred
async def test_client_hang_up_mid_stream_closes_the_upstream(
    reactor: Any, loopback: Loopback
) -> None:
    """A client that leaves after the first chunk makes the proxy close the upstream connection."""
    upstream = HeldStream()
    await loopback.start(upstream)
    _, reader = await loopback.post()
    await bounded(reactor, reader.until(len(HeldStream.FIRST)))
    assert reader.transport is not None
    IPushProducer(reader.transport).stopProducing()
    await bounded(reactor, upstream.ended)
    assert upstream.lost is not None and upstream.lost.check(ConnectionLost, ConnectionDone)
    await bounded(reactor, reader.ended)


@pytest.mark.parametrize(
    ("content_length", "how"),
    [(None, "loseConnection"), (None, "abortConnection"), (4096, "loseConnection")],
    ids=["chunked-close", "chunked-reset", "content-length-close"],
)
@pytest_twisted.ensureDeferred
async def test_upstream_death_mid_stream_truncates_the_client_response(
    reactor: Any, loopback: Loopback, content_length: int | None, how: str
) -> None:
    """An upstream that dies after the first chunk aborts the client: never a clean end."""
    upstream = HeldStream(content_length)
    await loopback.start(upstream)
    _, reader = await loopback.post()
    await bounded(reactor, reader.until(len(HeldStream.FIRST)))
    transport = upstream.requests[0].transport
    assert transport is not None
    getattr(transport, how)()
    await bounded(reactor, reader.ended)
    assert reader.reason is not None and reader.reason.check(ResponseFailed), reader.reason
    assert bytes(reader.data) == HeldStream.FIRST


class Firehose(Resource):
    """An upstream that writes 64 KiB chunks as fast as its own transport allows, up to ``total``."""

    isLeaf = True
    CHUNK = b"x" * 65536

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total
        self.sent = 0
        self.pauses = 0
        self.paused = False
        self.stopped = False
        self.finished = False
        self._request: Request | None = None

    def render(self, request: Request) -> int:  # type: ignore[override]
        self._request = request
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"content-length", b"%d" % self.total)
        request.registerProducer(PumpProducer(self), True)
        self.pump()
        return NOT_DONE_YET

    def pump(self) -> None:
        request = self._request
        assert request is not None
        while not self.paused and not self.stopped and self.sent < self.total:
            self.sent += len(self.CHUNK)
            request.write(self.CHUNK)
        if self.sent >= self.total and not self.finished and not self.stopped:
            self.finished = True
            request.unregisterProducer()
            request.finish()


PROXY_ALLOWANCE = 1 * MiB
"""What the firehose, the proxy and Twisted may hold in user space while the client reads nothing
(each side buffers about one 64 KiB read or write before pausing its producer)."""


def kernel_buffer_bound(client_rcvbuf: int) -> int:
    """The most stream bytes the kernel can hold between the firehose and a client that reads
    nothing: the firehose's send buffer, the proxy's receive buffer on the upstream socket, the
    proxy's send buffer on the client socket (each at most the TCP autotuning maximum) and the
    client's receive buffer (set explicitly; Linux doubles it)."""

    def maximum(name: str) -> int:
        with open(f"/proc/sys/net/ipv4/{name}") as limits:
            return int(limits.read().split()[2])

    return 2 * maximum("tcp_wmem") + maximum("tcp_rmem") + 2 * client_rcvbuf


def read_response(sock: socket.socket) -> tuple[bytes, int]:
    """Blocking (in a thread): read the head and the whole body, Content-Length or chunked;
    (head, payload bytes)."""
    sock.setblocking(True)
    sock.settimeout(30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
    buffered = bytearray()

    def fill() -> None:
        data = sock.recv(1 << 20)
        if not data:
            raise EOFError("connection closed mid-response")
        buffered.extend(data)

    while b"\r\n\r\n" not in buffered:
        fill()
    end = buffered.index(b"\r\n\r\n")
    head = bytes(buffered[:end])
    del buffered[: end + 4]
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            remaining = int(value) - len(buffered)
            buffered.clear()
            while remaining > 0:
                data = sock.recv(1 << 20)
                if not data:
                    raise EOFError("connection closed mid-response")
                remaining -= len(data)
            return head, int(value)
    payload = 0
    while True:
        while b"\r\n" not in buffered:
            fill()
        line_end = buffered.index(b"\r\n")
        size = int(bytes(buffered[:line_end]).split(b";")[0], 16)
        del buffered[: line_end + 2]
        if size == 0:
            return head, payload
        while len(buffered) < size + 2:
            fill()
        payload += size
        del buffered[: size + 2]


@pytest_twisted.ensureDeferred
async def test_client_that_reads_nothing_pauses_the_upstream(
    reactor: Any, loopback: Loopback
) -> None:
    """128 MiB offered to a client that reads nothing: the upstream is paused once the kernel's
    socket buffers are full, having sent no more than those buffers hold plus PROXY_ALLOWANCE (the
    proxy buffers next to nothing in user space); once the client reads, all of it arrives.
    (The proxy's resident memory in this situation is measured by ``bench/timings.py``.)"""
    total = 128 * MiB
    limit = kernel_buffer_bound(client_rcvbuf=4096) + PROXY_ALLOWANCE
    assert limit < total, "the kernel's socket buffers could hold the whole stream"
    firehose = Firehose(total)
    await loopback.start(firehose, Settings(write_stall_timeout=120.0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", loopback.port))
        sock.sendall(
            b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(REQUEST_BODY), REQUEST_BODY)
        )
        sock.setblocking(False)
        stable, last = 0, -1
        for _ in range(200):  # at most 20 s: the stream either stalls or runs to the end
            await deferLater(reactor, 0.1, lambda: None)
            if firehose.finished:
                break
            stable = stable + 1 if firehose.paused and firehose.sent == last else 0
            last = firehose.sent
            if stable >= 5:
                break
        assert not firehose.finished
        assert firehose.paused and firehose.pauses > 0
        assert firehose.sent <= limit, (firehose.sent, limit)
        head, received = await deferToThread(read_response, sock)
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert received == total
    assert firehose.finished


# ---- a node that dies mid-stream, in each framing, seen by a real HTTP client -------------------

LINE = b'{"message":{"role":"assistant","content":"partial"},"done":false}\n'
DYING_HEADS = {
    "chunked": b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(LINE), LINE),
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
    b"Content-Length: 4096\r\n\r\n" + LINE,
    "close-delimited": b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
    b"Connection: close\r\n\r\n" + LINE,
}


class DiesAfterOneLine(Protocol):
    """Reads a request, answers headers and one NDJSON line in its framing, then closes (FIN)."""

    def __init__(self, framing: str, seen: list[bytes]) -> None:
        self._framing = framing
        self._seen = seen
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        head, sep, rest = self._buffer.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        if sep and len(rest) >= length:
            assert self.transport is not None
            self._seen.append(rest)
            self.transport.write(DYING_HEADS[self._framing])
            self.transport.loseConnection()


def post_and_read(port: int) -> tuple[int, str | None, bytes, str]:
    """Blocking (in a thread): POST a stream with http.client; status, X-NVPair-Node, the bytes
    read, and how the body ended (``complete``, ``IncompleteRead`` or the error's name)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/api/chat", REQUEST_BODY, {"Content-Type": "application/json"})
        response = connection.getresponse()
        try:
            data = response.read()
            ending = "complete"
        except http.client.IncompleteRead as incomplete:
            data, ending = incomplete.partial, "IncompleteRead"
        except OSError as error:
            data, ending = b"", type(error).__name__
        return response.status, response.getheader("X-NVPair-Node"), data, ending
    finally:
        connection.close()


@pytest.mark.parametrize("framing", sorted(DYING_HEADS))
@pytest_twisted.ensureDeferred
async def test_death_mid_stream_delivers_what_was_sent_then_an_incomplete_message(
    reactor: Any, clusters: Clusters, listen: Callable[[Any], int], framing: str
) -> None:
    """A node sends headers and one NDJSON line, then closes, in each framing: the client gets the
    status line, X-NVPair-Node and that line, then an incomplete message (not a reset); the workload
    fails with "upstream dropped mid-stream"; the other node never receives the request."""
    seen: list[bytes] = []
    factory = Factory()
    factory.protocol = lambda: DiesAfterOneLine(framing, seen)  # type: ignore[assignment]
    dying = Node("a", f"http://127.0.0.1:{listen(factory)}", MODEL)
    cluster = clusters(ProxyCluster)
    healthy = await cluster.add_engine("b", SimulatedEngine(reactor, MODEL))
    await cluster.start_proxy([dying, healthy])
    ended: Deferred[None] = Deferred()
    cluster.facade.shared.bus.subscribe(
        lambda e: None if e.name != "proxy/request" or ended.called else ended.callback(None),
        name="until-record",
    )
    port = int(cluster.url.rsplit(":", 1)[1])
    status, node, data, ending = await deferToThread(post_and_read, port)
    await bounded(reactor, ended)
    assert (status, node, data, ending) == (200, "a", LINE, "IncompleteRead")
    assert seen == [REQUEST_BODY]
    assert cluster.received(0) == []
    [errored] = cluster.named("workload:errored")
    assert errored["workload"]["state"] == "failed"
    assert errored["workload"]["error"] == "upstream dropped mid-stream"
    [record] = cluster.named("proxy/request")
    assert record["error"] == "upstream dropped mid-stream"
    assert cluster.named("workload:completed") == []


# ---- the proxy ending a stream itself: a cancelled workload --------------------------------------


class ArrivingStream(HeldStream):
    """A HeldStream that says when its request has arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: Deferred[None] = Deferred()

    def render(self, request: Request) -> int:  # type: ignore[override]
        result = super().render(request)
        self.arrived.callback(None)
        return result


def open_and_read_first_line(port: int) -> tuple[http.client.HTTPConnection, Any, bytes]:
    """Blocking (in a thread): POST a stream and read its status line, headers and first line."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/api/chat", REQUEST_BODY, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return connection, response, response.readline()


def read_rest(response: Any) -> tuple[bytes, str]:
    """Blocking (in a thread): read to the end; what came and how it ended."""
    try:
        return response.read(), "complete"
    except http.client.IncompleteRead as incomplete:
        return incomplete.partial, "IncompleteRead"
    except OSError as error:
        return b"", type(error).__name__


@pytest_twisted.ensureDeferred
async def test_a_cancelled_workload_leaves_the_client_an_incomplete_message_not_a_reset(
    reactor: Any, loopback: Loopback
) -> None:
    """``workload/cancel`` mid-stream: the client keeps the line it was sent and then sees the
    message end unfinished (no terminating chunk), not ECONNRESET."""
    upstream = ArrivingStream()
    await loopback.start(upstream)
    connection, response, first = await deferToThread(open_and_read_first_line, loopback.port)
    try:
        assert loopback.proxy is not None
        workloads = loopback.proxy.runtime.shared.workloads
        [live] = workloads.live()
        assert workloads.cancel(live.id)
        rest, ending = await deferToThread(read_rest, response)
    finally:
        connection.close()
    assert (response.status, first, rest, ending) == (200, HeldStream.FIRST, b"", "IncompleteRead")
    await bounded(reactor, upstream.ended)


# ---- relay() itself, deterministic: a real twisted.web Request over a StringTransport, a BodyGate
# fed by hand, and a task.Clock (mutation testing: docs/testing.md) ------------------------------


class _Captured(Resource):
    """Keeps every request open (the relay answers it)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Request] = []

    def render(self, request: Request) -> int:  # type: ignore[override]
        self.requests.append(request)
        return NOT_DONE_YET


class ClientTransport(StringTransport):
    """The client's socket: records a reset apart from a clean close."""

    aborted = False

    def abortConnection(self) -> None:
        self.aborted = True
        super().abortConnection()


@implementer(IPushProducer)
class UpstreamTransport:
    """The upstream body's transport: records flow control; stopping it ends the body as a
    closed connection does."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate: BodyGate | None = None

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.connectionLost(Failure(ConnectionLost()))


@implementer(IResponse)
class UpstreamResponse:
    """The committed upstream response (what Twisted's client hands over)."""

    version = (b"HTTP", 1, 1)
    request = None
    previousResponse = None

    def __init__(self, code: int, phrase: bytes, headers: Headers, length: int | object) -> None:
        self.code, self.phrase, self.headers, self.length = code, phrase, headers, length

    def deliverBody(self, protocol: Any) -> None:
        raise AssertionError("the gate already holds the body")

    def setPreviousResponse(self, response: IResponse) -> None:
        pass


class Relayed:
    """One ``relay()`` from a committed response to a real server Request, both ends in memory."""

    def __init__(
        self,
        *,
        method: bytes = b"POST",
        version: bytes = b"HTTP/1.1",
        code: int = 200,
        phrase: bytes = b"OK",
        content_type: bytes | None = b"application/x-ndjson",
        length: int | object = UNKNOWN_LENGTH,
        first: bytes = b"",
        budget: float = 30.0,
        watch: bool = True,
    ) -> None:
        self.clock = Clock()
        captured = _Captured()
        site = Site(captured)
        site.timeOut = None
        self.client = ClientTransport()
        self.channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        assert self.channel is not None
        self.channel.makeConnection(self.client)
        self.channel.dataReceived(
            method + b" /api/chat " + version + b"\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
        )
        [self.request] = captured.requests
        self.caller = CallerState()
        if watch:  # as the exchange does: a client that goes away abandons the caller
            self.request.notifyFinish().addErrback(lambda _: self.caller.abandon("client gone"))
        self.upstream = UpstreamTransport()
        self.gate = BodyGate(self.clock, 0.0)
        self.gate.makeConnection(self.upstream)  # type: ignore[arg-type]
        self.upstream.gate = self.gate
        if first:
            self.gate.dataReceived(first)
        headers = Headers()
        if content_type is not None:
            headers.setRawHeaders(b"content-type", [content_type])
        response = UpstreamResponse(code, phrase, headers, length)
        committed = Committed(Node("n0", "http://n0.test"), response, self.gate, first)
        self.outcomes: list[RelayOutcome | Failure] = []
        Deferred.fromCoroutine(
            relay(
                Writer(self.request, ErrorShape.PROXY), committed, self.caller, self.clock, budget
            )
        ).addBoth(self.outcomes.append)

    def end(self, reason: BaseException) -> None:
        """The upstream body ends with ``reason``."""
        self.gate.connectionLost(Failure(reason))

    @property
    def outcome(self) -> RelayOutcome:
        [outcome] = self.outcomes
        assert isinstance(outcome, RelayOutcome), outcome
        return outcome

    def head(self) -> tuple[bytes, dict[bytes, bytes]]:
        """The status line and the headers (lower-cased names) the client got."""
        head = self.client.value().partition(b"\r\n\r\n")[0].split(b"\r\n")
        return head[0], {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in head[1:])
        }

    def body(self) -> bytes:
        """The body bytes the client got, de-chunked when the answer is chunked."""
        raw: bytes = self.client.value().partition(b"\r\n\r\n")[2]
        if self.head()[1].get(b"transfer-encoding") != b"chunked":
            return raw
        data = b""
        while raw:
            size_line, _, raw = raw.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            data, raw = data + raw[:size], raw[size + 2 :]
        return data


def test_relay_forwards_status_phrase_node_and_length_then_finishes() -> None:
    """A known-length JSON answer: the upstream's status and reason phrase, X-NVPair-Node, the
    Content-Length (not chunked), the bytes, and a finished, complete outcome."""
    relayed = Relayed(
        phrase=b"Fine Thanks", content_type=b"application/json", length=5, first=b"he"
    )
    relayed.gate.dataReceived(b"llo")
    relayed.end(ResponseDone())
    status, headers = relayed.head()
    assert status == b"HTTP/1.1 200 Fine Thanks"
    assert headers[b"x-nvpair-node"] == b"n0"
    assert headers[b"content-length"] == b"5" and b"transfer-encoding" not in headers
    assert relayed.body() == b"hello"
    assert relayed.outcome == RelayOutcome(
        status=200,
        end=RelayEnd.FINISHED,
        error=None,
        complete=True,
        terminal_seen=False,
        streaming=False,
        sent=5,
    )
    assert not relayed.client.disconnecting  # keep-alive: finished, not closed


@pytest.mark.parametrize(("method", "code"), [(b"HEAD", 200), (b"POST", 204), (b"POST", 304)])
def test_bodiless_answers_get_no_content_length(method: bytes, code: int) -> None:
    """HEAD, 204 and 304 answers carry no Content-Length from the (zero) upstream length."""
    relayed = Relayed(method=method, code=code, content_type=None, length=0)
    relayed.end(ResponseDone())
    status, headers = relayed.head()
    assert status.startswith(b"HTTP/1.1 %d" % code)
    assert b"content-length" not in headers
    assert relayed.outcome.end is RelayEnd.FINISHED


def test_commit_on_headers_sends_the_head_at_once_and_nothing_else() -> None:
    """With nothing held (commit on headers) the head goes out before any body byte, with no
    body byte of its own; an upstream without Content-Type is relayed as a plain body."""
    relayed = Relayed(content_type=None)
    status, headers = relayed.head()
    assert status == b"HTTP/1.1 200 OK" and headers[b"transfer-encoding"] == b"chunked"
    assert relayed.body() == b""
    relayed.gate.dataReceived(b"abc")
    relayed.end(ResponseDone())
    assert relayed.body() == b"abc"
    assert relayed.client.value().endswith(b"0\r\n\r\n")
    outcome = relayed.outcome
    assert (outcome.end, outcome.sent, outcome.streaming) == (RelayEnd.FINISHED, 3, False)


def test_close_delimited_stream_ending_in_an_unterminated_done_line_is_finished() -> None:
    """A close-delimited NDJSON stream whose terminal line has no newline still ends complete:
    the tail is checked at the end, so it is finished, not truncated."""
    relayed = Relayed(first=b'{"done":false}\n')
    relayed.gate.dataReceived(b'{"done":true}')
    relayed.end(PotentialDataLoss())
    outcome = relayed.outcome
    assert (outcome.end, outcome.terminal_seen, outcome.streaming) == (
        RelayEnd.FINISHED,
        True,
        True,
    )
    assert relayed.client.value().endswith(b"0\r\n\r\n")


def test_close_delimited_stream_without_its_terminal_frame_is_truncated() -> None:
    """The same stream closed before any terminal frame is truncated: no terminating chunk."""
    relayed = Relayed(first=b'{"done":false}\n')
    relayed.end(PotentialDataLoss())
    outcome = relayed.outcome
    assert (outcome.end, outcome.error) == (RelayEnd.TRUNCATED, "upstream dropped mid-stream")
    assert not relayed.client.value().endswith(b"0\r\n\r\n")


def test_close_delimited_plain_answer_is_finished() -> None:
    """A non-streaming answer framed by the upstream's close ends finished (nothing to check)."""
    relayed = Relayed(content_type=b"application/json", first=b'{"a": 1}')
    relayed.end(PotentialDataLoss())
    assert relayed.outcome.end is RelayEnd.FINISHED
    assert relayed.body() == b'{"a": 1}'


def test_caller_leaving_mid_answer_stops_the_upstream_and_reports_why() -> None:
    """The caller goes before the answer is complete: the upstream is stopped and the outcome
    is caller-gone with the caller's reason."""
    relayed = Relayed(content_type=b"application/json", length=10, first=b"12345")
    relayed.caller.abandon("client gone")
    assert relayed.upstream.calls == ["stop"]
    assert relayed.outcome == RelayOutcome(
        status=200,
        end=RelayEnd.CALLER_GONE,
        error="client gone",
        complete=False,
        terminal_seen=False,
        streaming=False,
        sent=5,
    )


def test_caller_leaving_after_the_last_counted_byte_got_the_whole_answer() -> None:
    """Every Content-Length byte went out before the caller left: no error, complete."""
    relayed = Relayed(content_type=b"application/json", length=5, first=b"12345")
    relayed.caller.abandon("client gone")
    outcome = relayed.outcome
    assert (outcome.end, outcome.error, outcome.complete) == (RelayEnd.CALLER_GONE, None, True)


def test_client_disconnect_mid_answer_ends_the_relay_cleanly() -> None:
    """The client's connection goes away mid-stream: the relay ends caller-gone without touching
    the gone request (no unregistering on a request that has no channel)."""
    relayed = Relayed(first=b'{"done":false}\n')
    relayed.channel.connectionLost(Failure(ConnectionLost()))
    assert relayed.upstream.calls == ["stop"]
    outcome = relayed.outcome
    assert (outcome.end, outcome.error) == (RelayEnd.CALLER_GONE, "client gone")


def test_client_that_stops_reading_for_the_budget_is_reset() -> None:
    """The client's socket stays full for the whole write-stall budget: the upstream was paused,
    then the caller is abandoned as ``client stopped reading``, the client reset, the upstream
    stopped."""
    relayed = Relayed(first=b'{"done":false}\n', budget=30.0)
    assert relayed.client.producer is not None
    relayed.client.producer.pauseProducing()  # what a transport with a full send buffer does
    assert relayed.upstream.calls == ["pause"]
    relayed.clock.advance(30.0 - 2**-10)
    assert relayed.outcomes == [] and not relayed.client.aborted
    relayed.clock.advance(2**-10)
    assert relayed.caller.gone == "client stopped reading"
    assert relayed.client.aborted
    assert relayed.upstream.calls == ["pause", "stop"]
    outcome = relayed.outcome
    assert (outcome.end, outcome.error) == (RelayEnd.CALLER_GONE, "client stopped reading")
    assert relayed.clock.getDelayedCalls() == []


@pytest.mark.parametrize("budget", [1.0, 30.0])
def test_truncated_chunked_answer_is_closed_then_reset_after_the_budget(budget: float) -> None:
    """The upstream dies mid-stream: the client connection is closed (FIN, no terminating chunk);
    a client that does not read the rest is reset exactly at the write-stall budget."""
    relayed = Relayed(first=b'{"done":false}\n', budget=budget)
    relayed.end(ConnectionLost())
    assert relayed.outcome.end is RelayEnd.TRUNCATED
    assert relayed.client.disconnecting and not relayed.client.aborted
    assert not relayed.client.value().endswith(b"0\r\n\r\n")
    [timer] = relayed.clock.getDelayedCalls()
    assert timer.getTime() == budget
    relayed.clock.advance(budget - 2**-10)
    assert not relayed.client.aborted
    relayed.clock.advance(2**-10)
    assert relayed.client.aborted
    assert relayed.clock.getDelayedCalls() == []


def test_truncated_answer_read_to_the_end_is_not_reset() -> None:
    """The client reads what is left and the connection ends before the budget: no reset."""
    relayed = Relayed(first=b'{"done":false}\n', budget=30.0)
    relayed.end(ConnectionLost())
    relayed.channel.connectionLost(Failure(ConnectionDone()))
    assert relayed.clock.getDelayedCalls() == []
    relayed.clock.advance(60)
    assert not relayed.client.aborted


def test_truncated_answer_without_a_budget_arms_nothing() -> None:
    """With the write-stall rule off the truncated answer is only closed, and the connection's
    end is handled without error."""
    with capturedLogs() as events:
        relayed = Relayed(first=b'{"done":false}\n', budget=0.0)
        relayed.end(ConnectionLost())
        assert relayed.client.disconnecting and not relayed.client.aborted
        assert relayed.clock.getDelayedCalls() == []
        relayed.channel.connectionLost(Failure(ConnectionDone()))
        del relayed
        gc.collect()
    assert [e for e in events if e.get("log_failure") is not None or e.get("isError")] == []


def test_truncated_close_delimited_answer_is_reset() -> None:
    """An HTTP/1.0 client (close-delimited answer) cannot tell a clean close from the end, so a
    truncated answer is reset."""
    relayed = Relayed(version=b"HTTP/1.0", first=b'{"done":false}\n')
    relayed.end(ConnectionLost())
    assert relayed.outcome.end is RelayEnd.TRUNCATED
    assert relayed.client.aborted


def test_sub_second_budget_arms_the_guard() -> None:
    """Any positive budget arms the stall timer, a fraction of a second too."""
    stall_guard, clock, _, stalls = guard(budget=0.5)
    stall_guard.pauseProducing()
    assert [call.getTime() for call in clock.getDelayedCalls()] == [0.5]
    clock.advance(0.5)
    assert stalls == [None]


def test_after_a_stall_the_guard_can_be_paused_and_resumed_again() -> None:
    """A fired stall timer is forgotten: the next pause arms a fresh one, resume disarms it."""
    stall_guard, clock, upstream, stalls = guard()
    stall_guard.pauseProducing()
    clock.advance(30)
    assert stalls == [None]
    stall_guard.pauseProducing()
    assert [call.getTime() for call in clock.getDelayedCalls()] == [60.0]
    stall_guard.resumeProducing()
    assert clock.getDelayedCalls() == []
    assert upstream.calls == ["pause", "pause", "resume"]


def test_a_body_failed_by_a_proxy_bug_is_cut_logged_once_and_recorded_as_the_proxys() -> None:
    """A committed body that fails with anything but the upstream's drop (here a transducer's own
    bug) is cut like a drop, but logged once with its type and recorded as ``proxy-error``: the
    node is not blamed."""
    with capturedLogs() as events:
        relayed = Relayed(first=b'{"done":false}\n')
        relayed.end(ProxyBug(KeyError("choices")))
        outcome = relayed.outcome
    assert (outcome.end, outcome.error) == (RelayEnd.TRUNCATED, "proxy-error")
    assert not relayed.client.value().endswith(b"0\r\n\r\n")
    failures = [e for e in events if e.get("log_failure") is not None]
    assert len(failures) == 1
    assert failures[0]["log_failure"].check(ProxyBug)
    assert failures[0]["kind"] == "ProxyBug"


@pytest.mark.parametrize(
    "reason",
    [ResponseFailed([Failure(ConnectionLost())]), ConnectionLost(), ConnectionDone()],
)
def test_an_upstream_drop_mid_stream_is_the_nodes_and_not_logged(reason: Exception) -> None:
    """The upstream's drop (a transport failure) is recorded as it always was, without a log."""
    with capturedLogs() as events:
        relayed = Relayed(first=b'{"done":false}\n')
        relayed.end(reason)
        outcome = relayed.outcome
    assert (outcome.end, outcome.error) == (RelayEnd.TRUNCATED, "upstream dropped mid-stream")
    assert [e for e in events if e.get("log_failure") is not None] == []
