"""Anthropic Messages end to end (docs/behaviour.md §17.3) on a real Ollama 0.9.3, which has no
``/v1/messages`` (it answers 404): a ``twist nvpair`` subprocess translates it to the engine's own
``/v1/chat/completions``, text only, with raw HTTP and with the official ``anthropic`` client.

The engine's own ``/v1/chat/completions`` answer to the same request at temperature 0 is the
reference. The same Ollama declared ``kind = "openai"`` stands for an OpenAI-compatible server
without the route (vLLM, LocalAI): the proxy learns it from its 404, beside a real
``llama-server`` whose build has the route. Engines that cannot be installed or started fail the
tests, never skip them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer, RealOllama
from tests.engines import llamacpp

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

MODEL = "smollm2"
TOKENS = 12
QUESTION = "Name a colour."
BOUND = pytest.mark.timeout(180, func_only=True)


@pytest.fixture(scope="module")
def real_ollama() -> Iterator[RealOllama]:
    node = RealOllama.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def proxy(
    real_ollama: RealOllama, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """The ollama facade over the real Ollama (a node of the facade's own kind)."""
    args: Sequence[str] = ["--engine", "ollama", "--node", f"o={real_ollama.url}"]
    started = ProxyProcess(list(args), tmp_path_factory.mktemp("proxy"))
    try:
        started.wait_ready(1)
        yield started
    finally:
        output = started.stop()
        assert "Traceback" not in output, output
        assert QUESTION not in output, "a prompt was logged"


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(timeout=120) as client:
        return client.post(url, json=body, headers={"anthropic-version": "2023-06-01"})


def _reference(base: str) -> str:
    """The engine's own chat completions answer to the question."""
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": QUESTION},
        ],
        "max_tokens": TOKENS,
        "temperature": 0,
    }
    answer = _post(f"{base}/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["message"]["content"]
    return text


def _messages(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": TOKENS,
        "temperature": 0,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": QUESTION}],
        "stream": stream,
    }


@BOUND
def test_the_real_ollama_has_no_messages_route_and_the_proxy_translates_it(
    real_ollama: RealOllama, proxy: ProxyProcess
) -> None:
    direct = _post(f"{real_ollama.url}/v1/messages", _messages(False))
    assert direct.status_code == 404
    answer = _post(f"{proxy.url}/v1/messages", _messages(False))
    assert answer.status_code == 200, answer.text
    message = answer.json()
    assert message["type"] == "message" and message["model"] == MODEL
    [block] = message["content"]
    assert block == {"type": "text", "text": _reference(real_ollama.url)}
    assert message["usage"]["input_tokens"] > 0 and 0 < message["usage"]["output_tokens"] <= TOKENS
    assert message["stop_reason"] in ("end_turn", "max_tokens")


@BOUND
def test_a_raw_messages_stream_is_anthropics_event_sequence(
    real_ollama: RealOllama, proxy: ProxyProcess
) -> None:
    answer = _post(f"{proxy.url}/v1/messages", _messages(True))
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/event-stream"
    events = []
    for frame in answer.text.split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            doc = json.loads(data.removeprefix("data: "))
            assert name == f"event: {doc['type']}"
            events.append(doc)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == _reference(real_ollama.url)


@BOUND
def test_the_anthropic_client_reads_the_translated_answers(
    real_ollama: RealOllama, proxy: ProxyProcess
) -> None:
    """The official client, whole and streamed (``messages.stream`` accumulates the events into
    the final message itself, so every event must be what it expects)."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    reference = _reference(real_ollama.url)
    whole = client.messages.create(
        model=MODEL,
        max_tokens=TOKENS,
        system="Be brief.",
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},  # this client has no temperature argument of its own
    )
    assert [block.type for block in whole.content] == ["text"]
    assert whole.content[0].text == reference  # type: ignore[union-attr]
    with client.messages.stream(
        model=MODEL,
        max_tokens=TOKENS,
        system="Be brief.",
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},  # this client has no temperature argument of its own
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == reference
    assert final.content[0].text == reference  # type: ignore[union-attr]
    assert final.usage.output_tokens == whole.usage.output_tokens > 0
    missing: Callable[..., Any] = client.messages.create
    with pytest.raises(anthropic.APIStatusError) as refused:
        missing(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert refused.value.status_code == 404  # model-not-found, §4.2


@pytest.mark.timeout(300, func_only=True)
def test_a_node_that_lacks_messages_is_learnt_and_one_that_has_it_is_sent_it(
    real_ollama: RealOllama, tmp_path: Path
) -> None:
    """docs/behaviour.md §17.3 on real servers behind the ``openai`` facade: the real Ollama
    0.9.3 declared ``kind = "openai"`` has no ``/v1/messages`` (Gin's ``404 page not found``),
    so its first Messages request is asked again, translated, within the same request and the
    second is translated from the start; this llama-server build has ``/v1/messages``, so it is
    sent the route as it is and nothing is learnt of it. The official client reads all three."""
    llama = RealLlamaServer.start(slots=1)
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(
        f'[[node]]\nid = "o"\nurl = "{real_ollama.url}"\nkind = "openai"\n\n'
        f'[[node]]\nid = "l"\nurl = "{llama.url}"\nkind = "openai"\n'
    )
    proxy = ProxyProcess(["--engine", "openai", "--nodes", str(nodes)], tmp_path)
    try:
        proxy.wait_ready(2)
        assert _post(f"{llama.url}/v1/messages", _messages(False)).status_code == 200
        client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
        asked = [("o", "smollm2:latest"), ("o", "smollm2:latest"), ("l", llamacpp.ALIAS)]
        for node, model in asked:
            answer = client.messages.create(
                model=model,
                max_tokens=TOKENS,
                messages=[{"role": "user", "content": QUESTION}],
                extra_body={"temperature": 0},
                extra_headers={"X-NVPair-Node": node},
            )
            assert answer.content and answer.content[0].type == "text"
        deadline = time.monotonic() + 10  # a record is published once its answer is written
        while len(records := proxy.events("proxy/request")) < len(asked):
            assert time.monotonic() < deadline, records
            time.sleep(0.05)
        seen = [([a["outcome"] for a in r["attempts"]], r["translated"]) for r in records]
        assert seen == [
            (["status-404", "committed"], True),
            (["committed"], True),
            (["committed"], False),
        ]
        assert [r["node_id"] for r in records] == ["o", "o", "l"]
    finally:
        output = proxy.stop()
        llama.stop()
    assert "Traceback" not in output and QUESTION not in output
    learnt = [e for e in _log_entries(output) if e.get("log_namespace", "").endswith("._gaps")]
    assert [(e["node"], e["route"]) for e in learnt] == [("o", "/v1/messages")]


def _log_entries(output: str) -> list[dict[str, Any]]:
    """The JSON log's entries."""
    found = []
    for line in output.replace("\x1e", "\n").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found
