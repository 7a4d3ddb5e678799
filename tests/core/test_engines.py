# -*- test-case-name: tests.core.test_engines -*-
"""Engine profiles: route classification (docs/behaviour.md §2), name matching (§4.1), inventory parsing (§3, §4.3)."""

from __future__ import annotations

from typing import Any

import pytest

from nvpair_tw.core._engines import (
    ENGINES,
    LMSTUDIO,
    LMSTUDIO_LOADED,
    OLLAMA,
    OLLAMA_PS,
    OMLX,
    OPENAI_MODELS,
    TAGS,
    RouteKind,
    lmstudio_loaded_ids,
    normalise_ollama,
    openai_model_ids,
    ps_names,
    tags_names,
)

OPENAI_INFERENCE = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/responses",
]
LMSTUDIO_INFERENCE = ["/api/v0/chat/completions", "/api/v0/completions", "/api/v0/embeddings"]
OLLAMA_INFERENCE = ["/api/generate", "/api/chat", "/api/embed", "/api/embeddings"]
PASS_THROUGH = [
    "/api/pull",
    "/api/version",
    "/api/delete",
    "/api/v0/models/",
    "/api/v0/model",
    "/v1/responses/resp_1",
    "/v1/models/status",
    "/health",
    "/",
    "/v1/chat/completions/",
    "/V1/chat/completions",
    "/v1/models/",
]


def test_all_four_engines_are_registered() -> None:
    """``ENGINES`` holds ollama, lmstudio, omlx and openai with docs/behaviour.md §1's and §11.2's
    default listeners and nodes."""
    assert {name: (p.default_listen, p.default_node_url) for name, p in ENGINES.items()} == {
        "ollama": ("tcp:11435:interface=127.0.0.1", "http://127.0.0.1:11434"),
        "lmstudio": ("tcp:1235:interface=127.0.0.1", "http://127.0.0.1:1234"),
        "omlx": ("tcp:8001:interface=127.0.0.1", "http://127.0.0.1:8000"),
        "openai": ("tcp:4000:interface=127.0.0.1", "http://127.0.0.1:8080"),
    }


def test_the_openai_facade_fronts_one_default_node_of_each_local_engine() -> None:
    """§11.2: with no nodes, ``--engine openai`` fronts Ollama, LM Studio and oMLX by their kinds."""
    assert ENGINES["openai"].default_kinds == ("ollama", "lmstudio", "omlx")
    assert [p.default_kinds for n, p in ENGINES.items() if n != "openai"] == [(), (), ()]


@pytest.mark.parametrize(
    ("kind", "path", "native"),
    [
        ("ollama", "/api/chat", True),
        ("ollama", "/v1/chat/completions", True),
        ("ollama", "/api/v0/chat/completions", False),
        ("lmstudio", "/api/v0/chat/completions", True),
        ("lmstudio", "/v1/embeddings", True),
        ("lmstudio", "/api/chat", False),
        ("omlx", "/v1/chat/completions", True),
        ("omlx", "/api/generate", False),
        ("openai", "/v1/messages", True),
        ("ollama", "/v1/messages", False),
        ("ollama", "/v1/messages/count_tokens", False),
        ("openai", "/api/embed", False),
        ("openai", "/api/v0/models", False),
    ],
)
def test_each_kind_speaks_its_own_routes_natively(kind: str, path: str, native: bool) -> None:
    """§11.3: which client routes a node of each kind is sent as they are."""
    assert ENGINES[kind].speaks(path) is native


def test_openai_names_compare_exactly() -> None:
    """§11.1: an ``openai`` node's names match exactly (no ``:latest``, no case folding)."""
    openai = ENGINES["openai"]
    assert openai.matches("SmolLM2", "SmolLM2")
    assert not openai.matches("smollm2", "SmolLM2")
    assert not openai.matches("smollm2", "smollm2:latest")


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("path", OPENAI_INFERENCE)
def test_openai_inference_paths_are_inference_on_post(engine: str, path: str) -> None:
    """The OpenAI-style and Anthropic-style paths are inference for every engine, POST only."""
    profile = ENGINES[engine]
    assert profile.classify(b"POST", path) is RouteKind.INFERENCE
    for method in (b"GET", b"OPTIONS", b"PUT", b"HEAD", b"post"):
        assert profile.classify(method, path) is RouteKind.PASS_THROUGH


@pytest.mark.parametrize("path", OLLAMA_INFERENCE)
def test_ollama_native_inference_paths(path: str) -> None:
    """``/api/generate`` and friends are inference for ollama only; other engines pass them through."""
    assert OLLAMA.classify(b"POST", path) is RouteKind.INFERENCE
    assert OLLAMA.classify(b"OPTIONS", path) is RouteKind.PASS_THROUGH
    assert LMSTUDIO.classify(b"POST", path) is RouteKind.PASS_THROUGH
    assert OMLX.classify(b"POST", path) is RouteKind.PASS_THROUGH


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_v1_models_is_a_model_list_on_get_only(engine: str) -> None:
    """``GET /v1/models`` is answered by the proxy for every engine; POST passes through."""
    profile = ENGINES[engine]
    assert profile.classify(b"GET", "/v1/models") is RouteKind.MODEL_LIST
    assert profile.classify(b"POST", "/v1/models") is RouteKind.PASS_THROUGH
    assert profile.classify(b"HEAD", "/v1/models") is RouteKind.PASS_THROUGH


def test_api_tags_is_a_model_list_for_ollama_only() -> None:
    """``GET /api/tags`` is aggregated by the ollama facade; the others pass it through."""
    assert OLLAMA.classify(b"GET", "/api/tags") is RouteKind.MODEL_LIST
    assert OLLAMA.classify(b"POST", "/api/tags") is RouteKind.PASS_THROUGH
    assert LMSTUDIO.classify(b"GET", "/api/tags") is RouteKind.PASS_THROUGH
    assert OMLX.classify(b"GET", "/api/tags") is RouteKind.PASS_THROUGH


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("path", PASS_THROUGH)
def test_everything_else_passes_through(engine: str, path: str) -> None:
    """Other paths (engine extras, near misses, trailing slashes) are forwarded verbatim."""
    profile = ENGINES[engine]
    for method in (b"GET", b"POST", b"DELETE"):
        assert profile.classify(method, path) is RouteKind.PASS_THROUGH


def test_issue_14_routes_are_classified_per_engine() -> None:
    """``/api/show`` is model-routed and ``/api/ps`` a model list on ollama only; LM Studio's
    ``/api/v0`` REST API is inference, a model list and a model-routed lookup on lmstudio only."""
    assert OLLAMA.classify(b"POST", "/api/show") is RouteKind.MODEL_ROUTED
    assert OLLAMA.classify(b"GET", "/api/show") is RouteKind.PASS_THROUGH
    assert OLLAMA.classify(b"GET", "/api/ps") is RouteKind.MODEL_LIST
    assert LMSTUDIO.classify(b"GET", "/api/v0/models") is RouteKind.MODEL_LIST
    assert LMSTUDIO.classify(b"GET", "/api/v0/models/qwen%2F7b") is RouteKind.MODEL_ROUTED
    for path in LMSTUDIO_INFERENCE:
        assert LMSTUDIO.classify(b"POST", path) is RouteKind.INFERENCE
        assert OLLAMA.classify(b"POST", path) is RouteKind.PASS_THROUGH
        assert OMLX.classify(b"POST", path) is RouteKind.PASS_THROUGH
    for profile in (LMSTUDIO, OMLX):
        assert profile.classify(b"POST", "/api/show") is RouteKind.PASS_THROUGH
        assert profile.classify(b"GET", "/api/ps") is RouteKind.PASS_THROUGH
    assert OMLX.classify(b"GET", "/api/v0/models/x") is RouteKind.PASS_THROUGH


def test_model_routes_read_the_model_from_the_body_or_the_path() -> None:
    """``/api/show`` takes ``model``, else ``name``; ``/api/v0/models/{id}`` the path's tail."""
    show = OLLAMA.model_route(b"POST", "/api/show")
    assert show is not None
    assert show.model("/api/show", {"model": "a", "name": "b"}) == "a"
    assert show.model("/api/show", {"name": "b"}) == "b"
    assert show.model("/api/show", {"model": " "}) is None
    assert show.model("/api/show", None) is None
    # The path is already decoded by the one parse of docs/behaviour.md §14.1.
    lookup = LMSTUDIO.model_route(b"GET", "/api/v0/models/qwen/7b")
    assert lookup is not None
    assert lookup.model("/api/v0/models/qwen/7b", None) == "qwen/7b"
    assert lookup.model("/api/v0/models/a%2Fb", None) == "a%2Fb"  # never decoded twice


@pytest.mark.parametrize(
    ("name", "normalised"),
    [
        ("llama3", "llama3:latest"),
        ("llama3:latest", "llama3:latest"),
        ("llama3:8b", "llama3:8b"),
        ("ns/llama3", "ns/llama3:latest"),
        ("host:5000/ns/m", "host:5000/ns/m:latest"),
        ("host:5000/ns/m:q4", "host:5000/ns/m:q4"),
        ("m@sha256:abc123", "m@sha256:abc123"),
        ("  llama3 \n", "llama3:latest"),
        ("", ""),
    ],
)
def test_ollama_names_normalise(name: str, normalised: str) -> None:
    """Trim, then add ``:latest`` when the last path segment has no tag or digest."""
    assert normalise_ollama(name) == normalised


def test_ollama_matching_treats_latest_as_implied() -> None:
    """``llama3`` ≡ ``llama3:latest``; a different tag is a different model."""
    assert OLLAMA.matches("llama3", "llama3:latest")
    assert OLLAMA.matches(" ns/llama3:latest", "ns/llama3")
    assert not OLLAMA.matches("llama3", "llama3:8b")
    assert OLLAMA.advertises("llama3", frozenset({"qwen2.5:7b", "llama3:latest"}))
    assert not OLLAMA.advertises("llama3", ("qwen2.5:7b",))


def test_lmstudio_matching_is_exact() -> None:
    """LM Studio compares names exactly: case and ``:latest`` matter."""
    assert LMSTUDIO.matches("qwen/qwen3-8b", "qwen/qwen3-8b")
    assert not LMSTUDIO.matches("Qwen/Qwen3-8B", "qwen/qwen3-8b")
    assert not LMSTUDIO.matches("llama3", "llama3:latest")
    assert not LMSTUDIO.advertises("llama3", ())


def test_omlx_matching_ignores_case_only() -> None:
    """oMLX compares case-insensitively but otherwise exactly."""
    assert OMLX.matches("Qwen3-8B-MLX-4bit", "qwen3-8b-mlx-4bit")
    assert not OMLX.matches("qwen3-8b", "qwen3-8b-mlx-4bit")
    assert OMLX.advertises("MISTRAL", ("mistral",))


def test_tags_names_prefer_model_then_name() -> None:
    """``models[].model`` is the name; ``.name`` is the fallback; nameless records are skipped."""
    document = {
        "models": [
            {"model": "llama3:latest", "name": "ignored"},
            {"name": "qwen2.5:7b"},
            {"model": "", "name": "phi3:mini"},
            {"size": 1},
            "junk",
        ]
    }
    assert tags_names(document) == ["llama3:latest", "qwen2.5:7b", "phi3:mini"]
    assert tags_names({"models": []}) == []


@pytest.mark.parametrize(
    "document", [None, [], "models", {}, {"models": None}, {"models": {"model": "x"}}]
)
def test_malformed_tags_answers_raise(document: Any) -> None:
    """An answer without a ``models`` list is malformed (the poll keeps the last good inventory)."""
    with pytest.raises(ValueError):
        tags_names(document)


def test_openai_model_ids_read_data_ids() -> None:
    """``data[].id`` are the names; records without a string id are skipped."""
    document = {
        "object": "list",
        "data": [{"id": "a"}, {"id": ""}, {"id": 3}, {"name": "b"}, "junk", {"id": "c"}],
    }
    assert openai_model_ids(document) == ["a", "c"]


@pytest.mark.parametrize("document", [None, [], {}, {"data": None}, {"data": {"id": "a"}}])
def test_malformed_openai_answers_raise(document: Any) -> None:
    """An answer without a ``data`` list is malformed."""
    with pytest.raises(ValueError):
        openai_model_ids(document)


def test_tags_record_keys_deduplicate_by_normalised_name() -> None:
    """``/api/tags`` records de-duplicate by the normalised ``model`` (else ``name``)."""
    key = TAGS.record_key
    assert key({"model": "llama3"}) == key({"name": "llama3:latest"}) == "llama3:latest"
    assert key({"model": "llama3", "name": "other"}) == "llama3:latest"
    assert key({"model": "", "name": "phi3"}) == "phi3:latest"
    assert key({"size": 1}) is None


def test_openai_record_keys_are_ids_verbatim() -> None:
    """``/v1/models`` records de-duplicate by ``id`` exactly as given."""
    key = OPENAI_MODELS.record_key
    assert key({"id": "Llama3"}) == "Llama3"
    assert key({"id": "Llama3"}) != key({"id": "llama3"})
    assert key({"id": ""}) is None
    assert key({"name": "x"}) is None


def test_envelopes_match_each_engine() -> None:
    """Merged lists are wrapped as the engine would: ``{"models": …}`` or an OpenAI list object."""
    assert TAGS.envelope([]) == {"models": []}
    assert OPENAI_MODELS.envelope([{"id": "a"}]) == {"object": "list", "data": [{"id": "a"}]}


def test_inventory_formats_per_engine() -> None:
    """Ollama polls ``/api/tags``; LM Studio and oMLX poll ``/v1/models``."""
    assert OLLAMA.inventory is TAGS
    assert LMSTUDIO.inventory is OPENAI_MODELS
    assert OMLX.inventory is OPENAI_MODELS
    assert TAGS.path == "/api/tags"
    assert TAGS.list_field == "models"
    assert OPENAI_MODELS.path == "/v1/models"
    assert OPENAI_MODELS.list_field == "data"


# --- residency (docs/behaviour.md §6.4) -----------------------------------------------------------------------


def test_residency_endpoint_is_engine_data() -> None:
    """Ollama reads /api/ps, LM Studio /api/v0/models; oMLX has no residency endpoint."""
    assert OLLAMA.residency is OLLAMA_PS and OLLAMA_PS.path == "/api/ps"
    assert LMSTUDIO.residency is LMSTUDIO_LOADED and LMSTUDIO_LOADED.path == "/api/v0/models"
    assert OMLX.residency is None


def test_ps_names_read_models_model_then_name() -> None:
    """``/api/ps`` has the ``/api/tags`` shape: ``models[].model``, else ``.name``."""
    document = {
        "models": [
            {"model": "llama3:latest", "name": "x", "size_vram": 5},
            {"name": "qwen:7b"},
            {"size": 1},
        ]
    }
    assert ps_names(document) == ["llama3:latest", "qwen:7b"]
    assert ps_names({"models": []}) == []
    malformed: Any
    for malformed in (None, [], {}, {"models": 3}):
        with pytest.raises(ValueError):
            ps_names(malformed)


def test_lmstudio_loaded_ids_keep_state_loaded_only() -> None:
    """Only records with ``state: "loaded"`` and a string id count."""
    document = {
        "object": "list",
        "data": [
            {"id": "a", "state": "loaded"},
            {"id": "b", "state": "not-loaded"},
            {"id": "c"},
            {"id": "", "state": "loaded"},
            {"id": 4, "state": "loaded"},
            {"id": "e", "state": "LOADED"},
            "junk",
            {"id": "f", "state": "loaded"},
        ],
    }
    assert lmstudio_loaded_ids(document) == ["a", "f"]
    broken: Any
    for broken in (None, [], {}, {"data": None}, {"data": {"id": "a"}}):
        with pytest.raises(ValueError):
            lmstudio_loaded_ids(broken)
