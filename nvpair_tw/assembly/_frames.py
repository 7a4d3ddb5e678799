# -*- test-case-name: tests.assembly.test_whole -*-
"""What the stream folders share (docs/behaviour.md §6.5): the route dialects, the assembled
answer, and the growing text with the cap on what is kept; the stream errors and compact JSON are
the core framer's, named here too."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from attrs import define, field, frozen

from nvpair_tw.core import AnswerTooLarge, MalformedStream, StreamCut, dump

__all__ = [
    "AnswerTooLarge",
    "Assembled",
    "AssemblyError",
    "Dialect",
    "MalformedStream",
    "StreamCut",
    "Tally",
    "Text",
    "dump",
    "insert_after",
    "parse_object",
]


class Dialect(Enum):
    """The four assembled routes, named by their path."""

    OLLAMA_CHAT = "/api/chat"
    OLLAMA_GENERATE = "/api/generate"
    OPENAI_CHAT = "/v1/chat/completions"
    OPENAI_COMPLETIONS = "/v1/completions"

    @property
    def sse(self) -> bool:
        """OpenAI routes stream server-sent events; Ollama's stream NDJSON."""
        return self in (Dialect.OPENAI_CHAT, Dialect.OPENAI_COMPLETIONS)

    @property
    def stream_type(self) -> str:
        """The media type the engine streams this route with."""
        return "text/event-stream" if self.sse else "application/x-ndjson"


AssemblyError = StreamCut
"""The stream cannot become an answer (the attempt fails as a drop, before any commit): the
core's :class:`~nvpair_tw.core.StreamCut`, whose subclasses are the cut's kinds."""


@frozen
class Assembled:
    """The client's whole answer: 200, or 500 when the engine reported an error in the stream
    (what the engine answers a non-streaming request that fails that way)."""

    status: int
    body: bytes


def parse_object(line: bytes) -> dict[str, Any]:
    """One frame as a JSON object, or :class:`MalformedStream`."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise MalformedStream("a frame is not JSON") from error
    if not isinstance(value, dict):
        raise MalformedStream("a frame is not a JSON object")
    return value


def insert_after(mapping: dict[str, Any], after: str, key: str, value: Any) -> dict[str, Any]:
    """``mapping`` with ``key`` set: in place if present, else right after ``after`` (or last)."""
    if key in mapping or after not in mapping:
        return {**mapping, key: value}
    out: dict[str, Any] = {}
    for name, item in mapping.items():
        out[name] = item
        if name == after:
            out[key] = value
    return out


@define
class Text:
    """A growing text: fragments joined in blocks, so a long answer is a few strings, not one
    string object per token."""

    blocks: list[str] = field(factory=list)
    recent: list[str] = field(factory=list)

    def add(self, fragment: str) -> None:
        self.recent.append(fragment)
        if len(self.recent) >= 256:
            self.blocks.append("".join(self.recent))
            self.recent.clear()

    def text(self) -> str:
        return "".join([*self.blocks, *self.recent])


@define
class Tally:
    """The characters of the answer kept so far, against the cap."""

    limit: int
    held: int = 0

    def check(self, extra: int = 0) -> None:
        """:class:`AnswerTooLarge` once the answer (and ``extra`` pending characters) pass it."""
        if self.held + extra > self.limit:
            raise AnswerTooLarge(f"the assembled answer passed {self.limit} characters")

    def grow(self, store: dict[str, Text], key: str, value: Any) -> None:
        """Add a non-empty string ``value`` to ``store[key]``, counted and checked."""
        if isinstance(value, str) and value:
            store.setdefault(key, Text()).add(value)
            self.held += len(value)
            self.check()
