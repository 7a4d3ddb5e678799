"""Mixed fleets end to end (docs/behaviour.md §11) on real engines: a ``twist nvpair`` subprocess in
front of a real Ollama (``tests/engines/ollama.py``) and a real llama.cpp ``llama-server``
(``tests/engines/llamacpp.py``, built on first use), both serving the same SmolLM2 GGUF.

- A real Ollama declared ``kind = openai`` behind the ``ollama`` facade: Ollama-native requests are
  translated to Ollama's own ``/v1`` routes, so the engine's ``/v1`` answer to the equivalent
  request is the reference (content, usage counts, embeddings), for raw HTTP and for the official
  ``ollama`` client.
- Failover across kinds with a real SIGSTOP, truncation with a real SIGKILL mid-stream (translated),
  and a fleet of both engines under one public name (``[[model]]`` catalogue) behind the ``ollama``
  and the ``openai`` facades.

Faults are real signals to an engine's process group; nothing sleeps in place of synchronisation
(every wait polls an observable condition under a deadline). Engines that cannot be installed or
started fail the tests, never skip them.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer, RealOllama
from tests.engines import llamacpp

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

# Ollama's /v1/models calls the model "smollm2:latest", and an ``openai`` node's names match
# exactly (§4.1, §11.1): a client of that node names it the way the node does.
LOCAL = "smollm2:latest"
PUBLIC = "smollm2"
SETTINGS = {"temperature": 0, "seed": 42}
TOKENS = 12
CHAT = [{"role": "user", "content": "Name a colour."}]
PROMPT = "Count: one, two,"
EMBED_INPUT = "hello world"
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
CATALOGUE = f'[[model]]\nname = "{PUBLIC}"\naliases = ["{llamacpp.ALIAS}"]\n'
# Each test's bound, fixture set-up included: an engine build on a fresh machine (10-20 minutes)
# happens in the first test's module fixture.
BOUND = pytest.mark.timeout(1500)


# --- engines and proxies ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama() -> Iterator[RealLlamaServer]:
    server = RealLlamaServer.start(slots=2)
    try:
        yield server
    finally:
        server.stop()


def nodes_file(path: Path, nodes: Sequence[tuple[str, str, str]], catalogue: str = "") -> Path:
    """A TOML nodes file of ``(id, url, kind)`` entries, then ``catalogue``."""
    lines = []
    for node_id, url, kind in nodes:
        lines += ["[[node]]", f'id = "{node_id}"', f'url = "{url}"', f'kind = "{kind}"', ""]
    path.write_text("\n".join(lines) + catalogue)
    return path


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ProxyProcess]]:
    """Starts proxies (each stopped at the end of the module; its log must hold no traceback and no
    prompt text)."""
    started: list[ProxyProcess] = []

    def start(args: Sequence[str], ready: int) -> ProxyProcess:
        workdir = tmp_path_factory.mktemp("proxy")
        proxy = ProxyProcess(list(args), workdir)
        started.append(proxy)
        proxy.wait_ready(ready)
        return proxy

    yield start
    for proxy in started:
        output = proxy.stop()
        assert "Traceback" not in output, output
        assert "lighthouse" not in output and "Name a colour" not in output, "a prompt was logged"


@pytest.fixture(scope="module")
def translating(real_ollama: RealOllama, proxies: Callable[..., ProxyProcess]) -> ProxyProcess:
    """The ollama facade over the real Ollama declared ``kind = openai`` (command-line flags)."""
    return proxies(
        ["--engine", "ollama", "--node", f"o={real_ollama.url}", "--node-kind", "o=openai"], 1
    )


def _mixed_nodes(where: Path, ollama_url: str, llama_url: str) -> Path:
    nodes = [("l", llama_url, "openai"), ("o", ollama_url, "ollama")]
    return nodes_file(where / "nodes.toml", nodes, CATALOGUE)


@pytest.fixture(scope="module", params=["ollama", "openai"])
def mixed(
    request: pytest.FixtureRequest,
    real_ollama: RealOllama,
    llama: RealLlamaServer,
    proxies: Callable[..., ProxyProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, ProxyProcess]:
    """A facade (``ollama`` or ``openai``) over a real Ollama (kind ollama, ``o``) and the
    llama-server (kind openai, ``l``), both owning the public name ``smollm2``."""
    listing = _mixed_nodes(tmp_path_factory.mktemp("nodes"), real_ollama.url, llama.url)
    facade = str(request.param)
    return facade, proxies(["--engine", facade, "--nodes", str(listing)], 2)


# --- helpers ---------------------------------------------------------------------------------------


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    with httpx.Client(timeout=120) as client:
        return client.post(url, json=body, headers=headers or {})


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()


def _lines(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, (response.status_code, response.text)
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def _v1_chat(base: str, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's own /v1 answer, the reference for a translated Ollama request."""
    body = {"model": model, "messages": messages, "max_tokens": TOKENS, **SETTINGS}
    answer: dict[str, Any] = _ok(_post(f"{base}/v1/chat/completions", body))
    return answer


def _ollama_body(
    messages: list[dict[str, Any]], stream: bool, model: str = LOCAL
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "stream": stream,
        "options": {**SETTINGS, "num_predict": TOKENS},
    }


def _check_final(final: dict[str, Any], reference: dict[str, Any]) -> None:
    """An Ollama terminal object translated from ``reference`` (an OpenAI chat completion)."""
    assert final["done"] is True
    assert final["done_reason"] == reference["choices"][0]["finish_reason"]
    assert final["prompt_eval_count"] == reference["usage"]["prompt_tokens"]
    assert final["eval_count"] == reference["usage"]["completion_tokens"]
    assert final["total_duration"] > 0


def _close(left: Sequence[float], right: Sequence[float]) -> bool:
    return len(left) == len(right) and all(
        math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(left, right, strict=True)
    )


def _record(proxy: ProxyProcess, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    """The ``proxy/request`` event of one request (it is logged when the request ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in proxy.events("proxy/request") if e.get("id") == request_id]
        if found:
            return found[0]
        time.sleep(0.05)
    pytest.fail(f"no proxy/request event for {request_id}:\n{proxy.tail()}")


# --- a. translation to a real Ollama's own /v1 -----------------------------------------------------


@BOUND
def test_translated_chat_is_the_engines_own_v1_answer(
    real_ollama: RealOllama, translating: ProxyProcess
) -> None:
    reference = _v1_chat(real_ollama.url, LOCAL, CHAT)
    expected = reference["choices"][0]["message"]["content"]
    assert expected

    whole = _post(f"{translating.url}/api/chat", _ollama_body(CHAT, stream=False))
    assert whole.headers["x-nvpair-node"] == "o"
    answer = _ok(whole)
    assert answer["message"] == {"role": "assistant", "content": expected}
    assert answer["model"] == LOCAL
    _check_final(answer, reference)

    streamed = _post(f"{translating.url}/api/chat", _ollama_body(CHAT, stream=True))
    assert streamed.headers["content-type"].startswith("application/x-ndjson")
    chunks = _lines(streamed)
    assert [c["done"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["message"]["content"] for c in chunks) == expected
    assert all(c["model"] == LOCAL for c in chunks)
    _check_final(chunks[-1], reference)


@BOUND
def test_translated_generate_is_the_engines_own_v1_chat_answer(
    real_ollama: RealOllama, translating: ProxyProcess
) -> None:
    """``/api/generate`` without ``raw`` is sent as a chat with the prompt as the user message."""
    reference = _v1_chat(real_ollama.url, LOCAL, [{"role": "user", "content": PROMPT}])
    body = {
        "model": LOCAL,
        "prompt": PROMPT,
        "stream": False,
        "options": {**SETTINGS, "num_predict": TOKENS},
    }
    answer = _ok(_post(f"{translating.url}/api/generate", body))
    assert answer["response"] == reference["choices"][0]["message"]["content"]
    _check_final(answer, reference)


@BOUND
def test_translated_embed_is_the_engines_own_v1_embedding(
    real_ollama: RealOllama, translating: ProxyProcess
) -> None:
    reference = _ok(
        _post(f"{real_ollama.url}/v1/embeddings", {"model": LOCAL, "input": EMBED_INPUT})
    )
    answer = _ok(_post(f"{translating.url}/api/embed", {"model": LOCAL, "input": EMBED_INPUT}))
    assert answer["model"] == LOCAL
    [vector] = answer["embeddings"]
    assert _close(vector, reference["data"][0]["embedding"])
    if "usage" in reference:
        assert answer["prompt_eval_count"] == reference["usage"]["prompt_tokens"]


# --- b. the official ollama client through the translation ----------------------------------------


@BOUND
def test_the_ollama_client_chats_and_embeds_through_the_translation(
    real_ollama: RealOllama, translating: ProxyProcess
) -> None:
    expected = _v1_chat(real_ollama.url, LOCAL, CHAT)["choices"][0]["message"]["content"]
    client = ollama.Client(host=translating.url, timeout=120)
    options = {**SETTINGS, "num_predict": TOKENS}

    whole = client.chat(model=LOCAL, messages=CHAT, stream=False, options=options)
    assert (whole.message.content, whole.done, whole.done_reason) == (expected, True, "length")
    assert whole.eval_count == TOKENS

    parts = list(client.chat(model=LOCAL, messages=CHAT, stream=True, options=options))
    assert "".join(p.message.content or "" for p in parts) == expected
    assert [p.done for p in parts][-1] is True
    assert not any(p.done for p in parts[:-1])

    reference = _ok(
        _post(f"{real_ollama.url}/v1/embeddings", {"model": LOCAL, "input": EMBED_INPUT})
    )
    embedded = client.embed(model=LOCAL, input=EMBED_INPUT)
    assert _close(embedded.embeddings[0], reference["data"][0]["embedding"])


# --- e. one public name over both engines, behind both facades ------------------------------------


@BOUND
def test_the_catalogue_lists_the_public_name_once(mixed: tuple[str, ProxyProcess]) -> None:
    facade, proxy = mixed
    if facade == "ollama":
        listed = _ok(httpx.get(f"{proxy.url}/api/tags", timeout=30))["models"]
        names = [m.get("model") or m.get("name") for m in listed]
    else:
        listed = _ok(httpx.get(f"{proxy.url}/v1/models", timeout=30))["data"]
        names = [m["id"] for m in listed]
    assert llamacpp.ALIAS not in names, names
    # /api/tags keys names the Ollama way (smollm2 = smollm2:latest); /v1/models keys ids
    # verbatim, so there the Ollama node's smollm2:latest must be listed as the public name too
    assert [n for n in names if n.split(":")[0] == PUBLIC] == [PUBLIC], names


def _ask(facade: str, proxy: ProxyProcess, node: str, stream: bool) -> tuple[str, list[str]]:
    """One request for the public name pinned to ``node``: its text and every ``model`` field."""
    headers = {"X-NVPair-Node": node}
    if facade == "ollama":
        response = _post(f"{proxy.url}/api/chat", _ollama_body(CHAT, stream, PUBLIC), headers)
        assert response.headers["x-nvpair-node"] == node
        chunks = _lines(response)
        assert chunks[-1]["done"] is True
        return "".join(c["message"]["content"] for c in chunks), [c["model"] for c in chunks]
    body = {"model": PUBLIC, "messages": CHAT, "max_tokens": TOKENS, "stream": stream, **SETTINGS}
    response = _post(f"{proxy.url}/v1/chat/completions", body, headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-nvpair-node"] == node
    if not stream:
        answer = response.json()
        return answer["choices"][0]["message"]["content"], [answer["model"]]
    frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    events = [json.loads(frame) for frame in frames[:-1]]
    text = "".join((e["choices"] or [{}])[0].get("delta", {}).get("content") or "" for e in events)
    return text, [e["model"] for e in events]


@BOUND
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_both_engines_serve_the_public_name_as_the_client_named_it(
    mixed: tuple[str, ProxyProcess], stream: bool
) -> None:
    facade, proxy = mixed
    for node in ("o", "l", "o", "l"):
        text, models = _ask(facade, proxy, node, stream)
        assert text, (node, stream)
        assert set(models) == {PUBLIC}, (node, models)


# --- c. failover across kinds with a real SIGSTOP --------------------------------------------------

HEADER_TIMEOUT = 4.0


@BOUND
@pytest.mark.parametrize("frozen", ["o", "l"], ids=["ollama-frozen", "llama-frozen"])
def test_a_frozen_node_fails_over_to_the_other_kind_and_cools(
    real_ollama: RealOllama,
    llama: RealLlamaServer,
    proxies: Callable[..., ProxyProcess],
    tmp_path: Path,
    frozen: str,
) -> None:
    """The pinned (first) candidate is SIGSTOPped: the request stalls one response-header timeout
    and completes from the node of the other kind (translated or native from the client's original
    body); a second request goes straight to the other node while the frozen one cools."""
    listing = _mixed_nodes(tmp_path, real_ollama.url, llama.url)
    timeout = ["--response-header-timeout", f"{HEADER_TIMEOUT:g}s"]
    proxy = proxies(["--engine", "ollama", "--nodes", str(listing), *timeout], 2)
    other = {"o": "l", "l": "o"}[frozen]
    engines: dict[str, RealOllama | RealLlamaServer] = {"o": real_ollama, "l": llama}
    for node in ("o", "l"):  # warm: no cold load stands in for a stall
        assert (
            _post(
                f"{proxy.url}/api/chat", _ollama_body(CHAT, False, PUBLIC), {"X-NVPair-Node": node}
            ).status_code
            == 200
        )
    proxy.call("node/select", {"id": frozen})
    body = _ollama_body(CHAT, stream=True, model=PUBLIC)
    engines[frozen].freeze()
    try:
        started = time.monotonic()
        first = _post(f"{proxy.url}/api/chat", body)
        first_took = time.monotonic() - started
        chunks = _lines(first)
        assert first.headers["x-nvpair-node"] == other
        assert chunks[-1]["done"] is True and {c["model"] for c in chunks} == {PUBLIC}
        assert first_took >= HEADER_TIMEOUT
        started = time.monotonic()
        second = _post(f"{proxy.url}/api/chat", body)
        second_took = time.monotonic() - started
        assert second.headers["x-nvpair-node"] == other
        assert _lines(second)[-1]["done"] is True
        assert second_took < HEADER_TIMEOUT, "the second request waited on the frozen node"
    finally:
        engines[frozen].thaw()
    outcomes = [
        [a["outcome"] for a in _record(proxy, r.headers["x-nvpair-request-id"])["attempts"]]
        for r in (first, second)
    ]
    assert outcomes == [["stall", "committed"], ["committed"]]
    assert any(c["node_id"] == frozen for c in proxy.events("node/cooldown"))


# --- d. truncation with a real SIGKILL mid-stream (translated) -------------------------------------


@BOUND
def test_a_llama_server_killed_mid_stream_leaves_a_truncated_translated_stream(
    proxies: Callable[..., ProxyProcess], tmp_path: Path
) -> None:
    """A translated /api/chat stream from a llama-server SIGKILLed after the first chunk: the client
    keeps what was sent, gets no ``done: true`` line, and the chunked framing never ends."""
    server = RealLlamaServer.start(slots=1)
    try:
        listing = nodes_file(tmp_path / "nodes.toml", [("l", server.url, "openai")], CATALOGUE)
        proxy = proxies(["--engine", "ollama", "--nodes", str(listing)], 1)
        body = _ollama_body(STORY, stream=True, model=PUBLIC)
        body["options"]["num_predict"] = 400
        host, port = proxy.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request(
            "POST", "/api/chat", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Transfer-Encoding") == "chunked"
        first = response.readline()
        assert json.loads(first)["done"] is False
        server.kill()
        with pytest.raises(http.client.IncompleteRead) as cut:
            response.read()
        connection.close()
        request_id = str(response.getheader("X-NVPair-Request-Id"))
    finally:
        server.stop()
    received = first + cut.value.partial
    whole_lines = [line for line in received.split(b"\n")[:-1] if line.strip()]
    assert whole_lines, "not even the first line"
    assert not any(json.loads(line).get("done") for line in whole_lines)
    record = _record(proxy, request_id)
    assert [a["outcome"] for a in record["attempts"]] == ["committed"]
    assert record["error"] == "upstream dropped mid-stream"
