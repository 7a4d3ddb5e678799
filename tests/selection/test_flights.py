"""Requests in flight per node (nvpair_tw.selection._flights, docs/behaviour.md §15.1, §15.2)."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from nvpair_tw.selection._flights import LIVE_TOKENS, FirstRun, FlightBook, Trip
from nvpair_tw.selection._progress import ProgressBook
from nvpair_tw.selection._speed import Start


def test_a_lone_flight_shared_its_node_with_nobody() -> None:
    clock = Clock()
    book = FlightBook(clock)
    flight = book.take_off("a", 4.0)
    clock.advance(4)
    assert flight.land() == 1.0
    assert book.in_flight("a") == 0


def test_concurrency_is_the_mean_over_the_flights_life() -> None:
    """A flight of 4 s that had company for its last 2 s shared the node with 1.5 on average."""
    clock = Clock()
    book = FlightBook(clock)
    first = book.take_off("a", 4.0)
    clock.advance(2)
    second = book.take_off("a", 4.0)
    assert book.in_flight("a") == 2
    clock.advance(2)
    assert first.land() == pytest.approx(1.5)
    clock.advance(2)
    assert second.land() == pytest.approx(1.5)


def test_remaining_work_is_each_flights_predicted_end_less_now_or_as_long_again_as_it_has_run() -> (
    None
):
    """Until its predicted end, that end less now; past it, a flight is predicted to run as long
    again as it has run (answers' lengths have a long tail: the later it is, the less it is worth
    waiting for); one without a prediction is past it from its start."""
    clock = Clock()
    book = FlightBook(clock)
    book.take_off("a", 4.0)
    book.take_off("a", 10.0)
    book.take_off("b", 1.0)
    book.take_off("d", 0.0)
    clock.advance(3)
    assert book.remaining("a") == pytest.approx(1.0 + 7.0)
    assert book.remaining("b") == pytest.approx(3.0)
    assert book.remaining("d") == pytest.approx(3.0)
    assert book.remaining("c") == 0.0


def test_a_second_landing_changes_nothing() -> None:
    clock = Clock()
    book = FlightBook(clock)
    flight = book.take_off("a", 1.0)
    book.take_off("a", 1.0)
    flight.land()
    flight.land()
    assert book.in_flight("a") == 1


def test_a_trip_lands_each_attempt_before_the_next_takes_off() -> None:
    """Failover: the first node's flight ends when the second attempt starts; the landing names
    the node that served, its prediction and how it started there."""
    clock = Clock()
    book = FlightBook(clock)
    starts = {"a": Start.LOADED, "b": Start.CACHED}
    trip = Trip(book, {"a": 2.0, "b": 3.0}, starts.__getitem__)
    trip.attempt("a")
    clock.advance(1)
    trip.attempt("b")
    assert (book.in_flight("a"), book.in_flight("b")) == (0, 1)
    landing = trip.land()
    assert landing is not None
    assert (landing.node_id, landing.predicted, landing.start) == ("b", 3.0, Start.CACHED)
    assert trip.land() is None
    assert book.in_flight("b") == 0


def test_a_flight_counts_its_prediction_from_dispatch_and_lands_with_the_arrivals() -> None:
    """A request that waited in the queue: the work it adds ahead is its prediction without the
    wait already spent; the record still compares the prediction made at arrival."""
    clock = Clock()
    book = FlightBook(clock)
    trip = Trip(book, {"a": 5.0}, lambda node: Start.PLAIN, {"a": 2.0})
    trip.attempt("a")
    assert book.remaining("a") == 2.0
    landing = trip.land()
    assert landing is not None and landing.predicted == 5.0


def test_a_first_run_shows_its_nodes_rate_once_enough_of_its_answer_came() -> None:
    """The oldest request for a model on a node, as it runs: seconds since dispatch and the
    pieces of body the node sent since; a rate (pieces over dispatch to the last one) once
    LIVE_TOKENS came, kept when another request shares the node (whose pieces would mix in)."""
    clock = Clock()
    progress = ProgressBook(clock)
    book = FlightBook(clock, progress)
    touch = progress.toucher("a")
    touch()  # an earlier answer's piece: not this request's
    book.take_off("a", 2.0, "llama3")
    assert book.first_run("a", "llama3") == FirstRun(0.0)
    assert book.first_run("a", "qwen") is None and book.first_run("b", "llama3") is None
    clock.advance(0.3)
    for _ in range(LIVE_TOKENS - 1):
        touch()
    early = book.first_run("a", "llama3")
    assert early == FirstRun(0.3, LIVE_TOKENS - 1, 0.3) and early.rate is None
    clock.advance(0.1)
    touch()
    shown = book.first_run("a", "llama3")
    assert shown is not None and shown.rate == pytest.approx(LIVE_TOKENS / 0.4)
    book.take_off("a", 2.0, "qwen")
    touch()
    clock.advance(0.1)
    kept = book.first_run("a", "llama3")
    assert kept is not None and kept.tokens == LIVE_TOKENS
    assert kept.elapsed == pytest.approx(0.5) and kept.until_last == pytest.approx(0.4)
    assert book.in_flight_for("a", "llama3") == book.in_flight_for("a", "qwen") == 1


def test_without_a_progress_book_a_first_run_shows_only_its_time() -> None:
    clock = Clock()
    book = FlightBook(clock)
    book.take_off("a", 2.0, "llama3")
    clock.advance(1.0)
    assert book.first_run("a", "llama3") == FirstRun(1.0)
