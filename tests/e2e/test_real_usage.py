"""Token counts and first tokens end to end (docs/behaviour.md §12.2, §12.3) on a real Ollama: the
counts the proxy records are the engine's own, and the official ``openai`` client streaming
without ``include_usage`` receives exactly the chunks the engine sends it directly (the proxy asks
for the usage chunk itself and removes it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.realnodes import ProxyProcess, RealOllama

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

MODEL = "smollm2"
OPTIONS = {"temperature": 0, "seed": 42}
CANARY = "zebra-canary-7731"
MESSAGES = [{"role": "user", "content": f"Say one word about {CANARY}."}]


@pytest.fixture(scope="module")
def proxy(
    real_ollama: RealOllama, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("usage")
    started = ProxyProcess(["--engine", "ollama", "--node", f"o={real_ollama.url}"], workdir)
    started.wait_ready(1)
    yield started
    log = started.stop()
    assert "Traceback" not in log, log
    assert CANARY not in log, "a prompt reached the log"


def record_of(proxy: ProxyProcess, request_id: str, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in proxy.events("proxy/request") if e.get("id") == request_id]
        if found:
            return found[0]
        time.sleep(0.05)
    pytest.fail(f"no proxy/request event for {request_id}:\n{proxy.tail()}")


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def test_ollama_counts_recorded_are_the_engines_own(proxy: ProxyProcess) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "options": {**OPTIONS, "num_predict": 8}}
    with httpx.Client(timeout=120) as client:
        streamed = client.post(f"{proxy.url}/api/chat", json=body)
        whole = client.post(f"{proxy.url}/api/chat", json={**body, "stream": False})
    final = lines(streamed)[-1]
    record = record_of(proxy, streamed.headers["x-nvpair-request-id"])
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        final["prompt_eval_count"],
        final["eval_count"],
    )
    assert record["cached_tokens"] is None  # Ollama says nothing of its cache: unknown, not 0
    expected_rate = final["eval_count"] / (final["eval_duration"] / 1e9)
    assert record["tokens_per_s"] == pytest.approx(expected_rate, rel=0.01)
    assert 0 <= record["ttft_ms"] <= record["duration_ms"]
    answer = whole.json()
    whole_record = record_of(proxy, whole.headers["x-nvpair-request-id"])
    assert (whole_record["prompt_tokens"], whole_record["completion_tokens"]) == (
        answer["prompt_eval_count"],
        answer["eval_count"],
    )
    assert whole_record["ttft_ms"] <= whole_record["ttfb_ms"]


def _chunks(base: str, model: str) -> tuple[list[dict[str, Any]], str | None]:
    """The openai client's streamed chunks (without ``include_usage``), ids and times dropped."""
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            max_tokens=8,
            temperature=0,
            seed=42,
        )
        request_id = raw.headers.get("x-nvpair-request-id")
        stream = raw.parse()
        assert isinstance(stream, openai.Stream)
        chunks = [c.model_dump(exclude={"id", "created"}) for c in stream]
    return chunks, request_id


def test_the_openai_client_gets_the_engines_own_stream_and_the_counts_are_kept(
    proxy: ProxyProcess, real_ollama: RealOllama
) -> None:
    direct, _ = _chunks(real_ollama.url, MODEL)
    proxied, request_id = _chunks(proxy.url, MODEL)
    assert proxied == direct
    assert all(c.get("usage") is None for c in proxied)
    assert request_id is not None
    record = record_of(proxy, request_id)
    with httpx.Client(timeout=120) as client:
        asked = client.post(
            f"{real_ollama.url}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": MESSAGES,
                "stream": True,
                "max_tokens": 8,
                "stream_options": {"include_usage": True},
                **OPTIONS,
            },
        )
    usage = [
        json.loads(line[5:])
        for line in asked.text.splitlines()
        if line.startswith("data: {") and '"usage"' in line
    ][-1]["usage"]
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
