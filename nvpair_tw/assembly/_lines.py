# -*- test-case-name: tests.assembly.test_whole -*-
"""The :class:`Assembler`: a streamed body split into lines, capped, and handed to the folder of
its API family (Ollama NDJSON, OpenAI SSE) until the answer is whole."""

from __future__ import annotations

from typing import Protocol

from attrs import define, field

from nvpair_tw.assembly._frames import Assembled, Dialect, StreamCut, Tally
from nvpair_tw.assembly._ollama import OllamaFolder
from nvpair_tw.assembly._openai import OpenAIFolder
from nvpair_tw.core import AnswerTooLarge, Events, Lines

__all__ = ["Assembler", "Folder"]


class Folder(Protocol):
    """What folds one API family's frames into the answer."""

    def frame(self, frame: bytes) -> Assembled | None:
        """Fold one frame (an NDJSON line, an SSE event's data); the answer once it is the
        terminal one."""


class Framer(Protocol):
    """The core framer of the route's stream: NDJSON lines or SSE events."""

    @property
    def held(self) -> int: ...

    @property
    def over(self) -> bool: ...

    def feed(self, data: bytes) -> list[bytes]: ...

    def end(self) -> list[bytes]: ...


def _folder(dialect: Dialect, tally: Tally) -> Folder:
    return OpenAIFolder(dialect, tally) if dialect.sse else OllamaFolder(dialect, tally)


@define
class Assembler:
    """Folds one stream into the answer; fed every body chunk in order, boundaries anywhere.

    :meth:`feed` returns the :class:`Assembled` answer once the terminal frame has arrived (Ollama
    ``"done": true``, an error object, or SSE ``data: [DONE]``), None before; later bytes are
    ignored. :meth:`finish` is called at a clean end of body: a last line without its line end,
    and an event without its blank line, are examined, and a stream with no terminal frame raises
    :class:`StreamCut`. What is kept is the answer (its text fragments, tool calls, the last
    object's fields) and the unfinished last line or event; past ``limit`` characters in all,
    :class:`AnswerTooLarge` is raised.
    """

    dialect: Dialect
    limit: int
    answer: Assembled | None = field(default=None, init=False)
    _tally: Tally = field(init=False, repr=False)
    _folder: Folder = field(init=False, repr=False)
    _frames: Framer = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._tally = Tally(self.limit)
        self._folder = _folder(self.dialect, self._tally)
        self._frames = Events(self.limit) if self.dialect.sse else Lines(self.limit)

    @property
    def held(self) -> int:
        """Characters kept: the answer's text so far and the unfinished last line or event."""
        return self._tally.held + self._frames.held

    def feed(self, chunk: bytes) -> Assembled | None:
        """Fold one body chunk; the answer once the terminal frame has arrived."""
        if self.answer is None:
            self._fold(self._frames.feed(chunk))
            if self.answer is None:
                if self._frames.over:
                    raise AnswerTooLarge(f"an unfinished frame passed {self.limit} bytes")
                self._tally.check(self._frames.held)
        return self.answer

    def finish(self) -> Assembled:
        """At a clean end of body: the answer, or :class:`StreamCut`."""
        if self.answer is None:
            self._fold(self._frames.end())
        if self.answer is None:
            raise StreamCut("the stream ended before its terminal object")
        return self.answer

    def _fold(self, frames: list[bytes]) -> None:
        for frame in frames:
            self.answer = self._folder.frame(frame)
            if self.answer is not None:
                return
