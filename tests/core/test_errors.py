"""Tests for nvpair_tw.core._errors: the proxy's own JSON error responses."""

from __future__ import annotations

import json

import pytest

from nvpair_tw.core._errors import ErrorShape, error_body, raw_error_response, shape_of


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


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/messages", ErrorShape.ANTHROPIC),
        ("/v1/messages/count_tokens", ErrorShape.ANTHROPIC),
        ("/v1/messagesx", ErrorShape.OPENAI),
        ("/v1/chat/completions", ErrorShape.OPENAI),
        ("/v1/models", ErrorShape.OPENAI),
        ("/api/chat", ErrorShape.PROXY),
        ("/api/v0/models", ErrorShape.PROXY),
        ("/v1", ErrorShape.PROXY),
        ("/", ErrorShape.PROXY),
    ],
)
def test_the_shape_of_errors_follows_the_route_family(path: str, shape: ErrorShape) -> None:
    assert shape_of(path) is shape


def test_an_openai_route_gets_openais_error_object_with_the_proxys_code() -> None:
    """``{"error": {"message", "type", "param", "code"}}``; a model no node lists is OpenAI's own
    ``model_not_found``, and the type follows the status."""
    body = json.loads(error_body("no such model", "model-not-found", ErrorShape.OPENAI, 404))
    assert body == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    limited = json.loads(error_body("slow down", "rate-limited", ErrorShape.OPENAI, 429))
    assert limited["error"]["type"] == "rate_limit_error"
    assert limited["error"]["code"] == "rate-limited"
    broken = json.loads(error_body("upstream", "upstream-error", ErrorShape.OPENAI, 502))
    assert broken["error"]["type"] == "server_error"
    keyless = json.loads(error_body("key", "auth-required", ErrorShape.OPENAI, 401))
    assert keyless["error"]["type"] == "authentication_error"


def test_a_messages_route_gets_anthropics_error_object_with_the_proxys_code_beside() -> None:
    body = json.loads(error_body("model: nope", "model-not-found", ErrorShape.ANTHROPIC, 404))
    assert body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model: nope"},
        "code": "model-not-found",
    }


def test_a_raw_refusal_takes_the_shape_it_is_given() -> None:
    raw = raw_error_response(
        413, b"Content Too Large", "big", "body-too-large", (), ErrorShape.OPENAI
    )
    _, _, body = _split(raw)
    assert json.loads(body)["error"] == {
        "message": "big",
        "type": "invalid_request_error",
        "param": None,
        "code": "body-too-large",
    }
