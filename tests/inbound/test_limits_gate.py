"""Tests for nvpair_tw.inbound._limits' head gate, body deadline and versionless ``Server``
(docs/behaviour.md §14.1 order of checks, §14.4)."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from nvpair_tw.core import IWriteHolding
from nvpair_tw.inbound import Rejection
from nvpair_tw.inbound._limits import MIB, LimitedRequest, LimitedSite, Limits, make_site
from tests.inbound.channel_kit import connect, split_answer

_REFUSED = Rejection(403, "source-not-allowed", "source address not allowed")
_CHALLENGE = Rejection(
    401, "auth-required", "API key required", ((b"WWW-Authenticate", b'Bearer realm="x"'),)
)
_BIG = 31 * MIB


class _Paths(Resource):
    """A leaf that records each request's path, body and what the gate put on it."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[bytes] = []
        self.stashed: list[object] = []

    def render(self, request: Request) -> bytes:
        assert request.content is not None
        self.paths.append(request.path)
        self.stashed.append(getattr(request, "caller", None))
        return b"got %d" % len(request.content.read())


class _Gate:
    """A head gate that refuses paths under /no and records what it saw."""

    def __init__(self, refusal: Rejection = _REFUSED) -> None:
        self.refusal = refusal
        self.seen: list[tuple[bytes, bytes, object]] = []

    def __call__(self, request: LimitedRequest) -> Rejection | None:
        self.seen.append((request.method, request.uri, getattr(request, "content", None)))
        if request.uri.startswith(b"/no"):
            return self.refusal
        request.caller = "alice"  # type: ignore[attr-defined]
        return None


class _CountingSite(LimitedSite):
    """Counts every byte its channels read; ``arrived`` fires once ``expect`` bytes are in."""

    received = 0
    expect = 0
    arrived: Deferred[None] | None = None

    def buildProtocol(self, addr: Any) -> Any:
        channel = super().buildProtocol(addr)
        read = channel.dataReceived

        def counted(data: bytes) -> None:
            self.received += len(data)
            read(data)
            if self.arrived is not None and self.received >= self.expect:
                arrived, self.arrived = self.arrived, None
                arrived.callback(None)

        channel.dataReceived = counted
        return channel


def _counting_site(clock: Any, gate: _Gate | None = None, **limits: Any) -> _CountingSite:
    site = _CountingSite(_Paths(), Limits(**limits), clock)
    site.head_gate = gate
    return site


def _post(path: bytes, body: bytes, *extra: bytes) -> bytes:
    head = [b"POST " + path + b" HTTP/1.1", b"Host: a", b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_HIDDEN = b"GET /secret HTTP/1.1\r\nHost: a\r\n\r\n"
"""A second request hidden in a refused request's body: it must never be parsed."""


def test_a_refused_head_is_answered_with_its_json_and_headers_and_closed() -> None:
    """The gate's Rejection becomes the answer (status, code, message, its headers, Connection:
    close, a versionless Server, no request id); the body is never read and nothing is handled."""
    clock = Clock()
    gate = _Gate(_CHALLENGE)
    site = _counting_site(clock, gate)
    transport = connect(site)
    transport.protocol.dataReceived(_post(b"/no", _HIDDEN))
    status, headers, body = split_answer(transport.value())
    assert status == b"HTTP/1.1 401 Unauthorized"
    assert json.loads(body) == {"error": "API key required", "code": "auth-required"}
    assert headers[b"www-authenticate"] == b'Bearer realm="x"'
    assert headers[b"connection"] == b"close"
    assert headers[b"server"] == b"nvpair-tw"
    assert b"x-nvpair-request-id" not in headers
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert not transport.connected
    assert gate.seen == [(b"POST", b"/no", None)]  # no body buffered, no temp file made
    assert isinstance(site.resource, _Paths)
    assert site.resource.paths == []
    assert clock.getDelayedCalls() == []


def test_the_gate_runs_once_per_request_and_what_it_stashes_reaches_the_resource() -> None:
    """Two keep-alive requests: the gate runs once for each, at the end of its head, and an
    attribute it sets is on the request the resource handles."""
    clock = Clock()
    gate = _Gate()
    site = _counting_site(clock, gate)
    transport = connect(site)
    transport.protocol.dataReceived(_post(b"/a", b"x") + b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [(method, uri) for method, uri, _ in gate.seen] == [(b"POST", b"/a"), (b"GET", b"/b")]
    assert isinstance(site.resource, _Paths)
    assert site.resource.paths == [b"/a", b"/b"]
    assert site.resource.stashed == ["alice", "alice"]
    transport.loseConnection()
    assert clock.getDelayedCalls() == []


def test_a_refused_expect_continue_gets_no_100_and_a_body_over_the_cap_gets_the_gates_answer() -> (
    None
):
    """The gate runs before the body cap and before ``100 Continue``: a 64 MiB declared body
    from a refused source is 403, not 413, and no 100 is written."""
    clock = Clock()
    site = _counting_site(clock, _Gate())
    transport = connect(site)
    transport.protocol.dataReceived(
        b"POST /no HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
        % (64 * MIB)
    )
    assert b"100 Continue" not in transport.value()
    assert split_answer(transport.value())[0] == b"HTTP/1.1 403 Forbidden"


def test_a_passed_expect_continue_still_gets_its_100() -> None:
    clock = Clock()
    site = _counting_site(clock, _Gate())
    transport = connect(site)
    transport.protocol.dataReceived(
        b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    assert transport.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    transport.protocol.dataReceived(b"ok")
    assert isinstance(site.resource, _Paths)
    assert site.resource.paths == [b"/a"]
    transport.loseConnection()


def test_a_gate_that_raises_is_a_500_and_a_close() -> None:
    clock = Clock()

    def broken(request: LimitedRequest) -> Rejection | None:
        raise KeyError("bug")

    site = _counting_site(clock)
    site.head_gate = broken
    transport = connect(site)
    transport.protocol.dataReceived(_post(b"/a", _HIDDEN))
    status, _, body = split_answer(transport.value())
    assert status == b"HTTP/1.1 500 Internal Server Error"
    assert json.loads(body)["code"] == "internal-error"
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert not transport.connected


def test_a_body_that_stops_arriving_for_30_seconds_gets_408() -> None:
    """The body deadline restarts with each byte: a slow trickle passes, a stall is 408."""
    clock = Clock()
    site = _counting_site(clock)
    transport = connect(site)
    transport.protocol.dataReceived(_post(b"/a", b"abc")[:-3])
    for byte in (b"a", b"b"):
        clock.advance(29)
        transport.protocol.dataReceived(byte)
    clock.advance(29.9)
    assert transport.value() == b""
    clock.advance(0.1)
    status, headers, body = split_answer(transport.value())
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert json.loads(body) == {
        "error": "request body stalled for 30 seconds",
        "code": "body-timeout",
    }
    assert headers[b"server"] == b"nvpair-tw"
    assert not transport.connected
    assert clock.getDelayedCalls() == []


def test_a_body_that_never_starts_gets_408_after_the_body_deadline() -> None:
    """The deadline runs from the end of the head, not from the first body byte."""
    clock = Clock()
    site = _counting_site(clock, body_timeout=5)
    transport = connect(site)
    transport.protocol.dataReceived(_post(b"/a", b"abc")[:-3])
    clock.advance(5)
    assert split_answer(transport.value())[0] == b"HTTP/1.1 408 Request Timeout"
    assert not transport.connected


def test_a_chunked_body_that_stalls_gets_408_and_a_complete_one_stops_the_deadline() -> None:
    clock = Clock()
    site = _counting_site(clock, body_timeout=5)
    transport = connect(site)
    head = b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    transport.protocol.dataReceived(head + b"1\r\na\r\n0\r\n\r\n")
    # the keep-alive timer and the next head's deadline: the body's is gone
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [10, 90]
    transport.protocol.dataReceived(head + b"1\r\na\r\n")
    clock.advance(5)
    assert (
        split_answer(transport.value().rpartition(b"got 1")[2])[0]
        == b"HTTP/1.1 408 Request Timeout"
    )


def test_every_answer_has_a_versionless_server_and_a_nodes_own_passes() -> None:
    """Twisted's ``TwistedWeb/x.y`` never goes out; a ``Server`` a resource set (a node's,
    relayed) is left as it is."""

    class _Named(Resource):
        isLeaf = True

        def render(self, request: Request) -> bytes:
            if request.path == b"/node":
                request.setHeader(b"server", b"llama.cpp")
            return b"ok"

    clock = Clock()
    transport = connect(make_site(_Named(), clock=clock))
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert split_answer(transport.value())[1][b"server"] == b"nvpair-tw"
    transport.clear()
    transport.protocol.dataReceived(b"GET /node HTTP/1.1\r\nHost: a\r\n\r\n")
    assert split_answer(transport.value())[1][b"server"] == b"llama.cpp"
    transport.clear()
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n")
    assert split_answer(transport.value())[1][b"server"] == b"nvpair-tw"  # the channel's own 400
    assert b"TwistedWeb" not in transport.value()


# Loopback tests over real sockets (blocking clients run in a thread).


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass  # the server closed with the client's unsent body still coming
    return b"".join(chunks)


def _polite_upload(port: int, head: bytes, size: int) -> tuple[bytes, int]:
    """As curl does: send the head, wait for ``100 Continue`` or an answer, then send the body
    anyway; return what was read and how many body bytes the kernel took before the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        first = sock.recv(65536)
        sent = 0
        block = b"x" * 65536
        try:
            while sent < size:
                sent += sock.send(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return first + _read_all(sock), sent


def _eager_upload(port: int, payload: bytes) -> bytes:
    """Send the head and the whole body without waiting; read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)
        return _read_all(sock)


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_31_mib_expect_continue_refused_at_the_head(
    reactor: Any, listen: Any
) -> None:
    """The finding: 31 MiB with ``Expect: 100-continue`` from a refused source got ``100
    Continue`` and was read to a temp file before the 403. Now no 100 is written and the server
    reads the head alone; the client's late body is never read."""
    gate = _Gate()
    site = _counting_site(reactor, gate)
    port = listen(site)
    head = b"POST /no HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (
        _BIG
    )
    raw, _ = await deferToThread(_polite_upload, port, head, _BIG)
    assert b"100 Continue" not in raw
    status, headers, body = split_answer(raw)
    assert status == b"HTTP/1.1 403 Forbidden"
    assert json.loads(body)["code"] == "source-not-allowed"
    assert headers[b"connection"] == b"close"
    assert site.received == len(head)
    assert gate.seen == [(b"POST", b"/no", None)]


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_eager_31_mib_refused_reads_a_bounded_amount(
    reactor: Any, listen: Any
) -> None:
    """A client that sends 31 MiB without waiting still gets the 403, and the server reads at
    most a few socket reads of it before it closes."""
    site = _counting_site(reactor, _Gate())
    port = listen(site)
    raw = await deferToThread(_eager_upload, port, _post(b"/no", b"x" * _BIG))
    assert split_answer(raw)[0] == b"HTTP/1.1 403 Forbidden"
    assert site.received < 1 * MIB


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_a_request_hidden_in_a_refused_body_is_never_parsed(
    reactor: Any, listen: Any
) -> None:
    site = _counting_site(reactor, _Gate())
    port = listen(site)
    raw = await deferToThread(_eager_upload, port, _post(b"/no", _HIDDEN) + _HIDDEN)
    assert raw.count(b"HTTP/1.1 ") == 1
    assert split_answer(raw)[0] == b"HTTP/1.1 403 Forbidden"
    assert isinstance(site.resource, _Paths)
    assert site.resource.paths == []


def _stalled_upload(port: int, head: bytes, part: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + part)
        return _read_all(sock)


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_a_stalled_body_gets_408_on_the_injected_clock(
    reactor: Any, listen: Any
) -> None:
    clock = Clock()
    site = _counting_site(clock)
    port = listen(site)
    head = b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"
    site.expect, site.arrived = len(head) + 4, Deferred()
    answer = deferToThread(_stalled_upload, port, head, b"half")
    await site.arrived
    clock.advance(29.9)
    assert not answer.called
    clock.advance(0.1)
    status, _, body = split_answer(await answer)
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert json.loads(body)["code"] == "body-timeout"
    assert site.open_connections == 0


@implementer(IWriteHolding)
class _HoldingTransport(StringTransportWithDisconnection):
    """Records, in order, the holds, the sends of what was held and each write's bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[bytes | str] = []

    def hold(self) -> None:
        self.steps.append("hold")

    def send_held(self) -> None:
        self.steps.append("send_held")

    def write(self, data: bytes) -> None:
        self.steps.append(data)
        super().write(data)

    def writeSequence(self, seq: Any) -> None:
        self.write(b"".join(seq))


def test_an_answers_head_and_first_body_bytes_are_written_as_one_send() -> None:
    """Twisted writes the head, then the body: both inside one hold of the transport, so an eager
    connection gives them to the kernel in one system call (one packet); later writes are direct."""

    class _Twice(Resource):
        isLeaf = True

        def render(self, request: Request) -> int:
            request.write(b"first")
            request.write(b"second")
            request.finish()
            return NOT_DONE_YET

    transport = _HoldingTransport()
    channel = make_site(_Twice(), clock=Clock()).buildProtocol(
        IPv4Address("TCP", "127.0.0.1", 40000)
    )
    transport.protocol = channel
    channel.makeConnection(transport)
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    hold, head, first, held, second, *_end = transport.steps
    assert (hold, held) == ("hold", "send_held")
    assert isinstance(head, bytes) and head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert first == b"5\r\nfirst\r\n" and second == b"6\r\nsecond\r\n"
