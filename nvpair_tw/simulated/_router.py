# -*- test-case-name: tests.simulated.test_router -*-
"""llama.cpp's ``llama-server`` in router mode (one server, many models; docs/behaviour.md §17.2), as
a simulated engine of kind ``openai`` with ``models_max`` set answers it — the shapes are those the
real server of this project's build answers (docs/engines/llamacpp-router.md):

- ``GET /models`` and ``GET /v1/models``: every model with ``status: {"value": "loaded" |
  "unloaded", "args": [...]}``.
- ``GET /props``: ``{"role": "router", "max_instances": MODELS_MAX, ...}``; with
  ``?model=NAME``, that model's own ``/props`` (``default_generation_settings.n_ctx``,
  ``total_slots``) — loading it first unless ``autoload=false``, when a model not loaded is a 400.
- ``POST /models/load`` and ``/models/unload`` ``{"model"}``: ``{"success": true}``; loading an
  unknown model is llama-server's 404.

Loading a model while ``models_max`` models are loaded (0: no limit) evicts the least recently
used one; :func:`load` says which, so the engine can abort the requests still running on it, as
the real router does (llama.cpp #22447).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from attrs import frozen

from nvpair_tw.simulated._inventory import Shelf
from nvpair_tw.simulated._kinds import not_found

__all__ = ["Change", "Step", "load", "router_get", "router_post"]

Answer = tuple[int, Any]

_NOT_LOADED = {
    "error": {"code": 400, "message": "model is not loaded", "type": "invalid_request_error"}
}


class Step(Enum):
    """What a ``/models/load`` or ``/models/unload`` asks of the router."""

    LOAD = "load"
    UNLOAD = "unload"


@frozen
class Change:
    """One model to load or unload."""

    step: Step
    model: str


def load(model: str, loaded: Sequence[str], models_max: int) -> tuple[list[str], list[str]]:
    """What is loaded after ``model`` is used (it becomes the most recently used), and what was
    evicted for it."""
    after = [m for m in loaded if m != model]
    evicted: list[str] = []
    while models_max > 0 and len(after) >= models_max:
        evicted.append(after.pop(0))
    return [*after, model], evicted


def _record(model: str, shelf: Shelf, context: int) -> dict[str, Any]:
    args = ["llama-server", "--alias", model, "--ctx-size", str(context)]
    status = {"value": "loaded" if shelf.is_loaded(model) else "unloaded", "args": args}
    return {
        "id": model,
        "aliases": [],
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": int(shelf.now),
        "status": status,
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "source": "models_dir",
        "can_remove": False,
    }


def _model_props(model: str, shelf: Shelf, context: int) -> dict[str, Any]:
    return {
        "default_generation_settings": {"id": 0, "n_ctx": context, "is_processing": False},
        "total_slots": shelf.slots,
        "model_alias": model,
        "model_path": f"/models/{model}.gguf",
        "modalities": {"vision": False},
        "build_info": "b0-simulated",
        "is_sleeping": False,
    }


def router_get(
    path: bytes, query: Mapping[bytes, list[bytes]], shelf: Shelf, models_max: int, context: int
) -> Answer | None:
    """The router's answer to ``GET path?query``, or None for a path it answers as a one-model
    server would. ``context`` is what each model is loaded with."""
    if path in (b"/models", b"/v1/models"):
        records = [_record(m, shelf, context) for m in shelf.names]
        return 200, {"data": records, "object": "list"}
    if path != b"/props":
        return None
    asked = query.get(b"model", [b""])[0].decode("utf-8", "replace")
    if not asked:
        return 200, {
            "role": "router",
            "max_instances": models_max,
            "models_autoload": True,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": None, "n_ctx": 0},
            "build_info": "b0-simulated",
        }
    if asked not in shelf.names:
        return 404, not_found("openai", b"GET", path)
    if not shelf.is_loaded(asked):
        return 400, _NOT_LOADED
    return 200, _model_props(asked, shelf, context)


def router_post(
    path: bytes, body: bytes, models: Sequence[str]
) -> tuple[Answer, Change | None] | None:
    """The router's answer to ``POST /models/load`` or ``/models/unload`` and the change it
    makes; None for another path."""
    if path not in (b"/models/load", b"/models/unload"):
        return None
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, str) or model not in models:
        return (404, not_found("openai", b"POST", path)), None
    step = Step.LOAD if path == b"/models/load" else Step.UNLOAD
    return (200, {"success": True}), Change(step, model)
