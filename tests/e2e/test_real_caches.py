"""A node's prompt cache is finite (docs/behaviour.md §5.3.1), on a real ``llama-server`` with one
slot behind the real proxy process: two conversations sharing a system prompt, then the first one's
second turn.

Without a host-memory prompt cache (``--cache-ram 0``) the second conversation took the only slot:
the first comes back expected warm (the engine states one slot, and a host cache might hold more)
and is found cold — the engine reports only the shared system prompt cached — so the proxy learns
that the node keeps one conversation. With llama-server's default host cache (8 GiB) the first one
is restored and found warm, and nothing is corrected. Measured on this build without the proxy:
22 of 229 prompt tokens cached without the host cache, 214 with it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer
from tests.engines import llamacpp

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

SYSTEM = "You are a terse assistant for a small repository."


def _ask(proxy: ProxyProcess, messages: list[dict[str, str]]) -> str:
    body = {"model": llamacpp.ALIAS, "max_tokens": 4, "temperature": 0, "messages": messages}
    answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    content = answer.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


def _conversation(topic: str, words: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Tell me about {topic}. " + f"{words} " * 60},
    ]


def _served(extra: Sequence[str], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The node's ``caches`` in ``nodes/list`` and the record of the first conversation's second
    turn, through a proxy in front of a one-slot llama-server started with ``extra``."""
    tmp_path.mkdir()
    llama = RealLlamaServer.start(slots=1, extra=extra)
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(f'[[node]]\nid = "l"\nurl = "{llama.url}"\nkind = "openai"\n')
    proxy = ProxyProcess(["--engine", "openai", "--nodes", str(nodes)], tmp_path)
    try:
        proxy.wait_ready(1)
        first = _conversation("apples", "apple orchard harvest")
        said = _ask(proxy, first)
        _ask(proxy, _conversation("boats", "boat sail harbour"))
        _ask(
            proxy,
            [
                *first,
                {"role": "assistant", "content": said},
                {"role": "user", "content": "And pears?"},
            ],
        )
        deadline = time.monotonic() + 10  # a record is published once its answer is written
        while len(records := proxy.events("proxy/request")) < 3:
            assert time.monotonic() < deadline, records
            time.sleep(0.05)
        [node] = proxy.call("nodes/list")["nodes"]
        return node["caches"], records[-1]
    finally:
        proxy.stop()
        llama.stop()


@pytest.mark.timeout(300, func_only=True)
def test_a_real_llama_servers_cached_count_corrects_its_capacity(tmp_path: Path) -> None:
    caches, record = _served(["--cache-ram", "0"], tmp_path / "slots-only")
    assert caches == {llamacpp.ALIAS: {"conversations": 1, "source": "learnt", "recent": 2}}
    assert record["warm_node"] == "l"
    assert record["cached_tokens"] < record["prompt_tokens"] // 2
    caches, record = _served([], tmp_path / "host-cache")
    assert caches == {llamacpp.ALIAS: {"conversations": None, "source": "engine", "recent": 2}}
    assert record["warm_node"] == "l"
    assert record["cached_tokens"] > record["prompt_tokens"] * 3 // 4
