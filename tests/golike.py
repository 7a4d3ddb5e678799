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

__all__ = ["GoLikeNode", "Seen", "go_clean", "go_fold", "go_model", "go_path", "listen_golike"]

_SURROGATES = re.compile("[\ud800-\udfff]")


@frozen
class Seen:
    """One request as the Go-like node read it (``headers``: lower-cased names, in order)."""

    method: str
    path: str
    model: str | None
    headers: tuple[tuple[bytes, bytes], ...]


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


def go_model(body: bytes) -> str | None:
    """What ``json.NewDecoder(body).Decode(&struct{ Model string })`` leaves in ``Model``.

    The first JSON value only; invalid UTF-8 and lone surrogates become U+FFFD; the last key that
    folds to ``model`` wins, a ``null`` leaves the field as it was; a body that is not an object,
    does not parse, or gives a non-string model has none.
    """
    text = body.decode("utf-8", "replace")
    decoder = json.JSONDecoder(object_pairs_hook=list, parse_constant=_refuse_constant)
    try:
        pairs, _ = decoder.raw_decode(text, len(text) - len(text.lstrip(" \t\r\n")))
    except (ValueError, RecursionError):
        return None
    if not isinstance(pairs, list) or (pairs and not isinstance(pairs[0], tuple)):
        return None  # an array, or a scalar: not an object
    model: Any = None
    for key, value in pairs:
        if go_fold(key) == "model" and value is not None:
            model = value
    if not isinstance(model, str):
        return None
    return _SURROGATES.sub("\ufffd", model)


class GoLikeNode(Resource):
    """Answers like a small Ollama / OpenAI-compatible engine and records every request in ``seen``."""

    isLeaf = True

    def __init__(self, models: tuple[str, ...] = ("llama3:latest",)) -> None:
        super().__init__()
        self.models = models
        self.seen: list[Seen] = []

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
        seen = Seen(method.decode("ascii"), go_path(target), go_model(body), headers)
        self.seen.append(seen)
        return self._answer(seen.method, seen.path, seen.model)

    def _answer(self, method: str, path: str, model: str | None) -> dict[str, Any]:
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
            return {"model": model, "message": message, "done": True, "done_reason": "stop"}
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


def listen_golike(reactor: IReactorTCP, node: GoLikeNode) -> IListeningPort:
    """Serve ``node`` on 127.0.0.1, port 0 (``.getHost().port``); the caller stops listening."""
    site = Site(node)
    return reactor.listenTCP(0, site, interface="127.0.0.1")  # type: ignore[arg-type]
