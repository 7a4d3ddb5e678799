"""Tests for nvpair_tw.inbound._limits: body cap, header limits, request line, timeouts, connection cap."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request

from nvpair_tw.inbound._limits import MIB, LimitedSite, Limits, make_site
from tests.helpers import exchange, refusal_code
from tests.inbound.channel_kit import Later, connect_limited, split_answer


class _Echo(Resource):
    """A leaf that records each request body and answers with its length."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []
        self.args: list[dict[bytes, list[bytes]]] = []

    def render(self, request: Request) -> bytes:
        assert request.content is not None
        body = request.content.read()
        self.bodies.append(body)
        self.args.append(dict(request.args or {}))
        return b"got %d" % len(body)


def _site(clock: Clock, **limits: Any) -> tuple[LimitedSite, _Echo]:
    root = _Echo()
    return make_site(root, clock=clock, **limits), root


def _error(raw: bytes) -> tuple[bytes, dict[str, Any]]:
    """The status line and JSON body of a proxy error response (checking its headers)."""
    status, headers, body = split_answer(raw)
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert headers[b"connection"] == b"close"
    assert int(headers[b"content-length"]) == len(body)
    return status, json.loads(body)


def _post(body: bytes, *extra: bytes) -> bytes:
    head = [b"POST /v1/x HTTP/1.1", b"Host: a", b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _chunked(*chunks: bytes) -> bytes:
    head = b"POST /v1/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return head + body + b"0\r\n\r\n"


def _closed(transport: StringTransportWithDisconnection, clock: Clock) -> None:
    """Close the connection if still open and check that no timer survives it."""
    if transport.connected:
        transport.loseConnection()
    assert clock.getDelayedCalls() == []


def test_content_length_body_at_the_cap_is_accepted() -> None:
    """A body of exactly max_body_size bytes reaches the resource."""
    clock = Clock()
    site, root = _site(clock, max_body_size=1024)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(_post(b"a" * 1024))
    assert root.bodies == [b"a" * 1024]
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    _closed(transport, clock)


def test_content_length_body_one_byte_over_the_cap_gets_413() -> None:
    """A declared length of cap + 1 is refused with 413 JSON and the connection closes."""
    clock = Clock()
    site, root = _site(clock, max_body_size=1024)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(_post(b"a" * 1025))
    status, body = _error(transport.value())
    assert status == b"HTTP/1.1 413 Content Too Large"
    assert body == {  # an OpenAI route's refusal is OpenAI's error object (docs/behaviour.md §9)
        "error": {
            "message": "request body exceeds 1024 bytes limit",
            "type": "invalid_request_error",
            "param": None,
            "code": "body-too-large",
        }
    }
    assert root.bodies == []
    assert not transport.connected
    _closed(transport, clock)


def test_default_cap_is_32_mib_and_named_in_the_message() -> None:
    """By default the cap is 32 MiB, exposed on the site and stated in MiB in the 413."""
    clock = Clock()
    site, _ = _site(clock)
    assert site.max_body_size == 32 * MIB
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % (32 * MIB + 1)
    )
    status, body = _error(transport.value())
    assert status.startswith(b"HTTP/1.1 413")
    assert body["error"] == "request body exceeds 32 MiB limit"
    _closed(transport, clock)


def test_chunked_body_at_the_cap_is_accepted() -> None:
    """A chunked upload totalling exactly the cap reaches the resource."""
    clock = Clock()
    site, root = _site(clock, max_body_size=1024)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(_chunked(b"a" * 1000, b"b" * 24))
    assert root.bodies == [b"a" * 1000 + b"b" * 24]
    _closed(transport, clock)


def test_chunked_body_over_the_cap_gets_413_and_is_never_rendered() -> None:
    """A chunked upload crossing the cap gets 413, even though its last chunk arrives after."""
    clock = Clock()
    site, root = _site(clock, max_body_size=1024)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(_chunked(b"a" * 1000, b"b" * 25))
    status, body = _error(transport.value())
    assert status == b"HTTP/1.1 413 Content Too Large"
    assert refusal_code(body) == "body-too-large"
    assert root.bodies == []
    _closed(transport, clock)


def test_expect_continue_over_the_cap_gets_413_without_100_continue() -> None:
    """An over-cap upload announcing Expect: 100-continue is refused before any 100."""
    clock = Clock()
    site, _ = _site(clock, max_body_size=1024)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1025\r\nExpect: 100-continue\r\n\r\n"
    )
    assert not transport.value().startswith(b"HTTP/1.1 100")
    status, _ = _error(transport.value())
    assert status.startswith(b"HTTP/1.1 413")
    _closed(transport, clock)


def test_expect_continue_within_the_cap_gets_100_continue() -> None:
    """An upload within the cap still gets the automatic 100 Continue."""
    clock = Clock()
    site, root = _site(clock, max_body_size=1024)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
    )
    assert transport.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    transport.protocol.dataReceived(b"abc")
    assert root.bodies == [b"abc"]
    _closed(transport, clock)


def test_headers_up_to_the_count_limit_are_accepted() -> None:
    """Exactly max_headers headers are fine."""
    clock = Clock()
    site, root = _site(clock, max_headers=5)
    _, transport = connect_limited(site)
    extra = b"".join(b"X-H%d: v\r\n" % i for i in range(4))
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
    assert root.bodies == [b""]
    _closed(transport, clock)


def test_too_many_headers_get_431() -> None:
    """One header more than max_headers is refused with 431 JSON."""
    clock = Clock()
    site, root = _site(clock, max_headers=5)
    _, transport = connect_limited(site)
    extra = b"".join(b"X-H%d: v\r\n" % i for i in range(5))
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
    status, body = _error(transport.value())
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert body == {"error": "more than 5 request headers", "code": "too-many-headers"}
    assert root.bodies == []
    _closed(transport, clock)


def test_too_large_headers_get_431() -> None:
    """Headers whose total size passes max_header_bytes are refused with 431 JSON."""
    clock = Clock()
    site, root = _site(clock, max_header_bytes=512)
    _, transport = connect_limited(site)
    extra = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(5))
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n" + extra + b"\r\n")
    status, body = _error(transport.value())
    assert status.startswith(b"HTTP/1.1 431")
    assert body == {"error": "request headers exceed 512 bytes", "code": "headers-too-large"}
    assert root.bodies == []
    _closed(transport, clock)


def test_unterminated_huge_header_line_gets_431() -> None:
    """A header line longer than any limit, still without its CRLF, is refused with 431."""
    clock = Clock()
    site, _ = _site(clock, max_header_bytes=512, max_request_line=256)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nX-Big: " + b"v" * 600)
    status, body = _error(transport.value())
    assert status.startswith(b"HTTP/1.1 431")
    assert body["code"] == "headers-too-large"
    _closed(transport, clock)


def test_long_request_line_gets_414() -> None:
    """A complete request line over max_request_line is refused with 414 JSON."""
    clock = Clock()
    site, root = _site(clock, max_request_line=256)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: a\r\n\r\n")
    status, body = _error(transport.value())
    assert status == b"HTTP/1.1 414 URI Too Long"
    assert body == {"error": "request line exceeds 256 bytes", "code": "request-line-too-long"}
    assert root.bodies == []
    _closed(transport, clock)


def test_unterminated_request_line_past_the_line_buffer_gets_414() -> None:
    """A request line that never ends is refused with 414 once it passes the line buffer."""
    clock = Clock()
    site, _ = _site(clock, max_request_line=256, max_header_bytes=512)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET /" + b"a" * 600)
    status, _ = _error(transport.value())
    assert status.startswith(b"HTTP/1.1 414")
    _closed(transport, clock)


def test_malformed_request_gets_json_400() -> None:
    """Twisted's bare 400 for a malformed header is replaced by a JSON one."""
    clock = Clock()
    site, _ = _site(clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
    status, body = _error(transport.value())
    assert status == b"HTTP/1.1 400 Bad Request"
    assert body["code"] == "bad-request"
    _closed(transport, clock)


def test_headers_not_complete_within_the_header_timeout_get_408() -> None:
    """Dribbled header bytes do not extend the header deadline: 408 JSON at 10 s, then close."""
    clock = Clock()
    site, root = _site(clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\n")
    for _ in range(3):
        clock.advance(3)
        transport.protocol.dataReceived(b"X-Slow: 1\r\n")
    assert transport.value() == b""
    clock.advance(1)
    status, body = _error(transport.value())
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert body == {
        "error": "request headers not received within 10 seconds",
        "code": "header-timeout",
    }
    assert root.bodies == []
    assert not transport.connected
    _closed(transport, clock)


def test_an_answered_request_leaves_the_next_heads_deadline_and_a_silent_close() -> None:
    """Once a request is answered the head deadline runs again from the answer's end: a
    kept-alive connection that sends nothing is closed at 10 s, without a 408 (docs/behaviour.md
    §14.4)."""
    clock = Clock()
    site, root = _site(clock)
    _, transport = connect_limited(site)
    clock.advance(3)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert root.bodies == [b""]
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [13.0, 93.0]
    clock.advance(9.9)
    assert transport.connected
    clock.advance(0.1)
    assert not transport.connected
    assert transport.value().count(b"HTTP/1.1 ") == 1 and b"408" not in transport.value()
    assert site.open_connections == 0
    _closed(transport, clock)


@pytest.mark.parametrize(
    "request_",
    [b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", b"GET / HTTP/1.0\r\n\r\n"],
    ids=["close", "http/1.0"],
)
def test_a_connection_closed_after_its_answer_is_not_given_another_deadline(
    request_: bytes,
) -> None:
    """Only a kept-alive connection waits for a next head: one closed after its answer keeps no
    timer of ours."""
    clock = Clock()
    site, root = _site(clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(request_)
    assert root.bodies == [b""] and not transport.connected
    assert clock.getDelayedCalls() == []


def test_a_connection_that_sends_nothing_is_closed_silently_from_accept() -> None:
    clock = Clock()
    site, _ = _site(clock, header_timeout=4.0)
    _, transport = connect_limited(site)
    clock.advance(3.9)
    assert transport.connected
    clock.advance(0.1)
    assert not transport.connected and transport.value() == b""
    _closed(transport, clock)


def test_slow_body_after_headers_is_not_cut_by_the_header_timer() -> None:
    """The header deadline stops at the end of the headers; a slow body is governed by the body
    deadline (30 s), longer than the header one (10 s)."""
    clock = Clock()
    site, root = _site(clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n")
    clock.advance(29)
    transport.protocol.dataReceived(b"ok")
    assert root.bodies == [b"ok"]
    _closed(transport, clock)


def test_a_keep_alive_requests_head_is_timed_from_the_previous_answer() -> None:
    """A second request on a kept-alive connection has 10 s from the end of the first answer for
    its whole head, however late its first byte comes."""
    clock = Clock()
    site, root = _site(clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    clock.advance(5)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\n")
    clock.advance(4.9)
    assert b"408" not in transport.value()
    clock.advance(0.1)
    assert b"HTTP/1.1 408 Request Timeout" in transport.value()
    assert root.bodies == [b""]
    _closed(transport, clock)


class _CountingClock(Clock):
    """A clock that counts the calls scheduled on it."""

    scheduled = 0

    def callLater(self, delay: float, callable: Any, *args: Any, **kw: Any) -> Any:
        self.scheduled += 1
        return super().callLater(delay, callable, *args, **kw)


def test_a_connection_holds_one_deadline_moved_from_request_to_request() -> None:
    """The input's deadline is made at accept and moved after that, never made again: requests
    read whole in one read schedule only Twisted's own keep-alive timer each."""
    clock = _CountingClock()
    site, root = _site(clock)
    _, transport = connect_limited(site)
    before = clock.scheduled
    for _ in range(3):
        transport.protocol.dataReceived(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok"
        )
        clock.advance(1)
    assert root.bodies == [b"ok"] * 3
    assert clock.scheduled - before == 3  # the keep-alive idle timer, moved by Twisted
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [12.0, 92.0]
    _closed(transport, clock)


def test_client_leaving_mid_headers_leaves_no_timer() -> None:
    """A client that disconnects while sending headers takes every timer with it."""
    clock = Clock()
    site, _ = _site(clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n")
    assert len(clock.getDelayedCalls()) == 2
    transport.loseConnection()
    assert clock.getDelayedCalls() == []
    assert site.open_connections == 0


def test_idle_keep_alive_closes_after_an_idle_timeout_shorter_than_the_head_deadline() -> None:
    """An idle kept-alive connection is closed by whichever comes first, and leaves no timer."""
    clock = Clock()
    site, _ = _site(clock, idle_timeout=5.0)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    clock.advance(4.9)
    assert transport.connected
    clock.advance(0.1)
    assert not transport.connected
    assert clock.getDelayedCalls() == []


def test_connections_beyond_the_cap_get_503_and_close() -> None:
    """The connection after max_connections gets 503 JSON; a freed slot is usable again."""
    clock = Clock()
    site, _ = _site(clock, max_connections=2)
    (_, first), (_, second) = connect_limited(site), connect_limited(site)
    assert site.open_connections == 2
    _, third = connect_limited(site)
    status, body = _error(third.value())
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert body == {"error": "too many connections", "code": "too-many-connections"}
    assert not third.connected
    assert site.open_connections == 2
    first.loseConnection()
    assert site.open_connections == 1
    _, fourth = connect_limited(site)
    fourth.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert fourth.value().startswith(b"HTTP/1.1 200 OK")
    for transport in (second, fourth):
        transport.loseConnection()
    assert site.open_connections == 0
    assert clock.getDelayedCalls() == []


def test_data_after_a_rejection_is_ignored() -> None:
    """Bytes arriving after a refusal are neither parsed into a request nor arm a timer."""
    clock = Clock()
    site, root = _site(clock, max_body_size=4)
    channel, transport = connect_limited(site)
    transport.loseConnection = lambda: None  # type: ignore[method-assign]
    channel.dataReceived(b"NONSENSE\r\n")
    assert transport.value().startswith(b"HTTP/1.1 400")
    [idle] = clock.getDelayedCalls()
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    channel.dataReceived(b"GET / HTTP/1.1\r\n")
    assert root.bodies == []
    assert transport.value().count(b"HTTP/1.1") == 1
    assert clock.getDelayedCalls() == [idle]
    channel.connectionLost(Failure(ConnectionDone()))
    assert clock.getDelayedCalls() == []


def test_form_bodies_are_not_parsed_and_site_is_quiet() -> None:
    """The site neither parses form uploads into args nor logs factory start/stop."""
    clock = Clock()
    site, root = _site(clock)
    assert site.noisy is False
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(
        _post(b"a=1&b=2", b"Content-Type: application/x-www-form-urlencoded")
    )
    assert root.bodies == [b"a=1&b=2"]
    assert root.args == [{}]
    _closed(transport, clock)


def test_limits_reject_non_positive_values() -> None:
    """A zero or negative limit is a configuration error, not a silently disabled check."""
    with pytest.raises(ValueError, match="max_body_size"):
        Limits(max_body_size=0)
    with pytest.raises(ValueError, match="header_timeout"):
        make_site(_Echo(), clock=Clock(), header_timeout=-1)


# Loopback tests over real sockets (blocking clients run in a thread).


def _crowd(port: int) -> tuple[bytes, bytes]:
    """Hold one connection, open a second (refused), then use the first."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as held:
        refused = exchange(port, b"")
        held.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := held.recv(65536):
            chunks.append(chunk)
    return refused, b"".join(chunks)


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_body_cap(reactor: Any, listen: Any) -> None:
    """Over real sockets: the cap is accepted, cap + 1 (length or chunked) gets 413."""
    root = _Echo()
    port = listen(make_site(root, clock=reactor, max_body_size=1024))
    ok = await deferToThread(exchange, port, _post(b"a" * 1024, b"Connection: close"))
    assert ok.startswith(b"HTTP/1.1 200 OK")
    assert ok.endswith(b"got 1024")
    over = await deferToThread(exchange, port, _post(b"a" * 1025))
    assert _error(over)[0].startswith(b"HTTP/1.1 413")
    chunked = await deferToThread(exchange, port, _chunked(b"a" * 1025))
    assert _error(chunked)[0].startswith(b"HTTP/1.1 413")
    assert root.bodies == [b"a" * 1024]


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_expect_continue_over_cap(reactor: Any, listen: Any) -> None:
    """Over real sockets: Expect: 100-continue over the cap gets 413 and never 100 Continue."""
    port = listen(make_site(_Echo(), clock=reactor, max_body_size=1024))
    raw = await deferToThread(
        exchange,
        port,
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2048\r\nExpect: 100-continue\r\n\r\n",
    )
    assert b"100 Continue" not in raw
    status, body = _error(raw)
    assert status.startswith(b"HTTP/1.1 413")
    assert body["code"] == "body-too-large"


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_header_limits(reactor: Any, listen: Any) -> None:
    """Over real sockets: too many headers get 431 and an over-long request line 414."""
    port = listen(make_site(_Echo(), clock=reactor, max_headers=3, max_request_line=128))
    many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(4)) + b"\r\n"
    assert _error(await deferToThread(exchange, port, many))[0].startswith(b"HTTP/1.1 431")
    long_line = b"GET /" + b"a" * 200 + b" HTTP/1.1\r\n\r\n"
    assert _error(await deferToThread(exchange, port, long_line))[0].startswith(b"HTTP/1.1 414")


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_connection_cap(reactor: Any, listen: Any) -> None:
    """Over real sockets: the connection beyond the cap gets 503; the held one still works."""
    site = make_site(_Echo(), clock=reactor, max_connections=1)
    port = listen(site)
    refused, served = await deferToThread(_crowd, port)
    status, body = _error(refused)
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert body["code"] == "too-many-connections"
    assert served.startswith(b"HTTP/1.1 200 OK")
    assert site.open_connections == 0


def test_a_head_dribbled_while_a_request_is_handled_is_timed_from_that_requests_end() -> None:
    """Bytes that arrive while a request is handled wait behind it; the head they start gets its
    10 s from the moment the answer is done."""
    clock = Clock()
    root = Later()
    site = make_site(root, clock=clock)
    _, transport = connect_limited(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HT")
    clock.advance(20)
    transport.protocol.dataReceived(b"TP/1.1\r\nX: 1\r\n")
    clock.advance(20)
    [req] = root.pending
    req.write(b"x")
    req.finish()
    clock.advance(9.9)
    assert b"408" not in transport.value()
    clock.advance(0.1)
    assert b"408" in transport.value()


_POST = b"POST / HTTP/1.1\r\nHost: a\r\n"
_STALLS: dict[str, tuple[list[bytes | float], float]] = {
    "a request line cut short": ([b"GET / HT"], 10.0),
    "a head after a bare CRLF, from accept": ([b"\r\n", 5.0, b"G", 4.0, b"E"], 10.0),
    "a head begun late, from accept": ([8.0, b"GET / HTTP/1.1\r\n"], 10.0),
    "a pipelined head cut short after an answered request": (
        [b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HT"],
        10.0,
    ),
    "a body split over reads, from its last read": (
        [_POST + b"Content-Length: 3\r\n\r\na", 29.0, b"b"],
        59.0,
    ),
    "an Expect: 100-continue body that never comes": (
        [_POST + b"Content-Length: 3\r\nExpect: 100-continue\r\n\r\n"],
        30.0,
    ),
    "a chunked body stalled after one chunk": (
        [_POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"],
        30.0,
    ),
}
"""Playbooks of requests that stop arriving: reads (bytes) and waits (seconds), then the time
their 408 is due: the head's 10 s from accept or from the last answer, the body's 30 s from its
last read."""


@pytest.mark.parametrize(("steps", "due"), list(_STALLS.values()), ids=list(_STALLS))
def test_a_request_that_stops_arriving_gets_its_408_when_its_deadline_is_due(
    steps: list[bytes | float], due: float
) -> None:
    clock = Clock()
    site, _ = _site(clock)
    _, transport = connect_limited(site)
    for step in steps:
        if isinstance(step, bytes):
            transport.protocol.dataReceived(step)
        else:
            clock.advance(step)
    clock.advance(due - 0.5 - clock.seconds())
    assert b"408" not in transport.value()
    clock.advance(0.5)
    assert b"HTTP/1.1 408 Request Timeout" in transport.value()
    _closed(transport, clock)
