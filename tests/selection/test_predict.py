"""Predicted time to the last token (nvpair_tw.selection._predict, docs/behaviour.md §15.2)."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from nvpair_tw.selection._predict import (
    IMAGE_TOKENS,
    Load,
    RequestSize,
    expected_completion,
    predict,
    predict_all,
    request_size,
)
from nvpair_tw.selection._speed import STALE_AFTER, Rates, Sample, SpeedBook

RATES = Rates(decode=10.0, prefill=100.0, load=5.0)


def test_an_idle_node_answers_in_prefill_plus_decode() -> None:
    assert predict(RATES, Load(), 200, 40.0) == pytest.approx(2.0 + 4.0)


def test_requests_in_flight_on_unlimited_slots_share_the_decode_rate() -> None:
    assert predict(RATES, Load(in_flight=2), 0, 40.0) == pytest.approx(12.0)


def test_a_full_node_adds_the_work_ahead_divided_by_its_slots() -> None:
    load = Load(in_flight=2, slots=2, remaining=6.0)
    assert predict(RATES, load, 0, 40.0) == pytest.approx(3.0 + 8.0)


def test_a_free_slot_waits_for_nothing() -> None:
    load = Load(in_flight=1, slots=2, remaining=6.0)
    assert predict(RATES, load, 0, 40.0) == pytest.approx(8.0)


def test_only_a_node_known_cold_pays_the_load_time() -> None:
    assert predict(RATES, Load(resident=False), 0, 10.0) == pytest.approx(6.0)
    assert predict(RATES, Load(resident=None), 0, 10.0) == pytest.approx(1.0)
    assert predict(RATES, Load(resident=True), 0, 10.0) == pytest.approx(1.0)


def test_the_prompt_is_estimated_at_four_bytes_a_token_images_at_768() -> None:
    doc = {
        "messages": [
            {"role": "system", "content": "x" * 400},
            {
                "role": "user",
                "content": [{"type": "text", "text": "y" * 40}, {"type": "image_url"}],
            },
        ],
        "max_tokens": 64,
    }
    assert request_size(doc) == RequestSize(100 + 10 + IMAGE_TOKENS, 10 + IMAGE_TOKENS, 64)


def test_ollama_prompt_images_and_num_predict_count() -> None:
    doc = {"prompt": "z" * 80, "images": ["..."], "options": {"num_predict": 12}}
    assert request_size(doc) == RequestSize(20 + IMAGE_TOKENS, 20 + IMAGE_TOKENS, 12)


def test_responses_and_lm_studio_chat_count_their_new_input_as_the_tail() -> None:
    """Without ``messages`` the new message is the last Responses input item (a tool result: its
    output), or the string ``input`` (Responses, LM Studio's ``/api/v1/chat``, whose
    ``system_prompt`` is prompt text): a warm node reads only that (§5.3)."""
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "q" * 400}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r" * 40},
    ]
    responses = request_size({"instructions": "s" * 400, "input": items})
    assert (responses.prompt_tokens, responses.tail_tokens) == (100 + 100 + 10, 10)
    lmstudio = request_size({"system_prompt": "s" * 400, "input": "hi" * 20})
    assert (lmstudio.prompt_tokens, lmstudio.tail_tokens) == (110, 10)
    completion = request_size({"prompt": "p" * 400})
    assert completion.tail_tokens == completion.prompt_tokens == 100


def test_a_request_with_no_document_has_no_size() -> None:
    assert request_size(None) == RequestSize()


def test_the_limit_counts_only_below_the_mean() -> None:
    assert expected_completion(RequestSize(max_tokens=16), 40.0) == 16.0
    assert expected_completion(RequestSize(max_tokens=4096), 40.0) == 40.0
    assert expected_completion(RequestSize(), 40.0) == 40.0


def _book(clock: Clock, rates: dict[str, float]) -> SpeedBook:
    book = SpeedBook(clock)
    for node, rate in rates.items():
        book.learn(node, "m", Sample(decode_rate=rate, completion_tokens=40))
    return book


def test_the_warm_node_prefills_only_the_last_message() -> None:
    """A warm prefix (§5.3) counts as cached: the warm node saves the prefill of the rest."""
    book = _book(Clock(), {"a": 10.0, "b": 10.0})
    size = RequestSize(prompt_tokens=4000, tail_tokens=100)
    predicted = predict_all(["a", "b"], "m", size, book, lambda n: Load(), "b")
    assert predicted["b"] < predicted["a"]
    assert predicted["a"] - predicted["b"] == pytest.approx(3900 / 400)


def test_a_stale_estimate_within_twice_the_best_is_refreshed_once() -> None:
    clock = Clock()
    book = _book(clock, {"fast": 57.0, "slow": 40.0})
    clock.advance(STALE_AFTER + 1)
    book.learn("fast", "m", Sample(decode_rate=57.0))
    size = RequestSize()
    first = predict_all(["fast", "slow"], "m", size, book, lambda n: Load(), None)
    assert first["slow"] < first["fast"]
    second = predict_all(["fast", "slow"], "m", size, book, lambda n: Load(), None)
    assert second["slow"] > second["fast"]


def test_a_stale_estimate_far_behind_the_best_is_left_alone() -> None:
    clock = Clock()
    book = _book(clock, {"fast": 57.0, "slow": 10.0})
    clock.advance(STALE_AFTER + 1)
    book.learn("fast", "m", Sample(decode_rate=57.0))
    predicted = predict_all(["fast", "slow"], "m", RequestSize(), book, lambda n: Load(), None)
    assert predicted["slow"] > predicted["fast"]


def test_an_unmeasured_node_wins_the_tie_with_the_median_it_is_given() -> None:
    """Exploration: the second node of two gets the first's rate as its median and must still be
    tried once, or it would never be measured."""
    book = _book(Clock(), {"a": 10.0})
    predicted = predict_all(["a", "b"], "m", RequestSize(), book, lambda n: Load(), None)
    assert predicted["b"] < predicted["a"]


def test_a_very_long_conversation_is_estimated_from_its_body_size() -> None:
    """More messages than are walked on the reactor: the body's bytes at 4 a token."""
    doc = {"messages": [{"role": "user", "content": "x" * 40}] * 3000}
    assert request_size(doc, 400_000) == RequestSize(100_000, 100_000, None)


def test_the_models_learnt_bytes_per_token_replaces_the_constant() -> None:
    """2,000 bytes of text: 500 tokens at the prior of 4 bytes a token, 1,000 at a learnt 2;
    the measured text is kept for learning (None once the prompt holds an image)."""
    doc = {"messages": [{"role": "system", "content": "s" * 1600}, {"content": "u" * 400}]}
    prior = request_size(doc)
    learnt = request_size(doc, 0, 2.0)
    assert (prior.prompt_tokens, prior.tail_tokens, prior.prompt_bytes) == (500, 100, 2000)
    assert (learnt.prompt_tokens, learnt.tail_tokens, learnt.prompt_bytes) == (1000, 200, 2000)
    pictured = {"messages": [{"content": "u" * 400, "images": ["aGk="]}]}
    assert request_size(pictured).prompt_bytes is None
    assert request_size(pictured, 0, 2.0).prompt_tokens == 200 + IMAGE_TOKENS


@pytest.mark.parametrize(
    "carried",
    [
        {"previous_response_id": "resp_1"},  # the Responses API's stored conversation
        {"context": [1, 2, 3]},  # Ollama /api/generate's returned context tokens
    ],
)
def test_a_prompt_carrying_an_earlier_conversation_teaches_no_bytes_per_token(
    carried: dict[str, object],
) -> None:
    # The engine's stated prompt tokens count the earlier turns the request only points to: its
    # own text over them would learn a ratio too small (docs/behaviour.md §15.1).
    doc: dict[str, object] = {"model": "m", "input": "x" * 2000, **carried}
    assert request_size(doc).prompt_bytes is None
    assert request_size({"model": "m", "input": "x" * 2000}).prompt_bytes == 2000
