# -*- test-case-name: tests.corridor.test_terminal -*-
"""Terminal-frame detection for streamed responses.

Prefix affinity is recorded only when a stream really finished (docs/behaviour.md §5.3): an SSE ``data: [DONE]``
(OpenAI-style), an Anthropic ``message_stop`` event, an OpenAI Responses API
``response.completed`` / ``response.failed`` / ``response.incomplete`` event, LM Studio's
``/api/v1/chat`` ``chat.end`` event, or an Ollama NDJSON
line whose object has ``"done": true``. The detector sits on the hot path of every relayed chunk, so it examines only
complete lines that pass a cheap substring pre-check, and keeps just the unfinished tail line,
capped in size.
"""

from __future__ import annotations

import json
import re
from typing import Any

from attrs import define, field

from nvpair_tw.core import Framing, Lines, line_around

__all__ = ["TerminalFrameDetector"]

MAX_LINE_BYTES = 1 << 20
BATCH = 8 << 10
"""Bytes of complete lines examined at once (what waits unexamined stays below this plus a
chunk)."""

# A complete line is parsed only if it matches one of these.
_SSE_HINT = re.compile(
    rb"\[DONE\]|message_stop|response\.(?:completed|failed|incomplete)|chat\.end"
)
# The terminal event types: Anthropic's, the OpenAI Responses API's three endings, LM Studio's.
_TERMINAL_TYPES = frozenset(
    {"message_stop", "response.completed", "response.failed", "response.incomplete", "chat.end"}
)
_NDJSON_HINT = re.compile(rb'"done"\s*:\s*true')
_SSE_MARKERS = (b"[DONE]", b"message_stop", b"response.", b"chat.end")
_NDJSON_MARKERS = (b"true",)
"""What a batch is searched for; only the lines holding one are matched against the hint."""
# For a line longer than the cap only its head is kept; these find a top-level ``"done": true`` in
# it without parsing (strings are skipped whole, so quoted text never counts).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]]', re.DOTALL)
_TRUE_VALUE = re.compile(rb"\s*:\s*true\b")


def _json_object(text: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _head_has_done(head: bytes) -> bool:
    """Whether the head of a truncated JSON object line has a top-level ``"done": true``."""
    depth = 0
    for match in _TOKEN.finditer(head):
        token = match.group()
        first = token[:1]
        if first in (b"{", b"["):
            depth += 1
        elif first in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and token == b'"done"' and _TRUE_VALUE.match(head, match.end()):
            return True
        if depth <= 0:
            return False
    return False


@define
class TerminalFrameDetector:
    """Fed every relayed response chunk; ``seen`` is True once the terminal frame has passed.

    ``streaming`` is True for ``text/event-stream`` and ``application/x-ndjson`` (parameters
    ignored, case-insensitive). For any other content type :meth:`feed` does nothing and ``seen``
    stays False. ``max_line_bytes`` caps the unfinished line kept between chunks; a longer line is
    judged on its head.

    A chunk costs one call of the framer, which hands the chunk's complete lines back as one run
    (the chunk itself when it ends a line). The runs are examined in batches of about
    :data:`BATCH` bytes, and whenever ``seen`` is read: a batch is joined and searched for the
    markers in C (SSE: ``[DONE]``, ``message_stop``, ``response.``, ``chat.end``; NDJSON:
    ``true``), so a stream
    of small chunks pays for a few substring searches per batch, not per chunk; only the lines that
    hold a marker are cut out of the batch, and only those that match the pattern are parsed.
    """

    content_type: str | None
    max_line_bytes: int = field(default=MAX_LINE_BYTES, kw_only=True)
    framing: Framing | None = field(init=False)
    """The stream's framing; None for any other content type."""
    streaming: bool = field(init=False)
    _seen: bool = field(init=False, default=False, repr=False)
    _sse: bool = field(init=False, repr=False)
    _lines: Lines = field(init=False, repr=False)
    _runs: list[bytes] = field(init=False, factory=list, repr=False)
    _size: int = field(init=False, default=0, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self.framing = framing = Framing.of(self.content_type)
        self.streaming = framing is not None
        self._sse = framing is Framing.SSE
        self._lines = Lines(self.max_line_bytes)

    @property
    def seen(self) -> bool:
        """Whether the terminal frame has passed (the complete lines fed so far are examined)."""
        if self._runs:
            self._examine()
        return self._seen

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished last line (never more than ``max_line_bytes``); complete
        lines wait unexamined for at most :data:`BATCH` bytes more."""
        return self._lines.held

    @property
    def waiting(self) -> int:
        """Bytes of complete lines not examined yet (below :data:`BATCH` between two chunks)."""
        return self._size

    def feed(self, chunk: bytes) -> None:
        """Take one relayed chunk; chunk boundaries may fall anywhere, even inside a line."""
        if self._seen or not self.streaming:
            return
        lines = self._lines
        run = lines.complete(chunk)
        if not run:
            return
        if lines.truncated:  # a line cut to its head: judged alone, after the ones before it
            self._examine()
            self._judge(run.splitlines(), True)
            return
        self._runs.append(run)
        self._size += len(run)
        if self._size >= BATCH:
            self._examine()

    def finish(self) -> None:
        """At a clean end of body, examine a last line the engine did not end with a newline."""
        if self.streaming and not self.seen and self._lines.held:
            line = self._lines.rest()
            self._judge([line], self._lines.truncated)

    def _examine(self) -> None:
        """Search the runs waiting (joined: one search per marker), then forget them."""
        runs = self._runs
        batch = runs[0] if len(runs) == 1 else b"".join(runs)
        self._runs = []
        self._size = 0
        if self._seen:
            return
        for marker in _SSE_MARKERS if self._sse else _NDJSON_MARKERS:
            if self._judge_marked(batch, marker):
                return

    def _judge_marked(self, batch: bytes, marker: bytes) -> bool:
        """Judge the lines of ``batch`` holding ``marker``, found by substring search (in C, at
        memory speed: a stream read whole holds its terminal frame in one batch with every event
        before it, and a pattern tried at every byte, or every line split off, costs more than
        the relay); whether one was the terminal frame.

        The search runs from the batch's end: whether *some* line is terminal does not depend on
        the order they are judged in, and the terminal frame is a stream's last, so a batch that
        holds it is settled by its first find, without scanning the events before it (and
        without judging each Responses API event, whose types all hold ``response.``)."""
        hint = _SSE_HINT if self._sse else _NDJSON_HINT
        found = batch.rfind(marker)
        while found >= 0:
            head, end = line_around(batch, found)
            line = batch[head:end]
            if hint.search(line) is not None and self._is_terminal(line):
                self._seen = True
                self._lines.clear()
                self._runs = []
                return True
            found = batch.rfind(marker, 0, head)
        return False

    def _judge(self, lines: list[bytes], truncated: bool) -> None:
        """Whether one of ``lines`` is the terminal frame (the first one cut to its head when
        ``truncated``: an NDJSON head is judged by its tokens, not parsed)."""
        hint = _SSE_HINT if self._sse else _NDJSON_HINT
        for index, line in enumerate(lines):
            if index == 0 and truncated and not self._sse:
                terminal = _head_has_done(line)
            else:
                terminal = hint.search(line) is not None and self._is_terminal(line)
            if terminal:
                self._seen = True
                self._lines.clear()
                self._runs = []
                return

    def _is_terminal(self, line: bytes) -> bool:
        if not self._sse:
            obj = _json_object(line)
            return obj is not None and obj.get("done") is True
        field_name, _, value = line.partition(b":")
        value = value.strip()
        if field_name == b"event":
            return value.decode("utf-8", "replace") in _TERMINAL_TYPES
        if field_name != b"data":
            return False
        if value == b"[DONE]":
            return True
        obj = _json_object(value)
        kind = None if obj is None else obj.get("type")
        return isinstance(kind, str) and kind in _TERMINAL_TYPES
