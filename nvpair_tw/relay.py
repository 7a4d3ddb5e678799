# -*- test-case-name: tests.test_relay -*-
"""A committed response on its way to the client: backpressure, the write-stall guard, completion.

After commit nothing is replayed: the client gets the upstream's bytes as they arrive, the upstream is
paused while the client's socket is full, a client that accepts nothing for the write-stall budget is
dropped, and an upstream that dies mid-stream aborts the client connection (never a clean end).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from zope.interface import implementer

from nvpair_tw.frames import TerminalFrameDetector

__all__ = ["Progress", "StallGuard"]


@implementer(IPushProducer)
class StallGuard:
    """Forwards the client's flow control to the upstream; fires ``on_stall`` if paused too long."""

    def __init__(
        self,
        clock: IReactorTime,
        upstream: IPushProducer,
        budget: float,
        on_stall: Callable[[], None],
    ) -> None:
        self._clock = clock
        self._upstream = upstream
        self._budget = budget
        self._on_stall = on_stall
        self._timer: IDelayedCall | None = None

    def pauseProducing(self) -> None:
        self._upstream.pauseProducing()
        if self._timer is None and self._budget > 0:
            self._timer = self._clock.callLater(self._budget, self._stalled)

    def resumeProducing(self) -> None:
        self.cancel()
        self._upstream.resumeProducing()

    def stopProducing(self) -> None:
        self.cancel()
        self._upstream.stopProducing()

    def cancel(self) -> None:
        """Disarm the stall timer (every exit path calls this)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stalled(self) -> None:
        self._timer = None
        self._on_stall()


class Progress:
    """What has been relayed: bytes, and whether the answer is already complete for the client.

    Complete means the stream's terminal frame passed (SSE ``[DONE]``, NDJSON ``"done": true``) or every
    ``Content-Length`` byte did: a client that hangs up after that got its whole answer.
    """

    def __init__(self, content_type: str | None, length: int | object) -> None:
        self.sent = 0
        self._length = length if isinstance(length, int) else None  # UNKNOWN_LENGTH is a str
        self.frames = TerminalFrameDetector(content_type)

    def wrap(self, write: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """A sink that counts and watches frames before writing."""
        feed = self.frames.feed
        streaming = self.frames.streaming

        def sink(data: bytes) -> None:
            self.sent += len(data)
            if streaming:
                feed(data)
            write(data)

        return sink

    @property
    def streaming(self) -> bool:
        return self.frames.streaming

    @property
    def complete(self) -> bool:
        if self.frames.seen:
            return True
        return self._length is not None and self.sent >= self._length
