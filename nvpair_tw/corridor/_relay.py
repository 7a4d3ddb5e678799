# -*- test-case-name: tests.corridor.test_relay -*-
"""A committed response on its way to the client, from the first byte to the end.

See docs/behaviour.md §6.2. After commit nothing is replayed: the client gets the upstream's bytes as
they arrive, the upstream is paused while the client's socket is full, and a client that accepts
nothing for the write-stall budget is reset. When the upstream dies mid-stream every byte already
received is delivered and the client connection is then closed *without* the end of the framing (no
terminating chunk, fewer bytes than the declared ``Content-Length``), so the client sees an
incomplete message; a reset is kept for the one framing where a clean close would look complete
(a close-delimited answer to the client). :func:`relay` returns a :class:`RelayOutcome` and writes
nothing into its caller's state. A body failed by anything but the upstream (a bug of the proxy's,
e.g. in a transducer) is cut the same way, logged once with its type, and recorded as
``proxy-error``, never as the node's drop.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from attrs import frozen
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair_tw.assembly import AssemblyGate
from nvpair_tw.core import Framing
from nvpair_tw.corridor._attempts import CallerState, Committed
from nvpair_tw.corridor._terminal import TerminalFrameDetector
from nvpair_tw.corridor._writer import Stream
from nvpair_tw.dialects import Usage, UsageMeter
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.upstream import TRANSPORT_FAILURES, BodyEnd, BodyGate, is_cancellation

__all__ = ["Broken", "Progress", "RelayEnd", "RelayOutcome", "StallGuard", "relay"]

DROPPED_MID_STREAM = "upstream dropped mid-stream"
CLIENT_STOPPED_READING = "client stopped reading"
PROXY_ERROR = "proxy-error"
"""What the record says of a committed answer the proxy itself broke (a bug, never the node's)."""

log = LevelledLogger(namespace=__name__)


class Broken(Enum):
    """How a relayed body that did not end cleanly broke."""

    DROPPED = "dropped"
    """The upstream dropped it, or the caller's departure cut it (the record says which)."""

    PROXY_ERROR = "proxy-error"
    """Something else failed it: a bug of the proxy's (a transducer's, say), logged once."""


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


_NOT_A_STREAM = TerminalFrameDetector(None)
"""The detector of every answer that is not a stream: it never keeps anything (``feed`` and
``finish`` do nothing, ``seen`` stays False), so this one serves them all."""


class Progress:
    """What has been relayed: bytes, and whether the answer is already complete for the client.

    Complete means the stream's terminal frame passed (SSE ``[DONE]``, NDJSON ``"done": true``) or every
    ``Content-Length`` byte did: a client that hangs up after that got its whole answer.
    """

    def __init__(
        self,
        content_type: str | None,
        length: int | object,
        meter: Callable[[Framing | None], UsageMeter] | None = None,
    ) -> None:
        self.sent = 0
        self._length = length if isinstance(length, int) else None  # UNKNOWN_LENGTH is a str
        framing = Framing.of(content_type)
        self.frames = _NOT_A_STREAM if framing is None else TerminalFrameDetector(content_type)
        self.meter = meter(framing) if meter is not None else None
        """The answer's meter, made for its framing (None: not metered)."""

    def wrap(self, write: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """A sink that counts and watches frames (and, metered, the tokens) before writing."""
        feed = self.frames.feed
        streaming = self.frames.streaming
        meter = self.meter

        if meter is not None:
            count = meter.feed

            def metered(data: bytes) -> None:
                self.sent += len(data)
                if streaming:
                    feed(data)
                count(data)
                write(data)

            return metered

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


class RelayEnd(Enum):
    """How a relay ended."""

    FINISHED = "finished"
    """The upstream body ended cleanly and the client's response was finished."""

    TRUNCATED = "truncated"
    """The upstream died (or a close-delimited stream ended before its terminal frame): what
    arrived was delivered and the client connection closed without the end of the framing."""

    CALLER_GONE = "caller-gone"
    """The client left, stopped reading, or the workload was cancelled."""


@frozen
class RelayOutcome:
    """What the relay did: the facade turns it into the workload's end, affinity and the record.

    ``error`` is what the record reports (None when the client got the whole answer); ``complete``
    says whether the client got the whole answer, even if it hung up right after it;
    ``terminal_seen`` whether a stream's terminal frame passed; ``streaming`` whether the body was
    an SSE or NDJSON stream.
    """

    status: int
    end: RelayEnd
    error: str | None
    complete: bool
    terminal_seen: bool
    streaming: bool
    sent: int
    usage: Usage | None = None
    """The answer's token counts and first content (§12.2), when it was metered."""


async def relay(
    stream: Stream,
    committed: Committed,
    caller: CallerState,
    clock: IReactorTime,
    write_stall_timeout: float,
    meter: Callable[[Framing | None], UsageMeter] | None = None,
) -> RelayOutcome:
    """Relay ``committed`` into ``stream`` until the body ends, the upstream dies or the caller
    goes.

    ``meter`` makes the meter that reads the answer's token counts (given the answer's framing)."""
    response = committed.response
    length = response.length if isinstance(response.length, int) else None
    own = ((b"x-nvpair-node", committed.node.id.encode()),)
    stream.head(response.code, response.phrase, response.headers, length, own)
    content_type = response.headers.getRawHeaders(b"content-type", [b""])[0]
    progress = Progress(content_type.decode("latin-1"), response.length, meter)
    counting = progress.meter
    if committed.first:
        progress.wrap(stream.first)(committed.first)
    else:
        stream.first(b"")  # the head goes out now, even before the first body byte
    sink = progress.wrap(stream.body_writer())
    end = await _pump(stream, committed.gate, sink, caller, clock, write_stall_timeout)
    if isinstance(end, BodyEnd):
        progress.frames.finish()

    def outcome(how: RelayEnd, error: str | None) -> RelayOutcome:
        return RelayOutcome(
            status=response.code,
            end=how,
            error=error,
            complete=progress.complete,
            terminal_seen=progress.frames.seen,
            streaming=progress.streaming,
            sent=progress.sent,
            usage=counting.end() if counting is not None else None,
        )

    if caller.gone is not None:
        return outcome(RelayEnd.CALLER_GONE, None if progress.complete else caller.gone)
    if end is Broken.PROXY_ERROR:
        stream.cut(clock, write_stall_timeout)
        return outcome(RelayEnd.TRUNCATED, PROXY_ERROR)
    if end is Broken.DROPPED or (
        end is BodyEnd.CLOSED and progress.streaming and not progress.frames.seen
    ):
        stream.cut(clock, write_stall_timeout)
        return outcome(RelayEnd.TRUNCATED, DROPPED_MID_STREAM)
    stream.finish()
    return outcome(RelayEnd.FINISHED, None)


async def _pump(
    stream: Stream,
    gate: BodyGate | AssemblyGate,
    sink: Callable[[bytes], None],
    caller: CallerState,
    clock: IReactorTime,
    write_stall_timeout: float,
) -> BodyEnd | Broken:
    """Relay the gate's body into ``sink`` under the client's flow control; how it ended."""

    def write_stalled() -> None:
        caller.abandon(CLIENT_STOPPED_READING)
        stream.reset()

    guard = StallGuard(clock, gate.producer(), write_stall_timeout, write_stalled)
    registered = stream.register(guard)
    caller.track(gate.stop)
    gate.start_relay(sink)
    try:
        return await gate.done
    except Exception:
        return _broken(Failure())
    finally:
        guard.cancel()
        caller.track(None)
        if registered:
            stream.unregister()


def _broken(failure: Failure) -> Broken:
    """A transport failure or a cancellation is the upstream's drop (nothing to log: the record
    says it); anything else is the proxy's own bug, logged here once with its traceback."""
    if failure.check(*TRANSPORT_FAILURES, ConnectionClosed) or is_cancellation(failure):
        return Broken.DROPPED
    log.failure(
        "a committed answer was cut by a proxy error ({kind})",
        failure,
        kind=failure.type.__name__ if failure.type is not None else "unknown",
    )
    return Broken.PROXY_ERROR
