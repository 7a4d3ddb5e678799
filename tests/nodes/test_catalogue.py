"""One model, many names (docs/behaviour.md §11.4): the ``[[model]]`` tables."""

from __future__ import annotations

from typing import Any

import pytest

from nvpair_tw.core._engines import normalise_ollama
from nvpair_tw.nodes._catalogue import Catalogue, CatalogueError, ModelNames, parse_catalogue

pytestmark = pytest.mark.timeout(10)

TABLES = [
    {"name": "llama3.1:8b", "aliases": ["meta-llama-3.1-8b-instruct", "mlx/Llama-3.1-8B"]},
    {"name": "qwen"},
]


def test_every_name_of_a_model_leads_to_its_public_name() -> None:
    catalogue = parse_catalogue("f", TABLES)
    for name in ("llama3.1:8b", "meta-llama-3.1-8b-instruct", " mlx/Llama-3.1-8B "):
        assert catalogue.public(name) == "llama3.1:8b"
    assert catalogue.lookup("mlx/Llama-3.1-8B").names == (
        "llama3.1:8b",
        "meta-llama-3.1-8b-instruct",
        "mlx/Llama-3.1-8B",
    )
    assert catalogue.public("qwen") == "qwen"
    assert [m.public for m in catalogue.models()] == ["llama3.1:8b", "qwen"]


def test_an_undeclared_model_is_its_own_public_name() -> None:
    catalogue = parse_catalogue("f", TABLES)
    assert catalogue.lookup("phi3") == ModelNames("phi3")
    assert Catalogue.empty().public(" phi3 ") == "phi3"
    assert parse_catalogue("f", None) == Catalogue.empty()


def test_a_listed_name_is_matched_under_the_node_kind_rule() -> None:
    """``llama3.1`` declared, Ollama lists ``llama3.1:latest``: the same model."""
    catalogue = parse_catalogue("f", [{"name": "pub", "aliases": ["llama3.1"]}])
    assert catalogue.public_of("llama3.1:latest", normalise_ollama) == "pub"
    assert catalogue.public_of("llama3.1:latest", str.strip) is None
    assert catalogue.public_of("other", normalise_ollama) is None


@pytest.mark.parametrize(
    ("tables", "needle"),
    [
        ({"name": "x"}, "'model' must be an array of tables"),
        (["x"], "model 1: must be a table"),
        ([{"aliases": ["a"]}], "name: required"),
        ([{"name": " "}], "name: required"),
        ([{"name": "x", "aliases": "a"}], "aliases: a list of non-empty strings"),
        ([{"name": "x", "aliases": [""]}], "aliases: a list of non-empty strings"),
        ([{"name": "x", "alias": ["a"]}], "unknown field 'alias'; did you mean 'aliases'"),
        ([{"name": "x"}, {"name": "x"}], "declared twice"),
        (
            [{"name": "x", "aliases": ["a"]}, {"name": "y", "aliases": ["a"]}],
            "'a' is already a name of 'x'",
        ),
        ([{"name": "x"}, {"name": "y", "aliases": ["x"]}], "'x' is already a name of 'x'"),
    ],
)
def test_a_bad_model_table_is_refused_with_one_clear_line(tables: Any, needle: str) -> None:
    with pytest.raises(CatalogueError, match=needle):
        parse_catalogue("nodes file f", tables)
