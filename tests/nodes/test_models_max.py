"""``models_max`` in the nodes file: how many models a llama.cpp router keeps loaded at once
(docs/behaviour.md §17.2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvpair_tw.nodes import NodesFileError, load_nodes_file


def test_models_max_is_per_node_and_unset_means_ask_the_router(tmp_path: Path) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text(
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\nkind = 'openai'\nmodels_max = 2\n"
        "[[node]]\nid = 'b'\nurl = 'http://b:1'\nkind = 'openai'\nmodels_max = 0\n"
        "[[node]]\nid = 'c'\nurl = 'http://c:1'\nkind = 'openai'\n"
    )
    nodes = load_nodes_file(str(path), "openai")
    assert [(n.id, n.models_max) for n in nodes] == [("a", 2), ("b", 0), ("c", None)]


@pytest.mark.parametrize("value", ["-1", "'2'", "1.5", "true"])
def test_a_bad_models_max_names_the_node_and_field(tmp_path: Path, value: str) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text(f"[[node]]\nid = 'a'\nurl = 'http://a:1'\nmodels_max = {value}\n")
    with pytest.raises(NodesFileError, match=r"node 1 \(id 'a'\): models_max: must be a whole"):
        load_nodes_file(str(path), "ollama")
