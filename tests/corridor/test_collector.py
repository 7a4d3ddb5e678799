"""The cyclic collector kept off a large body's objects (docs/behaviour.md §14.1)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from twisted.internet.task import Clock

from nvpair_tw.corridor._collector import QuietCollector, let_go

pytestmark = pytest.mark.timeout(10)


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_no_automatic_collection_while_a_large_body_is_parsed() -> None:
    quiet = QuietCollector()
    quiet.parse_started()
    assert not gc.isenabled()
    quiet.parse_ended()
    assert gc.isenabled()


def test_what_the_parse_built_is_frozen_until_the_last_request_holding_it_ends() -> None:
    quiet = QuietCollector()
    quiet.parse_started()
    quiet.parse_started()
    built = [[i] for i in range(1000)]
    quiet.parse_ended()
    assert not gc.isenabled() and gc.get_freeze_count() == 0  # one parse still running
    quiet.parse_ended()
    assert gc.isenabled() and gc.get_freeze_count() >= len(built)
    quiet.released()
    assert gc.get_freeze_count() > 0  # the other request still holds its body
    quiet.released()
    assert gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    quiet = QuietCollector()
    quiet.parse_started()
    quiet.parse_ended()
    assert not gc.isenabled()
    quiet.released()


def test_a_large_document_is_freed_a_slice_at_a_time() -> None:
    """Freeing a million objects at once holds the reactor as long as building them."""
    clock = Clock()
    messages = [{"n": i} for i in range(50_000)]
    doc = {"model": "m", "messages": messages}
    let_go(doc, clock)
    turns = 0
    while clock.calls:
        turn = clock.calls.pop(0)  # one turn at a time (advance would run them all)
        assert turn.getTime() == clock.seconds()  # the next reactor turn, not later
        turn.func(*turn.args, **turn.kw)
        turns += 1
        assert turns < 100
        if messages:
            assert len(messages) in (50_000, 30_000, 10_000), len(messages)  # 20,000 a turn
    assert doc == {} and messages == []
    assert turns == 6
