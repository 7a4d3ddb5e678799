# -*- test-case-name: tests.usage.test_minutes -*-
"""Usage as values (docs/behaviour.md §12.4): the minute a request counts in, what it counts, the
report's time window and grouping, and the sums of rows grouped by report columns.

Nothing here does I/O or keeps state. A *row* is one minute of one (key, model, node): the minute
as whole minutes since the Unix epoch (UTC), then the counts in :data:`COUNTS` order.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from attrs import frozen

from nvpair_tw.core import parse_duration
from nvpair_tw.events import ProxyRequest

__all__ = [
    "ANONYMOUS",
    "COUNTS",
    "DIMENSIONS",
    "MINUTE",
    "Counts",
    "Report",
    "Row",
    "UsageKey",
    "add",
    "counts_of",
    "grouped",
    "minute_iso",
    "parse_report",
    "parse_span",
    "rollup",
]

MINUTE = 60.0
ANONYMOUS = "anonymous"
"""The key of a request that named none (the record has no ``key``)."""

COUNTS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "unknown_tokens",
    "cached_tokens",
    "unknown_cached",
)
"""What each row counts: ``unknown_tokens`` is how many requests had no (or partial) counts;
``cached_tokens`` the prompt tokens the engines said they found cached (part of
``prompt_tokens``), ``unknown_cached`` how many requests' engines said nothing of a cache."""
DIMENSIONS = ("key", "model", "node", "minute", "hour", "day")
"""What a report may group by."""
_GRAIN = {"minute": 1, "hour": 60, "day": 1440}

Counts = list[int]
Row = tuple[int, str, str, str, int, int, int, int, int, int, int]
"""``(minute, key, model, node, requests, errors, prompt, completion, unknown, cached,
unknown_cached)``."""


class UsageKey(NamedTuple):
    """One bucket: a UTC minute (minutes since the epoch), a key name, a public model, a node id
    (``""`` when no node served the request).

    A named tuple, not an attrs value: one is made and hashed per inference record, and a tuple
    is made and hashed in C (an attrs value's ``__init__`` and ``__hash__`` are Python calls).
    """

    minute: int
    key: str
    model: str
    node: str


def _count(value: int | None) -> int | None:
    return None if value is None or value < 0 else value


def counts_of(time: float, record: ProxyRequest) -> tuple[UsageKey, Counts] | None:
    """The bucket and counts of one ``proxy/request`` record (:data:`COUNTS`); ``None`` for a
    record that is not an inference (it names no model). Only these fields are read: no body can
    reach usage."""
    model = record.model
    if model is None:
        return None
    status = record.status
    errored = status is None or status >= 400
    prompt = _count(record.prompt_tokens)
    completion = _count(record.completion_tokens)
    cached = _count(record.cached_tokens)
    bucket = UsageKey(int(time // MINUTE), record.key or ANONYMOUS, model, record.node_id or "")
    unknown = prompt is None or completion is None
    return bucket, [
        1,
        int(errored),
        prompt or 0,
        completion or 0,
        int(unknown),
        cached or 0,
        int(cached is None),
    ]


def add(into: Counts, counts: Sequence[int]) -> None:
    """Add ``counts`` to ``into`` in place (the first ``len(counts)`` of it)."""
    into[: len(counts)] = map(operator.add, into, counts)


def minute_iso(minute: int) -> str:
    """A minute as ISO-8601 UTC (``2026-12-01T13:17:00Z``)."""
    return datetime.fromtimestamp(minute * MINUTE, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


_RELATIVE_DAYS = re.compile(r"^\s*(\d+(?:\.\d*)?)d\s*$")


def parse_span(text: str) -> float:
    """A length of time in seconds: a Go duration (``24h``, ``90m``) or whole days (``90d``);
    ``ValueError`` for anything else or a negative one."""
    days = _RELATIVE_DAYS.match(text)
    seconds = float(days.group(1)) * 86400 if days else parse_duration(text)
    if seconds < 0:
        raise ValueError(f"negative duration {text!r}")
    return seconds


def _instant(text: object, label: str, now: float) -> float:
    """ISO-8601 (naive means UTC) or a span back from ``now``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{label} must be an ISO-8601 time or a duration such as 24h")
    try:
        return now - parse_span(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{label} must be an ISO-8601 time or a duration such as 24h, not {text[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@frozen
class Report:
    """What a report asks: minutes ``since`` to ``until`` (both included), grouped by ``by``."""

    since: int
    until: int
    by: tuple[str, ...]

    def columns(self, row: Row) -> tuple[Any, ...]:
        """The values of this report's group columns for one row."""
        minute = row[0]
        values: list[Any] = []
        for name in self.by:
            if name in _GRAIN:
                values.append(minute - minute % _GRAIN[name])
            else:
                values.append(row[1 + ("key", "model", "node").index(name)])
        return tuple(values)

    def covers(self, minute: int) -> bool:
        return self.since <= minute <= self.until


def parse_report(
    since: object, until: object, by: object, now: float, *, default_since: str = "24h"
) -> Report:
    """A report's parameters, checked; ``ValueError`` with a message fit for the caller.

    ``since`` and ``until`` are ISO-8601 times or durations back from ``now`` (``since`` defaults
    to 24 hours, ``until`` to now); ``by`` is a list of :data:`DIMENSIONS` or one comma-separated
    string of them (empty: one row of totals)."""
    start = _instant(default_since if since is None else since, "since", now)
    end = now if until is None else _instant(until, "until", now)
    if end < start:
        raise ValueError("until is before since")
    if by is None:
        names: list[object] = []
    elif isinstance(by, str):
        names = [part.strip() for part in by.split(",") if part.strip()]
    elif isinstance(by, list):
        names = list(by)
    else:
        raise ValueError("by must be an array of " + "|".join(DIMENSIONS))
    chosen: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in DIMENSIONS:
            shown = name[:40] if isinstance(name, str) else type(name).__name__
            raise ValueError(f"by: {shown!r} is not one of {', '.join(DIMENSIONS)}")
        if name not in chosen:
            chosen.append(name)
    return Report(int(start // MINUTE), int(end // MINUTE), tuple(chosen))


def rollup(
    report: Report, groups: Iterable[tuple[tuple[Any, ...], Sequence[int]]]
) -> list[dict[str, Any]]:
    """Sum grouped counts (group columns → counts; the same group may come several times, from the
    database, memory and the fleet) into the report's rows, ordered by their columns."""
    sums: dict[tuple[Any, ...], Counts] = {}
    for columns, counts in groups:
        add(sums.setdefault(columns, [0] * len(COUNTS)), counts)
    rows = []
    for columns in sorted(sums):  # a column holds one type: str or int
        row: dict[str, Any] = {}
        for name, value in zip(report.by, columns, strict=True):
            if name in _GRAIN:
                row[name] = minute_iso(value)
            else:
                row[name] = value if value != "" else None
        row.update(zip(COUNTS, sums[columns], strict=True))
        rows.append(row)
    return rows


def grouped(report: Report, rows: Iterable[Row]) -> Iterable[tuple[tuple[Any, ...], Sequence[int]]]:
    """Rows in the report's window as (group columns, counts)."""
    for row in rows:
        if report.covers(row[0]):
            yield report.columns(row), row[4:]
