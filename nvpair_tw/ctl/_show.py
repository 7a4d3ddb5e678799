# -*- test-case-name: tests.ctl.test_show -*-
"""How ``nvpair-ctl`` shows an answer: a table or a sentence per command, and what it means for
the exit status.

What the proxy sends is shown, never executed: every cell is passed through :func:`printable`, so
a node id or model name from a discovery agent cannot carry terminal escape sequences to the
operator's screen.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "USAGE_COUNTS",
    "changed_models",
    "cordoned",
    "drained",
    "level_set",
    "node_table",
    "printable",
    "table",
    "uncordoned",
    "usage_table",
]

USAGE_COUNTS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "unknown_tokens",
    "cached_tokens",
    "unknown_cached",
)
"""The counts every ``usage/report`` row has, after the columns it was grouped by."""


def printable(value: object) -> str:
    """``value`` as text with every non-printable character escaped (``\\x1b``, ``\\n``)."""
    text = value if isinstance(value, str) else json_text(value)
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def json_text(value: object) -> str:
    """A JSON value as a cell: ``-`` for null, numbers and strings as they are."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float | str):
        return str(value)
    return json.dumps(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: int = 0) -> str:
    """Columns padded to their widest cell; the last ``right`` columns (counts) right-aligned."""
    cells = [[printable(h) for h in headers], *([printable(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    first_right = len(headers) - right
    lines = []
    for row in cells:
        padded = [
            cell.rjust(width) if i >= first_right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _names(value: object) -> str:
    """A list of names, comma-joined; ``-`` for none, ``?`` when unknown (``null``)."""
    if value is None:
        return "?"
    if isinstance(value, list):
        return ", ".join(printable(v) for v in value) if value else "-"
    return printable(value)


def _contexts(value: object) -> str:
    """Each model's context as ``name tokens``, comma-joined; ``-`` for none, ``?`` when the
    proxy does not say."""
    if not isinstance(value, Mapping):
        return "?"
    return ", ".join(f"{printable(k)} {printable(v)}" for k, v in value.items()) or "-"


def _state(node: Mapping[str, Any], now: float) -> str:
    cordon = node.get("cordon")
    if isinstance(cordon, Mapping):
        return f"cordoned: {printable(cordon.get('reason', ''))}"
    until = node.get("coolingUntil")
    if isinstance(until, int | float):
        left = until / 1000 - now
        return f"cooling, {math.ceil(left)}s left" if left > 0 else "cooling, being re-checked"
    return "in service"


def _slots(node: Mapping[str, Any]) -> str:
    limit = node.get("slots")
    used = json_text(node.get("slotsInUse"))
    return f"{used}/{limit}" if isinstance(limit, int) and limit > 0 else f"{used}/no limit"


def node_table(result: Mapping[str, Any], now: float) -> str:
    """``nodes/list``: one row per node, then the queue."""
    nodes = result.get("nodes")
    rows = [
        [
            node.get("id"),
            node.get("kind"),
            _state(node, now),
            _slots(node),
            _names(node.get("models")),
            _names(node.get("loaded")),
            _contexts(node.get("contexts")),
            node.get("url"),
        ]
        for node in (nodes if isinstance(nodes, list) else [])
        if isinstance(node, Mapping)
    ]
    if not rows:
        return f"no nodes\nqueue: {printable(result.get('queueDepth'))} waiting"
    head = ["ID", "KIND", "STATE", "IN USE", "MODELS", "LOADED", "CONTEXT", "URL"]
    return f"{table(head, rows)}\nqueue: {printable(result.get('queueDepth'))} waiting"


def usage_table(result: Mapping[str, Any], by: Sequence[str]) -> str:
    """``usage/report``: the grouping columns, then the counts; the scope last."""
    rows = result.get("rows")
    found = [row for row in (rows if isinstance(rows, list) else []) if isinstance(row, Mapping)]
    scope = f"scope: {printable(result.get('scope'))}"
    if not found:
        return f"no requests in that span\n{scope}"
    columns = [*by, *USAGE_COUNTS]
    head = [c.replace("_", " ").upper() for c in columns]
    shown = [[row.get(c) for c in columns] for row in found]
    return f"{table(head, shown, right=len(USAGE_COUNTS))}\n{scope}"


def drained(result: Mapping[str, Any]) -> tuple[str, int]:
    """``node/drain``: a sentence; status 1 when the timeout came first."""
    node = printable(result.get("id"))
    if result.get("drained") is True:
        waited = result.get("waited_ms")
        seconds = waited / 1000 if isinstance(waited, int | float) else 0.0
        return f"{node} drained in {seconds:.1f} s (it stays cordoned: uncordon {node})", 0
    left = printable(result.get("inFlight"))
    return f"{node} not drained: {left} still in flight at the timeout (it stays cordoned)", 1


def cordoned(result: Mapping[str, Any]) -> tuple[str, int]:
    cordon = result.get("cordon")
    reason = cordon.get("reason") if isinstance(cordon, Mapping) else None
    node = printable(result.get("id"))
    return (
        f"{node} cordoned ({printable(reason)}); {printable(result.get('inFlight'))} in flight",
        0,
    )


def uncordoned(result: Mapping[str, Any]) -> tuple[str, int]:
    node = printable(result.get("id"))
    if result.get("uncordoned") is True:
        return f"{node} uncordoned: it takes new work again", 0
    return f"{node} was not cordoned", 0


def changed_models(result: Mapping[str, Any]) -> tuple[str, int]:
    """``model/load`` and ``model/unload``: a row per node; status 1 when any node failed."""
    nodes = result.get("nodes")
    answers = nodes if isinstance(nodes, Mapping) else {}
    model = printable(result.get("model"))
    if not answers:
        return f"no node serves {model}: nothing to do (name nodes with --node)", 1
    rows = []
    for node_id, answer in sorted(answers.items()):
        said = answer if isinstance(answer, Mapping) else {}
        if "error" in said:
            code = said.get("status")
            status = "failed" if code is None else f"failed ({printable(code)})"
        else:
            status = printable(said.get("status"))
        rows.append([node_id, status, said.get("error", "")])
    failed = any(isinstance(a, Mapping) and "error" in a for a in answers.values())
    return table(["NODE", "STATUS", "ERROR"], rows), 1 if failed else 0


def level_set(result: Mapping[str, Any]) -> tuple[str, int]:
    return f"log level: {printable(result.get('level'))}", 0
