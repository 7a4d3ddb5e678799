# -*- test-case-name: tests.assembly.test_whole -*-
"""Whole answers assembled from streamed work (docs/behaviour.md §6.5).

A non-streaming inference request is sent upstream as a stream, so headers and body bytes arrive with
the first token and the deadlines measure time to first token; the proxy folds the stream back into
the single JSON answer the client asked for. Three parts, the first two pure; this module plans
and re-exports the others' public names:

- :func:`plan_assembly` decides whether a request is assembled (route and body) and rewrites its
  body: ``"stream": true`` (and, on the OpenAI routes, ``stream_options.include_usage``) spliced
  into the client's own bytes, every other byte left as the client sent it;
- :class:`Assembler` (``assembly_lines``) folds the stream's frames into the answer, keeping only
  the growing answer and the unfinished last line, capped; the frames are folded per API family
  (``assembly_ollama`` for NDJSON objects, ``assembly_openai`` for SSE chunks), on what they share
  (``assembly_frames``);
- :class:`AssemblyGate` (``assembly_gate``), the sibling of :class:`~nvpair_tw.upstream._attempt.BodyGate` for assembled
  attempts: its ``first`` fires only with the whole answer, so the attempt loop commits then and a
  node that dies before the terminal object has sent the client nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from nvpair_tw.assembly._frames import (
    AnswerTooLarge,
    Assembled,
    AssemblyError,
    Dialect,
    MalformedStream,
    StreamCut,
)
from nvpair_tw.assembly._gate import (
    ANSWER_CONTENT_TYPE,
    AssembledResponse,
    AssemblyGate,
    AssemblyState,
)
from nvpair_tw.assembly._lines import Assembler
from nvpair_tw.core import (
    Edit,
    Outline,
    Outlined,
    media_type,
    object_members,
    outline_body,
    set_members,
)

__all__ = [
    "ANSWER_CONTENT_TYPE",
    "AnswerTooLarge",
    "Assembled",
    "AssembledResponse",
    "Assembler",
    "Assembly",
    "AssemblyError",
    "AssemblyGate",
    "AssemblyState",
    "Dialect",
    "MalformedStream",
    "StreamCut",
    "plan_assembly",
    "rewrite_body",
    "rewrite_outlined",
]

_BY_PATH = {d.value: d for d in Dialect}


@frozen
class Assembly:
    """An assembled request: its route's dialect, the body sent upstream, and the answer's cap;
    the outline of that body when the plan was given the client's (later edits use it)."""

    dialect: Dialect
    body: bytes
    limit: int
    outline: Outline | None = None

    def accepts(self, content_type: bytes | None) -> bool:
        """Whether an upstream 2xx with ``content_type`` is the stream to assemble.

        An engine that answered with a whole JSON document anyway is relayed as it is.
        """
        return media_type(content_type).decode("latin-1") == self.dialect.stream_type


def plan_assembly(
    path: str,
    body: bytes,
    parsed: Mapping[str, Any] | None,
    limit: int,
    outline: Outline | None = None,
) -> Assembly | None:
    """The assembly of a request to ``path`` whose body ``parsed`` to a JSON object, or None.

    Ollama ``/api/chat`` and ``/api/generate`` stream unless ``"stream": false``; the OpenAI routes
    stream only with ``"stream": true`` (absent or null is non-streaming). A ``stream`` of another
    type, an OpenAI ``stream_options`` that is neither an object nor null, or a body that is not
    UTF-8 is left alone: the engine answers it as it would have. With the ``outline`` of ``body``
    (the one parse's, docs/behaviour.md §14.1) the body is not read again, and the assembly
    carries the outline of its rewritten body.
    """
    dialect = _BY_PATH.get(path)
    if dialect is None or parsed is None:
        return None
    stream = parsed.get("stream", None)
    if dialect.sse:
        if stream is not None and stream is not False:
            return None
        options = parsed.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return None
    elif stream is not False:
        return None
    try:
        source = outline_body(body) if outline is None else Outlined(body, outline)
        rewritten = rewrite_outlined(dialect, source)
    except ValueError:
        return None
    return Assembly(dialect, rewritten.body, limit, rewritten.outline if outline else None)


def rewrite_body(dialect: Dialect, body: bytes) -> bytes:
    """``body`` with ``"stream": true`` (and ``stream_options.include_usage: true`` for OpenAI).

    Only those members' values are replaced (every duplicate of them), or the members inserted
    first; every other byte is the client's. Raises ``ValueError`` for a body that is not one UTF-8
    JSON object. Reads the whole body: given its outline, use :func:`rewrite_outlined`.
    """
    return rewrite_outlined(dialect, outline_body(body)).body


def rewrite_outlined(dialect: Dialect, doc: Outlined) -> Outlined:
    """:func:`rewrite_body` of ``doc.body``, reading only the spans its outline names (and a
    ``stream_options`` object's own span), with the outline of the result."""
    edits: dict[str, Edit] = {"stream": _true}
    if dialect.sse:
        edits["stream_options"] = _asking_usage
    return set_members(doc, edits)


def _true(old: memoryview | None) -> bytes:
    return b"true"


def _asking_usage(old: memoryview | None) -> bytes:
    """A ``stream_options`` value with ``include_usage: true``: an object keeps its other bytes."""
    if old is None or old[:1].tobytes() != b"{":
        return b'{"include_usage":true}'
    text = bytes(old).decode("utf-8")
    nested, _ = object_members(text, 0)
    out = text
    edits = _assign(text, 0, nested, {"include_usage": "true"})
    for s, e, replacement in sorted(edits, key=lambda edit: edit[0], reverse=True):
        out = out[:s] + replacement + out[e:]
    return out.encode("utf-8")


def _assign(
    text: str, start: int, members: list[tuple[str, int, int]], values: dict[str, str]
) -> list[tuple[int, int, str]]:
    """Edits giving the object at ``start`` each member of ``values`` (raw JSON texts)."""
    edits: list[tuple[int, int, str]] = []
    missing: list[str] = []
    for key, value in values.items():
        spans = [(s, e) for k, s, e in members if k == key]
        edits.extend((s, e, value) for s, e in spans)
        if not spans:
            missing.append(json.dumps(key) + ":" + value)
    if missing:
        inserted = ",".join(missing)
        if members:
            edits.append((start + 1, start + 1, inserted + ","))
        else:
            edits.append((start + 1, text.index("}", start), inserted))
    return edits
