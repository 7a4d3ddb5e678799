# -*- test-case-name: tests.core.test_errors -*-
"""The proxy's own error bodies, in the shape the client's route speaks (docs/behaviour.md §9).

Every error the proxy itself produces is shaped here, whichever stage refused: the facade's writer
(``corridor``) and the connection layer below it (``inbound``, where no request exists yet) both
ask :func:`error_body` for the bytes, so a client reads one shape per route:

- the Anthropic Messages routes (``/v1/messages…``): ``{"type": "error", "error": {"type",
  "message"}, "code"}``;
- every other ``/v1/…`` route: OpenAI's ``{"error": {"message", "type", "param", "code"}}``,
  whose ``code`` is the proxy's (``model_not_found`` for a model no node lists, as OpenAI names it);
- every other route (Ollama's ``/api/…``, LM Studio's, the proxy's own): ``{"error", "code"}``,
  Ollama's own ``{"error"}`` with the proxy's code beside it.

Each carries ``Content-Type: application/json`` and ``X-Content-Type-Options: nosniff``, and never
echoes a body or a key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import Enum
from typing import Any

__all__ = [
    "ERROR_HEADERS",
    "ErrorShape",
    "error_body",
    "error_document",
    "error_type",
    "raw_error_response",
    "shape_of",
]

ERROR_HEADERS = (
    (b"Content-Type", b"application/json"),
    (b"X-Content-Type-Options", b"nosniff"),
)
"""The headers every error of the proxy's own carries (besides its length)."""


class ErrorShape(Enum):
    """The error object a client of one family of routes reads."""

    PROXY = "proxy"
    """``{"error": message, "code": code}``: Ollama's shape, with the proxy's code."""
    OPENAI = "openai"
    """``{"error": {"message", "type", "param", "code"}}``."""
    ANTHROPIC = "anthropic"
    """``{"type": "error", "error": {"type", "message"}, "code"}``."""


_MESSAGES_PREFIX = "/v1/messages"
_OPENAI_PREFIX = "/v1/"


def shape_of(path: str) -> ErrorShape:
    """The shape of the errors on ``path`` (the normalised path, or the raw one where the request
    was refused before it could be normalised)."""
    if path == _MESSAGES_PREFIX or path.startswith(_MESSAGES_PREFIX + "/"):
        return ErrorShape.ANTHROPIC
    if path.startswith(_OPENAI_PREFIX):
        return ErrorShape.OPENAI
    return ErrorShape.PROXY


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""Anthropic's error types by status (its API reference); anything else is ``api_error``."""

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
"""OpenAI's error types by status beyond the two defaults (4xx ``invalid_request_error``, 5xx
``server_error``)."""

_OPENAI_CODES = {"model-not-found": "model_not_found"}
"""The proxy's codes OpenAI has a name of its own for."""


def error_type(shape: ErrorShape, status: int) -> str:
    """The ``type`` a client of ``shape`` expects for ``status``."""
    if shape is ErrorShape.ANTHROPIC:
        return _TYPES.get(status, "api_error")
    if status in _OPENAI_TYPES:
        return _OPENAI_TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_document(shape: ErrorShape, status: int, message: str, code: str) -> dict[str, Any]:
    """The error object of ``shape`` (see the module's list)."""
    kind = error_type(shape, status)
    if shape is ErrorShape.ANTHROPIC:
        return {"type": "error", "error": {"type": kind, "message": message}, "code": code}
    if shape is ErrorShape.OPENAI:
        named = _OPENAI_CODES.get(code, code)
        return {"error": {"message": message, "type": kind, "param": None, "code": named}}
    return {"error": message, "code": code}


def error_body(
    message: str, code: str, shape: ErrorShape = ErrorShape.PROXY, status: int = 400
) -> bytes:
    """The compact JSON error body of ``shape``."""
    document = error_document(shape, status, message, code)
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def raw_error_response(
    status: int,
    reason: bytes,
    message: str,
    code: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    shape: ErrorShape = ErrorShape.PROXY,
) -> bytes:
    """A complete HTTP/1.1 JSON error response that closes the connection (for the connection
    layer, where no ``Request`` answers)."""
    body = error_body(message, code, shape, status)
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    for name, value in (
        *ERROR_HEADERS,
        (b"Content-Length", b"%d" % len(body)),
        (b"Connection", b"close"),
        *headers,
    ):
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
