# -*- test-case-name: tests.usage.test_recorder -*-
"""The minutes the usage recorder holds outside the database (docs/behaviour.md §12.4).

Four places, each a dict of minute buckets or a list of row batches: ``memory`` (usage kept only
here: no database, or it failed; the last :data:`MEMORY_RETENTION` seconds at most), ``unsaved``
(counted since the last write), ``in_flight`` (batches handed to the database's thread and not
yet written) and ``unshared`` (counted since the last hand-over to the fleet store).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nvpair_tw.usage._minutes import COUNTS, MINUTE, Counts, Report, Row, UsageKey, add, grouped

__all__ = ["MEMORY_RETENTION", "UsageBuffer"]

MEMORY_RETENTION = 86400.0
"""Seconds of usage kept in memory when there is no database (``none``, or it failed)."""

Group = tuple[tuple[Any, ...], Sequence[int]]


def rows_of(buckets: dict[UsageKey, Counts]) -> list[Row]:
    """The buckets as database rows (minute, key, model, node, counts...)."""
    return [(k.minute, k.key, k.model, k.node, *c) for k, c in buckets.items()]  # type: ignore[misc]


def _merge(into: dict[UsageKey, Counts], rows: Iterable[Row]) -> None:
    for row in rows:
        add(into.setdefault(UsageKey(*row[:4]), [0] * len(COUNTS)), row[4:])


def _count(into: dict[UsageKey, Counts], bucket: UsageKey, counts: Sequence[int]) -> None:
    row = into.get(bucket)
    if row is None:
        into[bucket] = [*counts, *[0] * (len(COUNTS) - len(counts))]
    else:
        add(row, counts)


class UsageBuffer:
    """What is counted and not (yet) in the database; ``retention`` bounds the memory window."""

    def __init__(self, retention: float) -> None:
        self.retention = retention
        self.memory: dict[UsageKey, Counts] = {}
        self.unsaved: dict[UsageKey, Counts] = {}
        self.unshared: dict[UsageKey, Counts] = {}
        self.in_flight: list[list[Row]] = []
        self._memory_pruned = 0

    @property
    def memory_hours(self) -> int:
        """How many hours the memory window holds (for the warning that usage is memory only)."""
        return int(min(self.retention, MEMORY_RETENTION) // 3600)

    def keep(self, bucket: UsageKey, counts: Sequence[int]) -> None:
        """Count into memory (no database), forgetting minutes past the memory window."""
        _count(self.memory, bucket, counts)
        self._prune_memory(bucket.minute)

    def hold(self, bucket: UsageKey, counts: Sequence[int]) -> None:
        """Count into what the next write saves."""
        _count(self.unsaved, bucket, counts)

    def share(self, bucket: UsageKey, counts: Sequence[int]) -> None:
        """Count into what the next flush hands to the fleet store."""
        _count(self.unshared, bucket, counts)

    def _prune_memory(self, minute: int) -> None:
        """Forget memory minutes past the memory window (at most once a minute)."""
        if minute <= self._memory_pruned:
            return
        self._memory_pruned = minute
        keep = minute - int(min(self.retention, MEMORY_RETENTION) // MINUTE)
        for bucket in [b for b in self.memory if b.minute < keep]:
            del self.memory[bucket]

    def take_unshared(self) -> list[Row]:
        """Everything unshared, as rows, now counted as shared."""
        rows, self.unshared = rows_of(self.unshared), {}
        return rows

    def send(self) -> list[Row]:
        """Everything unsaved, as one batch now in flight."""
        batch, self.unsaved = rows_of(self.unsaved), {}
        self.in_flight.append(batch)
        return batch

    def written(self, batch: list[Row]) -> int:
        """``batch`` is in the database: no longer in flight; how many rows it held (0 when it
        was moved to memory meanwhile)."""
        if batch not in self.in_flight:
            return 0
        self.in_flight.remove(batch)
        return len(batch)

    def keep_in_flight(self) -> None:
        """The batches in flight will not be written: keep them in memory."""
        for batch in self.in_flight:
            _merge(self.memory, batch)
        self.in_flight = []

    def keep_everything(self) -> None:
        """The database is given up: what is in flight and unsaved is kept in memory."""
        self.keep_in_flight()
        _merge(self.memory, rows_of(self.unsaved))
        self.unsaved = {}

    def groups(self, report: Report) -> list[Group]:
        """This proxy's minutes outside the database (in flight, unsaved, memory) for ``report``."""
        return [
            *grouped(report, [r for batch in self.in_flight for r in batch]),
            *grouped(report, rows_of(self.unsaved)),
            *grouped(report, rows_of(self.memory)),
        ]

    def unshared_groups(self, report: Report) -> list[Group]:
        """The minutes not yet handed to the fleet store, for ``report``."""
        return list(grouped(report, rows_of(self.unshared)))
