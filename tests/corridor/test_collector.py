"""The cyclic collector kept off a large body's objects (docs/behaviour.md §14.1)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from nvpair_tw.corridor._collector import QuietCollector

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
