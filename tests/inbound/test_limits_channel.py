"""Tests for nvpair_tw.inbound._limits' channel over a connection's life: the raw hand-over a
tunnel takes, the close, an answer written after the client left, the CORS of a refusal made
before any request and of ``allow_origin``, the limits' exact boundaries, and the site's
settings (docs/behaviour.md §13.4, §14.4, §14.5)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.inbound import CorsPolicy
from nvpair_tw.inbound._cors import EXPOSED_HEADERS
from nvpair_tw.inbound._limits import (
    LimitedSite,
    Limits,
    allow_origin,
    make_site,
)
from tests.inbound.channel_kit import Later, Ok, connect_limited, split_answer

OK = b"https://ok.example"
_POLICY = CorsPolicy.of([OK.decode()])


class _Sink:
    """A tunnel's end: records what it is given."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.lost: list[Failure] = []

    def client_data(self, data: bytes) -> None:
        self.data.append(data)

    def client_lost(self, reason: Failure) -> None:
        self.lost.append(reason)


def _head(raw: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    status, headers, _ = split_answer(raw)
    return status, headers


_UPGRADE = b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"


def test_a_handed_over_connection_gives_the_tunnel_every_byte_and_its_loss() -> None:
    """What followed the head before the hand-over comes back from it (every read of it, in
    order); every later byte goes to the sink untouched, never parsed; the loss is the sink's."""
    clock = Clock()
    root = Later()
    channel, transport = connect_limited(make_site(root, clock=clock))
    channel.dataReceived(_UPGRADE + b"\x81\x05")
    channel.dataReceived(b"hello")
    sink = _Sink()
    assert channel.hand_over(sink) == b"\x81\x05hello"
    channel.dataReceived(b"GET / HTTP/1.1\r\n\r\n")
    assert sink.data == [b"GET / HTTP/1.1\r\n\r\n"]
    assert transport.value() == b""
    assert [call.getTime() for call in clock.getDelayedCalls()] == []
    reason = Failure(ConnectionDone())
    channel.connectionLost(reason)
    assert sink.lost == [reason]
    assert channel.site is not None
    assert isinstance(channel.site, LimitedSite) and channel.site.open_connections == 0


_ONCE = r"^hand_over is only for the request being handled, once$"


def test_hand_over_is_only_for_the_request_being_handled_and_only_once() -> None:
    channel, transport = connect_limited(make_site(Later(), clock=Clock()))
    with pytest.raises(RuntimeError, match=_ONCE):
        channel.hand_over(_Sink())
    channel.dataReceived(_UPGRADE)
    channel.hand_over(_Sink())
    with pytest.raises(RuntimeError, match=_ONCE):
        channel.hand_over(_Sink())
    transport.loseConnection()


def test_a_pending_request_learns_the_reason_its_client_left() -> None:
    root = Later()
    channel, transport = connect_limited(make_site(root, clock=Clock()))
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    gone: list[Failure] = []
    root.pending[0].notifyFinish().addErrback(gone.append)
    transport.loseConnection()
    [reason] = gone
    assert reason.check(ConnectionDone)


def test_an_answer_written_after_the_client_left_is_dropped_quietly() -> None:
    root = Later()
    channel, transport = connect_limited(make_site(root, clock=Clock(), cors=_POLICY))
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\nOrigin: " + OK + b"\r\n\r\n")
    transport.loseConnection()
    [request] = root.pending
    request.write(b"late")
    assert transport.value() == b""


def test_a_connection_closed_twice_is_released_once() -> None:
    site = make_site(Later(), clock=Clock())
    channel, transport = connect_limited(site)
    _, other = connect_limited(site)
    transport.loseConnection()
    channel.connectionLost(Failure(ConnectionDone()))
    assert site.open_connections == 1
    other.loseConnection()
    assert site.open_connections == 0


def test_a_connection_its_resource_closes_inside_a_read_arms_no_deadline_afterwards() -> None:
    """The resource answers and closes the connection while the read that brought its request
    still holds the start of a pipelined head: that leftover starts no header deadline (a timer
    on a dead connection)."""

    class _AnswerAndClose(Resource):
        isLeaf = True

        def render(self, request: Request) -> Any:
            request.write(b"x")
            request.finish()
            assert request.transport is not None
            request.transport.loseConnection()
            return NOT_DONE_YET

    clock = Clock()
    channel, transport = connect_limited(make_site(_AnswerAndClose(), clock=clock))
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HT")
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    assert not transport.connected
    assert clock.getDelayedCalls() == []


def test_a_refusal_before_any_request_answers_an_allowed_origins_site_without_grants() -> None:
    """A connection over the cap, and a request line that never ends, are refused before any
    ``Origin`` was read: JSON, no grants, and no failure looking for a request."""
    clock = Clock()
    site = make_site(Ok(), clock=clock, max_connections=1, cors=_POLICY)
    _, held = connect_limited(site)
    _, refused = connect_limited(site)
    status, headers = _head(refused.value())
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert not any(name.startswith(b"access-control-") for name in headers)
    held.protocol.dataReceived(b"GET / HT")
    clock.advance(10)
    status, headers = _head(held.value())
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert not any(name.startswith(b"access-control-") for name in headers)


def test_allow_origin_without_a_cors_policy_grants_last_over_a_nodes_cors() -> None:
    """``allow_origin`` on a site that knows no policy: the grants are set again as the head is
    written, so a node's ``Access-Control-Allow-Origin: *`` set after it does not win."""

    class _Granting(Resource):
        isLeaf = True

        def render(self, request: Request) -> bytes:
            allow_origin(request, OK)
            request.setHeader(b"access-control-allow-origin", b"*")
            request.setHeader(b"access-control-expose-headers", b"X-Secret")
            return b"ok"

    channel, transport = connect_limited(make_site(_Granting(), clock=Clock()))
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\nOrigin: " + OK + b"\r\n\r\n")
    _, headers = _head(transport.value())
    assert headers[b"access-control-allow-origin"] == OK
    assert headers[b"access-control-expose-headers"] == EXPOSED_HEADERS
    assert headers[b"vary"] == b"Origin"
    assert b"access-control-allow-credentials" not in headers
    transport.loseConnection()


def test_a_request_line_of_exactly_the_limit_passes_and_one_byte_more_gets_414() -> None:
    site = make_site(Ok(), clock=Clock(), max_request_line=64)
    for extra, status in ((0, b"HTTP/1.1 200 OK"), (1, b"HTTP/1.1 414 URI Too Long")):
        line = b"GET /" + b"a" * (64 - len(b"GET / HTTP/1.1") + extra) + b" HTTP/1.1"
        assert len(line) == 64 + extra
        _, transport = connect_limited(site)
        transport.protocol.dataReceived(line + b"\r\nHost: a\r\n\r\n")
        assert _head(transport.value())[0] == status
        transport.loseConnection()


def test_a_head_of_exactly_the_header_bytes_passes_and_one_byte_more_gets_431() -> None:
    """The size counts every line of the head without its CRLF: request line and headers."""
    site = make_site(Ok(), clock=Clock(), max_header_bytes=128)
    request_line, host = b"GET / HTTP/1.1", b"Host: a"
    for extra, status in ((0, b"HTTP/1.1 200 OK"), (1, b"HTTP/1.1 431 Request Header Fields")):
        filler = b"X-Pad: " + b"p" * (128 - len(request_line) - len(host) - 7 + extra)
        _, transport = connect_limited(site)
        transport.protocol.dataReceived(b"\r\n".join((request_line, host, filler)) + b"\r\n\r\n")
        assert _head(transport.value())[0].startswith(status)
        transport.loseConnection()


def test_a_one_byte_body_that_never_comes_gets_the_body_deadline() -> None:
    clock = Clock()
    _, transport = connect_limited(make_site(Ok(), clock=clock))
    transport.protocol.dataReceived(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n")
    clock.advance(29.9)
    assert transport.value() == b""
    clock.advance(0.1)
    status, _ = _head(transport.value())
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert json.loads(transport.value().partition(b"\r\n\r\n")[2])["code"] == "body-timeout"


def test_a_bodiless_head_split_over_reads_leaves_the_next_heads_deadline_once_answered() -> None:
    clock = Clock()
    _, transport = connect_limited(make_site(Ok(), clock=clock))
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\n")
    clock.advance(5)
    transport.protocol.dataReceived(b"Host: a\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [5 + 10, 5 + 90]
    clock.advance(9.9)
    assert transport.connected
    clock.advance(0.1)
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert not transport.connected
    assert clock.getDelayedCalls() == []


def test_make_site_hands_every_setting_to_its_limits_and_defaults_to_limits_defaults() -> None:
    assert make_site(Ok(), clock=Clock()).limits == Limits()
    chosen = Limits(
        max_body_size=1,
        max_connections=2,
        idle_timeout=3.0,
        header_timeout=4.0,
        max_headers=5,
        max_header_bytes=6,
        max_request_line=7,
        body_timeout=8.0,
        max_connections_per_source=9,
        remote_share=1,
    )
    assert make_site(Ok(), clock=Clock(), **attrs.asdict(chosen)).limits == chosen


def test_the_site_keeps_its_timers_on_the_injected_clock_and_parses_no_forms() -> None:
    clock = Clock()
    site = make_site(Ok(), clock=clock)
    site.doStart()
    assert len(clock.getDelayedCalls()) == 1  # Twisted's log-date timer, on our clock
    site.doStop()
    assert clock.getDelayedCalls() == []
    assert site._parsePOSTFormSubmission is False
