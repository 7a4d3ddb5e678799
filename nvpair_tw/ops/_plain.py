# -*- test-case-name: tests.ops.test_plain -*-
"""Counters and histograms kept as plain numbers, exposed by prometheus_client at scrape time.

prometheus_client's ``Counter`` and ``Histogram`` take a lock on every increment and observation
(they may be shared between threads); the bus feeds about twenty of them on the reactor thread for
each request. :class:`PlainCounter` and :class:`PlainHistogram` keep one float (or one bucket
row) per label set in a dict, and are each a custom collector (prometheus_client's documented way
to expose numbers kept elsewhere): the exposition is the one ``Counter`` and ``Histogram`` give,
their ``_total``, ``_bucket``, ``_count`` and ``_sum`` samples and a counter's ``_created``. Only
the reactor thread touches them; a scrape runs on it too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from math import inf
from time import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["PlainCounter", "PlainHistogram"]


class _Family(Collector):
    """A metric family's name, help and label names, registered; its label values checked."""

    def __init__(
        self, registry: CollectorRegistry, name: str, documentation: str, labels: Sequence[str]
    ) -> None:
        self.name = name
        self._documentation = documentation
        self._labels = list(labels)
        registry.register(self)

    def _check(self, values: tuple[str, ...]) -> None:
        """A new label set must name a value for each label (prometheus_client's ``labels``)."""
        if len(values) != len(self._labels):
            raise ValueError(f"{self.name} takes {len(self._labels)} label values")


class PlainCounter(_Family):
    """A counter family: a total per label set (with the time of its first count)."""

    def __init__(
        self, registry: CollectorRegistry, name: str, documentation: str, labels: Sequence[str]
    ) -> None:
        self._totals: dict[tuple[str, ...], list[float]] = {}  # [total, created]
        super().__init__(registry, name, documentation, labels)

    def inc(self, *values: str, amount: float = 1.0) -> None:
        """Add ``amount`` (not negative) to the total of the label set ``values``."""
        if amount < 0:
            raise ValueError("a counter only goes up")
        row = self._totals.get(values)
        if row is None:
            self._check(values)
            row = self._totals[values] = [0.0, time()]
        row[0] += amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self._documentation, labels=self._labels)
        for values, (total, created) in self._totals.items():
            family.add_metric(list(values), total, created=created)
        yield family


class PlainHistogram(_Family):
    """A histogram family: per label set, a count per bucket (``le`` upper bounds, +Inf last)
    and the sum of what was observed."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float],
    ) -> None:
        bounds = [float(b) for b in buckets]
        if not bounds or bounds[-1] != inf:
            bounds.append(inf)  # as prometheus_client: the last bucket is +Inf, once
        self._bounds = tuple(bounds)
        self._edges = [floatToGoString(b) for b in bounds]
        self._rows: dict[tuple[str, ...], list[float]] = {}  # a count per bucket, then the sum
        super().__init__(registry, name, documentation, labels)

    def observe(self, *values: str, amount: float) -> None:
        """Count ``amount`` in its bucket (the first whose bound is at least it) of ``values``."""
        row = self._rows.get(values)
        if row is None:
            self._check(values)
            row = self._rows[values] = [0.0] * (len(self._edges) + 1)
        row[-1] += amount
        if amount == amount:  # NaN is in the sum and in no bucket, as prometheus_client has it
            row[bisect_left(self._bounds, amount)] += 1

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._documentation, labels=self._labels)
        for values, row in self._rows.items():
            cumulative, buckets = 0.0, []
            for edge, count in zip(self._edges, row, strict=False):
                cumulative += count
                buckets.append((edge, cumulative))
            family.add_metric(list(values), buckets, row[-1])
        yield family
