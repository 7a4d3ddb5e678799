# -*- test-case-name: tests.dialects.test_models -*-
"""Model lists across kinds (docs/behaviour.md §11.3, last row): what a node reports, read from its own list
(:func:`facts_from`), and a record in the facade's shape (:func:`record_for`,
:func:`show_answer`). A field the node did not report is absent from the record, never invented.

What each node list gives:

==================  ============================================================================
node list           facts
==================  ============================================================================
``/api/tags``       ``name`` (else ``model``), ``size``; loaded unknown
``/api/ps``         ``name`` (else ``model``), ``size``, ``context_length`` where given; loaded
``/v1/models``      ``id``; a llama.cpp ``meta.n_ctx_train`` is not the served context: unused
``/api/v0/models``  ``id``, ``type``, ``state`` (``"loaded"`` → loaded), ``max_context_length``
==================  ============================================================================

A few fields the engine's own clients cannot do without are added where a record lacks them
(:func:`client_fields`, docs/behaviour.md §17.6): the Ollama CLI takes ``digest[:12]`` and prints
``size`` and ``modified_at``; an OpenAI client reads ``created`` and ``owned_by``.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from attrs import frozen

__all__ = [
    "LIST_PATHS",
    "ModelFacts",
    "client_fields",
    "facts_from",
    "record_for",
    "show_answer",
]

LIST_PATHS = frozenset({"/api/tags", "/api/ps", "/v1/models", "/api/v0/models"})


@frozen
class ModelFacts:
    """What a node reported about one model.

    :ivar name: the node's name for it.
    :ivar context_length: the context length it is (or would be) served with, if reported.
    :ivar type: LM Studio's ``type`` (``"llm"``, ``"vlm"``, ``"embeddings"``), if reported.
    :ivar loaded: whether it is resident, if the list says.
    :ivar size: its size in bytes, if reported.
    """

    name: str
    context_length: int | None = None
    type: str | None = None
    loaded: bool | None = None
    size: int | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _entries(document: Any, key: str, path: str) -> list[dict[str, Any]]:
    entries = document.get(key) if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: expected an object with a {key!r} list of objects")
    return entries


def facts_from(node_list_path: str, document: Any) -> list[ModelFacts]:
    """The models of a node's own list at ``node_list_path``, parsed from its JSON ``document``.

    Raises ``ValueError`` for a path not in :data:`LIST_PATHS` or a document of the wrong shape
    (an entry without a string name is skipped).
    """
    facts: list[ModelFacts] = []
    if node_list_path in ("/api/tags", "/api/ps"):
        resident = node_list_path == "/api/ps"
        for entry in _entries(document, "models", node_list_path):
            name = entry.get("name") or entry.get("model")
            if isinstance(name, str) and name:
                context = _int(entry.get("context_length")) if resident else None
                loaded = True if resident else None
                facts.append(ModelFacts(name, context, None, loaded, _int(entry.get("size"))))
    elif node_list_path == "/v1/models":
        for entry in _entries(document, "data", node_list_path):
            if isinstance(entry.get("id"), str) and entry["id"]:
                facts.append(ModelFacts(entry["id"]))
    elif node_list_path == "/api/v0/models":
        for entry in _entries(document, "data", node_list_path):
            if not isinstance(entry.get("id"), str) or not entry["id"]:
                continue
            state = entry.get("state")
            kind = entry.get("type")
            facts.append(
                ModelFacts(
                    entry["id"],
                    _int(entry.get("max_context_length")),
                    kind if isinstance(kind, str) else None,
                    state == "loaded" if isinstance(state, str) else None,
                )
            )
    else:
        raise ValueError(f"{node_list_path} is not a model list")
    return facts


def record_for(facade_list_path: str, facts: ModelFacts) -> dict[str, Any]:
    """One record of the facade's list at ``facade_list_path`` for ``facts``.

    ``/api/tags``: ``{"name", "model"}`` plus ``size`` where known; ``/api/ps``: the same plus
    ``context_length`` where known; ``/v1/models``: ``{"id", "object": "model"}``; ``/api/v0/models``: ``{"id", "object":
    "model"}`` plus ``type``, ``state`` (``"loaded"`` / ``"not-loaded"``) and
    ``max_context_length`` where known. Raises ``ValueError`` for another path.
    """
    if facade_list_path in ("/api/tags", "/api/ps"):
        record: dict[str, Any] = {"name": facts.name, "model": facts.name}
        if facts.size is not None:
            record["size"] = facts.size
        if facade_list_path == "/api/ps" and facts.context_length is not None:
            record["context_length"] = facts.context_length
        return record
    if facade_list_path == "/v1/models":
        return {"id": facts.name, "object": "model"}
    if facade_list_path == "/api/v0/models":
        record = {"id": facts.name, "object": "model"}
        if facts.type is not None:
            record["type"] = facts.type
        if facts.loaded is not None:
            record["state"] = "loaded" if facts.loaded else "not-loaded"
        if facts.context_length is not None:
            record["max_context_length"] = facts.context_length
        return record
    if facade_list_path == "/api/v1/models":
        return _v1_record(facts)
    raise ValueError(f"{facade_list_path} is not a model list")


def _v1_record(facts: ModelFacts) -> dict[str, Any]:
    """LM Studio 0.4's ``/api/v1/models`` record (docs/behaviour.md §17.1): ``type``, ``key``,
    ``display_name``, ``loaded_instances`` (one, with its context length where known, when the
    node reports the model loaded) and ``max_context_length`` where known."""
    embedding = facts.type is not None and facts.type.startswith("embed")
    record: dict[str, Any] = {"type": "embedding" if embedding else "llm", "key": facts.name}
    record["display_name"] = facts.name
    config = {} if facts.context_length is None else {"context_length": facts.context_length}
    instances = [{"id": facts.name, "config": config}] if facts.loaded else []
    record["loaded_instances"] = instances
    if facts.context_length is not None:
        record["max_context_length"] = facts.context_length
    return record


def show_answer(facts: ModelFacts) -> dict[str, Any]:
    """An Ollama ``/api/show`` answer synthesised from ``facts`` (docs/behaviour.md §17.6).

    The shape: ``{"details": {}, "capabilities": […]}``. ``capabilities`` is ``["embedding"]`` for
    an LM Studio ``embeddings`` model, ``["completion", "vision"]`` for a ``vlm``, else
    ``["completion"]``. ``model_info`` is absent: the Ollama CLI reads it only when present, and
    then asserts ``general.architecture``, ``general.parameter_count``,
    ``<architecture>.context_length`` and ``<architecture>.embedding_length`` unchecked (0.9.3
    panics on any of them missing), none of which a node of another kind reports. Without it the
    CLI prints ``details`` instead. ``modelfile``, ``parameters``, ``template``, ``license`` and
    the ``details`` fields are unknown and absent.
    """
    if facts.type == "embeddings":
        capabilities = ["embedding"]
    elif facts.type == "vlm":
        capabilities = ["completion", "vision"]
    else:
        capabilities = ["completion"]
    return {"details": {}, "capabilities": capabilities}


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _digest_ok(value: Any) -> bool:
    return isinstance(value, str) and len(value) >= 12


def client_fields(
    list_path: str, record: dict[str, Any], *, public: str, first_seen: float, owner: str
) -> dict[str, Any]:
    """``record`` with the fields its engine's own clients cannot do without, added where it lacks
    them (docs/behaviour.md §17.6); a field it has is kept as it is.

    Ollama lists (``/api/tags``, ``/api/ps``): ``name`` and ``model`` (``public``),
    ``modified_at`` (``first_seen``, clock seconds, as RFC 3339), ``size`` 0, ``digest`` the
    SHA-256 of ``public`` alone (a digest shorter than 12 characters is replaced: the CLI slices
    ``[:12]``), ``details`` ``{}``. ``/v1/models``: ``object`` ``"model"``, ``created``
    (``first_seen``), ``owned_by`` (``owner``). Other lists are returned unchanged.
    """
    if list_path in ("/api/tags", "/api/ps"):
        needed: dict[str, Any] = {
            "name": public,
            "model": public,
            "modified_at": _rfc3339(first_seen),
            "size": 0,
            "digest": hashlib.sha256(public.encode("utf-8")).hexdigest(),
            "details": {},
        }
        missing = {k: v for k, v in needed.items() if k not in record}
        if not _digest_ok(record.get("digest", "")):
            missing["digest"] = needed["digest"]
    elif list_path == "/v1/models":
        needed = {"object": "model", "created": int(first_seen), "owned_by": owner}
        missing = {k: v for k, v in needed.items() if k not in record}
    else:
        return record
    return {**record, **missing} if missing else record
