"""The prompt tokens a real llama-server found cached reach the request record (docs/behaviour.md
§7, §12.2): one prompt sent three times through a ``twist nvpair`` subprocess to a real
``llama-server`` (``tests/engines/llamacpp.py``, prompt caching on, its default), whole and then
streamed without ``include_usage`` (the proxy asks for the usage chunk itself and removes it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer
from tests.engines import llamacpp

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

SYSTEM = (
    "You are a helpful assistant who answers in one short sentence. You know a lot about "
    "geography, history and the weather of European cities."
)
BODY = {
    "model": llamacpp.ALIAS,
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "max_tokens": 4,
    "temperature": 0,
}


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    server = RealLlamaServer.start(slots=1)
    started = ProxyProcess(
        ["--engine", "openai", "--node", f"l={server.url}", "--node-kind", "l=openai"], tmp_path
    )
    try:
        started.wait_ready(1)
        yield started
    finally:
        log = started.stop()
        server.stop()
        assert "Traceback" not in log, log
        assert "capital of France" not in log, "a prompt reached the log"


def record_of(proxy: ProxyProcess, request_id: str, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in proxy.events("proxy/request") if e.get("id") == request_id]
        if found:
            return found[0]
        time.sleep(0.05)
    pytest.fail(f"no proxy/request event for {request_id}:\n{proxy.tail()}")


def test_a_repeated_prompt_records_the_cached_tokens_the_llama_server_states(
    proxy: ProxyProcess,
) -> None:
    """Whole, the record's ``cached_tokens`` is what the engine's answer says
    (``usage.prompt_tokens_details.cached_tokens``): few or none the first time, all but the
    last prompt token the second; streamed again, the count in the usage chunk the proxy
    removed is recorded."""
    with httpx.Client(timeout=300) as client:
        whole = [client.post(f"{proxy.url}/v1/chat/completions", json=BODY) for _ in range(2)]
        streamed = client.post(f"{proxy.url}/v1/chat/completions", json={**BODY, "stream": True})
    for answer in (*whole, streamed):
        assert answer.status_code == 200, answer.text
    assert '"usage"' not in streamed.text  # the client asked for no usage chunk
    usages = [answer.json()["usage"] for answer in whole]
    stated = [usage["prompt_tokens_details"]["cached_tokens"] for usage in usages]
    prompt = usages[1]["prompt_tokens"]
    assert stated[0] < stated[1] == prompt - 1  # llama.cpp reads the last prompt token again
    records = [record_of(proxy, a.headers["x-nvpair-request-id"]) for a in (*whole, streamed)]
    assert [r["cached_tokens"] for r in records] == [*stated, prompt - 1]
    assert [r["prompt_tokens"] for r in records] == [u["prompt_tokens"] for u in usages] + [prompt]
