# -*- test-case-name: tests.core.test_framer -*-
"""Streamed answers, framed: the one splitter of SSE and NDJSON bytes into whole lines and events,
the errors of a stream that cannot become its answer, and what a frame is written as.

Every reader of a streamed answer (the terminal-frame detector, the usage meter and stripper, the
assembly, the dialect translations, the fan-out merge) frames it here, so a line ends the same way
everywhere: at LF, CRLF or a lone CR (a CRLF split across two reads is one line end), and an
unfinished line held between reads is bounded. The framer works on bytes and finds line ends in C
(``bytes.rfind``, ``bytes.splitlines``): :meth:`Lines.complete` hands a read's complete lines over
as one run without a Python object per line, for readers that only search them; :meth:`Lines.feed`
gives the lines themselves. See docs/behaviour.md §6.5 and §11.3.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

__all__ = [
    "EVENT_ENDS",
    "AnswerTooLarge",
    "Events",
    "Framing",
    "Lines",
    "MalformedStream",
    "ProxyBug",
    "StreamCut",
    "after_last_event",
    "dump",
    "event_end",
    "line_around",
    "line_start",
    "media_type",
]


class StreamCut(Exception):
    """The upstream's stream cannot become the client's answer: it ended (cleanly) before its
    terminal frame, or (the subclasses) a frame of it is malformed or too large. Every error a
    reader of a stream raises for what the node sent is one of these: the node's fault."""


class AnswerTooLarge(StreamCut):
    """An answer kept whole, or one unfinished line or event, grew past its bound."""


class MalformedStream(StreamCut):
    """A frame of the stream is not what its route sends (a JSON object, UTF-8)."""


class ProxyBug(Exception):
    """A reader of a stream failed on its own (a bug in the proxy, not the node's fault): the
    request fails with the proxy's error and the node is neither cooled nor left for another.

    :ivar error: what the reader raised.
    """

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.__cause__ = error
        super().__init__(f"a stream reader failed: {type(error).__name__}: {error}")


def dump(document: Any) -> bytes:
    """``document`` as compact UTF-8 JSON (a frame, or a whole answer's body)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def media_type(content_type: bytes | None) -> bytes:
    """The media type of a ``Content-Type`` value, lower case, without parameters."""
    return (content_type or b"").partition(b";")[0].strip().lower()


class Framing(Enum):
    """How a streamed answer is framed, named by its media type."""

    SSE = b"text/event-stream"
    NDJSON = b"application/x-ndjson"

    @classmethod
    def of(cls, content_type: bytes | str | None) -> Framing | None:
        """The framing of a ``Content-Type`` value (parameters and case ignored); None when the
        body is not a stream."""
        if isinstance(content_type, str):
            content_type = content_type.encode("latin-1", "replace")
        media = media_type(content_type)
        if media == b"text/event-stream":
            return cls.SSE
        if media == b"application/x-ndjson":
            return cls.NDJSON
        return None


_LF = 10


class Lines:
    """Bytes in, whole lines out: LF, CRLF and CR end a line; the unfinished last line is held.

    The held line is bounded: past ``limit`` bytes only its head (``limit`` bytes) is kept and
    :attr:`over` is True until that line ends; the run that ends it starts with the head
    (:attr:`truncated`). A reader that refuses such a line raises :class:`AnswerTooLarge` then;
    one that can judge a line on its head goes on. A line that begins and ends within one read is
    never bounded.

    :ivar truncated: whether the first line of the last run given (by :meth:`complete`,
        :meth:`feed` or :meth:`rest`) was cut to its head.
    """

    __slots__ = ("_cut", "_held", "_lf", "_limit", "_pieces", "truncated")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a line bound must be at least 1 byte")
        self._limit = limit
        self._pieces: list[bytes] = []
        self._held = 0
        self._lf = False  # the last read ended with CR: a LF first in the next one is its end
        self._cut = False
        self.truncated = False

    @property
    def held(self) -> int:
        """Bytes of the unfinished line held now (never more than the bound)."""
        return self._held

    @property
    def over(self) -> bool:
        """Whether the line held now passed the bound (only its head is kept)."""
        return self._cut

    @property
    def idle(self) -> bool:
        """Whether nothing is held: no unfinished line, no line end half seen (CR of a CRLF)."""
        return not self._held and not self._lf

    def complete(self, data: bytes) -> bytes:
        """The complete lines ``data`` finishes (the held line first), as one run with their line
        ends; ``b""`` when none. Split it with ``bytes.splitlines``."""
        if self._lf:
            if not data:
                return b""
            self._lf = False
            if data[0] == _LF:
                data = data[1:]
        if not self._held and data.endswith(b"\n"):
            self.truncated = False
            return data  # the common read: whole lines, nothing held
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if end == 0:
            self._hold(data)
            return b""
        if self._held:
            run = self._joined(data, end)
        else:
            self.truncated = False
            run = data[:end]
        if end == len(data):
            self._lf = data[-1] != _LF
        else:
            self._hold(data[end:])
        return run

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes, without their line ends."""
        return self.complete(data).splitlines()

    def end(self) -> list[bytes]:
        """At the end of the body: the unfinished last line as a line (none when empty)."""
        line = self.rest()
        return [line] if line else []

    def rest(self) -> bytes:
        """At the end of the body: the unfinished last line (maybe its head: :attr:`truncated`),
        emptied; ``b""`` when none."""
        line = b"".join(self._pieces)
        self.truncated = self._cut
        self.clear()
        return line

    def clear(self) -> None:
        """Forget what is held."""
        self._pieces = []
        self._held = 0
        self._cut = False
        self._lf = False

    def _joined(self, data: bytes, end: int) -> bytes:
        """The held line completed by ``data[:end]`` (which holds at least one line end): its
        head alone when it was cut, then the other lines."""
        self.truncated = self._cut
        if self._cut:
            first = data.find(b"\n")  # the first line end is before ``end``
            cr = data.find(b"\r")
            if first < 0 or 0 <= cr < first:
                first = cr
            data = data[first:end]
        else:
            data = data[:end]
        self._pieces.append(data)
        run = b"".join(self._pieces)
        self._pieces = []
        self._held = 0
        self._cut = False
        return run

    def _hold(self, data: bytes) -> None:
        if not data:
            return
        room = self._limit - self._held
        if len(data) > room:
            if room > 0:
                self._pieces.append(data[:room])
                self._held = self._limit
            self._cut = True
        else:
            self._pieces.append(data)
            self._held += len(data)


class Events:
    """Server-sent events (the WHATWG rules that matter here): ``data:`` with or without its
    space, several ``data:`` lines joined with ``\\n``, and comments (``:``), ``event:``, ``id:``
    and ``retry:`` lines ignored; an event is dispatched at its blank line, its data given as
    bytes. :attr:`over` turns True when an unfinished line, or an event's data, passes ``limit``
    bytes."""

    __slots__ = ("_big", "_data", "_limit", "_lines", "_size")

    def __init__(self, limit: int) -> None:
        self._lines = Lines(limit)
        self._limit = limit
        self._data: list[bytes] = []
        self._size = 0
        self._big = False

    def feed(self, data: bytes) -> list[bytes]:
        """The data of the events ``data`` completes, in order."""
        if (
            not self._data
            and self._lines.idle
            and data.startswith(b"data: ")
            and data.endswith(b"\n\n")
            and data.find(b"\n") == len(data) - 2
            and data[-3] != 13  # not CR: one one-line event "data: …\n\n", the common read
            and len(data) <= self._limit
        ):
            return [data[6:-2]]
        events: list[bytes] = []
        pending = self._data
        for line in self._lines.feed(data):
            if not line:
                if pending:
                    events.append(b"\n".join(pending))  # one item: joined without a copy
                    pending.clear()
                    self._size = 0
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                pending.append(value)
                self._size += len(value)
                if self._size > self._limit:
                    self._big = True
        return events

    @property
    def held(self) -> int:
        """Bytes held: the unfinished line and the data of the event being gathered."""
        return self._lines.held + self._size

    @property
    def over(self) -> bool:
        """Whether the unfinished line or an event's data passed the bound."""
        return self._big or self._lines.over

    @property
    def idle(self) -> bool:
        """Whether nothing is held: no unfinished line, no event being gathered."""
        return not self._data and self._lines.idle

    def end(self) -> list[bytes]:
        """At the end of the body: the last line, and an event not followed by its blank line."""
        return self.feed(self._lines.rest() + b"\n\n")

    def check(self) -> None:
        """:class:`AnswerTooLarge` once :attr:`over`."""
        if self.over:
            raise AnswerTooLarge(f"an unfinished event passed {self._limit} bytes")


EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
"""What ends an SSE event: a blank line, after LF, CRLF or CR line ends."""


def after_last_event(data: bytes, before: int | None = None) -> int:
    """The index just after the last event end in ``data[:before]`` (0 when there is none)."""
    return max(
        (at + len(blank) for blank in EVENT_ENDS if (at := data.rfind(blank, 0, before)) >= 0),
        default=0,
    )


def event_end(data: bytes, at: int) -> int:
    """The index just after the end of the event holding ``at`` (the end of ``data`` if open)."""
    ends = [found + len(blank) for blank in EVENT_ENDS if (found := data.find(blank, at)) >= 0]
    return min(ends, default=len(data))


def line_start(data: bytes, at: int) -> int:
    """Where the line holding ``at`` starts in ``data`` (LF, CR or CRLF end a line; a point before
    ``data`` is in its first line)."""
    if at <= 0:
        return 0
    lf = data.rfind(b"\n", 0, at)
    return max(lf, data.rfind(b"\r", lf + 1, at)) + 1


def line_around(data: bytes, at: int) -> tuple[int, int]:
    """Where the line holding ``at`` starts and ends in ``data`` (its end excluded; LF, CR or
    CRLF end a line; the end of ``data`` ends an open one)."""
    ends = [found for mark in (b"\n", b"\r") if (found := data.find(mark, at)) >= 0]
    return line_start(data, at), min(ends, default=len(data))
