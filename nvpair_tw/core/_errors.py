# -*- test-case-name: tests.core.test_errors -*-
"""The proxy's own error responses: compact JSON ``{"error", "code"}`` (docs/behaviour.md §9).

Every error the proxy itself produces goes through here, so each carries ``Content-Type:
application/json`` and ``X-Content-Type-Options: nosniff`` and never echoes a body or a key.
``write_error`` answers through a ``Request``; ``raw_error_response`` builds the bytes for the
protocol layer below it (limits, connection cap), where no ``Request`` exists yet.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

from twisted.internet.interfaces import ITCPTransport
from twisted.web.server import Request

__all__ = ["error_body", "raw_error_response", "write_error"]

_BASE_HEADERS = (
    (b"Content-Type", b"application/json"),
    (b"X-Content-Type-Options", b"nosniff"),
)


def error_body(message: str, code: str) -> bytes:
    """Return the compact JSON body ``{"error": message, "code": code}``."""
    return json.dumps({"error": message, "code": code}, separators=(",", ":")).encode("utf-8")


def write_error(
    request: Request,
    status: int,
    message: str,
    code: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    body: bytes | None = None,
) -> None:
    """Answer ``request`` with a JSON error and finish it (``body``: the error in a client
    dialect's own shape, e.g. Anthropic Messages', docs/behaviour.md §17.3; else
    ``{"error", "code"}``).

    Does nothing if the client is already gone or the request is finished. If the response has
    already started, no clean error can follow, so the connection is aborted instead.
    """
    if request.finished or request.channel is None:
        return
    if request.startedWriting:
        transport = request.channel.transport
        if transport is not None:
            cast(ITCPTransport, transport).abortConnection()
        return
    body = error_body(message, code) if body is None else body
    request.setResponseCode(status)
    for name, value in (*_BASE_HEADERS, *headers):
        request.responseHeaders.setRawHeaders(name, [value])
    request.responseHeaders.setRawHeaders(b"Content-Length", [b"%d" % len(body)])
    request.write(body)
    request.finish()


def raw_error_response(
    status: int,
    reason: bytes,
    message: str,
    code: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> bytes:
    """Return a complete HTTP/1.1 JSON error response that closes the connection."""
    body = error_body(message, code)
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    for name, value in (
        *_BASE_HEADERS,
        (b"Content-Length", b"%d" % len(body)),
        (b"Connection", b"close"),
        *headers,
    ):
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
