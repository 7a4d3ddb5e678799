# -*- test-case-name: tests.assembly.test_whole -*-
"""The :class:`Assembler`: a streamed body split into lines, capped, and handed to the folder of
its API family (Ollama NDJSON, OpenAI SSE) until the answer is whole."""

from __future__ import annotations

from typing import Protocol

from attrs import define, field

from nvpair_tw.assembly._frames import Assembled, Dialect, StreamCut, Tally
from nvpair_tw.assembly._ollama import OllamaFolder
from nvpair_tw.assembly._openai import OpenAIFolder

__all__ = ["Assembler", "Folder"]


class Folder(Protocol):
    """What folds one API family's lines into the answer."""

    @property
    def pending(self) -> int:
        """Characters of an unfinished frame held between lines."""

    def line(self, line: bytes) -> Assembled | None:
        """Fold one line (no newline, no CR); the answer once the terminal frame is complete."""

    def end(self) -> Assembled | None:
        """At the end of the body, after the last line: the answer if that completed it."""


def _folder(dialect: Dialect, tally: Tally) -> Folder:
    return OpenAIFolder(dialect, tally) if dialect.sse else OllamaFolder(dialect, tally)


@define
class Assembler:
    """Folds one stream into the answer; fed every body chunk in order, boundaries anywhere.

    :meth:`feed` returns the :class:`Assembled` answer once the terminal frame has arrived (Ollama
    ``"done": true``, an error object, or SSE ``data: [DONE]``), None before; later bytes are
    ignored. :meth:`finish` is called at a clean end of body: a last line without a newline is
    examined, and a stream with no terminal frame raises :class:`StreamCut`. What is kept is the
    answer (its text fragments, tool calls, the last object's fields) and the unfinished last
    line; past ``limit`` characters in all, :class:`AnswerTooLarge` is raised.
    """

    dialect: Dialect
    limit: int
    answer: Assembled | None = field(default=None, init=False)
    _tail: bytearray = field(factory=bytearray, init=False, repr=False)
    _tally: Tally = field(init=False, repr=False)
    _folder: Folder = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._tally = Tally(self.limit)
        self._folder = _folder(self.dialect, self._tally)

    @property
    def held(self) -> int:
        """Characters kept: the answer's text so far and the unfinished last line."""
        return self._tally.held + self._folder.pending + len(self._tail)

    def feed(self, chunk: bytes) -> Assembled | None:
        """Fold one body chunk; the answer once the terminal frame has arrived."""
        if self.answer is not None:
            return self.answer
        start = 0
        while self.answer is None:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self._tail:
                self._tail += chunk[start:end]
                line = bytes(self._tail)
                self._tail.clear()
            else:
                line = chunk[start:end]
            self._line(line)
            start = end + 1
        if self.answer is None and start < len(chunk):
            self._tail += chunk[start:]
            self._tally.check(self._folder.pending + len(self._tail))
        return self.answer

    def finish(self) -> Assembled:
        """At a clean end of body: the answer, or :class:`StreamCut`."""
        if self.answer is None and self._tail:
            line = bytes(self._tail)
            self._tail.clear()
            self._line(line)
            if self.answer is None:
                self.answer = self._folder.end()
        if self.answer is None:
            raise StreamCut("the stream ended before its terminal object")
        return self.answer

    def _line(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        self.answer = self._folder.line(line)
