# -*- test-case-name: tests.ops.test_control -*-
"""JSON-RPC 2.0 plumbing for the control channel (docs/behaviour.md §8): the error codes, :class:`RpcError`,
reading one request line into a :class:`Request`, and the by-name params checks every method uses.

A line that is not JSON-RPC at all (not JSON, not a JSON object: an HTTP request line or header
included) is :class:`NotJsonRpc`, which closes the connection (docs/behaviour.md §14.3); a JSON
object that is not a valid request is :class:`BadRequest`, answered on a connection that stays open.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attrs import frozen

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "UNAUTHORIZED",
    "BadRequest",
    "NotJsonRpc",
    "Params",
    "Request",
    "Result",
    "RpcError",
    "any_string",
    "any_text",
    "array",
    "error",
    "integer",
    "invalid",
    "obj",
    "read_request",
    "short",
    "string",
    "text",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNAUTHORIZED = -32001
"""The first call on a channel with a token was not ``auth`` with that token (§14.3)."""

Params = Mapping[str, Any]
Result = dict[str, Any]


class RpcError(Exception):
    """A JSON-RPC error to answer with: a code and a message without secrets."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@frozen
class Request:
    """One well-formed request: its id (absent for a notification), method and raw params."""

    id: Any
    method: str
    params: object
    notification: bool


@frozen
class NotJsonRpc:
    """A line that is not a JSON object: answered -32700, then the connection closes."""

    response: Result


@frozen
class BadRequest:
    """A JSON object that is not a valid request: answered -32600; the connection stays open."""

    response: Result


def invalid(message: str) -> RpcError:
    """An ``invalid params`` error."""
    return RpcError(INVALID_PARAMS, f"invalid params: {message}")


def error(request_id: Any, code: int, message: str) -> Result:
    """An error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def short(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, for messages and logs."""
    return text if len(text) <= limit else text[:limit] + "…"


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))


def read_request(line: bytes) -> Request | NotJsonRpc | BadRequest | None:
    """The request on one line; :class:`NotJsonRpc` or :class:`BadRequest` for a malformed one;
    ``None`` for a blank line."""
    text = line.strip()
    if not text:
        return None
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return NotJsonRpc(error(None, PARSE_ERROR, "parse error: the line is not JSON; closing"))
    if isinstance(message, list):
        return NotJsonRpc(
            error(None, PARSE_ERROR, "parse error: batches are not supported; one object per line")
        )
    if not isinstance(message, dict):
        return NotJsonRpc(error(None, PARSE_ERROR, "parse error: expected a JSON object; closing"))
    request_id = message.get("id")
    if not _valid_id(request_id):
        return BadRequest(
            error(None, INVALID_REQUEST, "invalid request: id must be a string, a number or null")
        )
    if message.get("jsonrpc") != "2.0":
        return BadRequest(
            error(request_id, INVALID_REQUEST, 'invalid request: jsonrpc must be "2.0"')
        )
    method = message.get("method")
    if not isinstance(method, str) or not method:
        return BadRequest(
            error(request_id, INVALID_REQUEST, "invalid request: method must be a non-empty string")
        )
    return Request(request_id, method, message.get("params", {}), "id" not in message)


def string(value: object, label: str) -> str:
    """``value`` if it is a non-blank string, else invalid params."""
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"{label} must be a non-empty string")
    return value


def any_string(value: object, label: str) -> str:
    """``value`` if it is a string, blank or not, else invalid params."""
    if not isinstance(value, str):
        raise invalid(f"{label} must be a string")
    return value


def text(params: Params, key: str, where: str = "") -> str:
    """The non-blank string param ``key``; ``where`` prefixes its name in the message."""
    return string(params.get(key), f"{where}{key}")


def any_text(params: Params, key: str, where: str = "") -> str:
    """The string param ``key``, blank or not; ``where`` prefixes its name in the message."""
    return any_string(params.get(key), f"{where}{key}")


def integer(params: Params, key: str, where: str = "", default: int | None = None) -> int:
    """The integer param ``key`` (not a boolean), or ``default`` when absent."""
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{where}{key} must be an integer")
    return value


def array(params: Params, key: str, where: str = "") -> list[Any]:
    """The array param ``key``."""
    value = params.get(key)
    if not isinstance(value, list):
        raise invalid(f"{where}{key} must be an array")
    return value


def obj(value: object, where: str) -> Params:
    """``value`` if it is an object."""
    if not isinstance(value, dict):
        raise invalid(f"{where} must be an object")
    return value
