# -*- test-case-name: tests.core.test_engines -*-
"""Engine profiles: everything that differs between ollama, lmstudio and omlx, as data.

A facade never asks which engine it is; it asks its profile (routes, model-name matching,
inventory format, defaults). A fourth engine is a new row in :data:`ENGINES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from attrs import field, frozen

__all__ = [
    "COUNT_TOKENS",
    "ENGINES",
    "LMSTUDIO",
    "LMSTUDIO_LOADED",
    "LMSTUDIO_MODELS",
    "LMSTUDIO_V1_MODELS",
    "MODEL_NAMES",
    "OLLAMA",
    "OLLAMA_PS",
    "OMLX",
    "OPENAI",
    "OPENAI_MODELS",
    "PS",
    "RESPONSES_PATH",
    "TAGS",
    "EngineProfile",
    "FanOutRoute",
    "ModelChange",
    "ModelControl",
    "ModelListFormat",
    "ModelNames",
    "ModelRoute",
    "ResidencyFormat",
    "RouteKind",
    "SlotsFormat",
    "lmstudio_loaded_ids",
    "normalise_ollama",
    "openai_model_ids",
    "ps_names",
    "tags_names",
]


class RouteKind(Enum):
    """How a facade treats a request."""

    INFERENCE = "inference"
    MODEL_LIST = "model-list"
    MODEL_ROUTED = "model-routed"
    PASS_THROUGH = "pass-through"


def normalise_ollama(name: str) -> str:
    """Ollama names: trim; a name without ``:`` or ``@`` after its last ``/`` gets ``:latest``."""
    trimmed = name.strip()
    tail = trimmed.rsplit("/", 1)[-1]
    if trimmed and ":" not in tail and "@" not in tail:
        return trimmed + ":latest"
    return trimmed


def _normalise_exact(name: str) -> str:
    """LM Studio names compare exactly."""
    return name


def _normalise_casefold(name: str) -> str:
    """oMLX names compare case-insensitively."""
    return name.casefold()


def tags_names(document: Any) -> list[str]:
    """Model names from an Ollama ``/api/tags`` answer: ``models[].model``, else ``.name``."""
    names: list[str] = []
    if not isinstance(document, dict):
        raise ValueError("tags answer is not an object")
    models = document.get("models")
    if not isinstance(models, list):
        raise ValueError("tags answer has no models list")
    for record in models:
        if not isinstance(record, dict):
            continue
        name = record.get("model")
        if not isinstance(name, str) or not name:
            name = record.get("name")
        if isinstance(name, str) and name:
            names.append(name)
    return names


def openai_model_ids(document: Any) -> list[str]:
    """Model ids from an OpenAI-style ``/v1/models`` answer: ``data[].id``."""
    if not isinstance(document, dict):
        raise ValueError("models answer is not an object")
    data = document.get("data")
    if not isinstance(data, list):
        raise ValueError("models answer has no data list")
    return [
        record["id"]
        for record in data
        if isinstance(record, dict) and isinstance(record.get("id"), str) and record["id"]
    ]


def ps_names(document: Any) -> list[str]:
    """Loaded model names from an Ollama ``/api/ps`` answer: ``models[].model``, else ``.name``
    (the same shape as ``/api/tags``)."""
    return tags_names(document)


def lmstudio_loaded_ids(document: Any) -> list[str]:
    """Loaded model ids from an LM Studio ``/api/v0/models`` answer: ``data[].id`` of the records
    whose ``state`` is ``"loaded"``."""
    if not isinstance(document, dict):
        raise ValueError("models answer is not an object")
    data = document.get("data")
    if not isinstance(data, list):
        raise ValueError("models answer has no data list")
    return [
        record["id"]
        for record in data
        if isinstance(record, dict)
        and isinstance(record.get("id"), str)
        and record["id"]
        and record.get("state") == "loaded"
    ]


@frozen
class ResidencyFormat:
    """Where an engine says which models are loaded now (docs/behaviour.md §6.4), and how to read it.

    ``loaded`` returns the loaded names as the engine spells them, or raises ``ValueError`` for an
    answer of the wrong shape.
    """

    path: str
    loaded: Callable[[Any], list[str]]


OLLAMA_PS = ResidencyFormat(path="/api/ps", loaded=ps_names)
LMSTUDIO_LOADED = ResidencyFormat(path="/api/v0/models", loaded=lmstudio_loaded_ids)


def llamacpp_total_slots(document: Any) -> int:
    """The slots a llama.cpp ``llama-server`` runs requests in: ``total_slots`` of ``/props``."""
    slots = document.get("total_slots") if isinstance(document, dict) else None
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError("props answer has no total_slots")
    return slots


@frozen
class SlotsFormat:
    """Where a node says how many requests it runs at once, and how to read it (§11.1)."""

    path: str
    slots: Callable[[Any], int]


LLAMACPP_PROPS = SlotsFormat(path="/props", slots=llamacpp_total_slots)


class ModelChange(Enum):
    """A model loaded or unloaded on request: by the control channel's ``model/load`` and
    ``model/unload`` (docs/behaviour.md §13.3) or a prompt-less generate (§17.6)."""

    LOAD = "load"
    UNLOAD = "unload"


@frozen
class ModelControl:
    """How an engine loads and unloads a model on request (docs/behaviour.md §13.3): a POST of
    a JSON body to a path each. ``load`` gets the model and the keep-alive asked for (``None``: the
    engine's own default), ``unload`` the model."""

    load_path: str
    load: Callable[[str, str | float | None], dict[str, Any]]
    unload_path: str
    unload: Callable[[str], dict[str, Any]]

    def asking(
        self, change: ModelChange, model: str, keep_alive: str | float | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The path and the JSON body that ask the engine for ``change`` of ``model``."""
        if change is ModelChange.LOAD:
            return self.load_path, self.load(model, keep_alive)
        return self.unload_path, self.unload(model)


def _ollama_load(model: str, keep_alive: str | float | None) -> dict[str, Any]:
    # no prompt: Ollama loads the model and answers once it is in memory
    return {"model": model} if keep_alive is None else {"model": model, "keep_alive": keep_alive}


OLLAMA_CONTROL = ModelControl(
    "/api/generate", _ollama_load, "/api/generate", lambda model: {"model": model, "keep_alive": 0}
)
"""Ollama: ``/api/generate`` with no prompt loads (``keep_alive`` as given), ``keep_alive: 0``
unloads."""
LMSTUDIO_CONTROL = ModelControl(
    "/api/v1/models/load",
    lambda model, _keep_alive: {"model": model},
    "/api/v1/models/unload",
    lambda model: {"instance_id": model},
)
"""LM Studio 0.4+'s REST API (``/api/v1/models/load`` and ``/unload``); an older one answers 404."""


@frozen
class ModelListFormat:
    """How one model-list route is parsed, keyed and wrapped when the proxy merges it (docs/behaviour.md §4.3).

    ``per_node`` lists (``/api/ps``) are never merged across nodes: each record gains
    ``"nvpair_node": ID`` and is deduplicated only within its own node.
    """

    path: str
    list_field: str
    names: Callable[[Any], list[str]]
    record_key: Callable[[dict[str, Any]], str | None]
    envelope: Callable[[list[Any]], dict[str, Any]]
    per_node: bool = field(default=False, kw_only=True)


@frozen
class ModelRoute:
    """A route that is not inference but names a model, routed to an owner of it (docs/behaviour.md §2.1).

    ``path`` is exact, or with ``prefix`` every path below it (``/api/v0/models/{id}``).
    ``model`` reads the model from the path and the parsed JSON body (None: no model named).
    """

    method: bytes
    path: str
    model: Callable[[str, Any], str | None]
    prefix: bool = False

    def matches(self, method: bytes, path: str) -> bool:
        if method != self.method:
            return False
        if self.prefix:
            return path.startswith(self.path) and len(path) > len(self.path)
        return path == self.path


@frozen
class FanOutRoute:
    """A model-management route that ``X-NVPair-Node: *`` or a list of ids runs on several nodes
    at once (docs/behaviour.md §13.2).

    ``streams``: the nodes answer NDJSON progress, merged into one stream (pull, create); else
    each node's status is summed up in one JSON object (copy, delete). ``owners``: without the
    header the route goes to every owner of the body's model (delete).
    """

    method: bytes
    path: str
    streams: bool
    owners: bool = False

    def matches(self, method: bytes, path: str) -> bool:
        return method == self.method and path == self.path


def _show_model(_path: str, body: Any) -> str | None:
    """``/api/show`` names its model as ``model`` (current clients) or ``name`` (older ones)."""
    if not isinstance(body, dict):
        return None
    for name in ("model", "name"):
        value = body.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _body_model(_path: str, body: Any) -> str | None:
    """The ``model`` of a JSON body (Anthropic's ``/v1/messages/count_tokens``)."""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model.strip() else None


COUNT_TOKENS = ModelRoute(b"POST", "/v1/messages/count_tokens", _body_model)
"""Anthropic's token count (docs/behaviour.md §17.3): routed to an owner of the model that serves
it, on every facade (each serves ``/v1/messages``)."""


def _path_model(prefix: str) -> Callable[[str, Any], str | None]:
    """The model id below ``prefix`` of a path already decoded (docs/behaviour.md §14.1)."""

    def model(path: str, _body: Any) -> str | None:
        return path[len(prefix) :] or None

    return model


def _tags_key(record: dict[str, Any]) -> str | None:
    name = record.get("model")
    if not isinstance(name, str) or not name:
        name = record.get("name")
    return normalise_ollama(name) if isinstance(name, str) and name else None


def _key_of(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _v1_records(document: Any) -> list[tuple[str, dict[str, Any]]]:
    """LM Studio ``/api/v1/models`` records by ``key`` (ValueError for another shape)."""
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list):
        raise ValueError("models answer has no models list")
    found = [(_key_of(r.get("key")), r) for r in models if isinstance(r, dict)]
    return [(key, record) for key, record in found if key is not None]


def _openai_key(record: dict[str, Any]) -> str | None:
    ident = record.get("id")
    return ident if isinstance(ident, str) and ident else None


TAGS = ModelListFormat(
    path="/api/tags",
    list_field="models",
    names=tags_names,
    record_key=_tags_key,
    envelope=lambda records: {"models": records},
)
PS = ModelListFormat(
    path="/api/ps",
    list_field="models",
    names=tags_names,
    record_key=_tags_key,
    envelope=lambda records: {"models": records},
    per_node=True,
)
LMSTUDIO_MODELS = ModelListFormat(
    path="/api/v0/models",
    list_field="data",
    names=openai_model_ids,
    record_key=_openai_key,
    envelope=lambda records: {"object": "list", "data": records},
)
LMSTUDIO_V1_MODELS = ModelListFormat(
    path="/api/v1/models",
    list_field="models",
    names=lambda document: [k for k, _ in _v1_records(document)],
    record_key=lambda record: _key_of(record.get("key")),
    envelope=lambda records: {"models": records},
)
"""LM Studio 0.4+'s ``GET /api/v1/models`` (docs/behaviour.md §17.1): ``models[].key``."""
OPENAI_MODELS = ModelListFormat(
    path="/v1/models",
    list_field="data",
    names=openai_model_ids,
    record_key=_openai_key,
    envelope=lambda records: {"object": "list", "data": records},
)


@frozen
class ModelNames:
    """The members of a route's JSON body that name models (docs/behaviour.md §14.2): read, each by
    the model rule, for a key with a model scope, which may name only its own models in each.

    ``opaque`` members name what the proxy cannot read as a model (blob digests, a Modelfile's
    text): a key with a model scope may not send them."""

    fields: tuple[str, ...]
    opaque: tuple[str, ...] = ()


_BY_MODEL = ModelNames(("model",))
_BY_MODEL_OR_NAME = ModelNames(("model", "name"))

MODEL_NAMES: Mapping[str, ModelNames] = {
    # Ollama's own request structs (api/types.go)
    "/api/show": _BY_MODEL_OR_NAME,
    "/api/pull": _BY_MODEL_OR_NAME,
    "/api/push": _BY_MODEL_OR_NAME,
    "/api/delete": _BY_MODEL_OR_NAME,
    "/api/create": ModelNames(
        ("model", "name", "from"), opaque=("files", "adapters", "modelfile", "path")
    ),
    "/api/copy": ModelNames(("source", "destination")),
    # LM Studio's REST API (0.3 under /api/v0, 0.4 under /api/v1)
    "/api/v0/models/load": _BY_MODEL,
    "/api/v0/models/unload": ModelNames(("model", "instance_id")),
    "/api/v0/models/download": _BY_MODEL,
    "/api/v1/models/load": _BY_MODEL,
    "/api/v1/models/unload": ModelNames(("model", "instance_id")),
    "/api/v1/models/download": _BY_MODEL,
    # llama.cpp's llama-server: its router loads and runs the body's model on each of these
    "/models/load": _BY_MODEL,
    "/models/unload": _BY_MODEL,
    "/completion": _BY_MODEL,
    "/completions": _BY_MODEL,
    "/chat/completions": _BY_MODEL,
    "/infill": _BY_MODEL,
    "/embedding": _BY_MODEL,
    "/embeddings": _BY_MODEL,
    "/rerank": _BY_MODEL,
    "/reranking": _BY_MODEL,
    "/v1/rerank": _BY_MODEL,
    "/v1/reranking": _BY_MODEL,
    "/tokenize": _BY_MODEL,
    "/detokenize": _BY_MODEL,
    "/apply-template": _BY_MODEL,
}
"""The routes beyond inference whose bodies name models, by normalised path (the same on every
facade: a route another engine's node serves is passed through to it). Inference routes name
theirs by ``model`` alone."""

RESPONSES_PATH = "/v1/responses"
_OPENAI_INFERENCE = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages", RESPONSES_PATH}
)
_LMSTUDIO_INFERENCE = frozenset(
    {"/api/v0/chat/completions", "/api/v0/completions", "/api/v0/embeddings", "/api/v1/chat"}
)
_LMSTUDIO_MODEL = "/api/v0/models/"
_OLLAMA_INFERENCE = frozenset({"/api/generate", "/api/chat", "/api/embed", "/api/embeddings"})
AFFINITY_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/api/chat",
        "/v1/completions",
        "/api/generate",
        "/api/v0/chat/completions",
        "/api/v0/completions",
    }
)


@frozen
class EngineProfile:
    """One engine's routes, defaults and model-name rule.

    ``residency`` is where the inventory poll learns which models are loaded, or None when the
    engine has no such endpoint (residency then stays unknown).
    """

    name: str
    inference_paths: frozenset[str]
    model_lists: Mapping[str, ModelListFormat]
    inventory: ModelListFormat
    default_listen: str
    default_node_url: str
    normalise: Callable[[str], str]
    model_routes: tuple[ModelRoute, ...] = field(default=(), kw_only=True)
    fan_out_routes: tuple[FanOutRoute, ...] = field(default=(), kw_only=True)
    residency: ResidencyFormat | None = None
    control: ModelControl | None = field(default=None, kw_only=True)
    """How ``model/load`` and ``model/unload`` reach it; ``None``: the engine has no such API."""
    native_prefixes: tuple[str, ...] = field(default=("/v1/",), kw_only=True)
    """The client routes a node of this kind speaks itself (docs/behaviour.md §11.3): every path
    under one of these prefixes; any other route is translated for it or not sent to it."""
    foreign_prefixes: tuple[str, ...] = field(default=(), kw_only=True)
    """Paths under a native prefix that are another engine's (LM Studio's ``/api/v0/`` on Ollama)."""
    unserved_prefixes: tuple[str, ...] = field(default=(), kw_only=True)
    """Client routes a node of this kind may lack even behind a facade of its own kind, so they are
    translated for it (docs/behaviour.md §17.3): Ollama before 0.14 has no ``/v1/messages``."""
    slots: SlotsFormat | None = field(default=None, kw_only=True)
    """Where a node of this kind reports its slots, used when the node sets none (§11.1); a node
    that does not answer there keeps ``--default-slots``."""
    facts_list: str | None = field(default=None, kw_only=True)
    """The list a node of this kind tells most about its models on (name, type, context length,
    loaded state), read to synthesise another facade's list (§11.3); None: its inventory list."""
    passes_through: bool = field(default=True, kw_only=True)
    """Whether a route the facade does not know is forwarded to a node (§2); the ``openai`` facade
    serves its own routes only and answers 404 to the rest (§11.2)."""
    context_reloads: bool = field(default=False, kw_only=True)
    """Whether a node of this kind reloads a loaded model to serve a request asking another
    context (``options.num_ctx``) than it is loaded with: Ollama's scheduler compares the runner's
    options, ``num_ctx`` among them (docs/behaviour.md §15.2)."""
    default_kinds: tuple[str, ...] = field(default=(), kw_only=True)
    """When not empty, the facade's default nodes (no node given) are one per kind named here, at
    that kind's default URL (the ``openai`` facade, §11.2); else one ``default`` node."""
    counts_cache: bool = field(default=True, kw_only=True)
    """Whether what a node of this kind says of the prompt tokens it found cached is a count
    (docs/behaviour.md §12.2). Ollama's only such field is ``/v1/responses``'
    ``input_tokens_details.cached_tokens``, which its source writes as a constant 0 (to v0.33):
    an Ollama node's cached count is unknown."""

    def classify(self, method: bytes, path: str) -> RouteKind:
        """Classify by method and exact path (the query is not part of ``path``)."""
        if method == b"POST" and path in self.inference_paths:
            return RouteKind.INFERENCE
        if method == b"GET" and path in self.model_lists:
            return RouteKind.MODEL_LIST
        if self.model_route(method, path) is not None:
            return RouteKind.MODEL_ROUTED
        return RouteKind.PASS_THROUGH

    def model_route(self, method: bytes, path: str) -> ModelRoute | None:
        """The model-routed route this request takes, if any."""
        return next((r for r in self.model_routes if r.matches(method, path)), None)

    def fan_out_route(self, method: bytes, path: str) -> FanOutRoute | None:
        """The route of §13.2 this request takes, if it may be run on several nodes at once."""
        return next((r for r in self.fan_out_routes if r.matches(method, path)), None)

    def speaks(self, path: str) -> bool:
        """Whether a node of this kind serves the client route ``path`` natively (§11.3)."""
        return (
            path.startswith(self.native_prefixes)
            and not path.startswith(self.foreign_prefixes or ("\0",))
            and not self.lacks(path)
        )

    def lacks(self, path: str) -> bool:
        """Whether ``path`` is one of :attr:`unserved_prefixes` (§17.3)."""
        return path.startswith(self.unserved_prefixes or ("\0",))

    def matches(self, requested: str, advertised: str) -> bool:
        """Whether an advertised model name serves a requested one (docs/behaviour.md §4.1)."""
        return self.normalise(requested.strip()) == self.normalise(advertised.strip())

    def advertises(self, requested: str, inventory: frozenset[str] | tuple[str, ...]) -> bool:
        """Whether any name of an inventory matches the requested model."""
        wanted = self.normalise(requested.strip())
        return any(self.normalise(name.strip()) == wanted for name in inventory)


OLLAMA = EngineProfile(
    name="ollama",
    inference_paths=_OLLAMA_INFERENCE | _OPENAI_INFERENCE,
    model_lists={TAGS.path: TAGS, OPENAI_MODELS.path: OPENAI_MODELS, PS.path: PS},
    inventory=TAGS,
    default_listen="tcp:11435:interface=127.0.0.1",
    default_node_url="http://127.0.0.1:11434",
    normalise=normalise_ollama,
    model_routes=(ModelRoute(b"POST", "/api/show", _show_model), COUNT_TOKENS),
    fan_out_routes=(
        FanOutRoute(b"POST", "/api/pull", streams=True),
        FanOutRoute(b"POST", "/api/create", streams=True),
        FanOutRoute(b"POST", "/api/copy", streams=False),
        FanOutRoute(b"DELETE", "/api/delete", streams=False, owners=True),
    ),
    residency=OLLAMA_PS,
    control=OLLAMA_CONTROL,
    native_prefixes=("/api/", "/v1/"),
    foreign_prefixes=("/api/v0/", "/api/v1/"),
    unserved_prefixes=("/v1/messages",),
    context_reloads=True,
    counts_cache=False,
)
LMSTUDIO = EngineProfile(
    name="lmstudio",
    inference_paths=_OPENAI_INFERENCE | _LMSTUDIO_INFERENCE,
    model_lists={
        OPENAI_MODELS.path: OPENAI_MODELS,
        LMSTUDIO_MODELS.path: LMSTUDIO_MODELS,
        LMSTUDIO_V1_MODELS.path: LMSTUDIO_V1_MODELS,
    },
    inventory=OPENAI_MODELS,
    default_listen="tcp:1235:interface=127.0.0.1",
    default_node_url="http://127.0.0.1:1234",
    normalise=_normalise_exact,
    model_routes=(
        ModelRoute(b"GET", _LMSTUDIO_MODEL, _path_model(_LMSTUDIO_MODEL), prefix=True),
        COUNT_TOKENS,
    ),
    residency=LMSTUDIO_LOADED,
    control=LMSTUDIO_CONTROL,
    facts_list=LMSTUDIO_MODELS.path,
    native_prefixes=("/v1/", "/api/v0/", "/api/v1/"),
)
OMLX = EngineProfile(
    name="omlx",
    inference_paths=_OPENAI_INFERENCE,
    model_lists={OPENAI_MODELS.path: OPENAI_MODELS},
    inventory=OPENAI_MODELS,
    default_listen="tcp:8001:interface=127.0.0.1",
    default_node_url="http://127.0.0.1:8000",
    normalise=_normalise_casefold,
    model_routes=(COUNT_TOKENS,),
    residency=None,
)

OPENAI = EngineProfile(
    name="openai",
    inference_paths=_OPENAI_INFERENCE,
    model_lists={OPENAI_MODELS.path: OPENAI_MODELS},
    inventory=OPENAI_MODELS,
    default_listen="tcp:4000:interface=127.0.0.1",
    default_node_url="http://127.0.0.1:8080",
    normalise=_normalise_exact,
    model_routes=(COUNT_TOKENS,),
    residency=None,
    slots=LLAMACPP_PROPS,
    passes_through=False,
    default_kinds=("ollama", "lmstudio", "omlx"),
)
"""Any OpenAI-compatible server (llama.cpp's ``llama-server``, vLLM, SGLang, LocalAI) as a node
kind, and the OpenAI-only facade over nodes of every kind (docs/behaviour.md §11.2)."""

ENGINES: Mapping[str, EngineProfile] = {p.name: p for p in (OLLAMA, LMSTUDIO, OMLX, OPENAI)}
"""Every engine profile by name: the facades ``--engine`` may name, and the node kinds (§11.1)."""
