"""A simulated llama.cpp router over real loopback sockets: the shapes this project's real
``llama-server`` answers in router mode (docs/engines/llamacpp-router.md), its least-recently-used
eviction at ``models_max``, and the requests an eviction aborts (llama.cpp #22447)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.client import ResponseFailed

from nvpair_tw.simulated import Behaviour, always
from tests.simulated.test_kinds import Serve, client, serve

__all__ = ["client", "serve"]

pytestmark = pytest.mark.timeout(30)


def _status(listing: Any) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in listing["data"]}


def _router(serve: Serve, **kw: Any) -> Any:
    options = {"models": ("a", "b"), "loaded": [], "models_max": 1, "loaded_context": 2048}
    return serve("openai", **{**options, **kw})


@pytest_twisted.ensureDeferred
async def test_models_lists_each_model_with_its_status(serve: Serve) -> None:
    served = _router(serve, loaded=["a"])
    for path in ("/models", "/v1/models"):
        listing = (await served.ask("GET", path)).json()
        assert _status(listing) == {"a": "loaded", "b": "unloaded"}
        assert all(m["owned_by"] == "llamacpp" for m in listing["data"])


@pytest_twisted.ensureDeferred
async def test_props_say_router_and_a_models_props_never_load_with_autoload_false(
    serve: Serve,
) -> None:
    served = _router(serve, loaded=["a"])
    router = (await served.ask("GET", "/props")).json()
    assert (router["role"], router["max_instances"]) == ("router", 1)
    loaded = (await served.ask("GET", "/props?model=a&autoload=false")).json()
    assert loaded["default_generation_settings"]["n_ctx"] == 2048
    cold = await served.ask("GET", "/props?model=b&autoload=false")
    assert cold.status == 400 and cold.json()["error"]["message"] == "model is not loaded"
    assert served.engine.loaded == ["a"]
    assert (await served.ask("GET", "/props?model=b")).status == 200
    assert served.engine.loaded == ["b"]  # a plain /props?model= loads it, evicting a


@pytest_twisted.ensureDeferred
async def test_load_and_unload_answer_success_and_an_unknown_model_is_404(serve: Serve) -> None:
    served = _router(serve, models_max=2)
    assert (await served.ask("POST", "/models/load", {"model": "a"})).json() == {"success": True}
    assert (await served.ask("POST", "/models/load", {"model": "b"})).json() == {"success": True}
    assert served.engine.loaded == ["a", "b"]
    assert (await served.ask("POST", "/models/unload", {"model": "a"})).json() == {"success": True}
    assert served.engine.loaded == ["b"]
    unknown = await served.ask("POST", "/models/load", {"model": "zzz"})
    assert unknown.status == 404 and unknown.json()["error"]["message"] == "File Not Found"


@pytest_twisted.ensureDeferred
async def test_loading_past_models_max_evicts_and_aborts_the_evicted_models_requests(
    reactor: Any, serve: Serve
) -> None:
    served = _router(serve, loaded=["a"])
    served.engine.policy = always(Behaviour.FROZEN)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    running = Deferred.fromCoroutine(
        served.ask("POST", "/v1/chat/completions", {**chat, "model": "a"})
    )
    for _ in range(500):  # until the engine holds it (at most 5 s)
        if served.engine.open_requests:
            break
        await deferLater(reactor, 0.01, lambda: None)
    served.engine.policy = always(Behaviour.HEALTHY)
    other = await served.ask("POST", "/v1/chat/completions", {**chat, "model": "b"})
    assert other.status == 200 and served.engine.loaded == ["b"]
    with pytest.raises(ResponseFailed):
        await running
