"""Per-model defaults and fallbacks in the nodes file (docs/behaviour.md §16.1, §16.2)."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path
from typing import Any

import pytest

from nvpair_tw.nodes import NodesFileError
from nvpair_tw.nodes._catalogue import CatalogueError, parse_catalogue
from nvpair_tw.nodes._directory import load_nodes_document
from nvpair_tw.nodes._policy import ModelPolicy

pytestmark = pytest.mark.timeout(10)


def test_a_table_reads_its_defaults_force_and_fallbacks() -> None:
    tables = tomllib.loads(
        """
        [[model]]
        name = "qwen3:32b"
        aliases = ["qwen-big"]
        defaults = { keep_alive = "30m", think = false, options = { num_ctx = 16384 } }
        force = { options = { num_gpu = 99 } }
        fallbacks = ["qwen3:8b", " smollm2 ", "qwen3:8b"]
        fallback_after = "1m30s"
        """
    )["model"]
    catalogue = parse_catalogue("f", tables)
    policy = catalogue.policy("qwen3:32b")
    assert policy.defaults == {
        "keep_alive": "30m",
        "think": False,
        "options": {"num_ctx": 16384},
    }
    assert policy.force == {"options": {"num_gpu": 99}}
    assert policy.fallbacks == ("qwen3:8b", "smollm2")
    assert policy.fallback_after == 90.0
    assert policy.edits


def test_a_model_without_a_table_has_an_empty_policy() -> None:
    catalogue = parse_catalogue("f", [{"name": "x"}])
    policy = catalogue.policy("x")
    assert isinstance(policy, ModelPolicy)
    assert (policy.defaults, policy.force, policy.fallbacks, policy.fallback_after) == (
        {},
        {},
        (),
        None,
    )
    assert not policy.edits
    assert catalogue.policies == {}


@pytest.mark.parametrize("field", ["model", "Messages", "PROMPT", "input", "stream"])
@pytest.mark.parametrize("table", ["defaults", "force"])
def test_a_table_may_not_set_what_the_client_runs(field: str, table: str) -> None:
    with pytest.raises(CatalogueError, match=f"{table}: '{field}' may not be set here"):
        parse_catalogue("nodes file f", [{"name": "x", table: {field: "y"}}])


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"defaults": "x"}, "defaults: must be a table"),
        ({"force": {"options": 4}}, "force: options: must be a table"),
        ({"defaults": {"keep_alive": "1m", "Keep_Alive": "2m"}}, "are the same field"),
        ({"defaults": {"at": datetime.date(2026, 1, 1)}}, "defaults: at: a date or time"),
        ({"defaults": {"o": {"t": datetime.time(1, 2)}}}, r"defaults: o\.t: a date or time"),
        ({"fallbacks": "y"}, "fallbacks: a list of non-empty model names"),
        ({"fallbacks": [""]}, "fallbacks: a list of non-empty model names"),
        (
            {"fallbacks": ["y"], "fallback_after": "soon"},
            "fallback_after: 'soon' is not a duration; write 5s, 2m or 1m30s$",
        ),
        (
            {"fallbacks": ["y"], "fallback_after": "30"},
            "fallback_after: '30' is not a duration; write 30s, 2m or 1m30s$",
        ),
        (
            {"fallbacks": ["y"], "fallback_after": "-1s"},
            "fallback_after: '-1s' must be zero or more; write 5s, 2m or 1m30s$",
        ),
        (
            {"fallbacks": ["y"], "fallback_after": 5},
            'fallback_after: a quoted duration such as "30s", not 5$',
        ),
    ],
)
def test_a_bad_policy_is_refused_with_one_clear_line(entry: dict[str, Any], needle: str) -> None:
    with pytest.raises(CatalogueError, match=needle):
        parse_catalogue("nodes file f", [{"name": "x", **entry}])


@pytest.mark.parametrize(
    ("tables", "cycle"),
    [
        ([{"name": "a", "fallbacks": ["a"]}], "a -> a"),
        ([{"name": "a", "fallbacks": ["b"]}, {"name": "b", "fallbacks": ["a"]}], "a -> b -> a"),
        (
            [
                {"name": "a", "fallbacks": ["b"]},
                {"name": "b", "fallbacks": ["c"]},
                {"name": "c", "aliases": ["c2"], "fallbacks": ["x", "a"]},
            ],
            "a -> b -> c -> a",
        ),
        # an alias names its model: b's fallback "a-alias" is a
        (
            [
                {"name": "a", "aliases": ["a-alias"], "fallbacks": ["b"]},
                {"name": "b", "fallbacks": ["a-alias"]},
            ],
            "a -> b -> a",
        ),
    ],
)
def test_a_cycle_among_fallbacks_is_refused(tables: list[dict[str, Any]], cycle: str) -> None:
    with pytest.raises(CatalogueError, match=f"fallbacks form a cycle: {cycle}"):
        parse_catalogue("nodes file f", tables)


def test_fallbacks_that_share_a_model_are_no_cycle() -> None:
    tables = [
        {"name": "a", "fallbacks": ["c"]},
        {"name": "b", "fallbacks": ["c", "a"]},
        {"name": "c"},
    ]
    assert parse_catalogue("f", tables).policy("b").fallbacks == ("c", "a")


def test_a_nodes_file_with_a_reserved_default_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text(
        '[[node]]\nid = "a"\nurl = "http://127.0.0.1:1"\n\n'
        '[[model]]\nname = "x"\ndefaults = { stream = false }\n'
    )
    with pytest.raises(NodesFileError, match="defaults: 'stream' may not be set here"):
        load_nodes_document(str(path), "ollama")
