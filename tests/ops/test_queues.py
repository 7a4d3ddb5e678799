"""The queue per priority in ``/metrics`` and in the status page's state (docs/behaviour.md
§16.3): how many wait, the oldest wait, and the requests that left the queue with their time."""

from __future__ import annotations

from typing import cast

from twisted.internet.defer import CancelledError
from twisted.internet.testing import MemoryReactorClock

from nvpair_tw.core import IProxyReactor, Priority, Settings
from nvpair_tw.nodes import Node
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.ops._queues import queue_json
from nvpair_tw.runtime import Runtime, build_runtime
from nvpair_tw.selection import Slot, Waiter
from tests.ops.test_metrics import samples, value

NODE = Node("a", "http://127.0.0.1:1", ("llama3:latest",), slots=1)


def _queued() -> tuple[MemoryReactorClock, Runtime, Slot, Waiter, Waiter]:
    """One slot held, a batch request queued 5 s ago and an interactive one 2 s ago."""
    clock = MemoryReactorClock()
    runtime = build_runtime(
        cast(IProxyReactor, clock), Settings(), ["ollama"], nodes={"ollama": [NODE]}
    )
    admission = runtime.facades["ollama"].admission
    held = admission.admit([NODE])
    batch = admission.admit([NODE], priority=Priority.BATCH)
    clock.advance(3)
    interactive = admission.admit([NODE])
    clock.advance(2)
    assert isinstance(held, Slot) and isinstance(batch, Waiter) and isinstance(interactive, Waiter)
    return clock, runtime, held, batch, interactive


def test_the_state_shows_each_prioritys_waiting_oldest_wait_and_served() -> None:
    _, runtime, held, batch, _ = _queued()
    facade = runtime.facades["ollama"]
    assert queue_json(facade) == {
        "interactive": {"waiting": 1, "oldestWaitMs": 2000, "served": 0, "waitedMs": 0},
        "batch": {"waiting": 1, "oldestWaitMs": 5000, "served": 0, "waitedMs": 0},
    }
    held.release()
    batch.bound.addErrback(lambda failure: failure.trap(CancelledError))
    batch.bound.cancel()
    shown = queue_json(facade)
    assert shown["interactive"] == {"waiting": 0, "oldestWaitMs": 0, "served": 1, "waitedMs": 2000}
    assert shown["batch"] == {"waiting": 0, "oldestWaitMs": 0, "served": 1, "waitedMs": 5000}


def test_metrics_give_queue_depth_and_wait_per_priority() -> None:
    _, runtime, held, batch, _ = _queued()
    metrics = ProxyMetrics(runtime)
    scraped = samples(metrics.exposition().decode())
    for priority, waiting, oldest in (("interactive", 1, 2.0), ("batch", 1, 5.0)):
        labels = {"engine": "ollama", "priority": priority}
        assert value(scraped, "nvpair_queue_waiting", **labels) == waiting
        assert value(scraped, "nvpair_queue_oldest_wait_seconds", **labels) == oldest
    held.release()
    scraped = samples(metrics.exposition().decode())
    labels = {"engine": "ollama", "priority": "interactive"}
    assert value(scraped, "nvpair_queue_waiting", **labels) == 0
    assert value(scraped, "nvpair_queue_priority_wait_seconds_count", **labels) == 1
    assert value(scraped, "nvpair_queue_priority_wait_seconds_sum", **labels) == 2.0
    batch.bound.addErrback(lambda failure: failure.trap(CancelledError))
    batch.bound.cancel()
