"""Model-list records synthesised from what a node of another kind reports."""

from __future__ import annotations

import hashlib

import pytest

from nvpair_tw.dialects import ModelFacts, client_fields, facts_from, record_for, show_answer

pytestmark = pytest.mark.timeout(60)

V0 = {
    "object": "list",
    "data": [
        {
            "id": "qwen2-vl-7b-instruct",
            "object": "model",
            "type": "vlm",
            "publisher": "mlx-community",
            "arch": "qwen2_vl",
            "compatibility_type": "mlx",
            "quantization": "4bit",
            "state": "not-loaded",
            "max_context_length": 32768,
        },
        {"id": "text-embedding-nomic", "object": "model", "type": "embeddings", "state": "loaded"},
    ],
}


def test_lm_studio_v0_models_give_type_state_and_context() -> None:
    assert facts_from("/api/v0/models", V0) == [
        ModelFacts("qwen2-vl-7b-instruct", 32768, "vlm", False),
        ModelFacts("text-embedding-nomic", None, "embeddings", True),
    ]


def test_ollama_lists_and_v1_models_give_names_and_residency() -> None:
    tags = {"models": [{"name": "llama3:latest", "model": "llama3:latest", "details": {}}]}
    ps = {"models": [{"model": "llama3:latest", "context_length": 4096}]}
    assert facts_from("/api/tags", tags) == [ModelFacts("llama3:latest")]
    assert facts_from("/api/ps", ps) == [ModelFacts("llama3:latest", 4096, None, True)]
    v1 = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "me"}]}
    assert facts_from("/v1/models", v1) == [ModelFacts("m")]


@pytest.mark.parametrize(
    ("path", "document"),
    [("/api/tags", []), ("/api/tags", {"models": [1]}), ("/v1/models", {}), ("/x", {})],
)
def test_a_list_of_the_wrong_shape_is_a_value_error(path: str, document: object) -> None:
    with pytest.raises(ValueError):
        facts_from(path, document)


def test_records_hold_only_known_fields() -> None:
    bare = ModelFacts("m")
    full = ModelFacts("m", 8192, "llm", True)
    assert record_for("/api/tags", full) == {"name": "m", "model": "m"}
    assert record_for("/api/ps", full) == {"name": "m", "model": "m", "context_length": 8192}
    assert record_for("/api/ps", bare) == {"name": "m", "model": "m"}
    assert record_for("/v1/models", full) == {"id": "m", "object": "model"}
    assert record_for("/api/v0/models", full) == {
        "id": "m",
        "object": "model",
        "type": "llm",
        "state": "loaded",
        "max_context_length": 8192,
    }
    assert record_for("/api/v0/models", bare) == {"id": "m", "object": "model"}
    with pytest.raises(ValueError):
        record_for("/api/show", bare)


def test_show_answer_takes_capabilities_from_type_and_has_no_model_info() -> None:
    assert show_answer(ModelFacts("e", type="embeddings")) == {
        "details": {},
        "capabilities": ["embedding"],
    }
    assert show_answer(ModelFacts("v", 4096, "vlm"))["capabilities"] == ["completion", "vision"]
    assert show_answer(ModelFacts("m", 4096)) == {"details": {}, "capabilities": ["completion"]}


def test_client_fields_add_what_the_ollama_cli_reads_and_keep_what_is_there() -> None:
    """docs/behaviour.md §17.6: digest (SHA-256 of the public name), size 0, first seen, details."""
    added = client_fields("/api/tags", {"name": "m"}, public="m:latest", first_seen=90.5, owner="x")
    assert added == {
        "name": "m",
        "model": "m:latest",
        "modified_at": "1970-01-01T00:01:30.500000Z",
        "size": 0,
        "digest": hashlib.sha256(b"m:latest").hexdigest(),
        "details": {},
    }
    kept = {"name": "m", "model": "m", "size": 7, "digest": "d" * 64, "modified_at": "t"}
    assert client_fields(
        "/api/ps", {**kept, "details": {}}, public="m", first_seen=0, owner="x"
    ) == {
        **kept,
        "details": {},
    }
    short = client_fields("/api/ps", {**kept, "digest": "abc"}, public="m", first_seen=0, owner="x")
    assert short["digest"] == hashlib.sha256(b"m").hexdigest()


def test_client_fields_of_an_openai_list_and_others() -> None:
    record = client_fields("/v1/models", {"id": "m"}, public="m", first_seen=12.7, owner="lmstudio")
    assert record == {"id": "m", "object": "model", "created": 12, "owned_by": "lmstudio"}
    lm = {"id": "m", "object": "model"}
    assert client_fields("/api/v0/models", lm, public="m", first_seen=0, owner="x") is lm


def test_sizes_are_read_from_ollama_lists_and_kept_in_records() -> None:
    tags = {"models": [{"name": "m", "size": 123}, {"name": "n", "size": True}]}
    facts = facts_from("/api/tags", tags)
    assert [f.size for f in facts] == [123, None]
    assert record_for("/api/tags", facts[0]) == {"name": "m", "model": "m", "size": 123}
