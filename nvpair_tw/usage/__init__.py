"""Usage history (docs/behaviour.md §12.4): requests and tokens per minute by key, model and node,
saved in an embedded SQLite database off the reactor thread and, with ``--state``, summed by the
fleet."""

from __future__ import annotations

from nvpair_tw.usage._minutes import DIMENSIONS, Report, Row, parse_report, parse_span
from nvpair_tw.usage._recorder import DEFAULT_RETENTION, UsageRecorder, UsageSink

__all__ = [
    "DEFAULT_RETENTION",
    "DIMENSIONS",
    "Report",
    "Row",
    "UsageRecorder",
    "UsageSink",
    "parse_report",
    "parse_span",
]
