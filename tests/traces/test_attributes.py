"""What a request's spans say, from its record (docs/behaviour.md §12.5), the traces URL, the span
counts, and ``--otlp-endpoint`` on the command line."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.python import usage

from nvpair_tw.events import Attempt, ProxyRequest, outcome_named
from nvpair_tw.tap import Options
from nvpair_tw.traces import SpanCounts, traces_url
from nvpair_tw.traces._attributes import (
    attempt_spans,
    failed_attempt,
    operation_name,
    request_attributes,
    span_name,
)
from tests.helpers import proxy_request

pytestmark = pytest.mark.timeout(30)


def record(**fields: Any) -> ProxyRequest:
    """A request record of the wire-shaped ``fields`` (attempts as objects), over a served chat."""
    base: dict[str, Any] = {
        "id": "run-1",
        "engine": "ollama",
        "method": "POST",
        "path": "/api/chat",
        "status": 200,
        "node_id": "n1",
        "duration_ms": 40,
        "error": None,
        "attempts": [{"node_id": "n1", "outcome": "committed", "ms": 30, "busy_waits": 0}],
        "cache_affinity": False,
        "queued_ms": 0,
    }
    given = {**base, **fields}
    given["attempts"] = tuple(
        Attempt(**{**attempt, "outcome": outcome_named(attempt["outcome"])})
        for attempt in given["attempts"]
    )
    if given.get("fan_out") is not None:
        given["fan_out"] = tuple(given["fan_out"])
    return proxy_request(**given)


INFERENCE = {
    "model": "llama3",
    "model_local": "llama3:8b",
    "translated": True,
    "prompt_tokens": 12,
    "completion_tokens": 34,
    "ttft_ms": 7,
    "tokens_per_s": 21.5,
    "key": "alice",
}


@pytest.mark.parametrize(
    ("path", "operation"),
    [
        ("/api/chat", "chat"),
        ("/v1/chat/completions", "chat"),
        ("/api/v0/chat/completions", "chat"),
        ("/v1/messages", "chat"),
        ("/v1/responses", "chat"),
        ("/v1/completions", "text_completion"),
        ("/api/generate", "generate_content"),
        ("/api/embed", "embeddings"),
        ("/v1/embeddings", "embeddings"),
        ("/api/tags", None),
        ("/api/pull", None),
    ],
)
def test_operation_names_follow_the_route(path: str, operation: str | None) -> None:
    assert operation_name(path) == operation


def test_an_inference_record_gives_genai_and_nvpair_attributes() -> None:
    """Public and local model names, the engine's counts, the serving node and every nvpair one."""
    attempts = [
        {"node_id": "n0", "outcome": "stall", "ms": 100, "busy_waits": 2},
        {"node_id": "n1", "outcome": "committed", "ms": 30, "busy_waits": 1},
    ]
    payload = record(**INFERENCE, queued_ms=250, attempts=attempts)
    attributes = request_attributes(payload, workload_id=9)
    assert span_name(payload) == "chat llama3"
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "llama3",
        "gen_ai.response.model": "llama3:8b",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 34,
        "http.request.method": "POST",
        "url.path": "/api/chat",
        "http.response.status_code": 200,
        "server.address": "n1",
        "nvpair.request_id": "run-1",
        "nvpair.engine": "ollama",
        "nvpair.workload_id": 9,
        "nvpair.key": "alice",
        "nvpair.queue_ms": 250,
        "nvpair.attempts": 2,
        "nvpair.busy_waits": 3,
        "nvpair.translated": True,
        "nvpair.ttft_ms": 7,
        "nvpair.tokens_per_s": 21.5,
    }


def test_unknown_values_are_left_out_never_zero() -> None:
    """Unknown token counts and ttft, no serving node, no workload: absent attributes."""
    payload = record(
        **{**INFERENCE, "prompt_tokens": None, "completion_tokens": None, "ttft_ms": None},
        node_id=None,
        status=502,
        error="no-model-owner",
        attempts=[],
    )
    attributes = request_attributes(payload)
    for name in (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "nvpair.ttft_ms",
        "server.address",
        "nvpair.workload_id",
    ):
        assert name not in attributes
    assert attributes["error.type"] == "no-model-owner"


def test_the_local_name_stands_in_only_when_known() -> None:
    payload = record(**{**INFERENCE, "model_local": None})
    assert request_attributes(payload)["gen_ai.response.model"] == "llama3"


def test_other_routes_are_named_by_method_and_path() -> None:
    payload = record(method="GET", path="/api/tags", attempts=[])
    assert span_name(payload) == "GET /api/tags"
    attributes = request_attributes(payload)
    assert "gen_ai.operation.name" not in attributes and "nvpair.translated" not in attributes


def test_attempts_are_laid_end_to_end_after_the_queue_wait() -> None:
    attempts = [
        {"node_id": "n0", "outcome": "status-503", "ms": 10, "busy_waits": 0},
        {"node_id": "n0", "outcome": "connect-error", "ms": 5, "busy_waits": 0},
        {"node_id": "n1", "outcome": "committed", "ms": 20, "busy_waits": 1},
    ]
    payload = record(**INFERENCE, queued_ms=50, attempts=attempts)
    spans = attempt_spans(payload)
    assert [(s.offset_ms, s.ms) for s in spans] == [(50, 10), (60, 5), (65, 20)]
    assert [s.failed for s in spans] == [True, True, False]
    assert [s.name for s in spans] == ["chat llama3:8b"] * 3
    assert spans[0].attributes["http.response.status_code"] == 503
    assert "http.response.status_code" not in spans[1].attributes
    assert spans[2].attributes == {
        "server.address": "n1",
        "nvpair.node_id": "n1",
        "nvpair.outcome": "committed",
        "nvpair.attempt": 3,
        "nvpair.busy_waits": 1,
    }


def test_a_fan_outs_parts_start_together() -> None:
    payload = record(
        path="/api/pull",
        fan_out=["a", "b"],
        attempts=[
            {"node_id": "a", "outcome": "status-200", "ms": 10, "busy_waits": 0},
            {"node_id": "b", "outcome": "status-200", "ms": 30, "busy_waits": 0},
        ],
    )
    assert [s.offset_ms for s in attempt_spans(payload)] == [0, 0]
    assert request_attributes(payload)["nvpair.fan_out"] == ["a", "b"]


@pytest.mark.parametrize(
    ("outcome", "failed"),
    [
        ("committed", False),
        ("cancelled", False),
        ("stall", True),
        ("first-body-timeout", True),
        ("connect-error", True),
        ("dropped", True),
        ("status-404", True),
        ("unfinished", True),
    ],
)
def test_failed_attempts(outcome: str, failed: bool) -> None:
    assert failed_attempt(outcome_named(outcome)) is failed


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otel.example/v1/traces", "https://otel.example/v1/traces"),
        ("http://127.0.0.1:9/custom/path", "http://127.0.0.1:9/custom/path"),
    ],
)
def test_traces_url(endpoint: str, url: str) -> None:
    assert traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["collector:4318", "ftp://collector/", "http://", ""])
def test_traces_url_refuses_what_is_no_http_url(endpoint: str) -> None:
    with pytest.raises(ValueError, match="http"):
        traces_url(endpoint)


def test_span_counts_bound_the_queue_and_count_what_export_became() -> None:
    counts = SpanCounts(limit=2)
    assert counts.admit() and counts.admit()
    assert not counts.admit()  # full: dropped here
    counts.settled(2, ok=False)
    assert counts.admit()
    counts.settled(1, ok=True)
    assert (counts.exported, counts.dropped) == (1, 3)


def test_otlp_endpoint_option_is_off_by_default_and_checked() -> None:
    options = Options(environ={})
    options.parseOptions(["-e", "ollama"])
    assert options.config.settings.otlp_endpoint is None
    options = Options(environ={})
    options.parseOptions(["-e", "ollama", "--otlp-endpoint", "http://collector:4318"])
    assert options.config.settings.otlp_endpoint == "http://collector:4318"
    with pytest.raises(usage.UsageError, match="--otlp-endpoint"):
        Options(environ={}).parseOptions(["-e", "ollama", "--otlp-endpoint", "collector"])
