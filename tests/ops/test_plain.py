"""Tests for nvpair_tw.ops._plain: plain counters and histograms expose what prometheus_client's
``Counter`` and ``Histogram`` expose for the same increments and observations (the oracle)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from nvpair_tw.ops._plain import PlainCounter, PlainHistogram

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LABELS = st.sampled_from([("ollama", "a"), ("ollama", "b"), ("lmstudio", "a")])


def _lines(registry: CollectorRegistry) -> list[str]:
    """The exposition without the ``_created`` samples (their times differ between the two)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


@given(st.lists(st.tuples(LABELS, st.floats(min_value=0, max_value=1e6)), max_size=30))
def test_a_plain_counter_exposes_what_a_prometheus_counter_does(
    steps: list[tuple[tuple[str, str], float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainCounter(ours, "nvpair_things", "Things.", ["engine", "node"])
    counter = Counter("nvpair_things", "Things.", ["engine", "node"], registry=theirs)
    for labels, amount in steps:
        plain.inc(*labels, amount=amount)
        counter.labels(*labels).inc(amount)
    assert _lines(ours) == _lines(theirs)


@given(
    st.lists(
        st.tuples(
            LABELS, st.one_of(st.sampled_from(BUCKETS), st.floats(min_value=0, max_value=100))
        ),
        max_size=30,
    )
)
def test_a_plain_histogram_exposes_what_a_prometheus_histogram_does(
    steps: list[tuple[tuple[str, str], float]],
) -> None:
    """Bucket bounds included: a value equal to a bound counts in that bound's bucket."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainHistogram(ours, "nvpair_wait_seconds", "Waits.", ["engine", "node"], BUCKETS)
    histogram = Histogram(
        "nvpair_wait_seconds", "Waits.", ["engine", "node"], buckets=BUCKETS, registry=theirs
    )
    for labels, amount in steps:
        plain.observe(*labels, amount=amount)
        histogram.labels(*labels).observe(amount)
    assert _lines(ours) == _lines(theirs)


def test_a_plain_counter_has_a_created_sample_per_label_set_and_only_goes_up() -> None:
    registry = CollectorRegistry()
    plain = PlainCounter(registry, "nvpair_things", "Things.", ["engine"])
    plain.inc("ollama")
    created = registry.get_sample_value("nvpair_things_created", {"engine": "ollama"})
    assert created is not None and created > 0
    with pytest.raises(ValueError, match="only goes up"):
        plain.inc("ollama", amount=-1)
    assert registry.get_sample_value("nvpair_things_total", {"engine": "ollama"}) == 1


def test_an_explicit_inf_bound_gives_one_inf_bucket() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    PlainHistogram(ours, "w", "W.", ["e"], (1, math.inf)).observe("a", amount=0.5)
    Histogram("w", "W.", ["e"], buckets=(1, math.inf), registry=theirs).labels("a").observe(0.5)
    assert _lines(ours) == _lines(theirs)


def test_a_nan_observation_is_summed_and_counted_in_no_bucket() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    PlainHistogram(ours, "w", "W.", ["e"], (1, 2)).observe("a", amount=math.nan)
    Histogram("w", "W.", ["e"], buckets=(1, 2), registry=theirs).labels("a").observe(math.nan)
    assert _lines(ours) == _lines(theirs)


def test_a_wrong_number_of_label_values_is_refused() -> None:
    registry = CollectorRegistry()
    counter = PlainCounter(registry, "nvpair_x", "X.", ["engine", "node"])
    histogram = PlainHistogram(registry, "nvpair_y", "Y.", ["engine"], (1,))
    with pytest.raises(ValueError, match="takes 2 label values"):
        counter.inc("ollama")
    with pytest.raises(ValueError, match="takes 1 label values"):
        histogram.observe("ollama", "a", amount=1)
