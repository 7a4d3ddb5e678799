"""The simulated Ollama (``SimulatedEngine(kind="ollama", pace=…)``, what ``--demo`` runs) answers in
the real Ollama 0.9.3's shapes, compared field by field: the same requests go to a real Ollama and
to a simulated one, and every answer's structure (keys, nested keys, value types) must match, except
for the differences listed in :data:`ALLOWED` with their reason.

A structure is the JSON with every leaf replaced by its type; a list by its first element's
structure. Streams are compared line by line where the real one is fixed (first content line, the
closing line), SSE by event role (first chunk, the chunk carrying the ``finish_reason``, the usage
chunk, ``[DONE]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.realnodes import RealOllama, free_ports, gone
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

REPO = Path(__file__).resolve().parents[2]
MODEL = ollama_engine.MODEL
ASK = [{"role": "user", "content": "Why is the sky blue?"}]
LIMIT = {"options": {"num_predict": 3}}

SIMULATED = f"""
import sys
from twisted.internet import reactor
from nvpair_tw.simulated import Pace, SimulatedEngine
models = ("{MODEL}:latest",)
engine = SimulatedEngine(
    reactor, models, loaded=models, kind="ollama", pace=Pace(decode=200.0, prefill=2000.0)
)
reactor.listenTCP(int(sys.argv[1]), engine.site(), interface="127.0.0.1")
reactor.run()
"""

ALLOWED: dict[str, tuple[set[str], set[str], str]] = {
    "GET /api/ps": (
        {"models.context_length"},
        set(),
        "newer Ollama reports a loaded model's context length; §15.3 reads it where given",
    ),
}
"""Per request: (paths only the simulated engine has, paths only the real one has, why)."""


def structure(value: Any) -> Any:
    """``value`` with every leaf replaced by its type name (a list by its first element's)."""
    if isinstance(value, dict):
        return {key: structure(item) for key, item in value.items()}
    if isinstance(value, list):
        return [structure(value[0])] if value else []
    return type(value).__name__


def paths(shape: Any, prefix: str = "") -> dict[str, Any]:
    """Every key path of a structure (``a.b``; a list's element shares its path) to its leaf."""
    if isinstance(shape, dict):
        found: dict[str, Any] = {}
        for key, item in shape.items():
            found.update(paths(item, f"{prefix}.{key}" if prefix else key))
        return found or {prefix: "{}"}
    if isinstance(shape, list):
        return paths(shape[0], prefix) if shape else {prefix: "[]"}
    return {prefix: shape}


def assert_same_shape(what: str, real: Any, simulated: Any) -> None:
    only_sim, only_real, _why = ALLOWED.get(what, (set(), set(), ""))
    real_paths = {k: v for k, v in paths(structure(real)).items() if k not in only_real}
    sim_paths = {k: v for k, v in paths(structure(simulated)).items() if k not in only_sim}
    assert sim_paths == real_paths, f"{what}: the simulated engine's shape differs from Ollama's"


@pytest.fixture(scope="module")
def simulated() -> Iterator[str]:
    """A simulated Ollama of a kind, paced, in its own process on a free port."""
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", SIMULATED, str(port)], cwd=REPO, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/api/tags", timeout=1)
            break
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the simulated engine did not start")
            time.sleep(0.1)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        assert gone(process.pid)


@pytest.fixture(scope="module")
def both(real_ollama: RealOllama, simulated: str) -> dict[str, str]:
    return {"real": real_ollama.url, "simulated": simulated}


def _ask(url: str, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", json=body, timeout=120)


def _lines(response: httpx.Response) -> list[Any]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def _events(response: httpx.Response) -> list[Any]:
    payloads = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e.strip()]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_ollama_streams_and_whole_answers_have_ollamas_shape(
    both: dict[str, str], route: str
) -> None:
    """A streamed chat or generate: its content lines and its closing line (a chat's still has
    its ``message``, a generate's has ``context``); whole, the one object; the content type."""
    asked = {"messages": ASK} if route == "/api/chat" else {"prompt": "Why is the sky blue?"}
    answers = {
        name: (
            _ask(url, "POST", route, {"model": MODEL, **asked, **LIMIT}),
            _ask(url, "POST", route, {"model": MODEL, **asked, **LIMIT, "stream": False}),
        )
        for name, url in both.items()
    }
    (real_stream, real_whole), (sim_stream, sim_whole) = answers["real"], answers["simulated"]
    assert sim_stream.headers["content-type"] == real_stream.headers["content-type"]
    real_lines, sim_lines = _lines(real_stream), _lines(sim_stream)
    assert len(sim_lines) == len(real_lines) == 4  # three tokens (num_predict), then the close
    assert_same_shape(f"{route} first", real_lines[0], sim_lines[0])
    assert_same_shape(f"{route} close", real_lines[-1], sim_lines[-1])
    assert sim_lines[-1]["done_reason"] == real_lines[-1]["done_reason"] == "length"
    assert_same_shape(f"{route} whole", real_whole.json(), sim_whole.json())


def test_openai_chat_chunks_and_usage_have_ollamas_shape(both: dict[str, str]) -> None:
    """``/v1/chat/completions`` streamed with usage: the content chunks, the empty chunk with the
    ``finish_reason``, the usage chunk and ``[DONE]``, in that order; whole, the completion."""
    body = {"model": MODEL, "messages": ASK, "max_tokens": 3}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = {
        name: _events(_ask(url, "POST", "/v1/chat/completions", streamed))
        for name, url in both.items()
    }
    real, sim = events["real"], events["simulated"]
    assert len(sim) == len(real) == 6 and sim[-1] == real[-1] == "[DONE]"
    for index, role in enumerate(("first", "second", "third", "finish", "usage")):
        assert_same_shape(f"chunk {role}", real[index], sim[index])
    assert sim[3]["choices"][0]["finish_reason"] == real[3]["choices"][0]["finish_reason"]
    assert (
        sim[3]["choices"][0]["delta"]
        == real[3]["choices"][0]["delta"]
        == {"role": "assistant", "content": ""}
    )
    whole = {
        name: _ask(url, "POST", "/v1/chat/completions", body).json() for name, url in both.items()
    }
    assert_same_shape("/v1/chat/completions whole", whole["real"], whole["simulated"])


def test_openai_text_completions_have_ollamas_shape(both: dict[str, str]) -> None:
    """``/v1/completions``, streamed (content chunks, then the finishing one) and whole."""
    body = {"model": MODEL, "prompt": "Why is the sky blue?", "max_tokens": 3}
    events = {
        name: _events(_ask(url, "POST", "/v1/completions", {**body, "stream": True}))
        for name, url in both.items()
    }
    real, sim = events["real"], events["simulated"]
    assert len(sim) == len(real) == 5
    assert_same_shape("text chunk", real[0], sim[0])
    assert_same_shape("text finish", real[3], sim[3])
    whole = {name: _ask(url, "POST", "/v1/completions", body).json() for name, url in both.items()}
    assert_same_shape("/v1/completions whole", whole["real"], whole["simulated"])


@pytest.mark.parametrize("route", ["/api/tags", "/api/ps", "/v1/models"])
def test_model_lists_have_ollamas_shape(both: dict[str, str], route: str) -> None:
    """The model list, the loaded models (after a request loaded the real one's) and OpenAI's list."""
    _ask(both["real"], "POST", "/api/generate", {"model": MODEL})  # loads it, for /api/ps
    answers = {name: _ask(url, "GET", route).json() for name, url in both.items()}
    assert_same_shape(f"GET {route}", answers["real"], answers["simulated"])


def test_show_has_ollamas_shape_and_what_the_cli_reads(both: dict[str, str]) -> None:
    """``/api/show``: the same fields (0.9.3's ``tensors`` aside: it lists every tensor, and no
    client reads them), ``model_info`` with the four keys the Ollama
    CLI reads without checking, and Ollama's 404 for a model it lacks."""
    answers = {
        name: _ask(url, "POST", "/api/show", {"model": MODEL}).json() for name, url in both.items()
    }
    real, sim = answers["real"], answers["simulated"]
    assert set(sim) == set(real) - {"tensors"}
    assert_same_shape("details", real["details"], sim["details"])
    for info in (real["model_info"], sim["model_info"]):
        arch = info["general.architecture"]
        cli = ("general.parameter_count", f"{arch}.context_length", f"{arch}.embedding_length")
        assert all(isinstance(info[key], int) for key in cli)
    missing = {
        name: _ask(url, "POST", "/api/show", {"model": "nope"}) for name, url in both.items()
    }
    assert missing["simulated"].status_code == missing["real"].status_code == 404
    assert missing["simulated"].json() == missing["real"].json()
