# -*- test-case-name: tests.traces.test_attributes -*-
"""What a request's spans say, from its ``proxy/request`` record (docs/behaviour.md §12.5).

The GenAI semantic conventions name the operation, the models and the token counts; ``nvpair.*``
attributes carry what only the proxy knows. Nothing here reads a body: no prompt or completion can
reach a span. Plain data in, plain data out (no OpenTelemetry types), so it is tested alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from nvpair_tw.events import AttemptOutcome, Outcome, ProxyRequest, StatusOutcome

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
_NOT_FAILED = frozenset({AttemptOutcome.COMMITTED, AttemptOutcome.CANCELLED})


def operation_name(path: str) -> str | None:
    """``gen_ai.operation.name`` of an inference route; None for any other route."""
    return _OPERATIONS.get(path)


def span_name(record: ProxyRequest) -> str:
    """``{operation} {model}`` for inference (``chat llama3``; just ``chat`` while the record names
    no model, as for a refused request), else ``{method} {path}``."""
    operation = operation_name(record.path)
    model = record.model
    if operation is not None:
        return f"{operation} {model}" if model else operation
    return f"{record.method} {record.path}".strip()


def _put(attributes: dict[str, AttributeValue], name: str, value: AttributeValue | None) -> None:
    """Set ``name`` unless ``value`` is unknown (None): a span never says zero for unknown."""
    if value is not None:
        attributes[name] = value


def request_attributes(
    record: ProxyRequest, workload_id: int | None = None
) -> dict[str, AttributeValue]:
    """The request span's attributes: GenAI, HTTP and ``nvpair.*``, known values only."""
    path = record.path
    attributes: dict[str, AttributeValue] = {}
    operation = operation_name(path)
    model = record.model
    if operation is not None:
        attributes["gen_ai.operation.name"] = operation
    if operation is not None and model:
        attributes["gen_ai.request.model"] = model
        attributes["gen_ai.response.model"] = record.model_local or model
        _put(attributes, "gen_ai.usage.input_tokens", record.prompt_tokens)
        _put(attributes, "gen_ai.usage.output_tokens", record.completion_tokens)
    _put(attributes, "http.request.method", record.method)
    _put(attributes, "url.path", path or None)
    status = record.status
    _put(attributes, "http.response.status_code", status)
    _put(attributes, "server.address", record.node_id)
    if record.error is not None and status is not None and status >= 400:
        attributes["error.type"] = record.error
    _put(attributes, "nvpair.request_id", record.id)
    _put(attributes, "nvpair.engine", record.engine)
    _put(attributes, "nvpair.workload_id", workload_id)
    _put(attributes, "nvpair.key", record.key)
    attributes["nvpair.queue_ms"] = record.queued_ms
    attributes["nvpair.attempts"] = len(record.attempts)
    attributes["nvpair.busy_waits"] = sum(a.busy_waits for a in record.attempts)
    if model:
        attributes["nvpair.translated"] = record.translated
    _put(attributes, "nvpair.ttft_ms", record.ttft_ms)
    _put(attributes, "nvpair.tokens_per_s", record.tokens_per_s)
    if record.cache_affinity:
        attributes["nvpair.cache_affinity"] = True
    if record.fan_out is not None:
        attributes["nvpair.fan_out"] = list(record.fan_out)
    return attributes


@frozen
class AttemptSpan:
    """One attempt laid out on the request's timeline: ms after the request start, and its length."""

    name: str
    offset_ms: int
    ms: int
    attributes: dict[str, AttributeValue]
    failed: bool


def failed_attempt(outcome: Outcome) -> bool:
    """Whether an attempt with this outcome failed (its span's status is ERROR)."""
    return outcome not in _NOT_FAILED


def attempt_spans(record: ProxyRequest) -> list[AttemptSpan]:
    """The request's attempts, one after another from the end of its queue wait (each attempt
    starts when the one before it ended); a fan-out's parts all start together (§13.2)."""
    operation = operation_name(record.path)
    model = record.model_local or record.model
    name = f"{operation} {model}" if operation is not None and model else span_name(record)
    parallel = record.fan_out is not None
    offset = record.queued_ms
    spans = []
    for number, attempt in enumerate(record.attempts, start=1):
        ms = max(0, attempt.ms)
        outcome = attempt.outcome
        attributes: dict[str, AttributeValue] = {
            "server.address": attempt.node_id,
            "nvpair.node_id": attempt.node_id,
            "nvpair.outcome": outcome.value,
            "nvpair.attempt": number,
            "nvpair.busy_waits": attempt.busy_waits,
        }
        if isinstance(outcome, StatusOutcome):
            attributes["http.response.status_code"] = outcome.code
        spans.append(AttemptSpan(name, offset, ms, attributes, failed_attempt(outcome)))
        if not parallel:
            offset += ms
    return spans
