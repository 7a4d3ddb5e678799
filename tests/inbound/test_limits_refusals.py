"""Tests for what nvpair_tw.inbound._limits' channel tells about its own refusals and which
request lines it lets through: the ``on_reject`` report (status, code, method, path), the
request-line check, the reason of an unknown status, the refusals' log lines, and the 413 of a
``LimitedRequest`` on a channel that is not a ``LimitedChannel`` (docs/behaviour.md §14.1, §14.4)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.logger import LogEvent, LogLevel
from twisted.web import http, server
from twisted.web.resource import Resource
from twisted.web.server import Request

from nvpair_tw.inbound import Rejection
from nvpair_tw.inbound._limits import (
    LimitedRequest,
    LimitedSite,
    _valid_request_line,
    make_site,
)
from nvpair_tw.logs import current_level, set_level
from tests.helpers import refusal_code
from tests.inbound.channel_kit import Ok, connect, split_answer

_Report = tuple[int, str, str, str]


def _gate(request: LimitedRequest) -> Rejection | None:
    """Refuses ``/no…``; refuses ``/recorded…`` after recording the refusal itself (as the
    facade does when it knows the caller's key); lets anything else through."""
    if request.uri.startswith(b"/recorded"):
        request.recorded = True
        return Rejection(401, "invalid-api-key", "invalid API key")
    if request.uri.startswith(b"/no"):
        return Rejection(403, "source-not-allowed", "source address not allowed")
    if request.uri.startswith(b"/odd"):
        return Rejection(599, "odd", "an odd refusal")
    return None


def _reporting_site(clock: Clock, **limits: Any) -> tuple[LimitedSite, list[_Report]]:
    site = make_site(Ok(), clock=clock, **limits)
    site.head_gate = _gate
    reports: list[_Report] = []
    site.on_reject = lambda *report: reports.append(report)
    return site, reports


def _answer(raw: bytes) -> tuple[bytes, dict[bytes, bytes], Any]:
    """The status line, headers (lower-cased names) and JSON body of one error answer."""
    status, headers, body = split_answer(raw)
    return status, headers, json.loads(body)


_REPORTS: dict[str, tuple[dict[str, Any], list[bytes | float], _Report]] = {
    "a declared body over the cap: its method and path, no query": (
        {"max_body_size": 8},
        [b"POST /v1/x?key=a?b HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n"],
        (413, "body-too-large", "POST", "/v1/x"),
    ),
    "a chunked body over the cap": (
        {"max_body_size": 8},
        [b"PUT /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n"],
        (413, "body-too-large", "PUT", "/up"),
    ),
    "a head the gate refuses": (
        {},
        [b"DELETE /no/x?q=1 HTTP/1.1\r\nHost: a\r\n\r\n"],
        (403, "source-not-allowed", "DELETE", "/no/x"),
    ),
    "a body that stalls": (
        {},
        [b"POST /slow?q HTTP/1.1\r\nContent-Length: 3\r\n\r\na", 30.0],
        (408, "body-timeout", "POST", "/slow"),
    ),
    "a head that never ends: no request yet": (
        {},
        [b"GET / HT", 10.0],
        (408, "header-timeout", "-", "-"),
    ),
    "a malformed request line: no request yet": (
        {},
        [b"GET evil HTTP/1.1\r\n"],
        (400, "bad-request", "-", "-"),
    ),
}
"""Refusals made below the facade: reads (bytes) and waits (seconds), then what ``on_reject``
is told: status, code, method and path (``-`` when no request head was read)."""


@pytest.mark.parametrize(("limits", "steps", "report"), list(_REPORTS.values()), ids=list(_REPORTS))
def test_each_refusal_below_the_facade_is_reported_once_with_its_method_and_path(
    limits: dict[str, Any], steps: list[bytes | float], report: _Report
) -> None:
    clock = Clock()
    site, reports = _reporting_site(clock, **limits)
    transport = connect(site)
    for step in steps:
        if isinstance(step, bytes):
            transport.protocol.dataReceived(step)
        else:
            clock.advance(step)
    assert reports == [report]
    status, headers, body = _answer(transport.value())
    assert status.startswith(b"HTTP/1.1 %d " % report[0])
    assert refusal_code(body) == report[1]
    assert headers[b"connection"] == b"close"
    assert not transport.connected


def test_the_gate_sees_the_method_target_version_and_the_path_without_its_query() -> None:
    seen: list[tuple[bytes, bytes, bytes, bytes]] = []

    def look(request: LimitedRequest) -> Rejection | None:
        seen.append((request.method, request.uri, request.path, request.clientproto))
        return None

    site = make_site(Ok(), clock=Clock())
    site.head_gate = look
    transport = connect(site)
    transport.protocol.dataReceived(b"PATCH /v1/x?a=1?b HTTP/1.0\r\nHost: a\r\n\r\n")
    assert seen == [(b"PATCH", b"/v1/x?a=1?b", b"/v1/x", b"HTTP/1.0")]


def test_a_connection_over_the_cap_is_reported_with_no_method_or_path() -> None:
    site, reports = _reporting_site(Clock(), max_connections=1)
    held = connect(site)
    refused = connect(site)
    assert reports == [(503, "too-many-connections", "-", "-")]
    assert not refused.connected
    held.loseConnection()


def test_a_refusal_the_facade_recorded_itself_is_not_reported_again() -> None:
    site, reports = _reporting_site(Clock())
    transport = connect(site)
    transport.protocol.dataReceived(b"GET /recorded HTTP/1.1\r\nHost: a\r\n\r\n")
    assert _answer(transport.value())[0] == b"HTTP/1.1 401 Unauthorized"
    assert reports == []


def test_a_site_without_on_reject_still_answers_its_refusals() -> None:
    site = make_site(Ok(), clock=Clock(), max_body_size=8)
    transport = connect(site)
    transport.protocol.dataReceived(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n")
    assert _answer(transport.value())[0] == b"HTTP/1.1 413 Content Too Large"


def test_a_refusal_with_a_status_http_has_no_reason_for_is_answered_with_error() -> None:
    site, _ = _reporting_site(Clock())
    transport = connect(site)
    transport.protocol.dataReceived(b"GET /odd HTTP/1.1\r\nHost: a\r\n\r\n")
    status, _, body = _answer(transport.value())
    assert 599 not in http.RESPONSES
    assert status == b"HTTP/1.1 599 Error"
    assert body == {"error": "an odd refusal", "code": "odd"}


_LINES: dict[bytes, bool] = {
    b"GET /v1/models HTTP/1.1": True,
    b"POST http://node.example/v1/chat HTTP/1.1": True,
    b"GET HTTPS://NODE.EXAMPLE/ HTTP/1.1": True,
    b"GET hTtP://a/ HTTP/1.0": True,
    b"OPTIONS * HTTP/1.1": True,
    b"GET * HTTP/1.1": False,
    b"options * HTTP/1.1": False,
    b"GET evil HTTP/1.1": False,
    b"GET ftp://a/ HTTP/1.1": False,
    b"GET http:/a HTTP/1.1": False,
    b"GET /caf\xe9 HTTP/1.1": False,
    b"GET /\x80 HTTP/1.1": False,
    b"GET / HTTP/1.1 extra": True,
    b"GET  / HTTP/1.1": True,
    b"GET\t*\tHTTP/1.1": True,
    b"GET": True,
}
"""Request lines and whether the facade's own check lets them through: ASCII, an origin-form or
absolute-form target, ``*`` for ``OPTIONS`` only; a line not split in three by single spaces is
left to Twisted (which refuses it as malformed)."""


@pytest.mark.parametrize(("line", "passes"), list(_LINES.items()), ids=[repr(k) for k in _LINES])
def test_request_lines_the_facade_lets_through(line: bytes, passes: bool) -> None:
    assert _valid_request_line(line) is passes


@pytest.mark.parametrize(
    "line", [b"GET /\x80 HTTP/1.1", b"GET evil HTTP/1.1", b"GET * HTTP/1.1", b"GET  / HTTP/1.1"]
)
def test_a_request_line_refused_gets_the_json_400_and_is_never_handled(line: bytes) -> None:
    """Twisted would let the byte 0x80 and a target ``evil`` through; both get the same 400 as
    a line Twisted itself finds malformed."""
    site, _ = _reporting_site(Clock())
    transport = connect(site)
    transport.protocol.dataReceived(line + b"\r\nHost: a\r\n\r\n")
    status, headers, body = _answer(transport.value())
    assert status == b"HTTP/1.1 400 Bad Request"
    assert body == {"error": "malformed request", "code": "bad-request"}
    assert headers[b"server"] == b"nvpair-tw"
    assert transport.value().count(b"HTTP/1.1 ") == 1


def test_a_refused_connection_is_logged_with_the_count_and_the_cap(
    log_events: list[LogEvent],
) -> None:
    site, _ = _reporting_site(Clock(), max_connections=2, max_connections_per_source=1)
    peer = IPv4Address("TCP", "203.0.113.7", 40000)
    held = []
    for _ in range(2):
        held.append(connect(site, peer))
    held.append(connect(site))
    held.append(connect(site))
    warnings = [
        (e["log_format"], e.get("open"), e.get("cap"))
        for e in log_events
        if e.get("log_namespace") == "nvpair_tw.inbound._limits"
    ]
    assert warnings == [
        ("refusing a connection: {cap} open from one source", None, 1),
        ("refusing a connection: {open} open, cap {cap}", 2, 2),
    ]
    for transport in held:
        if transport.connected:
            transport.loseConnection()
    assert site.open_connections == 0


def test_a_local_connection_over_its_share_is_logged_with_the_count_and_the_share(
    log_events: list[LogEvent],
) -> None:
    site, _ = _reporting_site(Clock(), max_connections=4, remote_share=1)
    local = IPv4Address("TCP", "127.0.0.1", 40000)
    held = [connect(site, local) for _ in range(4)]
    assert [t.connected for t in held] == [True, True, True, False]
    warnings = [
        (e["log_format"], e.get("open"), e.get("cap"), e.get("kept"))
        for e in log_events
        if e.get("log_namespace") == "nvpair_tw.inbound._limits"
    ]
    assert warnings == [
        (
            "refusing a local connection: {open} open from this machine, cap {cap} ({kept}"
            " kept for remote callers)",
            3,
            3,
            1,
        )
    ]
    for transport in held[:3]:
        transport.loseConnection()
    assert (site.open_connections, site.local_connections) == (0, 0)


def test_a_connection_closed_for_sending_nothing_is_logged_quietly_and_reads_no_more(
    log_events: list[LogEvent],
) -> None:
    """The head deadline's silent close: one debug line, no record, and bytes that arrive after
    it are never read as a request."""
    clock = Clock()
    site, reported = _reporting_site(clock, header_timeout=2.0)
    transport = connect(site)
    level = current_level()
    set_level(LogLevel.debug)
    try:
        clock.advance(2)
    finally:
        set_level(level)
    assert not transport.connected
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert transport.value() == b"" and reported == []
    [event] = [e for e in log_events if e.get("log_namespace") == "nvpair_tw.inbound._limits"]
    assert event["log_format"] == (
        "closing a connection that sent no request within the head deadline"
    )
    assert event["log_level"] == LogLevel.debug


def test_a_gate_that_raises_is_logged_with_its_failure(log_events: list[LogEvent]) -> None:
    def broken(request: LimitedRequest) -> Rejection | None:
        raise KeyError("bug")

    site = make_site(Ok(), clock=Clock())
    site.head_gate = broken
    transport = connect(site)
    transport.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    [event] = [e for e in log_events if e.get("log_namespace") == "nvpair_tw.inbound._limits"]
    assert event["log_format"] == "the head gate failed"
    assert event["log_failure"].check(KeyError)
    assert _answer(transport.value())[2]["code"] == "internal-error"


def _plain_channel() -> StringTransportWithDisconnection:
    """A ``LimitedRequest`` on Twisted's own ``HTTPChannel`` (no ``LimitedChannel``)."""
    site = server.Site(Ok())
    site.requestFactory = LimitedRequest
    return connect(site)


@pytest.mark.parametrize(
    "body",
    [
        b"Content-Length: %d\r\n\r\n" % (32 * 1024 * 1024 + 1),
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % (32 * 1024 * 1024 + 1)
        + b"x" * (32 * 1024 * 1024 + 1)
        + b"\r\n1\r\nx\r\n",
    ],
    ids=["declared", "chunked"],
)
def test_a_limited_request_on_a_plain_channel_answers_one_413_with_the_default_cap(
    body: bytes,
) -> None:
    """Chunks after the one that crossed the cap are dropped unread."""
    transport = _plain_channel()
    transport.protocol.dataReceived(b"POST /v1/x HTTP/1.1\r\nHost: a\r\n" + body)
    status, headers, answer = _answer(transport.value())
    assert status == b"HTTP/1.1 413 Content Too Large"
    assert answer == {"error": "request body exceeds 32 MiB limit", "code": "body-too-large"}
    assert headers[b"connection"] == b"close"
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert not transport.connected


def test_a_small_declared_body_is_buffered_in_memory_and_a_large_one_in_a_file() -> None:
    """The declared length reaches Twisted's choice of buffer: no temporary file per request."""
    seen: list[object] = []

    class _Keep(Resource):
        isLeaf = True

        def render(self, request: Request) -> bytes:
            seen.append(request.content)
            return b"ok"

    transport = connect(make_site(_Keep(), clock=Clock()))
    transport.protocol.dataReceived(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok")
    big = 200_000
    transport.protocol.dataReceived(
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % big + b"x" * big
    )
    small_buffer, large_buffer = seen
    assert type(small_buffer).__name__ == "BytesIO"
    assert type(large_buffer).__name__ != "BytesIO"
    transport.loseConnection()
