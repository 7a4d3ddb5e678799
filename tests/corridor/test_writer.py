"""The one writer of a request's answer (nvpair_tw.corridor._writer): refusals in the route's
error shape, whole answers, and the stream face the relay writes through."""

from __future__ import annotations

import json

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IProtocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.core import ErrorShape
from nvpair_tw.corridor._writer import Whole, Writer
from nvpair_tw.inbound import Rejection


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


def _writer(request: Request, shape: ErrorShape = ErrorShape.PROXY) -> Writer:
    return Writer(request, shape)


def test_a_refusal_sends_json_with_nosniff_and_finishes() -> None:
    """A refusal sets status, JSON type, nosniff, length and extra headers, then finishes."""
    request, transport, channel = _open_request()
    _writer(request).refuse(
        Rejection(401, "auth-required", "API key required", ((b"WWW-Authenticate", b"X"),))
    )
    status, headers, body = _split(transport.value())
    assert status == b"HTTP/1.1 401 Unauthorized"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert headers[b"www-authenticate"] == b"X"
    assert int(headers[b"content-length"]) == len(body)
    assert json.loads(body) == {"error": "API key required", "code": "auth-required"}
    assert request.finished
    channel.connectionLost(Failure(ConnectionDone()))


def test_a_refusal_on_head_sends_no_body() -> None:
    """A HEAD request gets the error status and headers but no body bytes."""
    request, transport, channel = _open_request(b"HEAD")
    _writer(request).refuse(Rejection(404, "not-found", "nope"))
    status, headers, body = _split(transport.value())
    assert status == b"HTTP/1.1 404 Not Found"
    assert headers[b"content-type"] == b"application/json"
    assert body == b""
    channel.connectionLost(Failure(ConnectionDone()))


def test_a_refusal_after_client_left_is_a_silent_no_op() -> None:
    """When the client is already gone nothing is written and nothing raises."""
    request, transport, channel = _open_request()
    channel.connectionLost(Failure(ConnectionDone()))
    _writer(request).refuse(Rejection(500, "late", "late"))
    assert transport.value() == b""


def test_a_refusal_twice_writes_once() -> None:
    """A second refusal on a finished request is ignored."""
    request, transport, channel = _open_request()
    _writer(request).refuse(Rejection(400, "first", "first"))
    sent = transport.value()
    _writer(request).refuse(Rejection(500, "second", "second"))
    assert transport.value() == sent
    channel.connectionLost(Failure(ConnectionDone()))


def test_a_refusal_after_response_started_aborts_the_connection() -> None:
    """Once headers are out no clean error can follow: the connection is aborted."""
    request, transport, channel = _open_request()
    request.write(b"partial")
    _writer(request).refuse(Rejection(502, "upstream", "upstream failed"))
    assert transport.disconnected
    assert b"upstream failed" not in transport.value()
    channel.connectionLost(Failure(ConnectionDone()))


def test_a_refusal_on_an_openai_route_is_openais_error_object() -> None:
    request, transport, channel = _open_request()
    _writer(request, ErrorShape.OPENAI).refuse(Rejection(429, "rate-limited", "slow down"))
    status, _, body = _split(transport.value())
    assert status.startswith(b"HTTP/1.1 429 ")
    assert json.loads(body) == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate-limited",
        }
    }
    channel.connectionLost(Failure(ConnectionDone()))


def test_a_whole_answer_carries_its_type_headers_and_length() -> None:
    request, transport, channel = _open_request()
    _writer(request).whole(Whole(207, b"{}", b"application/json", ((b"x-nvpair-node", b"a,b"),)))
    status, headers, body = _split(transport.value())
    assert status == b"HTTP/1.1 207 Multi-Status"
    assert headers[b"x-nvpair-node"] == b"a,b"
    assert headers[b"content-length"] == b"2" and body == b"{}"
    assert request.finished
    channel.connectionLost(Failure(ConnectionDone()))


def test_a_cut_before_anything_was_written_closes_without_a_reset() -> None:
    request, transport, channel = _open_request()
    _writer(request).cut(Clock(), 30.0)
    assert transport.disconnecting and transport.value() == b""
    channel.connectionLost(Failure(ConnectionDone()))
