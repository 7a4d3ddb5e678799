"""A key removed or re-scoped loses what it holds (docs/behaviour.md §14.2)."""

from __future__ import annotations

import pytest

from nvpair_tw.corridor._revocation import Holdings
from nvpair_tw.corridor._tunnel import TunnelBook, TunnelState

pytestmark = pytest.mark.timeout(10)


def test_revoking_a_key_cancels_its_queued_requests_only() -> None:
    holdings = Holdings(TunnelBook(8))
    cancelled: list[str] = []
    holdings.hold("alice", lambda: cancelled.append("a1"))
    holdings.hold("alice", lambda: cancelled.append("a2"))
    holdings.hold("bob", lambda: cancelled.append("b1"))
    holdings.revoke(frozenset({"alice"}))
    assert sorted(cancelled) == ["a1", "a2"]
    assert (holdings.queued("alice"), holdings.queued("bob")) == (0, 1)


def test_a_request_that_left_the_queue_is_not_cancelled_later() -> None:
    holdings = Holdings(TunnelBook(8))
    cancelled: list[str] = []
    release = holdings.hold("alice", lambda: cancelled.append("a1"))
    release()
    holdings.revoke(frozenset({"alice"}))
    assert cancelled == [] and holdings.queued("alice") == 0


def test_a_key_has_at_most_its_own_number_of_tunnels() -> None:
    book = TunnelBook(10)
    first = [book.admit("lmstudio", "alice", 2) for _ in range(3)]
    assert [t is not None for t in first] == [True, True, False]
    assert book.admit("lmstudio", "bob", 2) is not None
    assert book.admit("lmstudio") is not None  # the local caller: only the process's cap
    assert book.held_by("alice") == 2


def test_revoking_a_key_closes_its_open_tunnels() -> None:
    book = TunnelBook(10)
    mine = book.admit("lmstudio", "alice", None)
    theirs = book.admit("lmstudio", "bob", None)
    assert mine is not None and theirs is not None
    mine.state = theirs.state = TunnelState.OPEN
    Holdings(book).revoke(frozenset({"alice"}))
    assert (mine.state, theirs.state) == (TunnelState.CLOSED, TunnelState.OPEN)
    assert book.held_by("alice") == 0
