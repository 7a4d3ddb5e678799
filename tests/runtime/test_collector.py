"""The process's collector once the proxy is built (docs/performance.md)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from nvpair_tw.runtime._collector import YOUNG_THRESHOLD, steady_collector

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """The collector's thresholds and permanent generation as they were before the test."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_what_was_built_is_frozen_and_young_passes_are_spaced(restored_collector: None) -> None:
    built = [[i] for i in range(100)]  # containers the collector tracks
    _, middle, old = gc.get_threshold()
    steady_collector()
    assert gc.get_freeze_count() >= len(built)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
