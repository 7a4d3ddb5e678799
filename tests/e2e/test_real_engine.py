"""End to end: the official ``ollama`` and ``openai`` clients through a real ``twist nvpair``
process in front of a real Ollama (installed on first use by ``tests/engines/ollama.py``) get the
engine's own answers.

The engine lives in the user cache (``NVPAIR_REAL_OLLAMA_DIR`` overrides the directory). If it
cannot be installed or started, the tests fail (never skip), so a missing dependency is visible.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.realnodes import free_ports, gone
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2"
OPTIONS = {"num_predict": 16}
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour."}]
PROMPT = "Count: one, two,"
EMBED_INPUT = "hello world"
PRIVATE_TEXTS = ("Name a colour", "Count: one", EMBED_INPUT)
READY_TIMEOUT = 30.0


def _stop_group(pid: int) -> None:
    """SIGTERM the process group led by ``pid``; SIGKILL it if it outlives 10 seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    """A real Ollama serving ``smollm2`` on a free loopback port; its base URL."""
    (port,) = free_ports(1)
    pid = ollama_engine.up_or_fail(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop_group(pid)


def _tail(log: Path, limit: int = 6000) -> str:
    """The end of a log file, short enough for a failure message."""
    text = log.read_text(errors="replace")
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _wait_ready(
    url: str, process: subprocess.Popen[bytes], log: Path, facade: str = "ollama"
) -> None:
    """Poll the proxy until it answers and its model list names the model (or fail clearly)."""
    deadline = time.monotonic() + READY_TIMEOUT
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the proxy exited with {process.returncode}:\n{_tail(log)}")
        try:
            httpx.get(f"{url}/api/version", timeout=2).raise_for_status()
            if facade == "ollama":
                tags = httpx.get(f"{url}/api/tags", timeout=2)
                names = [m["name"] for m in tags.json().get("models", [])]
            else:
                tags = httpx.get(f"{url}/v1/models", timeout=2)
                names = [m["id"] for m in tags.json().get("data", [])]
            if f"{MODEL}:latest" in names:
                return
            last = f"the model list answered {tags.status_code} listing {names}"
        except (httpx.HTTPError, ValueError) as error:
            last = repr(error)
        time.sleep(0.1)
    pytest.fail(
        f"the proxy did not serve {MODEL}:latest within {READY_TIMEOUT:.0f} s ({last}):\n"
        f"{_tail(log)}"
    )


@contextlib.contextmanager
def _proxy_process(nodes: list[str], log: Path, facade: str = "ollama") -> Iterator[str]:
    """``python -m twisted nvpair --engine FACADE`` over ``--node`` values; its base URL.

    At exit it is stopped with SIGTERM and its output must hold no traceback and no prompt.
    """
    (port,) = free_ports(1)
    command = [
        sys.executable,
        "-m",
        "twisted",
        "--log-format=text",
        "nvpair",
        "--engine",
        facade,
        "--usage-db",
        "none",
        "--listen",
        f"tcp:{port}:interface=127.0.0.1",
        *(arg for node in nodes for arg in ("--node", node)),
        "--admin",
        "none",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log, facade)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"the proxy ignored SIGTERM for 20 s:\n{_tail(log)}")
    output = log.read_text()
    assert "Traceback" not in output, output
    # twist re-raises the signal it stopped on, so a clean SIGTERM exit reads as -SIGTERM.
    assert process.returncode in (0, -signal.SIGTERM), output
    leaked = [text for text in PRIVATE_TEXTS if text in output]
    assert not leaked, f"request content {leaked} in the proxy log:\n{output}"


@pytest.fixture(scope="module")
def proxy(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The proxy with one node, the engine; its base URL."""
    with _proxy_process([f"a={engine}"], tmp_path_factory.mktemp("proxy") / "twist.log") as url:
        yield url


@pytest.fixture(scope="module")
def ollama_pair(engine: str, proxy: str) -> tuple[ollama.Client, ollama.Client]:
    """``ollama`` clients for (through the proxy, directly)."""
    return ollama.Client(host=proxy), ollama.Client(host=engine)


@pytest.fixture(scope="module")
def openai_pair(engine: str, proxy: str) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    """``openai`` clients for (through the proxy, directly)."""
    via = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=f"{engine}/v1", api_key="unused", max_retries=0)
    yield via, direct
    via.close()
    direct.close()


def _both(pair: tuple[Any, Any], call: Any) -> tuple[Any, Any]:
    """``call`` applied to the proxied client, then to the direct one."""
    return call(pair[0]), call(pair[1])


def test_ollama_chat_matches_engine(ollama_pair: tuple[ollama.Client, ollama.Client]) -> None:
    """A non-streaming chat through the proxy answers exactly what the engine answers."""

    def ask(client: ollama.Client) -> tuple[Any, ...]:
        r = client.chat(model=MODEL, messages=CHAT, options=OPTIONS)
        return r.model, r.message.role, r.message.content, r.done_reason, r.eval_count

    via, direct = _both(ollama_pair, ask)
    assert via == direct
    assert via[2]


def test_ollama_streaming_chat_matches_engine(
    ollama_pair: tuple[ollama.Client, ollama.Client],
) -> None:
    """A streaming chat through the proxy yields the engine's chunks, one for one."""

    def ask(client: ollama.Client) -> list[tuple[str | None, bool]]:
        parts = client.chat(model=MODEL, messages=CHAT, options=OPTIONS, stream=True)
        return [(p.message.content, bool(p.done)) for p in parts]

    via, direct = _both(ollama_pair, ask)
    assert via == direct
    assert len(via) > 2 and via[-1][1]


def test_ollama_generate_matches_engine(ollama_pair: tuple[ollama.Client, ollama.Client]) -> None:
    """``generate`` through the proxy answers exactly what the engine answers."""

    def ask(client: ollama.Client) -> tuple[Any, ...]:
        r = client.generate(model=MODEL, prompt=PROMPT, options=OPTIONS)
        return r.model, r.response, r.done_reason, r.eval_count

    via, direct = _both(ollama_pair, ask)
    assert via == direct
    assert via[1]


def test_ollama_embed_matches_engine(ollama_pair: tuple[ollama.Client, ollama.Client]) -> None:
    """``embed`` through the proxy returns the engine's embedding, bit for bit."""

    def ask(client: ollama.Client) -> tuple[Any, ...]:
        r = client.embed(model=MODEL, input=EMBED_INPUT)
        return r.model, r.embeddings

    via, direct = _both(ollama_pair, ask)
    assert via == direct
    assert len(via[1]) == 1 and len(via[1][0]) > 0


def test_ollama_list_matches_engine(ollama_pair: tuple[ollama.Client, ollama.Client]) -> None:
    """``list`` through the proxy shows the engine's models with their digests and sizes."""

    def ask(client: ollama.Client) -> list[tuple[Any, ...]]:
        return [(m.model, m.digest, m.size, m.details) for m in client.list().models]

    via, direct = _both(ollama_pair, ask)
    assert via == direct
    assert f"{MODEL}:latest" in [m[0] for m in via]


def test_openai_chat_completion_matches_engine(
    openai_pair: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """An OpenAI chat completion through the proxy's /v1 matches the engine's."""

    def ask(client: openai.OpenAI) -> tuple[Any, ...]:
        r = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=16,
            temperature=0,
        )
        choice = r.choices[0]
        return r.model, choice.message.role, choice.message.content, choice.finish_reason

    via, direct = _both(openai_pair, ask)
    assert via == direct
    assert via[2]


def test_openai_streaming_chat_completion_matches_engine(
    openai_pair: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """A streaming OpenAI chat completion through the proxy yields the engine's deltas."""

    def ask(client: openai.OpenAI) -> list[tuple[Any, ...]]:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=16,
            temperature=0,
            stream=True,
        )
        return [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in stream]

    via, direct = _both(openai_pair, ask)
    assert via == direct
    assert len(via) > 2 and "".join(part or "" for part, _ in via)


def test_openai_models_list_matches_engine(
    openai_pair: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """``models.list()`` through the proxy names the engine's models."""

    def ask(client: openai.OpenAI) -> list[tuple[str, str]]:
        return [(m.id, m.owned_by) for m in client.models.list()]

    via, direct = _both(openai_pair, ask)
    assert via == direct
    assert f"{MODEL}:latest" in [m[0] for m in via]


def test_openai_embeddings_match_engine(openai_pair: tuple[openai.OpenAI, openai.OpenAI]) -> None:
    """OpenAI embeddings through the proxy equal the engine's, bit for bit."""

    def ask(client: openai.OpenAI) -> tuple[Any, ...]:
        r = client.embeddings.create(model=MODEL, input=EMBED_INPUT)
        return r.model, [d.embedding for d in r.data]

    via, direct = _both(openai_pair, ask)
    assert via == direct
    assert len(via[1]) == 1 and len(via[1][0]) > 0


def test_proxy_names_the_serving_node(proxy: str) -> None:
    """An inference answer carries ``X-NVPair-Node`` naming the node that served it."""
    body = {"model": MODEL, "prompt": PROMPT, "stream": False, "options": {"num_predict": 1}}
    response = httpx.post(f"{proxy}/api/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers.get("X-NVPair-Node") == "a"


def test_a_model_no_node_lists_is_the_real_ollamas_own_404(proxy: str, engine: str) -> None:
    """A model no node lists is refused at once with the 404 the real Ollama itself answers (its
    status and its words, docs/behaviour.md §4.2), naming the models the caller may use, never
    forwarded; on `/v1` it is OpenAI's ``model_not_found``."""
    body = {"model": "no-such-model:latest", "messages": CHAT, "stream": False}
    itself = httpx.post(f"{engine}/api/chat", json=body, timeout=30)
    response = httpx.post(f"{proxy}/api/chat", json=body, timeout=30)
    assert (itself.status_code, response.status_code) == (404, 404), response.text
    assert response.headers["Content-Type"].startswith("application/json")
    said, ours = itself.json()["error"], response.json()["error"]
    assert ours.startswith(said) and ours == f"{said} (models you may use: smollm2:latest)"
    assert response.json()["code"] == "model-not-found"
    assert "X-NVPair-Node" not in response.headers
    openai = {"model": "no-such-model:latest", "messages": CHAT}
    v1 = httpx.post(f"{proxy}/v1/chat/completions", json=openai, timeout=30)
    assert v1.status_code == 404
    assert v1.json()["error"]["type"] == "invalid_request_error"
    assert v1.json()["error"]["code"] == "model_not_found"


# --- issue 14: routes that know their model or span every node (docs/behaviour.md §2.1) ---------

SIMULATED = """
import sys
from twisted.internet import reactor
from nvpair_tw.simulated._engine import SimulatedEngine
engine = SimulatedEngine(reactor, ("llama3:latest",), loaded=("llama3:latest",))
reactor.listenTCP(int(sys.argv[1]), engine.site(), interface="127.0.0.1")
reactor.run()
"""


@pytest.fixture(scope="module")
def split_proxy(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The proxy over two nodes: a, a simulated engine without smollm2 (first in the default
    order), then b, the real engine; its base URL."""
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    simulated = subprocess.Popen(
        [sys.executable, "-c", SIMULATED, str(port)], cwd=REPO, env=env, start_new_session=True
    )
    try:
        log = tmp_path_factory.mktemp("split") / "twist.log"
        with _proxy_process([f"a=http://127.0.0.1:{port}", f"b={engine}"], log) as url:
            yield url
    finally:
        _stop_group(simulated.pid)
        simulated.wait()


def test_ollama_show_reaches_the_second_node_that_has_the_model(
    engine: str, split_proxy: str
) -> None:
    """``ollama.show`` through the facade answers what the engine answers, from node b, although
    node a comes first and lacks the model; an unknown model is Ollama-shaped 404."""
    via, direct = (
        ollama.Client(host=split_proxy).show(MODEL),
        ollama.Client(host=engine).show(MODEL),
    )
    # Ollama prints a modelfile's PARAMETER lines in Go map order, which differs between two calls
    # to the same engine: compare the lines, not their order.
    assert (sorted((via.modelfile or "").splitlines()), via.details, via.template) == (
        sorted((direct.modelfile or "").splitlines()),
        direct.details,
        direct.template,
    )
    raw = httpx.post(f"{split_proxy}/api/show", json={"model": MODEL}, timeout=30)
    assert raw.headers.get("X-NVPair-Node") == "b"
    with pytest.raises(ollama.ResponseError) as missing:
        ollama.Client(host=split_proxy).show("no-such-model")
    with pytest.raises(ollama.ResponseError) as engines_own:
        ollama.Client(host=engine).show("no-such-model")
    # The engine's own words, then the models the caller may use (docs/behaviour.md §4.2).
    assert missing.value.status_code == engines_own.value.status_code == 404
    assert missing.value.error == (
        f"{engines_own.value.error} (models you may use: llama3:latest, {MODEL}:latest)"
    )


def test_ollama_ps_lists_the_loaded_model_with_its_node(split_proxy: str) -> None:
    """After a generate through the facade, ``ollama.ps()`` lists smollm2, and the raw answer
    tags it with ``nvpair_node`` b (the simulated node's own record is tagged a)."""
    client = ollama.Client(host=split_proxy)
    client.generate(model=MODEL, prompt=PROMPT, options={"num_predict": 1})
    assert f"{MODEL}:latest" in [m.model for m in client.ps().models]
    listed = httpx.get(f"{split_proxy}/api/ps", timeout=30).json()["models"]
    assert {(m["model"], m["nvpair_node"]) for m in listed} == {
        (f"{MODEL}:latest", "b"),
        ("llama3:latest", "a"),
    }


# --- the lmstudio and omlx facades in front of the same real engine (it serves /v1/* too) --------

TAGGED = f"{MODEL}:latest"  # LM Studio names match exactly, so clients use the listed id


@pytest.fixture(scope="module", params=["lmstudio", "omlx"])
def openai_facade_pair(
    request: pytest.FixtureRequest, engine: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    """``openai`` clients for (through an lmstudio or omlx facade, directly)."""
    facade = str(request.param)
    log = tmp_path_factory.mktemp(facade) / "twist.log"
    with _proxy_process([f"a={engine}"], log, facade) as url:
        via = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        direct = openai.OpenAI(base_url=f"{engine}/v1", api_key="unused", max_retries=0)
        yield via, direct
        via.close()
        direct.close()


def test_other_facades_chat_stream_models_and_embeddings_match_the_engine(
    openai_facade_pair: tuple[openai.OpenAI, openai.OpenAI],
) -> None:
    """Through the lmstudio and omlx facades: chat, a streamed chat, the model list and embeddings
    equal the engine's own answers."""

    def chat(client: openai.OpenAI) -> tuple[Any, ...]:
        r = client.chat.completions.create(
            model=TAGGED, messages=CHAT, max_tokens=16, temperature=0
        )
        return r.model, r.choices[0].message.content, r.choices[0].finish_reason

    def stream(client: openai.OpenAI) -> list[Any]:
        chunks = client.chat.completions.create(
            model=TAGGED, messages=CHAT, max_tokens=16, temperature=0, stream=True
        )
        return [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in chunks]

    def models(client: openai.OpenAI) -> list[tuple[str, str]]:
        return [(m.id, m.owned_by) for m in client.models.list()]

    def embed(client: openai.OpenAI) -> list[list[float]]:
        return [d.embedding for d in client.embeddings.create(model=TAGGED, input=EMBED_INPUT).data]

    for call in (chat, stream, models, embed):
        via, direct = _both(openai_facade_pair, call)
        assert via == direct, call.__name__
        assert via, call.__name__
