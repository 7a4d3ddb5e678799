# -*- test-case-name: tests.selection.test_holdings -*-
"""What a node holds, read from the engine's richest model list (docs/behaviour.md §17.1, §17.2): the
models it serves, which are loaded, their context lengths and, for llama.cpp's router, how it loads
and unloads them — and, per node kind, the lists to try, richest first.

- ``lmstudio``: ``GET /api/v1/models`` (LM Studio 0.4+: ``models[].key``, ``loaded_instances``, the
  loaded instance's ``config.context_length``), else ``GET /api/v0/models`` (``data[].id``,
  ``state``, ``max_context_length``), else ``GET /v1/models`` (names only).
- ``openai``: ``GET /models`` answering a per-model ``status`` (llama.cpp's router: every listed
  model, ``status.value == "loaded"``, the context of each loaded model from
  ``/props?model=NAME&autoload=false``), else ``GET /v1/models`` (names only).

Kinds not listed here (``ollama``, ``omlx``) read their profile's inventory and residency lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from attrs import field, frozen

from nvpair_tw.core import ModelControl

__all__ = [
    "HOLDINGS",
    "ROUTER_CONTROL",
    "ContextQuery",
    "Holdings",
    "HoldingsSource",
    "lmstudio_v0",
    "lmstudio_v1",
    "names_only",
    "router_context",
    "router_models",
    "router_models_max",
]


@frozen
class Holdings:
    """One answer about a node's models.

    :ivar names: every model it serves, as it spells them.
    :ivar loaded: the loaded ones, or None when this list does not say.
    :ivar contexts: the context length of a loaded model, where the list says.
    """

    names: frozenset[str]
    loaded: frozenset[str] | None = None
    contexts: Mapping[str, int] = field(factory=dict)


@frozen
class ContextQuery:
    """Where a loaded model's context length is asked, one model at a time, and how it is read."""

    path: Callable[[str], str]
    read: Callable[[Any], int]


@frozen
class HoldingsSource:
    """One list a node may answer: its path, how it is read (``ValueError``: not this list), how
    the context of each loaded model is asked when the list does not say, and the API that loads
    and unloads models on a node that answers it."""

    path: str
    read: Callable[[Any], Holdings]
    context: ContextQuery | None = field(default=None, kw_only=True)
    control: ModelControl | None = field(default=None, kw_only=True)


def _count(value: Any) -> int | None:
    """A positive whole number, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _records(document: Any, key: str) -> list[dict[str, Any]]:
    listed = document.get(key) if isinstance(document, dict) else None
    if not isinstance(listed, list):
        raise ValueError(f"models answer has no {key} list")
    return [record for record in listed if isinstance(record, dict)]


def _named(record: dict[str, Any], key: str) -> str | None:
    name = record.get(key)
    return name if isinstance(name, str) and name.strip() else None


def lmstudio_v1(document: Any) -> Holdings:
    """LM Studio 0.4+'s ``/api/v1/models``: a model with ``loaded_instances`` is loaded, with the
    smallest context length its instances were loaded with (docs/behaviour.md §15.3)."""
    names: set[str] = set()
    loaded: set[str] = set()
    contexts: dict[str, int] = {}
    for record in _records(document, "models"):
        key = _named(record, "key")
        if key is None:
            continue
        names.add(key)
        instances = record.get("loaded_instances")
        if not isinstance(instances, list) or not instances:
            continue
        loaded.add(key)
        configs = [i.get("config") for i in instances if isinstance(i, dict)]
        lengths = [_count(c.get("context_length")) for c in configs if isinstance(c, dict)]
        known = [n for n in lengths if n is not None]
        if known:
            contexts[key] = min(known)
    return Holdings(frozenset(names), frozenset(loaded), contexts)


def lmstudio_v0(document: Any) -> Holdings:
    """LM Studio's ``/api/v0/models``: ``state: "loaded"`` is loaded; a loaded model's context
    is its ``max_context_length`` (the only length this list gives)."""
    names: set[str] = set()
    loaded: set[str] = set()
    contexts: dict[str, int] = {}
    for record in _records(document, "data"):
        name = _named(record, "id")
        if name is None:
            continue
        names.add(name)
        if record.get("state") == "loaded":
            loaded.add(name)
            length = _count(record.get("max_context_length"))
            if length is not None:
                contexts[name] = length
    return Holdings(frozenset(names), frozenset(loaded), contexts)


def names_only(document: Any) -> Holdings:
    """An OpenAI-style ``/v1/models``: the names, nothing about residency."""
    names = (_named(record, "id") for record in _records(document, "data"))
    return Holdings(frozenset(n for n in names if n is not None))


def router_models(document: Any) -> Holdings:
    """llama.cpp router's ``/models``: every record carries ``status.value``; ``loaded`` is loaded.
    A list without a status (a one-model ``llama-server``, vLLM) is not a router's: ValueError."""
    records = _records(document, "data")
    statuses = [r.get("status") for r in records]
    if not records or not all(isinstance(s, dict) and "value" in s for s in statuses):
        raise ValueError("not a router's model list (no per-model status)")
    names: set[str] = set()
    loaded: set[str] = set()
    for record, status in zip(records, statuses, strict=True):
        name = _named(record, "id")
        if name is None:
            continue
        names.add(name)
        if isinstance(status, dict) and status.get("value") == "loaded":
            loaded.add(name)
    return Holdings(frozenset(names), frozenset(loaded))


def router_context(document: Any) -> int:
    """A loaded model's per-slot context on a router: ``/props``'s
    ``default_generation_settings.n_ctx``."""
    settings = document.get("default_generation_settings") if isinstance(document, dict) else None
    length = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if length is None:
        raise ValueError("props answer has no n_ctx")
    return length


def router_models_max(document: Any) -> int | None:
    """How many models a router keeps loaded at once, from its own ``/props`` (``role: router``,
    ``max_instances``; 0 = no limit), or None when it does not say."""
    if not isinstance(document, dict) or document.get("role") != "router":
        return None
    value = document.get("max_instances")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _props_of(model: str) -> str:
    # autoload=false: a plain /props?model= loads the model it asks about (docs/behaviour.md §17.2)
    return f"/props?model={quote(model, safe='')}&autoload=false"


ROUTER_CONTROL = ModelControl(
    "/models/load",
    lambda model, _keep_alive: {"model": model},
    "/models/unload",
    lambda model: {"model": model},
)
"""llama.cpp's router: ``POST /models/load`` and ``POST /models/unload``, ``{"model": NAME}``."""

_V1_MODELS = HoldingsSource("/v1/models", names_only)

HOLDINGS: Mapping[str, tuple[HoldingsSource, ...]] = {
    "lmstudio": (
        HoldingsSource("/api/v1/models", lmstudio_v1),
        HoldingsSource("/api/v0/models", lmstudio_v0),
        _V1_MODELS,
    ),
    "openai": (
        HoldingsSource(
            "/models",
            router_models,
            context=ContextQuery(_props_of, router_context),
            control=ROUTER_CONTROL,
        ),
        _V1_MODELS,
    ),
}
"""Per node kind, the lists that say what a node holds, tried in order until one answers."""
