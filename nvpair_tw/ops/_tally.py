# -*- test-case-name: tests.ops.test_board -*-
"""How each request ended, in the status page's words, and the counts of them by key and by model
(docs/operations.md, "The status page").

Every ``proxy/request`` record is one of four verdicts, by its status (docs/behaviour.md §7):

- **answered**: a status below 400 and no error in the record;
- **refused**: a 4xx other than 499, the proxy's own refusals (a bad body, a key, a rate, a
  model no node has) and a node's 4xx alike;
- **cancelled**: 499, the client left before its answer ended;
- **failed**: a 5xx (no node could answer, every node failed, the queue was full or timed out,
  a bug of the proxy's), a record without a status, and an answer that began with a 2xx but
  did not end whole (a stream cut mid-way, a fan-out where some node failed: the record carries
  an error).

:class:`Tally` counts them by one dimension's value since the process started, in memory, for at
most :data:`MAX_ROWS` values; later values are summed in one "others" row.
"""

from __future__ import annotations

from typing import Any

from nvpair_tw.core import IdentityEnum
from nvpair_tw.events import ProxyRequest

__all__ = ["CLIENT_LEFT", "MAX_ROWS", "Tally", "Verdict", "verdict_of"]

CLIENT_LEFT = 499
MAX_ROWS = 200
"""Values a tally keeps a row for (keys are few; models pass the model rule, §14.1)."""


class Verdict(IdentityEnum):
    """How a request ended, in the status page's words."""

    ANSWERED = "answered"
    REFUSED = "refused"
    FAILED = "failed"
    CANCELLED = "cancelled"


def verdict_of(record: ProxyRequest) -> Verdict:
    """The request's verdict (see the module docstring for the rule)."""
    status = record.status
    if status is None or status >= 500:
        return Verdict.FAILED
    if status == CLIENT_LEFT:
        return Verdict.CANCELLED
    if status >= 400:
        return Verdict.REFUSED
    return Verdict.FAILED if record.error is not None else Verdict.ANSWERED


def _zero() -> dict[Verdict, int]:
    return dict.fromkeys(Verdict, 0)


class Tally:
    """Requests by verdict for each value of one dimension (``None``: the record names none)."""

    def __init__(self, column: str, limit: int = MAX_ROWS) -> None:
        self._column = column
        self._limit = limit
        self._rows: dict[str | None, dict[Verdict, int]] = {}
        self._others = _zero()

    def add(self, value: str | None, verdict: Verdict) -> None:
        """Count one request of ``value`` with ``verdict``."""
        row = self._rows.get(value)
        if row is None:
            if len(self._rows) >= self._limit:
                self._others[verdict] += 1
                return
            row = self._rows[value] = _zero()
        row[verdict] += 1

    def to_json(self) -> list[dict[str, Any]]:
        """One object per value, by name (the value ``None`` last, then the others), each with
        the column's value, ``requests`` and a count per verdict."""
        named = sorted((v for v in self._rows if v is not None), key=str.casefold)
        order: list[str | None] = [*named, *([None] if None in self._rows else [])]
        rows = [self._row(value, self._rows[value]) for value in order]
        if any(self._others.values()):
            rows.append({**self._row(None, self._others), "others": True})
        return rows

    def _row(self, value: str | None, counts: dict[Verdict, int]) -> dict[str, Any]:
        row: dict[str, Any] = {self._column: value, "requests": sum(counts.values())}
        row.update((verdict.value, count) for verdict, count in counts.items())
        return row
