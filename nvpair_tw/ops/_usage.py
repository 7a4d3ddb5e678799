# -*- test-case-name: tests.ops.test_usage -*-
"""Usage reports (docs/behaviour.md §12.4): the control method ``usage/report`` and what the admin
listener's ``GET /api/usage`` shares with it.

Both read the same parameters (``since``, ``until``, ``by``) and answer ``{"rows": [...],
"scope": "fleet" | "local"}``; the rows come from the usage database on its own thread, so the
answer is a Deferred. Bad parameters are refused before anything is read.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed

from nvpair_tw.ops._rpc import Params, Result, invalid
from nvpair_tw.runtime import Runtime
from nvpair_tw.usage import Report, parse_report

__all__ = ["USAGE", "read_report", "usage_report"]


def read_report(runtime: Runtime, since: object, until: object, by: object) -> Report:
    """The report asked for, checked against the runtime's clock; ``ValueError`` when malformed."""
    return parse_report(since, until, by, runtime.reactor.seconds())


def report_of(runtime: Runtime, report: Report) -> Deferred[dict[str, Any]]:
    """The report's rows (an empty report when the process keeps no usage)."""
    if runtime.usage is None:
        return succeed({"rows": [], "scope": "local"})
    return runtime.usage.report(report)


def usage_report(runtime: Runtime, params: Params) -> Deferred[Result]:
    """``usage/report {since?, until?, by?}`` → ``{"rows": [...], "scope": ...}``."""
    unknown = sorted(set(params) - {"since", "until", "by"})
    if unknown:
        raise invalid(f"unknown parameter {unknown[0][:40]!r}; expected since, until, by")
    try:
        report = read_report(runtime, params.get("since"), params.get("until"), params.get("by"))
    except ValueError as error:
        raise invalid(str(error)) from None
    return report_of(runtime, report)


USAGE = {"usage/report": usage_report}
"""The usage methods, on the whole process."""
