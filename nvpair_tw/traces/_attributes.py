# -*- test-case-name: tests.traces.test_attributes -*-
"""What a request's spans say, from its ``proxy/request`` record (docs/behaviour.md §12.5).

The GenAI semantic conventions name the operation, the models and the token counts; ``nvpair.*``
attributes carry what only the proxy knows. Nothing here reads a body: no prompt or completion can
reach a span. Plain data in, plain data out (no OpenTelemetry types), so it is tested alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

__all__ = [
    "AttemptSpan",
    "attempt_spans",
    "failed_attempt",
    "operation_name",
    "request_attributes",
    "span_name",
]

AttributeValue = str | bool | int | float | list[str]

_OPERATIONS: Mapping[str, str] = {
    "/api/chat": "chat",
    "/v1/chat/completions": "chat",
    "/api/v0/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/v1/completions": "text_completion",
    "/api/v0/completions": "text_completion",
    "/api/generate": "generate_content",
    "/api/embed": "embeddings",
    "/api/embeddings": "embeddings",
    "/v1/embeddings": "embeddings",
    "/api/v0/embeddings": "embeddings",
}

# Attempt outcomes that are no failure of the attempt: it answered, or the caller left.
_NOT_FAILED = frozenset({"committed", "cancelled"})


def operation_name(path: str) -> str | None:
    """``gen_ai.operation.name`` of an inference route; None for any other route."""
    return _OPERATIONS.get(path)


def span_name(payload: Mapping[str, Any]) -> str:
    """``{operation} {model}`` for inference (``chat llama3``; just ``chat`` while the record names
    no model, as for a refused request), else ``{method} {path}``."""
    operation = operation_name(str(payload.get("path", "")))
    model = payload.get("model")
    if operation is not None:
        return f"{operation} {model}" if model else operation
    return f"{payload.get('method', '')} {payload.get('path', '')}".strip()


def _put(attributes: dict[str, AttributeValue], name: str, value: Any) -> None:
    """Set ``name`` unless ``value`` is unknown (None): a span never says zero for unknown."""
    if value is not None:
        attributes[name] = value


def request_attributes(
    payload: Mapping[str, Any], workload_id: int | None = None
) -> dict[str, AttributeValue]:
    """The request span's attributes: GenAI, HTTP and ``nvpair.*``, known values only."""
    path = str(payload.get("path", ""))
    attributes: dict[str, AttributeValue] = {}
    operation = operation_name(path)
    model = payload.get("model")
    if operation is not None:
        attributes["gen_ai.operation.name"] = operation
    if operation is not None and model:
        attributes["gen_ai.request.model"] = str(model)
        attributes["gen_ai.response.model"] = str(payload.get("model_local") or model)
        _put(attributes, "gen_ai.usage.input_tokens", payload.get("prompt_tokens"))
        _put(attributes, "gen_ai.usage.output_tokens", payload.get("completion_tokens"))
    _put(attributes, "http.request.method", payload.get("method"))
    _put(attributes, "url.path", path or None)
    _put(attributes, "http.response.status_code", payload.get("status"))
    _put(attributes, "server.address", payload.get("node_id"))
    status = payload.get("status")
    if payload.get("error") is not None and isinstance(status, int) and status >= 400:
        attributes["error.type"] = str(payload["error"])
    _put(attributes, "nvpair.request_id", payload.get("id"))
    _put(attributes, "nvpair.engine", payload.get("engine"))
    _put(attributes, "nvpair.workload_id", workload_id)
    _put(attributes, "nvpair.key", payload.get("key"))
    attempts = _attempts(payload)
    attributes["nvpair.queue_ms"] = int(payload.get("queued_ms") or 0)
    attributes["nvpair.attempts"] = len(attempts)
    attributes["nvpair.busy_waits"] = sum(int(a.get("busy_waits") or 0) for a in attempts)
    if model:
        attributes["nvpair.translated"] = bool(payload.get("translated"))
    _put(attributes, "nvpair.ttft_ms", payload.get("ttft_ms"))
    _put(attributes, "nvpair.tokens_per_s", payload.get("tokens_per_s"))
    if payload.get("cache_affinity"):
        attributes["nvpair.cache_affinity"] = True
    fan_out = payload.get("fan_out")
    if isinstance(fan_out, list):
        attributes["nvpair.fan_out"] = [str(n) for n in fan_out]
    return attributes


@frozen
class AttemptSpan:
    """One attempt laid out on the request's timeline: ms after the request start, and its length."""

    name: str
    offset_ms: int
    ms: int
    attributes: dict[str, AttributeValue]
    failed: bool


def failed_attempt(outcome: str) -> bool:
    """Whether an attempt with this outcome failed (its span's status is ERROR)."""
    return outcome not in _NOT_FAILED


def _attempts(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    attempts = payload.get("attempts")
    return [a for a in attempts if isinstance(a, Mapping)] if isinstance(attempts, list) else []


def attempt_spans(payload: Mapping[str, Any]) -> list[AttemptSpan]:
    """The request's attempts, one after another from the end of its queue wait (each attempt
    starts when the one before it ended); a fan-out's parts all start together (§13.2)."""
    operation = operation_name(str(payload.get("path", "")))
    model = payload.get("model_local") or payload.get("model")
    name = f"{operation} {model}" if operation is not None and model else span_name(payload)
    parallel = isinstance(payload.get("fan_out"), list)
    offset = int(payload.get("queued_ms") or 0)
    spans = []
    for number, attempt in enumerate(_attempts(payload), start=1):
        ms = max(0, int(attempt.get("ms") or 0))
        outcome = str(attempt.get("outcome"))
        attributes: dict[str, AttributeValue] = {
            "server.address": str(attempt.get("node_id")),
            "nvpair.node_id": str(attempt.get("node_id")),
            "nvpair.outcome": outcome,
            "nvpair.attempt": number,
            "nvpair.busy_waits": int(attempt.get("busy_waits") or 0),
        }
        if outcome.startswith("status-") and outcome[7:].isdigit():
            attributes["http.response.status_code"] = int(outcome[7:])
        spans.append(AttemptSpan(name, offset, ms, attributes, failed_attempt(outcome)))
        if not parallel:
            offset += ms
    return spans
