# -*- test-case-name: tests.simulated.test_kinds -*-
"""Which routes a simulated engine of one kind serves, and how that kind says "not found".

A :class:`~nvpair_tw.simulated._engine.SimulatedEngine` with a ``kind`` answers only the routes the
real server of that kind serves (docs/behaviour.md §11.1, §11.3); every other request gets a 404 whose body has
that server's own shape:

- ``ollama``: ``/api/*`` (not LM Studio's ``/api/v0`` or ``/api/v1``) and ``/v1/chat/completions``,
  ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``; an unknown route answers Gin's plain
  ``404 page not found``.
- ``lmstudio``: ``/v1/*``, ``/api/v0/*``, ``GET /api/v1/models``, ``POST /api/v1/chat`` and
  ``/api/v1/models/load`` / ``unload``; an unknown route
  answers ``{"error": "Unexpected endpoint or method. (GET /x)"}``.
- ``omlx``: ``/v1/*``; FastAPI's ``{"detail": "Not Found"}``.
- ``openai`` (llama.cpp's ``llama-server``): ``/v1/*``, ``/health``, ``/v1/health``, ``/props``,
  ``/slots``, and its router's ``GET /models``, ``POST /models/load`` and ``/models/unload``; ``{"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}``.
"""

from __future__ import annotations

import json

from attrs import frozen

__all__ = ["KINDS", "Raw", "lmstudio_facts", "not_found", "serves"]


@frozen
class Raw:
    """A body sent as it is, with its content type (a document that is not JSON)."""

    content_type: bytes
    body: bytes


KINDS = ("ollama", "lmstudio", "omlx", "openai")
"""The node kinds of docs/behaviour.md §11.1."""

_OLLAMA_V1 = (b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings")

_GETS: dict[str, tuple[bytes, ...]] = {
    "ollama": (b"/api/tags", b"/api/ps", b"/api/version", b"/v1/models"),
    "lmstudio": (b"/v1/models", b"/api/v0/models", b"/api/v1/models"),
    "omlx": (b"/v1/models", b"/v1/models/status"),
    "openai": (b"/v1/models", b"/models", b"/health", b"/v1/health", b"/props", b"/slots"),
}


def serves(kind: str, method: bytes, path: bytes) -> bool:
    """Whether the real server of ``kind`` has the route ``method path``.

    :param kind: one of :data:`KINDS`.
    :param method: the request method.
    :param path: the request path, without its query.
    """
    if method == b"GET":
        return path in _GETS[kind] or (
            kind == "lmstudio" and path.startswith((b"/api/v0/models/", b"/v1/models/"))
        )
    if method == b"DELETE":
        return kind == "ollama" and path == b"/api/delete"
    if method != b"POST":
        return False
    if kind == "ollama":
        own = path.startswith(b"/api/") and not path.startswith((b"/api/v0/", b"/api/v1/"))
        return own or path in _OLLAMA_V1
    if kind == "lmstudio":
        loading = path in (b"/api/v1/models/load", b"/api/v1/models/unload", b"/api/v1/chat")
        return loading or path.startswith((b"/v1/", b"/api/v0/"))
    return path.startswith(b"/v1/") or path in (b"/models/load", b"/models/unload")


def not_found(kind: str, method: bytes, path: bytes) -> Raw:
    """The body of the 404 the real server of ``kind`` answers for a route it does not have.

    :param kind: one of :data:`KINDS`.
    :param method: the request method.
    :param path: the request path, without its query.
    """
    if kind == "ollama":
        return Raw(b"text/plain", b"404 page not found")
    if kind == "lmstudio":
        route = f"{method.decode('ascii', 'replace')} {path.decode('utf-8', 'replace')}"
        document: object = {"error": f"Unexpected endpoint or method. ({route})"}
    elif kind == "omlx":
        document = {"detail": "Not Found"}
    else:
        document = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
    return Raw(b"application/json", json.dumps(document).encode())


def lmstudio_facts(model: str, context_length: int) -> dict[str, object]:
    """What LM Studio's ``/api/v0/models`` says of ``model`` besides its ``id`` and ``state``,
    derived from its name: ``type`` (``embeddings`` for a name with "embed", else ``llm``),
    ``publisher`` (the part before ``/``, else ``lmstudio-community``), ``arch`` (the name's first
    letters), ``compatibility_type``, ``quantization`` and ``max_context_length``.

    :param model: the model's id.
    :param context_length: what ``max_context_length`` says.
    """
    publisher, _, name = model.rpartition("/")
    letters = "".join(c for c in name.split(":")[0].split("-")[0] if c.isalpha()).lower()
    return {
        "type": "embeddings" if "embed" in model.lower() else "llm",
        "publisher": publisher or "lmstudio-community",
        "arch": letters or "llama",
        "compatibility_type": "gguf",
        "quantization": "Q4_K_M",
        "max_context_length": context_length,
    }
