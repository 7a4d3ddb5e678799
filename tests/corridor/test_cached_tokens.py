"""The record carries the prompt tokens the serving engine said it found cached (docs/behaviour.md
§7, §12.2), end to end through a facade: the engines answer what the real ones answered to a
prompt sent twice (``tests/dialects/engine_answers.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster
from tests.dialects import engine_answers as real

pytestmark = pytest.mark.timeout(30)

Make = Callable[..., MemoryCluster]
CHAT = {"model": "smollm2-llamacpp", "messages": [{"role": "user", "content": "hi"}]}


def answering(whole: bytes, stream: bytes) -> Callable[[bytes, bool, bytes], list[bytes]]:
    """An engine's script: ``whole`` as one document, ``stream`` one event a write."""

    def script(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        if not streaming:
            return [whole]
        return [event + b"\n\n" for event in stream.split(b"\n\n") if event]

    return script


def records(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in cluster.events if e.name == "proxy/request"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_llama_cpp_node_s_cached_prompt_tokens_reach_the_record(
    memory_cluster: Make, stream: bool
) -> None:
    """Whole, and streamed without ``include_usage``: the proxy asks for the usage chunk on the
    client's behalf and removes it (§12.2), and the cached count in it is recorded."""
    clock = Clock()
    engine = SimulatedEngine(
        clock,
        ("smollm2-llamacpp",),
        kind="openai",
        script=answering(real.LLAMA_CHAT_WARM, real.LLAMA_CHAT_STREAM_WARM),
    )
    cluster = memory_cluster(clock, {"llama": engine}, facades=("openai",))
    answer = cluster.fetch("POST", "/v1/chat/completions", json={**CHAT, "stream": stream})
    assert answer.status == 200
    assert b'"usage"' not in answer.body or not stream  # the client asked for no usage chunk
    [record] = records(cluster)
    assert (record["prompt_tokens"], record["cached_tokens"]) == (48, 47)


def test_an_ollama_node_s_cached_count_is_unknown_even_where_it_writes_zero(
    memory_cluster: Make,
) -> None:
    """Ollama's only cached count is ``/v1/responses``' ``input_tokens_details.cached_tokens``,
    which its source writes as a constant 0 (v0.33: "wire through the actual values"): from a
    node of kind ``ollama`` it is unknown, never 0. The same answer from an OpenAI-compatible
    node is a count."""
    usage = {
        "input_tokens": 48,
        "output_tokens": 4,
        "total_tokens": 52,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    answer = {"id": "resp_1", "object": "response", "status": "completed", "usage": usage}
    whole = json.dumps(answer).encode()
    clock = Clock()
    engines = {
        name: SimulatedEngine(clock, ("smollm2",), script=answering(whole, b"")) for name in "ab"
    }
    kinds = {"a": "ollama", "b": "openai"}
    nodes = {
        "ollama": [
            Node(n, f"http://{n}.node.test:11434", ("smollm2",), kind=kinds[n]) for n in "ab"
        ]
    }
    cluster = memory_cluster(clock, engines, nodes=nodes)
    said = {}
    for name in "ab":
        got = cluster.fetch(
            "POST",
            "/v1/responses",
            json={"model": "smollm2", "input": "hi", "stream": False},
            headers={"X-NVPair-Node": name},
        )
        assert got.status == 200
        record = records(cluster)[-1]
        said[record["node_id"]] = (record["prompt_tokens"], record["cached_tokens"])
    assert said == {"a": (48, None), "b": (48, 0)}
