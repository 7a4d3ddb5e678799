"""Context fit (nvpair_tw.selection._contexts, docs/behaviour.md §15.3)."""

from __future__ import annotations

from nvpair_tw.selection._contexts import ANY_MODEL, Fit, fit, props_context, ps_contexts


def test_ollama_ps_gives_each_loaded_models_context_where_it_says() -> None:
    document = {
        "models": [
            {"name": "llama3:latest", "model": "llama3:latest", "context_length": 2048},
            {"name": "qwen:7b", "model": "qwen:7b"},  # an older Ollama: not said
            {"name": "bad", "context_length": True},
            "junk",
        ]
    }
    assert ps_contexts(document) == {"llama3:latest": 2048}
    assert ps_contexts([]) == {}


def test_llamacpp_props_gives_the_per_slot_context() -> None:
    assert props_context({"n_ctx": 8192, "total_slots": 4}) == {ANY_MODEL: 2048}
    assert props_context({"default_generation_settings": {"n_ctx": 4096}}) == {ANY_MODEL: 4096}
    assert props_context({"total_slots": 1}) == {}
    assert props_context(None) == {}


def test_a_node_too_small_is_no_candidate_while_one_fits() -> None:
    contexts = {"small": 2048, "big": 32768}
    assert fit(["small", "big"], 10_000, contexts.get) == Fit(["big"], True)


def test_a_node_of_unknown_context_still_fits() -> None:
    contexts = {"small": 2048}
    assert fit(["small", "unknown"], 10_000, contexts.get) == Fit(["unknown"], True)


def test_when_none_fits_the_largest_is_used_and_said() -> None:
    contexts = {"a": 2048, "b": 4096, "c": 1024}
    assert fit(["a", "b", "c"], 10_000, contexts.get) == Fit(["b"], False)


def test_a_request_that_fits_everywhere_keeps_every_candidate_in_order() -> None:
    contexts = {"a": 2048, "b": 4096}
    assert fit(["b", "a"], 100, contexts.get) == Fit(["b", "a"], True)
