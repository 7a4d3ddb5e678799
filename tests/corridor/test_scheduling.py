"""What the prediction learns of a model's tokens and of a node's loaded context
(nvpair_tw.corridor._scheduling, docs/behaviour.md §15.1, §15.2), through ``MemoryCluster`` on a
Clock."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.corridor._scheduling import reloading
from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection import RequestSize
from nvpair_tw.selection._speed import DEFAULT_LOAD
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]


def _stating(bytes_per_token: int, load_seconds: float = 0.0) -> Callable[..., list[bytes]]:
    """An Ollama chat answer stating the prompt's tokens at ``bytes_per_token`` bytes of its
    messages' text a token, and ``load_seconds`` of loading."""

    def frames(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        text = sum(len(m["content"]) for m in json.loads(body)["messages"])
        final = {
            "model": "llama3",
            "message": {"role": "assistant", "content": "tok"},
            "done": True,
            "prompt_eval_count": text // bytes_per_token,
            "eval_count": 10,
            "eval_duration": 10**9,
            "load_duration": int(load_seconds * 1e9),
        }
        return [json.dumps(final).encode() + b"\n"]

    return frames


def _ollama(clock: Clock, context: int, script: Callable[..., list[bytes]]) -> SimulatedEngine:
    return SimulatedEngine(
        clock, loaded=["llama3:latest"], context_length=context, kind="ollama", script=script
    )


def _chat(text: int, **options: int) -> dict[str, Any]:
    chat: dict[str, Any] = {
        "model": "llama3",
        "messages": [{"role": "user", "content": "x" * text}],
    }
    if options:
        chat["options"] = options
    return chat


def _polled(*ids: str, kind: str | None = None) -> list[Node]:
    return [Node(i, f"http://{i}.node.test:11434", kind=kind) for i in ids]


def _served(cluster: MemoryCluster, chat: dict[str, Any]) -> str | None:
    pending = cluster.request("POST", "/api/chat", json=chat)
    node = cluster.result(pending).header("x-nvpair-node")
    cluster.advance(5)
    return node


def test_the_stated_prompt_tokens_teach_the_models_bytes_per_token_and_the_prediction_uses_it(
    memory_cluster: Make,
) -> None:
    """The engines count 2 bytes a token. A 6,000-byte prompt is 1,500 tokens at the prior 4 and
    fits the 2,048 context of ``a-small``; once one answer stated its count, the same prompt is
    predicted at 3,000 tokens and goes to ``b-big`` (context fit, §15.3). Two short prompts
    (under 32 tokens: no ratio learnt) have measured both nodes first, so neither explores."""
    clock = Clock()
    small, big = _ollama(clock, 2048, _stating(2)), _ollama(clock, 32768, _stating(2))
    cluster = memory_cluster(
        clock, {"a-small": small, "b-big": big}, nodes={"ollama": _polled("a-small", "b-big")}
    )
    cluster.flush()
    assert [_served(cluster, _chat(40)) for _ in range(2)] == ["a-small", "b-big"]
    assert cluster.facade().speeds.bytes_per_token("llama3") is None
    assert _served(cluster, _chat(6000)) == "a-small"  # the prior: 1,500 tokens
    assert cluster.facade().speeds.bytes_per_token("llama3") == 2.0
    assert _served(cluster, _chat(6000)) == "b-big"
    [rates] = cluster.facade().speeds.to_json("a-small").values()
    assert rates["bytesPerToken"] == 2.0


def test_a_node_loaded_at_another_context_than_asked_is_predicted_cold(
    memory_cluster: Make,
) -> None:
    """Ollama reloads a model asked with another ``num_ctx`` than it is loaded with: with both
    nodes resident, ``a-small`` (2,048) is predicted to load again for ``num_ctx`` 8,192 and the
    node loaded at 8,192 goes first; asked 2,048, ``a-small`` does."""
    clock = Clock()
    small, big = _ollama(clock, 2048, _stating(4)), _ollama(clock, 8192, _stating(4))
    cluster = memory_cluster(
        clock, {"a-small": small, "b-big": big}, nodes={"ollama": _polled("a-small", "b-big")}
    )
    cluster.flush()
    assert _served(cluster, _chat(400, num_ctx=8192)) == "b-big"
    assert _served(cluster, _chat(400, num_ctx=2048)) == "a-small"


@pytest.mark.parametrize(("asked", "load"), [(8192, 7.0), (2048, None)])
def test_an_answer_that_reloaded_for_its_context_teaches_the_load_time(
    memory_cluster: Make, asked: int, load: float | None
) -> None:
    """The start of an answer on a node predicted to reload is a load (§15.1): the engine's
    ``load_duration`` is learnt as the node's load time; at the loaded context it is not."""
    clock = Clock()
    only = _ollama(clock, 2048, _stating(4, load_seconds=7.0))
    cluster = memory_cluster(clock, {"a-small": only}, nodes={"ollama": _polled("a-small")})
    cluster.flush()
    assert _served(cluster, _chat(400, num_ctx=asked)) == "a-small"
    speeds = cluster.facade().speeds
    learnt = speeds.rates("a-small", "llama3").load
    assert learnt == (load if load is not None else DEFAULT_LOAD)


@pytest.mark.parametrize("options", [{}, {"num_ctx": 2048}])
def test_the_loaded_context_or_none_asked_is_not_predicted_cold(
    memory_cluster: Make, options: dict[str, int]
) -> None:
    """No ``num_ctx``, or the one ``a-small`` is loaded with: both resident, the tie goes by id."""
    clock = Clock()
    small, big = _ollama(clock, 2048, _stating(4)), _ollama(clock, 8192, _stating(4))
    cluster = memory_cluster(
        clock, {"a-small": small, "b-big": big}, nodes={"ollama": _polled("a-small", "b-big")}
    )
    cluster.flush()
    assert _served(cluster, _chat(400, **options)) == "a-small"


@pytest.mark.parametrize(
    ("kind", "reloads", "at_loaded"), [("ollama", {"a-small"}, {"b-big"}), ("openai", set(), set())]
)
def test_only_a_kind_whose_profile_reloads_on_a_context_change_is_predicted_cold(
    memory_cluster: Make, kind: str, reloads: set[str], at_loaded: set[str]
) -> None:
    """llama.cpp (``openai``) serves whatever context it was started with: a request's
    ``num_ctx`` does not reload it, though its context (``/props``) is known."""
    clock = Clock()
    small = SimulatedEngine(clock, loaded=["llama3:latest"], context_length=2048, kind=kind)
    big = SimulatedEngine(clock, loaded=["llama3:latest"], context_length=8192, kind=kind)
    nodes = _polled("a-small", "b-big", kind=kind)
    cluster = memory_cluster(clock, {"a-small": small, "b-big": big}, nodes={"ollama": nodes})
    cluster.flush()
    facade = cluster.facade()
    assert facade.inventory.context_length("a-small", "llama3") == 2048
    asked = RequestSize(num_ctx=8192)
    assert reloading(facade, nodes, "llama3", asked) == reloads
    assert reloading(facade, nodes, "llama3", RequestSize(num_ctx=2048)) == at_loaded
    assert reloading(facade, nodes, "llama3", RequestSize()) == set()


def _responses_stream(prompt: int, cached: int) -> Callable[..., list[bytes]]:
    """A llama.cpp Responses stream: three text deltas, then ``response.completed`` whose
    ``input_tokens`` counts the cached tokens too (``input_tokens_details.cached_tokens``)."""

    def frames(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        delta = {"type": "response.output_text.delta", "delta": "tok "}
        usage = {
            "input_tokens": prompt,
            "output_tokens": 3,
            "total_tokens": prompt + 3,
            "input_tokens_details": {"cached_tokens": cached},
        }
        done = {"type": "response.completed", "response": {"status": "completed", "usage": usage}}
        events = [delta, delta, delta, done]
        return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events]

    return frames


def test_a_prompt_found_cached_teaches_the_prefill_rate_of_the_part_read(
    memory_cluster: Make,
) -> None:
    """9,000 input tokens of which the engine found 8,000 cached, first text 0.5 s after
    dispatch: the node reads 2,000 tokens/s, not the 18,000 the whole prompt would make it
    (docs/behaviour.md §15.1)."""
    clock = Clock()
    engine = SimulatedEngine(
        clock,
        ("qwen3-coder",),
        kind="openai",
        script=_responses_stream(9000, 8000),
        header_delay=0.5,
        chunk_delay=0.1,
    )
    cluster = memory_cluster(clock, {"a": engine}, facades=("openai",))
    pending = cluster.request(
        "POST", "/v1/responses", json={"model": "qwen3-coder", "input": "go", "stream": True}
    )
    cluster.advance(2)
    assert cluster.result(pending).status == 200
    rates = cluster.facade().speeds.measured("a", "qwen3-coder")
    assert rates is not None and rates.prefill == 2000.0
