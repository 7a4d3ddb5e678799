# -*- test-case-name: tests.dialects.test_common -*-
"""What the dialect translators share: the :class:`Transducer` protocol, the framer as they use
it (:class:`Lines` and :class:`SseEvents`: the core's, refusing what passes the bound), RFC 3339
time stamps and the content types they answer with; the stream errors, compact JSON and media
types are the core's (``core._framer``), named here too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from nvpair_tw.core import AnswerTooLarge, Events, MalformedStream, StreamCut, dump, media_type
from nvpair_tw.core import Lines as _Lines

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


MalformedAnswer = MalformedStream
"""A frame of the upstream answer is not what its route sends (the core's
:class:`~nvpair_tw.core.MalformedStream`, by the name the translators use)."""


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


class Lines(_Lines):
    """The core framer's lines, refusing a held line past the bound: :meth:`feed` raises
    :class:`AnswerTooLarge` (what a translator does with it)."""

    __slots__ = ()

    def feed(self, data: bytes) -> list[bytes]:
        lines = super().feed(data)
        if self.over:
            raise AnswerTooLarge(f"an unfinished line passed {self._limit} bytes")
        return lines


class SseEvents(Events):
    """The core framer's SSE events, refusing a line or an event past the bound: :meth:`feed`
    and :meth:`rest` raise :class:`AnswerTooLarge` (what a translator does with it)."""

    __slots__ = ()

    def feed(self, data: bytes) -> list[bytes]:
        events = super().feed(data)
        self.check()
        return events

    def rest(self) -> list[bytes]:
        """At the end of the body: the last line and an event not followed by its blank line."""
        events = self.end()
        self.check()
        return events


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
