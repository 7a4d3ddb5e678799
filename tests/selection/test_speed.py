"""What the proxy learns of each node's speed (nvpair_tw.selection._speed, docs/behaviour.md §15.1)."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from nvpair_tw.selection._speed import (
    ALPHA,
    DEFAULT_DECODE,
    DEFAULT_PREFILL,
    HALF_LIFE,
    PRIOR_BYTES_PER_TOKEN,
    STALE_AFTER,
    Answer,
    Sample,
    SpeedBook,
    Start,
    sample_of,
)


def test_the_first_sample_is_the_estimate() -> None:
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(decode_rate=57.0, prefill_rate=900.0, completion_tokens=40))
    rates = book.rates("a", "m")
    assert (rates.decode, rates.prefill, rates.measured, rates.samples) == (57.0, 900.0, True, 1)


def test_a_sample_weighs_half_after_twenty_answers() -> None:
    """Half-life of 20 answers: after one sample of 0 and twenty of 100, the first weighs half
    of what it did at the start (the estimate is half way from 0 to 100)."""
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(decode_rate=10.0))
    for _ in range(HALF_LIFE):
        book.learn("a", "m", Sample(decode_rate=110.0))
    assert book.rates("a", "m").decode == pytest.approx(60.0)


def test_a_rate_measured_under_load_counts_as_the_nodes_throughput() -> None:
    """Two requests shared the node: each saw 10 tokens/s, the node gives 20 to one alone."""
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(decode_rate=10.0, concurrency=2.0))
    assert book.rates("a", "m").decode == 20.0


def test_an_unmeasured_node_is_predicted_at_the_fleet_median() -> None:
    """Exploration: a node with no measurement for the model gets the median of those measured."""
    book = SpeedBook(Clock())
    for node, rate in (("a", 10.0), ("b", 30.0), ("c", 57.0)):
        book.learn(node, "m", Sample(decode_rate=rate))
    stand_in = book.rates("new", "m")
    assert (stand_in.decode, stand_in.measured) == (30.0, False)
    assert book.rates("new", "other").decode == DEFAULT_DECODE


def test_a_speed_in_the_nodes_file_seeds_until_measured() -> None:
    seeds = {"fast": 5.0}
    book = SpeedBook(Clock(), seeds.get)
    assert book.rates("fast", "m").decode == DEFAULT_DECODE * 5
    assert book.rates("plain", "m").decode == DEFAULT_DECODE
    book.learn("fast", "m", Sample(decode_rate=12.0))
    assert book.rates("fast", "m").decode == 12.0


def test_the_mean_completion_length_is_per_model() -> None:
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(decode_rate=10.0, completion_tokens=40))
    book.learn("b", "n", Sample(decode_rate=10.0, completion_tokens=400))
    assert (book.completion_mean("m"), book.completion_mean("n")) == (40.0, 400.0)


def test_an_estimate_goes_stale_after_ten_minutes_and_a_refresh_renews_it() -> None:
    clock = Clock()
    book = SpeedBook(clock)
    book.learn("a", "m", Sample(decode_rate=10.0))
    clock.advance(STALE_AFTER - 1)
    assert not book.stale("a", "m")
    clock.advance(2)
    assert book.stale("a", "m")
    book.refreshing("a", "m")
    assert not book.stale("a", "m")


def test_known_lists_only_measured_estimates() -> None:
    book = SpeedBook(Clock())
    book.learn("b", "m", Sample(decode_rate=10.0))
    book.learn("a", "m", Sample(prefill_rate=100.0))  # no decode rate: not an estimate yet
    assert [(n, m) for n, m, _ in book.known()] == [("b", "m")]


def test_the_engines_own_rate_beats_the_measured_one() -> None:
    answer = Answer(100, 40, 0.0, 1.0, 3.0, engine_rate=57.7)
    assert sample_of(answer, Start.PLAIN, 1.0, DEFAULT_PREFILL).decode_rate == 57.7


def test_without_the_engines_rate_decode_is_first_to_last_content() -> None:
    answer = Answer(100, 40, 0.0, 1.0, 5.0)
    sample = sample_of(answer, Start.PLAIN, 1.0, DEFAULT_PREFILL)
    assert (sample.decode_rate, sample.prefill_rate, sample.load_seconds) == (10.0, 100.0, None)


def test_a_cold_start_measures_the_load_not_the_prefill() -> None:
    """Known not resident: time to first token less the prompt at the prefill estimate."""
    answer = Answer(400, 40, 10.0, 14.0, 18.0)
    sample = sample_of(answer, Start.LOADED, 1.0, 400.0)
    assert (sample.prefill_rate, sample.load_seconds) == (None, 3.0)


def test_the_engines_own_prefill_rate_and_load_time_beat_the_measured_ones() -> None:
    plain = Answer(400, 40, 10.0, 14.0, 18.0, engine_prefill=800.0)
    assert sample_of(plain, Start.PLAIN, 1.0, 400.0).prefill_rate == 800.0
    cold = Answer(400, 40, 10.0, 14.0, 18.0, engine_load=2.5)
    assert sample_of(cold, Start.LOADED, 1.0, 400.0).load_seconds == 2.5


def test_a_warm_prefix_teaches_no_prefill_rate() -> None:
    answer = Answer(400, 40, 10.0, 10.1, 12.0)
    assert sample_of(answer, Start.CACHED, 1.0, 400.0).prefill_rate is None


def test_a_warm_prefix_the_engine_counted_teaches_the_rate_of_what_it_read() -> None:
    """9,000 prompt tokens, 8,000 found cached (§12.2): the 1,000 read in 0.5 s are 2,000
    tokens/s, not the 18,000 the whole prompt would say (docs/behaviour.md §15.1)."""
    answer = Answer(9000, 40, 10.0, 10.5, 12.0, cached_tokens=8000)
    assert sample_of(answer, Start.CACHED, 1.0, 400.0).prefill_rate == 2000.0


def test_a_plain_start_that_found_its_prefix_cached_learns_only_what_was_read() -> None:
    """Not expected warm, yet the engine found 2,000 of 3,000 cached (another conversation's
    system prompt in its slot)."""
    answer = Answer(3000, 40, 10.0, 10.5, 12.0, cached_tokens=2000)
    assert sample_of(answer, Start.PLAIN, 1.0, 400.0).prefill_rate == 2000.0


def test_a_prompt_read_almost_whole_from_the_cache_teaches_no_prefill_rate() -> None:
    """llama.cpp's answer to a prompt sent twice: 47 of 48 tokens cached, its own rate over the
    one it read (21 tokens/s) says nothing of the node's prefill."""
    answer = Answer(48, 8, 10.0, 10.1, 10.4, engine_prefill=21.06, cached_tokens=47)
    assert sample_of(answer, Start.PLAIN, 1.0, 400.0).prefill_rate is None


def test_a_cold_load_subtracts_only_the_prompt_read() -> None:
    answer = Answer(4400, 40, 10.0, 14.0, 18.0, cached_tokens=4000)
    assert sample_of(answer, Start.LOADED, 1.0, 400.0).load_seconds == 3.0


def test_a_short_prompt_teaches_no_prefill_rate() -> None:
    """A few tokens say more of the round trip than of the prefill rate."""
    answer = Answer(8, 40, 10.0, 10.2, 12.0)
    assert sample_of(answer, Start.PLAIN, 1.0, 400.0).prefill_rate is None


def test_a_load_time_sample_is_learnt() -> None:
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(decode_rate=10.0, load_seconds=7.5))
    assert book.rates("a", "m").load == 7.5


# Bytes per token, per model (docs/behaviour.md §15.1)


def test_a_models_bytes_per_token_is_the_prompt_text_over_the_stated_prompt_tokens() -> None:
    """300 bytes of prompt text that the engine said were 100 tokens: 3 bytes a token, learnt
    for the model (whichever node answered) and shown with each node's rates."""
    answer = Answer(100, 40, 0.0, 1.0, 3.0)
    sample = sample_of(answer, Start.PLAIN, 1.0, DEFAULT_PREFILL, 300)
    assert sample.bytes_per_token == 3.0
    book = SpeedBook(Clock())
    assert book.bytes_per_token("m") is None
    book.learn("a", "m", sample)
    assert (book.bytes_per_token("m"), book.bytes_per_token("other")) == (3.0, None)
    assert book.to_json("a")["m"]["bytesPerToken"] == 3.0


def test_bytes_per_token_is_weighted_with_the_same_half_life() -> None:
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(bytes_per_token=2.0))
    for _ in range(HALF_LIFE):
        book.learn("b", "m", Sample(bytes_per_token=3.0))
    assert book.bytes_per_token("m") == pytest.approx(2.5)


def test_one_sample_moves_a_models_bytes_per_token_by_twice_at_most() -> None:
    """A crafted prompt (a long run of one character, 16 bytes a token) counts as twice the prior
    at first, then as twice the learnt value: one client cannot set everyone's estimate (§15.1)."""
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(bytes_per_token=16.0))
    assert book.bytes_per_token("m") == 2 * PRIOR_BYTES_PER_TOKEN
    book.learn("a", "m", Sample(bytes_per_token=1.0))
    assert book.bytes_per_token("m") == pytest.approx(8.0 + ALPHA * (4.0 - 8.0))


@pytest.mark.parametrize(
    ("prompt_bytes", "stated"),
    [
        (4000, 100),  # 40 bytes a token: the count was not of this prompt (cached, truncated)
        (50, 100),  # under one byte a token
        (100, 20),  # a prompt under 32 tokens: the template's tokens weigh too much
        (None, 100),  # nothing measured (images, a prompt not walked)
        (300, None),  # the engine stated no prompt tokens
    ],
)
def test_a_ratio_outside_one_to_sixteen_bytes_or_unmeasured_is_not_learnt(
    prompt_bytes: int | None, stated: int | None
) -> None:
    answer = Answer(stated, 40, 0.0, 1.0, 3.0)
    sample = sample_of(answer, Start.PLAIN, 1.0, DEFAULT_PREFILL, prompt_bytes)
    assert sample.bytes_per_token is None
    book = SpeedBook(Clock())
    book.learn("a", "m", Sample(bytes_per_token=40.0))  # a peer's sample out of range too
    assert book.bytes_per_token("m") is None


def test_a_whole_answer_that_came_at_once_measures_no_decode_rate() -> None:
    """First and last content of an answer that was not streamed arrive together: tokens over
    their few microseconds are no rate (a non-streamed Messages answer once taught 16,553 tokens/s);
    the engine's own rate still counts."""
    whole = Answer(10, 200, 0.0, 2.0, 2.0001, paced=False)
    assert sample_of(whole, Start.PLAIN, 1.0, DEFAULT_PREFILL).decode_rate is None
    stated = Answer(10, 200, 0.0, 2.0, 2.0001, engine_rate=42.0, paced=False)
    assert sample_of(stated, Start.PLAIN, 1.0, DEFAULT_PREFILL).decode_rate == 42.0
    streamed = Answer(10, 200, 0.0, 2.0, 6.0)
    assert sample_of(streamed, Start.PLAIN, 1.0, DEFAULT_PREFILL).decode_rate == 50.0


def test_the_prefill_rate_alone_is_the_one_rates_gives() -> None:
    """``prefill`` (read on every request) is ``rates(...).prefill`` whatever the book knows: the
    default, the fleet's median for an unmeasured node, the node's own, the median for a measured
    node that taught no prefill rate, and the median again once a decode rate alone was learnt."""
    book = SpeedBook(Clock(), {"seeded": 3.0}.get)
    asked = [("a", "m"), ("b", "m"), ("seeded", "m"), ("new", "m"), ("a", "other")]

    def agree() -> None:
        for node, model in asked:
            assert book.prefill(node, model) == book.rates(node, model).prefill, (node, model)

    agree()
    assert book.prefill("a", "m") == DEFAULT_PREFILL
    book.learn("a", "m", Sample(decode_rate=20.0, prefill_rate=800.0))
    book.learn("b", "m", Sample(decode_rate=30.0))  # measured, no prefill rate of its own
    agree()
    assert book.prefill("b", "m") == 800.0  # the median of the measured ones
    book.learn("seeded", "m", Sample(prefill_rate=1200.0))  # a prefill rate, no decode yet
    agree()
