"""What a node holds from its kind's richest list (docs/behaviour.md §17.1, §17.2): the readers on
the documented shapes, then the inventory poll against simulated LM Studio and llama.cpp router
engines over real loopback sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
from treq.client import HTTPClient

from nvpair_tw.core._engines import LMSTUDIO, OPENAI
from nvpair_tw.nodes import Node, NodeDirectory
from nvpair_tw.selection._holdings import (
    ROUTER_CONTROL,
    Holdings,
    lmstudio_v0,
    lmstudio_v1,
    router_context,
    router_models,
    router_models_max,
)
from nvpair_tw.selection._inventory import InventoryBook
from nvpair_tw.simulated import SimulatedEngine

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    return cast(_Test, pytest_twisted.ensureDeferred(test))


# The example answer of LM Studio's "List your models" page (docs/engines/lmstudio.md), with a
# second instance of the LLM loaded at another context length.
V1_EXAMPLE = {
    "models": [
        {
            "type": "llm",
            "publisher": "lmstudio-community",
            "key": "gemma-3-270m-it-qat",
            "display_name": "Gemma 3 270m Instruct Qat",
            "architecture": "gemma3",
            "quantization": {"name": "Q4_0", "bits_per_weight": 4},
            "size_bytes": 241410208,
            "params_string": "270M",
            "loaded_instances": [
                {"id": "gemma-3-270m-it-qat", "config": {"context_length": 4096}},
                {"id": "gemma-3-270m-it-qat:2", "config": {"context_length": 2048}},
            ],
            "max_context_length": 32768,
            "format": "gguf",
            "capabilities": {"vision": False, "trained_for_tool_use": False},
            "description": None,
        },
        {
            "type": "embedding",
            "publisher": "gaianet",
            "key": "text-embedding-nomic-embed-text-v1.5-embedding",
            "display_name": "Nomic Embed Text v1.5",
            "quantization": {"name": "F16", "bits_per_weight": 16},
            "size_bytes": 274290560,
            "params_string": None,
            "loaded_instances": [],
            "max_context_length": 2048,
            "format": "gguf",
        },
    ]
}

# What this project's llama-server build answers in router mode (trimmed: args, preset).
ROUTER_MODELS = {
    "data": [
        {"id": "smolA", "object": "model", "status": {"value": "loaded", "args": []}},
        {"id": "smolB", "object": "model", "status": {"value": "unloaded"}},
        {"id": "smolC", "object": "model", "status": {"value": "loading", "args": []}},
    ],
    "object": "list",
}


def test_lmstudio_v1_lists_every_key_and_loads_with_the_smallest_instance_context() -> None:
    """``loaded_instances`` decides residency; the context is the loaded instance's config (the
    smaller of two), never ``max_context_length``; an unloaded model has no context."""
    assert lmstudio_v1(V1_EXAMPLE) == Holdings(
        frozenset({"gemma-3-270m-it-qat", "text-embedding-nomic-embed-text-v1.5-embedding"}),
        frozenset({"gemma-3-270m-it-qat"}),
        {"gemma-3-270m-it-qat": 2048},
    )


@pytest.mark.parametrize(
    "document", [{"object": "list", "data": []}, {"models": 3}, [], "x"], ids=repr
)
def test_lmstudio_v1_refuses_another_shape(document: Any) -> None:
    """An older LM Studio's v0 list or garbage is not the v1 list: the next list is asked."""
    with pytest.raises(ValueError, match="models"):
        lmstudio_v1(document)


def test_lmstudio_v0_reads_state_and_the_only_context_it_gives() -> None:
    document = {
        "object": "list",
        "data": [
            {"id": "qwen", "state": "loaded", "max_context_length": 32768},
            {"id": "phi", "state": "not-loaded", "max_context_length": 4096},
        ],
    }
    assert lmstudio_v0(document) == Holdings(
        frozenset({"qwen", "phi"}), frozenset({"qwen"}), {"qwen": 32768}
    )


def test_a_router_lists_every_model_and_only_loaded_ones_are_resident() -> None:
    assert router_models(ROUTER_MODELS) == Holdings(
        frozenset({"smolA", "smolB", "smolC"}), frozenset({"smolA"})
    )


@pytest.mark.parametrize(
    "document",
    [
        # a one-model llama-server's /models (this build): no status
        {"models": [{"name": "m"}], "object": "list", "data": [{"id": "m", "meta": {}}]},
        {"data": [{"id": "a", "status": {"value": "loaded"}}, {"id": "b"}]},
        {"data": []},
        {"error": {"code": 404}},
    ],
    ids=["one-model", "partly", "empty", "error"],
)
def test_a_list_without_per_model_status_is_not_a_router(document: Any) -> None:
    with pytest.raises(ValueError, match=r"router|no data list"):
        router_models(document)


def test_a_routers_props_say_its_models_max_and_a_models_props_its_context() -> None:
    router = {"role": "router", "max_instances": 1, "default_generation_settings": {"n_ctx": 0}}
    assert router_models_max(router) == 1
    assert router_models_max({**router, "max_instances": 0}) == 0
    assert router_models_max({"total_slots": 4}) is None
    assert router_models_max(None) is None
    assert router_context({"default_generation_settings": {"n_ctx": 2048}}) == 2048
    with pytest.raises(ValueError, match="n_ctx"):
        router_context(router)


# --- the poll, over real sockets ---------------------------------------------------------------


async def _polled(
    listen: Callable[[Any], int],
    http: HTTPClient,
    reactor: Any,
    engine: SimulatedEngine,
    **node: Any,
) -> InventoryBook:
    """A book over one node of the engine's kind at the engine's loopback port, polled once."""
    url = f"http://127.0.0.1:{listen(engine.site())}"
    profile = LMSTUDIO if engine.kind == "lmstudio" else OPENAI
    directory = NodeDirectory(profile, reactor, flag_nodes=[Node("n", url, **node)])
    book = InventoryBook(profile, directory, http, reactor, timeout=5.0)
    await book.poll_now()
    return book


def _asked(engine: SimulatedEngine) -> list[bytes]:
    return [r.path for r in engine.received]


@on_reactor
async def test_lmstudio_0_4_is_read_from_api_v1_models_alone(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """One read of ``/api/v1/models``: every model, the loaded one resident with its instance's
    context (not ``max_context_length``); residency follows the next poll."""
    engine = SimulatedEngine(
        reactor,
        models=("qwen", "phi"),
        loaded=["qwen"],
        kind="lmstudio",
        context_length=32768,
        loaded_context=4096,
    )
    book = await _polled(listen, http, reactor, engine)
    assert _asked(engine) == [b"/api/v1/models"]
    assert book.models("n") == frozenset({"qwen", "phi"})
    assert (book.resident("n", "qwen"), book.resident("n", "phi")) == (True, False)
    assert (book.context_length("n", "qwen"), book.context_length("n", "phi")) == (4096, None)
    engine.loaded = ["phi"]
    await book.poll_now()
    assert (book.resident("n", "qwen"), book.resident("n", "phi")) == (False, True)
    assert book.context_length("n", "phi") == 4096
    engine.stop()


@on_reactor
async def test_an_lmstudio_without_its_rest_lists_falls_back_to_v1_models(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """Neither ``/api/v1/models`` nor ``/api/v0/models`` answers: names from ``/v1/models``,
    residency and contexts unknown."""
    engine = SimulatedEngine(reactor, models=("qwen",), kind="lmstudio")
    book = await _polled(listen, http, reactor, engine)
    assert _asked(engine) == [b"/api/v1/models", b"/api/v0/models", b"/v1/models"]
    assert book.models("n") == frozenset({"qwen"})
    assert book.resident("n", "qwen") is None and book.loaded("n") is None
    assert book.context_length("n", "qwen") is None
    engine.stop()


@on_reactor
async def test_a_router_is_read_from_models_and_props_without_loading_anything(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """§17.2: inventory from ``/models``, ``loaded`` resident, the context of each loaded model
    from ``/props?model=NAME&autoload=false`` (never asked of the others, never without
    ``autoload=false``), ``models_max`` from the router's ``/props``, its load API known; what
    is loaded is exactly what was loaded before the poll."""
    engine = SimulatedEngine(
        reactor,
        models=("smolA", "smolB"),
        loaded=["smolA"],
        kind="openai",
        models_max=1,
        loaded_context=2048,
    )
    book = await _polled(listen, http, reactor, engine)
    assert sorted(r.path for r in engine.received) == [
        b"/models",
        b"/props",
        b"/props?model=smolA&autoload=false",
    ]
    assert engine.loaded == ["smolA"]
    assert book.models("n") == frozenset({"smolA", "smolB"})
    assert (book.resident("n", "smolA"), book.resident("n", "smolB")) == (True, False)
    assert (book.context_length("n", "smolA"), book.context_length("n", "smolB")) == (2048, None)
    assert book.facts.models_max("n") == 1
    node = book._directory.get("n")
    assert node is not None and book.control(node) is ROUTER_CONTROL
    engine.stop()


@on_reactor
async def test_a_nodes_own_models_max_wins_over_the_routers(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    engine = SimulatedEngine(reactor, models=("a",), loaded=[], kind="openai", models_max=4)
    book = await _polled(listen, http, reactor, engine, models_max=2)
    assert book.facts.models_max("n") == 2
    engine.stop()


@on_reactor
async def test_a_one_model_llama_server_is_no_router(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """``/models`` has no per-model status there: names from ``/v1/models``, residency unknown,
    no load API, no ``models_max``."""
    engine = SimulatedEngine(reactor, models=("m.gguf",), kind="openai", slots=2)
    book = await _polled(listen, http, reactor, engine)
    assert book.models("n") == frozenset({"m.gguf"})
    assert book.resident("n", "m.gguf") is None
    node = book._directory.get("n")
    assert node is not None and book.control(node) is None
    assert book.facts.models_max("n") is None and book.reported_slots("n") == 2
    engine.stop()
