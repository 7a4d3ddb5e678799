"""A node that reads requests the way engines written in Go do, for tests of docs/behaviour.md §14.1.

Why it exists: the proxy is a boundary only if what it reads is what the engine behind it reads.
Ollama and the Go front ends read a request differently from Python's defaults: ``net/http``
decodes the percent-encoded path and ``path.Clean`` resolves ``.``/``..`` and ``//``;
``encoding/json`` replaces invalid UTF-8 (and lone surrogate escapes) with U+FFFD, decodes only
the first JSON value of a stream (what follows is ignored), and matches object keys to struct
fields case-insensitively (Unicode simple folding: the Kelvin sign folds to ``k``) with the last
match winning. :func:`go_path` and :func:`go_model` are those readings; :class:`GoLikeNode`
records, for every request it gets, the path and model a Go engine would have acted on, so a
test can check that the proxy forwarded what it checked.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from attrs import frozen
from twisted.internet.interfaces import IListeningPort, IReactorTCP
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

__all__ = [
    "NAMED_BY",
    "GoLikeNode",
    "Seen",
    "go_clean",
    "go_fold",
    "go_model",
    "go_names",
    "go_path",
    "listen_golike",
]

_SURROGATES = re.compile("[\ud800-\udfff]")


@frozen
class Seen:
    """One request as the Go-like node read it (``headers``: lower-cased names, in order)."""

    method: str
    path: str
    model: str | None
    headers: tuple[tuple[bytes, bytes], ...]
    names: tuple[tuple[str, str], ...] = ()
    """Every model the route's request struct names (field, value), as Go decodes them."""
    query: bytes = b""


def go_clean(path: str) -> str:
    """Go's ``path.Clean``: ``.`` and ``..`` resolved (never above the root), ``//`` merged, no
    trailing ``/`` (``posixpath.normpath`` keeps a leading ``//``; Go does not)."""
    rooted = path.startswith("/")
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(segment)
    joined = "/".join(parts)
    return "/" + joined if rooted else joined or "."


def go_path(target: bytes) -> str:
    """The path a Go server routes on: the target's path percent-decoded, then cleaned."""
    path = target.partition(b"?")[0]
    return go_clean(unquote_to_bytes(path).decode("utf-8", "replace"))


def go_fold(text: str) -> str:
    """Unicode simple case folding, one character to one (``ß`` stays ``ß``; Go never folds to
    two characters, ``str.casefold`` does)."""
    return "".join(c.casefold() if len(c.casefold()) == 1 else c for c in text)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


NAMED_BY: dict[str, tuple[str, ...]] = {
    "/api/show": ("model", "name"),
    "/api/pull": ("model", "name"),
    "/api/push": ("model", "name"),
    "/api/delete": ("model", "name"),
    "/api/create": ("model", "name", "from"),
    "/api/copy": ("source", "destination"),
}
"""The fields of Ollama's request structs that name a model, per route; every other route's
struct names its model by ``model`` alone (chat, generate, llama.cpp's own routes)."""


def _pairs(body: bytes) -> list[tuple[str, Any]] | None:
    """The top-level members of the first JSON value, as ``encoding/json`` sees them."""
    text = body.decode("utf-8", "replace")
    decoder = json.JSONDecoder(object_pairs_hook=list, parse_constant=_refuse_constant)
    try:
        pairs, _ = decoder.raw_decode(text, len(text) - len(text.lstrip(" \t\r\n")))
    except (ValueError, RecursionError):
        return None
    if not isinstance(pairs, list) or (pairs and not isinstance(pairs[0], tuple)):
        return None  # an array, or a scalar: not an object
    return pairs


def _field(pairs: list[tuple[str, Any]], name: str) -> str | None:
    """The string a struct field ``name`` ends with: the last key folding to it wins, a ``null``
    leaves it as it was, anything but a string leaves none."""
    found: Any = None
    for key, value in pairs:
        if go_fold(key) == name and value is not None:
            found = value
    if not isinstance(found, str):
        return None
    return _SURROGATES.sub("\ufffd", found)


def go_model(body: bytes) -> str | None:
    """What ``json.NewDecoder(body).Decode(&struct{ Model string })`` leaves in ``Model``.

    The first JSON value only; invalid UTF-8 and lone surrogates become U+FFFD; the last key that
    folds to ``model`` wins, a ``null`` leaves the field as it was; a body that is not an object,
    does not parse, or gives a non-string model has none.
    """
    pairs = _pairs(body)
    return None if pairs is None else _field(pairs, "model")


def go_names(path: str, body: bytes) -> tuple[tuple[str, str], ...]:
    """Every non-empty model name the struct of route ``path`` decodes from ``body`` (field,
    value), read as :func:`go_model` reads ``model``."""
    pairs = _pairs(body)
    if pairs is None:
        return ()
    fields = NAMED_BY.get(path, ("model",))
    found = ((name, _field(pairs, name)) for name in fields)
    return tuple((name, value) for name, value in found if value)


class GoLikeNode(Resource):
    """Answers like a small Ollama / OpenAI-compatible engine and records every request in ``seen``."""

    isLeaf = True

    def __init__(self, models: tuple[str, ...] = ("llama3:latest",)) -> None:
        super().__init__()
        self.models = models
        self.seen: list[Seen] = []
        self._responses = 0

    def render(self, request: Request) -> bytes:
        body = request.content.read() if request.content is not None else b""
        headers = tuple(
            (name.lower(), value)
            for name, values in request.requestHeaders.getAllRawHeaders()
            for value in values
        )
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(self.serve(request.method, request.uri, body, headers)).encode()

    def serve(
        self, method: bytes, target: bytes, body: bytes, headers: tuple[tuple[bytes, bytes], ...]
    ) -> dict[str, Any]:
        """Record the request as a Go engine reads it; the JSON answer to send."""
        path = go_path(target)
        query = target.partition(b"?")[2]
        names = go_names(path, body)
        seen = Seen(method.decode("ascii"), path, go_model(body), headers, names, query)
        self.seen.append(seen)
        return self._answer(seen.method, seen.path, seen.model)

    def _answer(self, method: str, path: str, model: str | None) -> dict[str, Any]:
        if path.startswith("/v1/responses"):
            return self._response(method, path, model)
        if (method, path) == ("GET", "/api/tags"):
            return {
                "models": [{"name": m, "model": m, "size": 0, "details": {}} for m in self.models]
            }
        if (method, path) == ("GET", "/v1/models"):
            listed = [
                {"id": m, "object": "model", "created": 0, "owned_by": "golike"}
                for m in self.models
            ]
            return {"object": "list", "data": listed}
        if (method, path) == ("POST", "/api/chat"):
            message = {"role": "assistant", "content": "ok"}
            return {"model": model, "message": message, "done": True, "done_reason": "stop",
                    "prompt_eval_count": 4, "prompt_eval_duration": 2_000_000,
                    "eval_count": 8, "eval_duration": 40_000_000}  # fmt: skip
        if (method, path) == ("POST", "/api/show"):
            return {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": {},
                "model_info": {},
            }
        if (method, path) == ("POST", "/v1/chat/completions"):
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            return {"id": "chatcmpl-golike", "object": "chat.completion", "created": 0,
                    "model": model, "choices": [choice], "usage": usage}  # fmt: skip
        return {}

    def _response(self, method: str, path: str, model: str | None) -> dict[str, Any]:
        """``/v1/responses``: a new stored response (``resp_1``, ``resp_2``, ...) for a POST,
        the one the path names for anything else."""
        if method == "POST" and path == "/v1/responses":
            self._responses += 1
            return {"id": f"resp_{self._responses}", "object": "response", "created_at": 0,
                    "status": "completed", "model": model, "output": [],
                    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}  # fmt: skip
        return {"id": path.rsplit("/", 1)[-1], "object": "response", "status": "completed"}


def listen_golike(reactor: IReactorTCP, node: GoLikeNode) -> IListeningPort:
    """Serve ``node`` on 127.0.0.1, port 0 (``.getHost().port``); the caller stops listening."""
    site = Site(node)
    return reactor.listenTCP(0, site, interface="127.0.0.1")  # type: ignore[arg-type]
