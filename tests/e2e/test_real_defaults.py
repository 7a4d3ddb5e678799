"""Per-model defaults on a real Ollama (docs/behaviour.md §16.1): with ``options = { num_ctx = 8192 }``
in the model's table, a prompt longer than Ollama 0.9.3's default 2,048-token context is read whole
(its ``prompt_eval_count``) on the native routes, although the client never asked for a context.
Sent to the engine directly, Ollama cuts the same prompt to 2,048 tokens (its log says
``truncating input prompt limit=2048``); that run is left out here because prompt evaluation on
one CPU thread takes minutes on a shared machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.realnodes import ProxyProcess, RealOllama

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine, pytest.mark.timeout(1800)]

MODEL = "smollm2"
DEFAULT_CONTEXT = 2048
PROMPT = "Count the apples: " + "one apple, " * 720 + "How many?"
"""About 2,200 tokens for SmolLM2's tokenizer (900 repeats were 2,716): past 2,048, within 8,192."""


@pytest.fixture(scope="module")
def proxy(
    real_ollama: RealOllama, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("defaults")
    nodes = Path(workdir) / "nodes.toml"
    nodes.write_text(
        f'[[node]]\nid = "o"\nurl = "{real_ollama.url}"\n\n'
        f'[[model]]\nname = "{MODEL}"\ndefaults = {{ options = {{ num_ctx = 8192 }} }}\n'
    )
    # Prompt evaluation on one shared CPU thread takes minutes: wait for the headers that long.
    args = ["--engine", "ollama", "--nodes", str(nodes), "--response-header-timeout", "1680s"]
    started = ProxyProcess(args, workdir)
    started.wait_ready(1)
    yield started
    log = started.stop()
    assert "Traceback" not in log, log
    assert "apple" not in log, "a prompt reached the log"


def generate(base: str) -> int:
    body = {"model": MODEL, "prompt": PROMPT, "stream": False, "options": {"num_predict": 1}}
    with httpx.Client(timeout=1700) as client:
        answer = client.post(f"{base}/api/generate", json=body)
    assert answer.status_code == 200, answer.text
    count: int = answer.json()["prompt_eval_count"]
    return count


def test_the_models_context_default_keeps_a_long_prompt_whole(
    real_ollama: RealOllama, proxy: ProxyProcess
) -> None:
    assert generate(proxy.url) > DEFAULT_CONTEXT
