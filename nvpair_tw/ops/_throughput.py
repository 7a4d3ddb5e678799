# -*- test-case-name: tests.ops.test_admin -*-
"""The status page's chart of tokens per second per node over the last 15 minutes
(docs/operations.md, "The status page")."""

from __future__ import annotations

from typing import Any

__all__ = ["THROUGHPUT_BUCKET", "THROUGHPUT_BUCKETS", "Throughput", "completion_tokens"]

THROUGHPUT_BUCKET = 10.0
"""Seconds per throughput bucket on the status page's chart."""
THROUGHPUT_BUCKETS = 90
"""How many buckets the chart covers: 90 buckets of 10 s, the last 15 minutes."""


def completion_tokens(value: int | None) -> int | None:
    """A record's completion tokens, None when it has none or a count that is not one."""
    return None if value is None or value <= 0 else value


class Throughput:
    """Completion tokens per (engine, node) in fixed buckets over a short window (the chart's data).

    A request's completion tokens all count in the bucket its record was published in, that is the
    bucket of the request's *end* on the runtime's clock (the bus stamps events with it): a long
    answer shows as one spike when it finishes, never spread over the time it streamed. A bucket
    is ``bucket`` seconds (``int(t // bucket)``); only the last ``buckets`` of them are kept, older
    ones are dropped whenever a request is counted or the series is read, so memory is bounded by
    nodes times ``buckets``. The newest bucket is still filling, so its rate reads low until it ends.
    """

    def __init__(
        self, bucket: float = THROUGHPUT_BUCKET, buckets: int = THROUGHPUT_BUCKETS
    ) -> None:
        self.bucket = bucket
        self.buckets = buckets
        self._counts: dict[tuple[str, str], dict[int, int]] = {}
        self._pruned: int | None = None
        """The newest bucket of the last prune: pruning again for it would drop nothing (only
        that bucket was added to since), so a request of the same bucket does not walk them."""

    def _index(self, time: float) -> int:
        return int(time // self.bucket)

    def add(self, time: float, engine: str, node: str, tokens: int) -> None:
        """Count ``tokens`` completion tokens for ``(engine, node)`` in the bucket of ``time``."""
        index = self._index(time)
        series = (engine, node)
        counts = self._counts.get(series)
        if counts is None:
            counts = self._counts[series] = {}
        counts[index] = counts.get(index, 0) + tokens
        if index != self._pruned:
            self._prune(index)

    def _prune(self, newest: int) -> None:
        self._pruned = newest
        oldest = newest - self.buckets + 1
        for series, counts in list(self._counts.items()):
            for index in [i for i in counts if i < oldest]:
                del counts[index]
            if not counts:
                del self._counts[series]

    def kept(self) -> int:
        """How many buckets are held in all (for the bound's tests)."""
        return sum(len(counts) for counts in self._counts.values())

    def to_json(self, now: float) -> dict[str, Any]:
        """``{"bucketSeconds", "since" (ms, the oldest bucket's start), "series": [{"engine",
        "node", "points": [[t_ms, tokens_per_second], ...]}]}``: one point per bucket of the
        window, oldest first, zero where the node served no tokens, each at its bucket's start;
        only nodes with tokens in the window have a series (ordered by engine, then node)."""
        newest = self._index(now)
        self._prune(newest)
        oldest = newest - self.buckets + 1
        series = []
        for (engine, node), counts in sorted(self._counts.items()):
            points = [
                [int(i * self.bucket * 1000), round(counts.get(i, 0) / self.bucket, 2)]
                for i in range(oldest, newest + 1)
            ]
            series.append({"engine": engine, "node": node, "points": points})
        return {
            "bucketSeconds": self.bucket,
            "since": int(oldest * self.bucket * 1000),
            "series": series,
        }
