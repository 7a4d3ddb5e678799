"""A paced simulated engine (``SimulatedEngine(kind=..., pace=Pace(...))``): it answers in words at its
machine's speed, on its clock, and states the counts and durations it was produced at."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.simulated import Pace, SimulatedEngine
from nvpair_tw.simulated._pace import ANSWER, Timing, answer_tokens, token_limit
from nvpair_tw.testing import MemoryCluster, MemoryResponse

Make = Callable[..., MemoryCluster]
ASK = [{"role": "user", "content": "Why is the sky blue?"}]  # five prompt tokens
PACE = Pace(decode=10.0, prefill=50.0, load=0.1)
TOKENS = len(ANSWER.split(" "))


def _paced(memory_cluster: Make, kind: str = "ollama") -> MemoryCluster:
    clock = Clock()
    return memory_cluster(clock, {"e": SimulatedEngine(clock, kind=kind, pace=PACE)}, facades=())


def _post(cluster: MemoryCluster, path: str, body: dict[str, Any]) -> MemoryResponse:
    pending = cluster.request("POST", path, json=body, node="e")
    cluster.advance(30)
    return cluster.result(pending)


def test_a_request_limit_is_the_smallest_it_sets() -> None:
    """``num_predict``, ``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``: the least;
    none, a negative ``num_predict`` (Ollama's "no limit") or a boolean: no limit."""
    assert token_limit({}) is None
    assert token_limit({"options": {"num_predict": 8}}) == 8
    assert token_limit({"max_tokens": 64, "max_completion_tokens": 16}) == 16
    assert token_limit({"options": {"num_predict": -1}, "max_output_tokens": 5}) == 5
    assert token_limit({"options": {"num_predict": -1}}) is None
    assert token_limit({"max_tokens": True}) is None


def test_the_answer_is_words_cut_at_the_limit() -> None:
    """The text's words, each after its space; a limit cuts it (``length``), never below one."""
    whole, why = answer_tokens(None)
    assert "".join(whole) == ANSWER and len(whole) == TOKENS and why == "stop"
    assert whole[1].startswith(" ") and not whole[0].startswith(" ")
    assert answer_tokens(3) == (whole[:3], "length")
    assert answer_tokens(0) == (whole[:1], "length")
    assert answer_tokens(TOKENS) == (whole, "stop")


def test_a_pace_times_an_answer_from_its_counts() -> None:
    """Load, then the prompt at the prefill rate, then the tokens at the decode rate; a stream's
    first token comes one token's time after the prompt."""
    timing = PACE.timing(prompt_tokens=5, completion_tokens=20)
    assert timing == Timing(load=0.1, prompt_eval=0.1, eval=2.0, tokens=20)
    assert timing.per_token == pytest.approx(0.1)
    assert timing.first_token == pytest.approx(0.3)
    assert timing.total == pytest.approx(2.2)
    with pytest.raises(ValueError):
        Pace(decode=0.0, prefill=1.0)


def test_a_paced_stream_goes_at_its_pace_and_states_it(memory_cluster: Make) -> None:
    """Headers and the first word at load + prompt + one token, then a word every 1 / decode; the
    closing line (with the last word) states the counts and the durations of that very pace."""
    cluster = _paced(memory_cluster)
    response = _post(cluster, "/api/chat", {"model": "llama3", "messages": ASK})
    lines = [json.loads(line) for line in response.body.splitlines()]
    *words, final = lines
    assert "".join(w["message"]["content"] for w in words) == ANSWER
    assert response.headers_at == pytest.approx(0.1 + 5 / 50 + 0.1)
    assert response.arrivals[-1] - response.arrivals[0] == pytest.approx((TOKENS - 1) * 0.1)
    assert len(response.arrivals) == TOKENS  # the closing line goes with the last word
    assert (final["prompt_eval_count"], final["eval_count"]) == (5, TOKENS)
    assert final["load_duration"] == 100_000_000
    assert final["prompt_eval_duration"] == 100_000_000
    assert final["eval_duration"] == TOKENS * 100_000_000
    assert final["total_duration"] == sum(
        final[k] for k in ("load_duration", "prompt_eval_duration", "eval_duration")
    )
    assert final["message"] == {"role": "assistant", "content": ""}


def test_a_whole_paced_answer_arrives_once_every_token_is_written(memory_cluster: Make) -> None:
    """``stream: false``: one object, when the last token would have been written."""
    cluster = _paced(memory_cluster)
    response = _post(cluster, "/api/chat", {"model": "llama3", "messages": ASK, "stream": False})
    assert response.headers_at == pytest.approx(0.1 + 0.1 + TOKENS * 0.1)
    assert response.json()["message"]["content"] == ANSWER


def test_a_limit_cuts_the_paced_answer_with_length(memory_cluster: Make) -> None:
    """``num_predict`` 3: three words, ``done_reason: length``, ``eval_count`` 3; a generate's
    ``context`` holds a token id for each prompt and answer token."""
    cluster = _paced(memory_cluster)
    asked = {"model": "llama3", "prompt": "Why is it blue?", "options": {"num_predict": 3}}
    *words, final = [
        json.loads(line) for line in _post(cluster, "/api/generate", asked).body.splitlines()
    ]
    assert [w["response"] for w in words] == list(answer_tokens(3)[0])
    assert (final["done_reason"], final["eval_count"]) == ("length", 3)
    assert final["eval_duration"] == 300_000_000 and len(final["context"]) == 4 + 3


def test_paced_openai_answers_state_usage_and_finish_at_the_pace(memory_cluster: Make) -> None:
    """``/v1/chat/completions`` with ``max_tokens`` 2 and usage: two words a token apart, Ollama's
    finishing chunk (``length``) and the usage chunk with the last of them."""
    cluster = _paced(memory_cluster)
    asked = {
        "model": "llama3",
        "messages": ASK,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = _post(cluster, "/v1/chat/completions", asked)
    events = [e.removeprefix(b"data: ") for e in response.body.split(b"\n\n") if e]
    *chunks, done = events
    parsed = [json.loads(c) for c in chunks]
    assert done == b"[DONE]"
    assert [c["choices"][0]["finish_reason"] for c in parsed[:-1]] == [None, None, "length"]
    assert parsed[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert response.arrivals == [pytest.approx(0.3), pytest.approx(0.4)]
