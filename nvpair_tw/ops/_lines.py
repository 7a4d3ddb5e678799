# -*- test-case-name: tests.ops.test_control -*-
"""Newline framing for the control channel: bytes in, one complete line at a time out.

Unlike ``twisted.protocols.basic.LineOnlyReceiver`` it hands lines out only when asked, so the
connection decides after each line whether to go on: it stops at once after a line that closes
the connection (docs/behaviour.md §14.3) and holds the rest while an in-order answer is pending.
"""

from __future__ import annotations

from attrs import define, field, frozen

__all__ = ["LineBuffer", "TooLong"]


@frozen
class TooLong:
    """A line (or an unfinished one) longer than the limit."""

    limit: int


@define
class LineBuffer:
    """Buffered bytes split on ``\\n``; a line may be at most ``limit`` bytes."""

    limit: int
    _pending: bytearray = field(factory=bytearray, init=False)
    _start: int = field(default=0, init=False)

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        if self._start:
            del self._pending[: self._start]  # once per read, not once per line
            self._start = 0
        self._pending += data

    @property
    def size(self) -> int:
        """Bytes buffered and not yet handed out."""
        return len(self._pending) - self._start

    def next_line(self) -> bytes | TooLong | None:
        """The next complete line without its ``\\n``; :class:`TooLong` past the limit (then the
        buffer is useless: the caller closes); ``None`` until a whole line has arrived."""
        start = self._start
        end = self._pending.find(b"\n", start, start + self.limit + 1)
        if end < 0:
            return TooLong(self.limit) if len(self._pending) - start > self.limit else None
        self._start = end + 1
        return bytes(self._pending[start:end])
