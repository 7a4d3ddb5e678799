"""Tests for nvpair_tw.ctl._show: the tables and sentences, their exit statuses, and that nothing
the proxy sends reaches the terminal as a control sequence."""

from __future__ import annotations

import re
from typing import Any

import pytest

from nvpair_tw.ctl._show import (
    USAGE_COUNTS,
    changed_models,
    cordoned,
    drained,
    level_set,
    node_table,
    printable,
    table,
    uncordoned,
    usage_table,
)

NOW = 1_800_000_000.0


def test_the_usage_columns_are_the_counts_the_usage_history_keeps() -> None:
    """nvpair-ctl names the counts of a ``usage/report`` row without importing the proxy's
    usage package (the client starts without Twisted); the two lists are one contract."""
    from nvpair_tw.usage._minutes import COUNTS

    assert USAGE_COUNTS == COUNTS


def _cells(line: str) -> list[str]:
    """A table line's cells (columns are two or more spaces apart)."""
    return re.split(r"\s{2,}", line.strip())


def _node(**fields: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": "gpu1",
        "url": "http://10.0.0.11:11434",
        "models": ["llama3:latest", "qwen2:7b"],
        "loaded": ["llama3:latest"],
        "kind": "ollama",
        "coolingUntil": None,
        "slots": 4,
        "slotsInUse": 1,
        "cordon": None,
        "contexts": {"llama3:latest": 8192},
    }
    node.update(fields)
    return node


def test_a_table_pads_columns_and_right_aligns_the_counts() -> None:
    shown = table(["NAME", "N"], [["a", 5], ["longer", 123]], right=1)
    assert shown.splitlines() == ["NAME      N", "a         5", "longer  123"]


def test_node_table_rows_say_state_slots_models_residency_and_contexts() -> None:
    """A row per node: its state, slots in use, models, what is loaded and the context each
    model is served with (``-``: none said; ``?``: a proxy that does not say)."""
    nodes = [
        _node(),
        _node(id="gpu2", cordon={"reason": "driver upgrade", "since": 1, "origin": "control"}),
        _node(id="gpu3", coolingUntil=int((NOW + 41.2) * 1000), slots=0, slotsInUse=2),
        _node(id="gpu4", coolingUntil=int((NOW - 1) * 1000), loaded=None, models=[], contexts={}),
        _node(id="mac", kind="omlx", loaded=[], contexts=None),
        _node(id="r", kind="openai", contexts={"a": 8192, "b": 4096}),
    ]
    shown = node_table({"nodes": nodes, "queueDepth": 3}, NOW).splitlines()
    assert _cells(shown[0]) == [
        "ID", "KIND", "STATE", "IN USE", "MODELS", "LOADED", "CONTEXT", "URL"
    ]  # fmt: skip
    rows = [_cells(line) for line in shown[1:-1]]
    url = "http://10.0.0.11:11434"
    both = "llama3:latest, qwen2:7b"
    llama = ["llama3:latest", "llama3:latest 8192"]
    assert rows == [
        ["gpu1", "ollama", "in service", "1/4", both, *llama, url],
        ["gpu2", "ollama", "cordoned: driver upgrade", "1/4", both, *llama, url],
        ["gpu3", "ollama", "cooling, 42s left", "2/no limit", both, *llama, url],
        ["gpu4", "ollama", "cooling, being re-checked", "1/4", "-", "?", "-", url],
        ["mac", "omlx", "in service", "1/4", both, "-", "?", url],
        ["r", "openai", "in service", "1/4", both, "llama3:latest", "a 8192, b 4096", url],
    ]
    assert shown[-1] == "queue: 3 waiting"


def test_no_nodes_is_said_in_words() -> None:
    assert node_table({"nodes": [], "queueDepth": 0}, NOW) == "no nodes\nqueue: 0 waiting"


def test_what_the_proxy_sends_cannot_drive_the_terminal() -> None:
    """A node id from a discovery agent with an escape sequence is shown escaped."""
    hostile = "evil\x1b]0;pwned\x07\x1b[2J"
    shown = node_table({"nodes": [_node(id=hostile, models=["m\nx"])], "queueDepth": 0}, NOW)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in shown and "m\\nx" in shown
    assert printable("caf\u00e9 \u2603") == "caf\u00e9 \u2603"  # printable text is kept


def test_usage_table_has_the_grouping_columns_then_the_counts() -> None:
    rows = [
        {"key": "team-a", "model": "llama3:latest", "requests": 42, "errors": 1}
        | {"prompt_tokens": 5120, "completion_tokens": 9800, "unknown_tokens": 0}
        | {"cached_tokens": 4096, "unknown_cached": 2},
        # a proxy of an earlier version reports no cached counts
        {"key": "team-b", "model": "qwen2", "requests": 1, "errors": 0}
        | {"prompt_tokens": 10, "completion_tokens": 20, "unknown_tokens": 0},
    ]
    shown = usage_table({"rows": rows, "scope": "fleet"}, ["key", "model"]).splitlines()
    assert shown == [
        "KEY     MODEL          REQUESTS  ERRORS  PROMPT TOKENS  COMPLETION TOKENS  UNKNOWN TOKENS"
        "  CACHED TOKENS  UNKNOWN CACHED",
        "team-a  llama3:latest        42       1           5120               9800               0"
        "           4096               2",
        "team-b  qwen2                 1       0             10                 20               0"
        "              -               -",
        "scope: fleet",
    ]
    empty = usage_table({"rows": [], "scope": "local"}, ["key"])
    assert empty == "no requests in that span\nscope: local"


def test_a_drain_that_timed_out_is_status_1() -> None:
    assert drained({"id": "gpu2", "drained": True, "waited_ms": 48210}) == (
        "gpu2 drained in 48.2 s (it stays cordoned: uncordon gpu2)",
        0,
    )
    assert drained({"id": "gpu2", "drained": False, "inFlight": 2}) == (
        "gpu2 not drained: 2 still in flight at the timeout (it stays cordoned)",
        1,
    )


def test_cordon_uncordon_and_the_level_are_sentences() -> None:
    given = {"id": "gpu2", "cordon": {"reason": "upgrade"}, "inFlight": 1}
    assert cordoned(given) == ("gpu2 cordoned (upgrade); 1 in flight", 0)
    assert uncordoned({"id": "gpu2", "uncordoned": True}) == (
        "gpu2 uncordoned: it takes new work again",
        0,
    )
    assert uncordoned({"id": "gpu2", "uncordoned": False}) == ("gpu2 was not cordoned", 0)
    assert level_set({"level": "warn"}) == ("log level: warn", 0)


@pytest.mark.parametrize(
    ("nodes", "rows", "status"),
    [
        ({"a": {"status": "loaded"}}, [["a", "loaded"]], 0),
        (
            {"b": {"error": "timed out"}, "a": {"status": "loaded"}},
            [["a", "loaded"], ["b", "failed", "timed out"]],
            1,
        ),
        (
            {"a": {"error": "model 'x' not found", "status": 404}},
            [["a", "failed (404)", "model 'x' not found"]],
            1,
        ),
    ],
)
def test_a_load_fails_when_any_node_fails(
    nodes: dict[str, Any], rows: list[list[str]], status: int
) -> None:
    text, code = changed_models({"model": "x", "nodes": nodes})
    lines = text.splitlines()
    assert _cells(lines[0]) == ["NODE", "STATUS", "ERROR"]
    assert [_cells(line) for line in lines[1:]] == rows
    assert code == status


def test_a_load_with_no_node_to_ask_is_status_1() -> None:
    assert changed_models({"model": "x", "nodes": {}}) == (
        "no node serves x: nothing to do (name nodes with --node)",
        1,
    )
