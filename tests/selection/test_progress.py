"""Tests for nvpair_tw.selection._progress: when each node last delivered body bytes, and its busy waits."""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair_tw.selection._progress import ProgressBook

PERIOD = 30.0
EPSILON = 2**-10  # exact in binary


def test_a_node_that_never_delivered_shows_no_progress() -> None:
    """No chunk yet: no last time, and no progress within any period."""
    book = ProgressBook(Clock())
    assert book.last("a") is None
    assert not book.delivered_within("a", PERIOD)


def test_touch_records_the_clock_time_of_the_last_chunk() -> None:
    """Each call of a node's toucher stores the current clock time for that node only."""
    clock = Clock()
    book = ProgressBook(clock)
    touch_a = book.toucher("a")
    clock.advance(3)
    touch_a()
    clock.advance(4)
    touch_a()
    assert book.last("a") == 7
    assert book.last("b") is None


def test_progress_counts_within_one_period_inclusive_and_not_after() -> None:
    """A chunk exactly one period ago still counts; one a hair older does not."""
    clock = Clock()
    book = ProgressBook(clock)
    book.toucher("a")()
    clock.advance(PERIOD)
    assert book.delivered_within("a", PERIOD)
    clock.advance(EPSILON)
    assert not book.delivered_within("a", PERIOD)
    assert not book.delivered_within("b", PERIOD)


def test_busy_waits_are_counted_per_node() -> None:
    """The busy-wait counter grows per node and starts at zero."""
    book = ProgressBook(Clock())
    book.busy_waited("a")
    book.busy_waited("a")
    book.busy_waited("b")
    assert (book.busy_waits("a"), book.busy_waits("b"), book.busy_waits("c")) == (2, 1, 0)


def test_a_shared_book_tells_every_touch_and_counts_a_peers_bytes() -> None:
    """In a fleet each touch is told (the store rate-limits), and bytes a peer saw from a node
    count as progress here within the same period rule."""
    clock = Clock()
    told: list[str] = []
    peers: dict[str, float] = {}
    book = ProgressBook(clock).shared(told.append, peers.get)
    book.toucher("a")()
    assert told == ["a"]
    assert not book.delivered_within("b", 5.0)
    clock.advance(10)
    peers["b"] = 8.0
    assert book.delivered_within("b", 2.0)
    assert not book.delivered_within("b", 1.0)
    assert not book.delivered_within("a", 5.0)
    peers["a"] = 9.5
    assert book.delivered_within("a", 0.5)


def test_each_piece_of_body_a_node_delivers_is_counted() -> None:
    """What a node's first answer shows of its speed (§15.2): its pieces, per node, shared or not."""
    clock = Clock()
    book = ProgressBook(clock)
    shared = ProgressBook(clock).shared(lambda _node: None, lambda _node: None)
    for each in (book, shared):
        touch = each.toucher("a")
        for _ in range(3):
            touch()
        assert (each.chunks("a"), each.chunks("b")) == (3, 0)
