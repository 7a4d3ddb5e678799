# -*- test-case-name: tests.dialects.test_common -*-
"""What the dialect translators share: the errors, the :class:`Transducer` protocol, compact JSON,
the SSE and line splitters, RFC 3339 time stamps, and media types."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "JSON_TYPE",
    "NDJSON_TYPE",
    "SSE_TYPE",
    "AnswerTooLarge",
    "Lines",
    "MalformedAnswer",
    "SseEvents",
    "Stamp",
    "StreamCut",
    "Transducer",
    "Untranslatable",
    "dump",
    "media_type",
]

JSON_TYPE = b"application/json; charset=utf-8"
NDJSON_TYPE = b"application/x-ndjson"
SSE_TYPE = b"text/event-stream"


class Untranslatable(Exception):
    """A request that cannot be translated faithfully for a node of another kind.

    :ivar field: the offending field of the request (``"context"``, ``"template"``, …).
    """

    def __init__(self, field: str, why: str | None = None) -> None:
        self.field = field
        reason = f": {why}" if why else ""
        super().__init__(
            f"the request's {field!r} field cannot be translated for a node of another kind{reason}"
        )


class StreamCut(Exception):
    """The upstream ended (cleanly) before its terminal frame: the translated answer is
    incomplete. Every error a transducer raises is one of these."""


class AnswerTooLarge(StreamCut):
    """An answer buffered whole (or one unfinished frame) grew past the limit."""


class MalformedAnswer(StreamCut):
    """A frame of the upstream answer is not what its route sends (a JSON object)."""


class Transducer(Protocol):
    """One attempt's answer, upstream bytes in, client bytes out.

    :ivar content_type: the ``Content-Type`` the client gets.
    """

    content_type: bytes

    def feed(self, data: bytes) -> bytes:
        """Upstream bytes in (split anywhere, even inside a line or a UTF-8 sequence); the client
        bytes ready now out (maybe ``b""``)."""

    def end(self) -> bytes:
        """The upstream ended cleanly: the rest of the client bytes. Raises :class:`StreamCut`
        when the terminal frame never came."""

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        """The (prompt, completion) token counts the answer reported, None where unknown."""


def dump(document: Any) -> bytes:
    """``document`` as compact UTF-8 JSON."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def media_type(content_type: bytes | None) -> bytes:
    """The media type of a ``Content-Type`` value, lower case, without parameters."""
    return (content_type or b"").split(b";", 1)[0].strip().lower()


class Lines:
    """Splits a byte stream into lines (without ``\\n`` and a trailing ``\\r``), holding the
    unfinished last line, at most ``limit`` bytes of it."""

    __slots__ = ("_limit", "_tail")

    def __init__(self, limit: int) -> None:
        self._tail = b""
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        if self._tail:
            data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > self._limit:
            raise AnswerTooLarge(f"an unfinished line passed {self._limit} bytes")
        return [line[:-1] if line.endswith(b"\r") else line for line in lines]

    def rest(self) -> bytes:
        """The unfinished last line (``\\r`` removed), emptied."""
        tail, self._tail = self._tail, b""
        return tail[:-1] if tail.endswith(b"\r") else tail


class SseEvents:
    """Server-sent events (the WHATWG rules that matter here): ``data:`` with or without its
    space, LF or CRLF line ends, several ``data:`` lines joined with ``\\n``, and comments
    (``:``), ``event:``, ``id:`` and ``retry:`` lines ignored. An event is dispatched at its
    blank line; :meth:`rest` dispatches one left unfinished at the end of the body."""

    __slots__ = ("_data", "_lines", "_size")

    def __init__(self, limit: int) -> None:
        self._lines = Lines(limit)
        self._data: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The events ``data`` completes, in order."""
        lines = self._lines
        if (
            not lines._tail
            and not self._data
            and data.startswith(b"data: ")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and data[-3] != 13  # not CR: a one-line event "data: …\n\n", the common chunk
            and len(data) <= lines._limit
        ):
            return [data[6:-2]]
        events: list[bytes] = []
        pending = self._data
        for line in lines.feed(data):
            if not line:
                if pending:
                    events.append(pending[0] if len(pending) == 1 else b"\n".join(pending))
                    pending.clear()
                    self._size = 0
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                pending.append(value)
                self._size += len(value)
                if self._size > lines._limit:
                    raise AnswerTooLarge("an unfinished event passed the limit")
        return events

    @property
    def idle(self) -> bool:
        """Whether nothing is held: no unfinished line, no event being gathered."""
        return not self._lines._tail and not self._data

    def rest(self) -> list[bytes]:
        """At the end of the body: the last line and an event not followed by its blank line."""
        last = self._lines.rest()
        return self.feed(last + b"\n\n" if last else b"\n")


class Stamp:
    """RFC 3339 UTC time stamps with nanoseconds (what Ollama's ``created_at`` looks like), from a
    clock in seconds since the epoch; the date and time part is formatted once per second."""

    __slots__ = ("_clock", "_prefix", "_second")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._second = -1
        self._prefix = ""

    def now(self) -> tuple[float, str]:
        """The clock's reading and its stamp."""
        when = self._clock()
        second = int(when)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        return when, f"{self._prefix}{int((when - second) * 1e9):09d}Z"
