"""Tests for nvpair_tw.core._errors: the proxy's own JSON error responses."""

from __future__ import annotations

import json

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IProtocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.core._errors import error_body, raw_error_response, write_error


class _Holder(Resource):
    """A leaf that keeps each request open so the test can answer it."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Request] = []

    def render(self, request: Request) -> object:  # type: ignore[override]
        self.requests.append(request)
        return NOT_DONE_YET


def _open_request(method: bytes = b"GET") -> tuple[Request, StringTransport, IProtocol]:
    root = _Holder()
    site = Site(root, reactor=Clock())
    channel = site.buildProtocol(None)
    assert channel is not None
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(method + b" /x HTTP/1.1\r\nHost: a\r\n\r\n")
    [request] = root.requests
    return request, transport, channel


def _split(raw: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines)
    return status, {k.lower(): v for k, v in headers.items()}, body


def test_error_body_is_compact_json() -> None:
    """The body is compact JSON with exactly the error and code fields."""
    body = error_body('bad "thing"', "some-code")
    assert body == b'{"error":"bad \\"thing\\"","code":"some-code"}'
    assert json.loads(body) == {"error": 'bad "thing"', "code": "some-code"}


def test_write_error_sends_json_with_nosniff_and_finishes() -> None:
    """write_error sets status, JSON type, nosniff, length and extra headers, then finishes."""
    request, transport, channel = _open_request()
    write_error(request, 401, "API key required", "auth-required", [(b"WWW-Authenticate", b"X")])
    status, headers, body = _split(transport.value())
    assert status == b"HTTP/1.1 401 Unauthorized"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert headers[b"www-authenticate"] == b"X"
    assert int(headers[b"content-length"]) == len(body)
    assert json.loads(body) == {"error": "API key required", "code": "auth-required"}
    assert request.finished
    channel.connectionLost(Failure(ConnectionDone()))


def test_write_error_on_head_sends_no_body() -> None:
    """A HEAD request gets the error status and headers but no body bytes."""
    request, transport, channel = _open_request(b"HEAD")
    write_error(request, 404, "nope", "not-found")
    status, headers, body = _split(transport.value())
    assert status == b"HTTP/1.1 404 Not Found"
    assert headers[b"content-type"] == b"application/json"
    assert body == b""
    channel.connectionLost(Failure(ConnectionDone()))


def test_write_error_after_client_left_is_a_silent_no_op() -> None:
    """When the client is already gone nothing is written and nothing raises."""
    request, transport, channel = _open_request()
    channel.connectionLost(Failure(ConnectionDone()))
    write_error(request, 500, "late", "late")
    assert transport.value() == b""


def test_write_error_twice_writes_once() -> None:
    """A second write_error on a finished request is ignored."""
    request, transport, channel = _open_request()
    write_error(request, 400, "first", "first")
    sent = transport.value()
    write_error(request, 500, "second", "second")
    assert transport.value() == sent
    channel.connectionLost(Failure(ConnectionDone()))


def test_write_error_after_response_started_aborts_the_connection() -> None:
    """Once headers are out no clean error can follow: the connection is aborted."""
    request, transport, channel = _open_request()
    request.write(b"partial")
    write_error(request, 502, "upstream failed", "upstream")
    assert transport.disconnected
    assert b"upstream failed" not in transport.value()
    channel.connectionLost(Failure(ConnectionDone()))


def test_raw_error_response_is_a_complete_closing_response() -> None:
    """The raw response has status line, JSON headers, Connection: close and the body."""
    raw = raw_error_response(
        413, b"Content Too Large", "too big", "body-too-large", [(b"Retry-After", b"1")]
    )
    status, headers, body = _split(raw)
    assert status == b"HTTP/1.1 413 Content Too Large"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert headers[b"connection"] == b"close"
    assert headers[b"retry-after"] == b"1"
    assert int(headers[b"content-length"]) == len(body)
    assert json.loads(body) == {"error": "too big", "code": "body-too-large"}
