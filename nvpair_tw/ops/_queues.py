# -*- test-case-name: tests.ops.test_queues -*-
"""The queue of each facade per priority (docs/behaviour.md §16.3), for ``/metrics`` and the
status page: how many requests of each priority wait now, how long the oldest has waited, and the
requests that have left the queue with their total time in it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from nvpair_tw.core import Priority
from nvpair_tw.corridor import FacadeState

__all__ = ["queue_json", "queue_metrics"]


def queue_json(facade: FacadeState) -> dict[str, Any]:
    """Per priority: ``waiting``, ``oldestWaitMs``, ``served`` (left the queue) and ``waitedMs``
    (their total time in it)."""
    admission = facade.admission
    shown = {}
    for priority in Priority:
        waited = admission.waited(priority)
        shown[priority.value] = {
            "waiting": admission.depth_of(priority),
            "oldestWaitMs": round(admission.oldest_wait(priority) * 1000),
            "served": waited.count,
            "waitedMs": round(waited.seconds * 1000),
        }
    return shown


def queue_metrics(facades: Mapping[str, FacadeState]) -> Iterator[Metric]:
    """``nvpair_queue_waiting``, ``nvpair_queue_oldest_wait_seconds`` and
    ``nvpair_queue_priority_wait_seconds`` (a summary), by engine and priority."""
    labels = ["engine", "priority"]
    waiting = GaugeMetricFamily(
        "nvpair_queue_waiting", "Requests waiting for a slot now, by priority.", labels=labels
    )
    oldest = GaugeMetricFamily(
        "nvpair_queue_oldest_wait_seconds",
        "How long the oldest waiting request of the priority has waited.",
        labels=labels,
    )
    waits = SummaryMetricFamily(
        "nvpair_queue_priority_wait_seconds",
        "Time in the queue of the requests that left it (bound, timed out or gone).",
        labels=labels,
    )
    for engine, facade in facades.items():
        admission = facade.admission
        for priority in Priority:
            key = [engine, priority.value]
            waiting.add_metric(key, admission.depth_of(priority))
            oldest.add_metric(key, admission.oldest_wait(priority))
            waited = admission.waited(priority)
            waits.add_metric(key, waited.count, waited.seconds)
    yield from (waiting, oldest, waits)
