# -*- test-case-name: tests.corridor.test_terminal -*-
"""Terminal-frame detection for streamed responses.

Prefix affinity is recorded only when a stream really finished (docs/behaviour.md §5.3): an SSE ``data: [DONE]``
(OpenAI-style), an Anthropic ``message_stop`` event, an OpenAI Responses API
``response.completed`` / ``response.failed`` / ``response.incomplete`` event, or an Ollama NDJSON
line whose object has ``"done": true``. The detector sits on the hot path of every relayed chunk, so it examines only
complete lines that pass a cheap substring pre-check, and keeps just the unfinished tail line,
capped in size.
"""

from __future__ import annotations

import json
import re
from typing import Any

from attrs import define, field

from nvpair_tw.core import Framing, Lines

__all__ = ["TerminalFrameDetector"]

MAX_LINE_BYTES = 1 << 20

# A complete line is parsed only if it matches one of these.
_SSE_HINT = re.compile(rb"\[DONE\]|message_stop|response\.(?:completed|failed|incomplete)")
# The terminal event types: Anthropic's, and the OpenAI Responses API's three endings.
_TERMINAL_TYPES = frozenset(
    {"message_stop", "response.completed", "response.failed", "response.incomplete"}
)
_NDJSON_HINT = re.compile(rb'"done"\s*:\s*true')
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
    """Fed every relayed response chunk; ``seen`` turns True once the terminal frame has passed.

    ``streaming`` is True for ``text/event-stream`` and ``application/x-ndjson`` (parameters
    ignored, case-insensitive). For any other content type :meth:`feed` does nothing and ``seen``
    stays False. ``max_line_bytes`` caps the unfinished line kept between chunks; a longer line is
    judged on its head.

    A chunk costs one call of the framer (which hands the chunk's complete lines back as one run,
    without a copy when the chunk ends a line) and, for SSE, three substring searches in C (a
    terminal line must hold one of the markers; for NDJSON, ``true``); only a run that passes is
    split into lines and its lines that match the pattern parsed.
    """

    content_type: str | None
    max_line_bytes: int = field(default=MAX_LINE_BYTES, kw_only=True)
    streaming: bool = field(init=False)
    seen: bool = field(init=False, default=False)
    _sse: bool = field(init=False, repr=False)
    _lines: Lines = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        framing = Framing.of(self.content_type)
        self.streaming = framing is not None
        self._sse = framing is Framing.SSE
        self._lines = Lines(self.max_line_bytes)

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished last line (never more than ``max_line_bytes``)."""
        return self._lines.held

    def feed(self, chunk: bytes) -> None:
        """Examine one relayed chunk; chunk boundaries may fall anywhere, even inside a line."""
        if self.seen or not self.streaming:
            return
        run = self._lines.complete(chunk)
        if not run:
            return
        if self._sse:
            if b"[DONE]" in run or b"message_stop" in run or b"response." in run:
                self._judge(run.splitlines(), self._lines.truncated)
        elif b"true" in run:
            self._judge(run.splitlines(), self._lines.truncated)

    def finish(self) -> None:
        """At a clean end of body, examine a last line the engine did not end with a newline."""
        if self.streaming and not self.seen and self._lines.held:
            line = self._lines.rest()
            self._judge([line], self._lines.truncated)

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
                self.seen = True
                self._lines.clear()
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
        return obj is not None and obj.get("type") in _TERMINAL_TYPES
