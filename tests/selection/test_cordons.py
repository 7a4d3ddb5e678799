"""Tests for nvpair_tw.selection._cordons: the cordon book, on a ``task.Clock``."""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.selection._cordons import Cordon, CordonBook

A = Node("a", "http://a.test:11434")


def _book() -> tuple[CordonBook, Clock, list[tuple[str, Cordon | None]]]:
    clock = Clock()
    told: list[tuple[str, Cordon | None]] = []
    return CordonBook(clock, lambda n, c: told.append((n, c))), clock, told


def test_a_cordon_keeps_its_first_time_and_takes_the_new_reason() -> None:
    """Cordoning again changes the reason, not the time it started; each change is told once."""
    book, clock, told = _book()
    clock.advance(5)
    book.cordon("a", "upgrade")
    clock.advance(5)
    again = book.cordon("a", "upgrade, slower")
    assert again == Cordon("a", "upgrade, slower", 5.0, "control")
    book.cordon("a", "upgrade, slower")  # no change: nobody is told
    assert [c.reason if c else None for _, c in told] == ["upgrade", "upgrade, slower"]
    assert book.cordoned(A) and book.ids() == frozenset({"a"})


def test_uncordon_lifts_and_says_whether_there_was_one() -> None:
    """Uncordon tells the listeners with None; a second one is False and tells nobody."""
    book, _, told = _book()
    book.cordon("a", "x")
    assert book.uncordon("a") is True
    assert book.uncordon("a") is False
    assert told[-1] == ("a", None) and len(told) == 2
    assert not book.cordoned(A)


def test_the_nodes_file_cordon_comes_from_the_node() -> None:
    """``cordon = true`` on the node cordons it whatever the book holds, with origin ``file``."""
    book, _, _ = _book()
    filed = Node("a", "http://a.test:11434", cordon=True)
    assert book.cordoned(filed)
    cordon = book.of(filed)
    assert cordon is not None and cordon.origin == "file"
    assert cordon.to_json() == {
        "reason": "cordon = true in the nodes file",
        "since": None,
        "origin": "file",
    }
    assert book.of(A) is None


def test_to_json_gives_the_start_in_milliseconds() -> None:
    """``since`` is ms since the epoch of the injected clock."""
    book, clock, _ = _book()
    clock.advance(1.25)
    assert book.cordon("a", "r", "peer").to_json() == {
        "reason": "r",
        "since": 1250,
        "origin": "peer",
    }
