# -*- test-case-name: tests.inbound.test_parse -*-
"""One strict reading of a request's path (docs/behaviour.md §14.1).

Engines written in Go decode a percent-encoded path before they route it: the proxy does the same,
once, refuses what it cannot read as the node would (an encoded ``/``, ``\\``, NUL or control
byte, a bad escape: 400 ``bad-path``) and forwards the normalised path in one canonical encoding
(:func:`parse_target`), so what the node routes is what the proxy classified.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote, unquote_to_bytes, urlsplit

from attrs import frozen

from nvpair_tw.inbound._ingress import Rejection

__all__ = ["Target", "parse_target"]

MODEL_ROUTES: Final = (("api", "v0", "models"), ("api", "v1", "models"), ("v1", "models"))
_SAFE = "!$&'()*+,;=:@"  # RFC 3986 pchar, less unreserved (always kept) and pct-encoded
_FAST_PATH = re.compile(rb"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9\-._~!$&'()*+,;=:@]+)+")
_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


@frozen
class Target:
    """A request-target as the proxy and the node both read it (docs/behaviour.md §14.1).

    ``path`` is decoded and normalised (classification and scopes use it); ``wire`` is what goes
    to the node: ``path`` in one canonical percent-encoding, then ``?query`` when the client sent
    a non-empty one; ``model_id`` is the decoded id of ``/api/v0|v1/models/{id}`` and
    ``/v1/models/{id}``.
    """

    path: str
    query: bytes
    wire: bytes
    model_id: str | None


def _bad_path(why: str) -> Rejection:
    return Rejection(400, "bad-path", f"bad request path: {why}")


def parse_target(raw: bytes) -> Target | Rejection:
    """The normalised target of ``raw`` (origin-form, or absolute-form reduced to its path)."""
    if raw.startswith(b"/"):
        path, _, query = raw.partition(b"#")[0].partition(b"?")
    else:
        parts = _absolute(raw)
        if isinstance(parts, Rejection):
            return parts
        path, query = parts
    if _FAST_PATH.fullmatch(path):
        segments = path.decode("ascii").split("/")[1:]
        wire = path
    else:
        resolved = _segments(path)
        if isinstance(resolved, Rejection):
            return resolved
        segments = resolved
        wire = ("/" + "/".join(quote(s, safe=_SAFE) for s in segments)).encode("ascii")
    prefix = _model_prefix(segments)
    model_id = "/".join(segments[prefix:]) if prefix and len(segments) > prefix else None
    wire += b"?" + query if query else b""
    return Target("/" + "/".join(segments), query, wire, model_id)


def _absolute(raw: bytes) -> tuple[bytes, bytes] | Rejection:
    """The path and query of an absolute-form target (``http://host/path?query``)."""
    if _CONTROL_BYTES.search(raw):
        return _bad_path("a control character")
    try:
        parts = urlsplit(raw.decode("latin-1"))
    except ValueError:
        return _bad_path("not an origin-form or absolute-form target")
    if not (parts.scheme and parts.netloc):
        return _bad_path("not an origin-form or absolute-form target")
    return (parts.path or "/").encode("latin-1"), parts.query.encode("latin-1")


def _model_prefix(segments: list[str]) -> int:
    """How many segments name a route that carries a model id after them (0: none)."""
    for route in MODEL_ROUTES:
        if tuple(segments[: len(route)]) == route:
            return len(route)
    return 0


def _segments(path: bytes) -> list[str] | Rejection:
    """The decoded segments of ``path``, dot-segments resolved, empty ones dropped."""
    if _BAD_ESCAPE.search(path):
        return _bad_path("a malformed percent-escape")
    out: list[str] = []
    for raw in path.split(b"/")[1:]:
        decoded = unquote_to_bytes(raw) if b"%" in raw else raw
        if b"\\" in decoded or _CONTROL_BYTES.search(decoded):
            return _bad_path("a backslash or a control character")
        try:
            segment = decoded.decode("utf-8")
        except UnicodeDecodeError:
            return _bad_path("not UTF-8")
        if segment == "..":
            if out:
                out.pop()
        elif segment not in ("", "."):
            out.append(segment)
    prefix = _model_prefix(out)
    for index, segment in enumerate(out):
        if "/" not in segment:
            continue
        if not prefix or index < prefix:
            return _bad_path("an encoded '/'")
        if any(piece in ("", ".", "..") for piece in segment.split("/")):
            return _bad_path("an empty or dot segment in the model id")
    return out
