# -*- test-case-name: tests.simulated.test_kinds -*-
"""The GET routes of a simulated engine of one kind, answered from what it holds (a :class:`Shelf`):
model lists, residency, and the status routes of its real server.

- ``ollama``: ``/api/tags``, ``/api/ps``, ``/api/version``, ``/v1/models``, and the one POST
  answered from what it holds, ``/api/show`` (:func:`ollama_show`); records as Ollama 0.9.3's.
- ``lmstudio``: ``/v1/models``, ``/v1/models/{id}``, ``/api/v0/models`` and ``/api/v0/models/{id}``
  with LM Studio's documented records (``type``, ``state``, ``max_context_length``, …), and
  LM Studio 0.4's ``/api/v1/models`` (:mod:`~nvpair_tw.simulated._lmstudio`).
- ``omlx``: ``/v1/models`` (``owned_by: "omlx"``, ``max_model_len``) and ``/v1/models/status``.
- ``openai`` (llama.cpp's ``llama-server``): ``/v1/models``, ``/health``, ``/props``, ``/slots``.

The residency routes (``/api/ps``, ``/api/v0/models``, ``/v1/models/status``) answer the kind's
404 while ``loaded`` is None, as for an engine without them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from nvpair_tw.simulated._kinds import lmstudio_facts
from nvpair_tw.simulated._lmstudio import V1_MODELS, v1_model

__all__ = ["Shelf", "kind_listing", "ollama_show"]

_SIZE = 4_661_224_676
_MODIFIED = "2025-01-01T00:00:00Z"


@frozen
class Shelf:
    """What a simulated engine holds, for its GET routes.

    :ivar models: the models it has.
    :ivar loaded: the resident ones, or None for an engine that does not say.
    :ivar context_length: each model's context length (per slot, for llama.cpp).
    :ivar loaded_context: the context a loaded model is loaded with (LM Studio's instances).
    :ivar slots: llama.cpp's ``total_slots``.
    :ivar busy: how many requests are in flight (``is_processing`` slots).
    :ivar now: the engine clock's time, in seconds.
    """

    models: Sequence[str]
    loaded: Sequence[str] | None
    context_length: int
    loaded_context: int
    slots: int
    busy: int
    now: float

    @property
    def names(self) -> list[str]:
        """Every model, the loaded ones it lacks included, once each."""
        return list(dict.fromkeys([*self.models, *(self.loaded or ())]))

    def is_loaded(self, model: str) -> bool:
        """Whether ``model`` is resident."""
        return self.loaded is not None and model in self.loaded


Answer = tuple[int, Any] | None


def kind_listing(kind: str, path: bytes, shelf: Shelf) -> Answer:
    """The status and JSON document of ``GET path`` on an engine of ``kind``; None for a path it
    does not answer here, or when a residency route has no ``loaded`` to report (the caller answers
    the kind's 404).

    :param kind: the engine's kind.
    :param path: the request path, without its query.
    :param shelf: what the engine holds.
    """
    if kind == "ollama":
        return _ollama(path, shelf)
    if kind == "lmstudio":
        return _lmstudio(path, shelf)
    if kind == "omlx":
        return _omlx(path, shelf)
    return _llama_cpp(path, shelf)


def _ollama_details(model: str, shelf: Shelf) -> dict[str, Any]:
    """An Ollama model's ``details``, its family from its name."""
    family = lmstudio_facts(model, shelf.context_length)["arch"]
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": "8B",
        "quantization_level": "Q4_K_M",
    }


def ollama_show(model: str, shelf: Shelf) -> Answer:
    """Ollama's ``POST /api/show`` of ``model`` (``llama3`` is ``llama3:latest``): its Modelfile, parameters, template, details,
    ``model_info`` (the architecture, parameter count, context and embedding lengths the Ollama
    CLI reads without checking), capabilities and modification time; 404 in Ollama's words for a
    model it lacks."""
    untagged = ":" not in model.rsplit("/", 1)[-1] and model not in shelf.names
    tagged = f"{model}:latest" if untagged else model
    if tagged not in shelf.names:
        return 404, {"error": f"model '{model}' not found"}
    details = _ollama_details(tagged, shelf)
    arch = details["family"]
    template = "{{ .Prompt }}"
    return 200, {
        "modelfile": f"# Modelfile of the simulated {model}\nFROM {model}\n"
        f'TEMPLATE "{template}"\nPARAMETER temperature 0.7\n',
        "parameters": "temperature                    0.7",
        "template": template,
        "details": details,
        "model_info": {
            "general.architecture": arch,
            "general.parameter_count": 8_030_261_248,
            f"{arch}.context_length": shelf.context_length,
            f"{arch}.embedding_length": 4096,
        },
        "capabilities": ["completion"],
        "modified_at": _MODIFIED,
    }


def _ollama(path: bytes, shelf: Shelf) -> Answer:
    def record(model: str) -> dict[str, Any]:
        details = _ollama_details(model, shelf)
        digest = hashlib.sha256(model.encode()).hexdigest()  # Ollama's: hex, no "sha256:"
        return {"name": model, "model": model, "size": _SIZE, "digest": digest, "details": details}

    if path == b"/api/tags":
        return 200, {"models": [{**record(m), "modified_at": _MODIFIED} for m in shelf.models]}
    if path == b"/api/ps":
        if shelf.loaded is None:
            return None
        resident = [
            {**record(m), "expires_at": "2318-01-01T00:00:00Z", "size_vram": _SIZE}
            | {"context_length": shelf.context_length}
            for m in shelf.loaded
        ]
        return 200, {"models": resident}
    if path == b"/api/version":
        return 200, {"version": "0.0.0-simulated"}
    if path == b"/v1/models":
        records = [_openai_record(m, shelf, "library") for m in shelf.models]
        return 200, {"object": "list", "data": records}
    return None


def _lmstudio(path: bytes, shelf: Shelf) -> Answer:
    def record(model: str) -> dict[str, Any]:
        facts = lmstudio_facts(model, shelf.context_length)
        state = "loaded" if shelf.is_loaded(model) else "not-loaded"
        return {"id": model, "object": "model", **facts, "state": state}

    for prefix, full in ((b"/api/v0/models/", True), (b"/v1/models/", False)):
        if path.startswith(prefix):
            wanted = path[len(prefix) :].decode("utf-8", "replace")
            if wanted not in shelf.names:
                return 404, {"error": f"Model '{wanted}' not found"}
            found = record(wanted) if full else _lmstudio_short(wanted)
            return 200, found
    if path == b"/api/v0/models":
        if shelf.loaded is None:
            return None
        return 200, {"object": "list", "data": [record(m) for m in shelf.names]}
    if path == V1_MODELS:
        if shelf.loaded is None:
            return None
        contexts = {m: shelf.loaded_context for m in shelf.loaded}
        return 200, {
            "models": [v1_model(m, shelf.context_length, contexts.get(m)) for m in shelf.names]
        }
    if path == b"/v1/models":
        return 200, {"object": "list", "data": [_lmstudio_short(m) for m in shelf.models]}
    return None


def _lmstudio_short(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "owned_by": "organization_owner"}


def _omlx(path: bytes, shelf: Shelf) -> Answer:
    if path == b"/v1/models":
        records = [
            {**_openai_record(m, shelf, "omlx"), "max_model_len": shelf.context_length}
            for m in shelf.models
        ]
        return 200, {"object": "list", "data": records}
    if path == b"/v1/models/status" and shelf.loaded is not None:
        models = [_omlx_status(m, shelf) for m in shelf.names]
        loaded = sum(1 for m in models if m["loaded"])
        return 200, {"models": models, "model_count": len(models), "loaded_count": loaded}
    return None


def _omlx_status(model: str, shelf: Shelf) -> dict[str, Any]:
    embedding = "embed" in model.lower()
    return {
        "id": model,
        "model_path": f"~/.omlx/models/{model}",
        "loaded": shelf.is_loaded(model),
        "is_loading": False,
        "pinned": False,
        "model_type": "embedding" if embedding else "llm",
        "engine_type": "embedding" if embedding else "batched",
        "estimated_size": _SIZE,
        "max_context_window": shelf.context_length,
        "max_tokens": shelf.context_length,
    }


def _llama_cpp(path: bytes, shelf: Shelf) -> Answer:
    if path in (b"/health", b"/v1/health"):
        return 200, {"status": "ok"}
    if path in (b"/v1/models", b"/models"):
        records = [
            {**_openai_record(m, shelf, "llamacpp"), "meta": {"n_ctx_train": shelf.context_length}}
            for m in shelf.models
        ]
        return 200, {"object": "list", "data": records}
    slots = [
        {
            "id": i,
            "id_task": -1,
            "n_ctx": shelf.context_length,
            "speculative": False,
            "is_processing": i < shelf.busy,
        }
        for i in range(shelf.slots)
    ]
    if path == b"/slots":
        return 200, slots
    if path == b"/props":
        return 200, {
            "default_generation_settings": {**slots[0], "is_processing": False} if slots else {},
            "total_slots": shelf.slots,
            "model_path": shelf.models[0] if shelf.models else "",
            "modalities": {"vision": False},
            "build_info": "b0-simulated",
            "is_sleeping": False,
        }
    return None


def _openai_record(model: str, shelf: Shelf, owner: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": int(shelf.now), "owned_by": owner}
