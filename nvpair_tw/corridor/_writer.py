# -*- test-case-name: tests.corridor.test_writer -*-
"""The one writer of a request's answer: the only code of the corridor that holds its ``Request``.

The driver (:mod:`~nvpair_tw.corridor._driver`) makes one :class:`Writer` per request and every
answer goes through it: a refusal in the facade's own error shape (Ollama's, OpenAI's or
Anthropic's, docs/behaviour.md §9; shaped by :func:`nvpair_tw.core.error_body`), an answer the
proxy makes whole (a model list, a probe, a preload, a fan-out's summary, a node's refusal of a
tunnel), and a streamed answer: the relay and a streamed fan-out write through its :class:`Stream`
face (a head, body bytes, the client's backpressure, a clean finish or a cut), never the
``Request``. A tunnel gets the client's channel from :meth:`Writer.hand_over`, after the node's
``101``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from attrs import frozen
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web.http import NO_BODY_CODES, HTTPChannel
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from nvpair_tw.core import ERROR_HEADERS, ErrorShape, abort, close, error_body, forward_headers
from nvpair_tw.inbound import LimitedChannel, Rejection

__all__ = ["Stream", "Whole", "Writer"]

Pairs = Iterable[tuple[bytes, bytes]]


@frozen
class Whole:
    """An answer the proxy makes whole: its status, body, type and further headers."""

    status: int
    body: bytes
    content_type: bytes = b"application/json"
    headers: tuple[tuple[bytes, bytes], ...] = ()


class Stream(Protocol):
    """A streamed answer on its way to the client, as the relay and a fan-out write it."""

    @property
    def connected(self) -> bool:
        """Whether the client's connection is still there."""

    def head(
        self,
        status: int,
        phrase: bytes | None,
        headers: Headers,
        length: int | None,
        own: Pairs = (),
    ) -> None:
        """The status, the end-to-end ones of ``headers`` (a node's, or the proxy's for its own
        stream) and the proxy's ``own`` after them, with the framing ``length`` implies (None:
        chunked)."""

    def first(self, data: bytes) -> None:
        """The first body bytes, sent with the head (``b""``: the head alone, now)."""

    def body_writer(self) -> Callable[[bytes], None]:
        """How every later body chunk is written (the fastest way the channel allows)."""

    def register(self, producer: IPushProducer) -> bool:
        """Let the client's flow control pause ``producer``; False when the client is gone."""

    def unregister(self) -> None:
        """The producer is done (no-op when the client is gone)."""

    def finish(self) -> None:
        """The answer is complete: its framing ends."""

    def cut(self, clock: IReactorTime, budget: float) -> None:
        """End an unfinished answer so the client can tell (docs/behaviour.md §6.2)."""

    def reset(self) -> None:
        """Reset the client's connection now (a client that stopped reading)."""


class Writer:
    """The answer of one request, and the client's presence (see the module docstring)."""

    def __init__(self, request: Request, shape: ErrorShape) -> None:
        self._request = request
        self._shape = shape

    @property
    def connected(self) -> bool:
        return self._request.channel is not None

    @property
    def answered(self) -> bool:
        """Whether the answer has begun (nothing else can be written cleanly)."""
        return bool(self._request.startedWriting) or bool(self._request.finished)

    @property
    def _open(self) -> bool:
        request = self._request
        return not request.finished and request.channel is not None

    def mark(self, name: bytes, value: bytes) -> None:
        """A header of the answer (``X-NVPair-Request-Id``, ``X-NVPair-Model``)."""
        self._request.responseHeaders.setRawHeaders(name, [value])

    def on_gone(self, gone: Callable[[str], None]) -> None:
        """Call ``gone`` with the reason if the client leaves before the answer is finished."""

        def left(_: Failure) -> None:
            gone("client disconnected")

        self._request.notifyFinish().addErrback(left)

    def refuse(self, refused: Rejection) -> None:
        """The refusal as the proxy's JSON error in the route's shape; a reset when the answer
        had already begun (no clean error can follow)."""
        if not self._open:
            return
        if self._request.startedWriting:
            self.reset()
            return
        body = error_body(refused.message, refused.code, self._shape, refused.status)
        self.whole(Whole(refused.status, body, headers=(*ERROR_HEADERS[1:], *refused.headers)))

    def whole(self, answer: Whole) -> None:
        """Write ``answer`` and finish."""
        request = self._request
        if request.finished or request.channel is None:
            return
        request.setResponseCode(answer.status)
        headers = request.responseHeaders
        headers.setRawHeaders(b"content-type", [answer.content_type])
        for name, value in answer.headers:
            headers.setRawHeaders(name, [value])
        headers.setRawHeaders(b"content-length", [b"%d" % len(answer.body)])
        request.write(answer.body)
        request.finish()

    def preflight(self, grants: Pairs) -> None:
        """A CORS preflight's 204 with ``grants`` (docs/behaviour.md §13.4)."""
        request = self._request
        request.setResponseCode(204)
        for name, value in grants:
            request.responseHeaders.setRawHeaders(name, [value])
        request.finish()

    def hand_over(self) -> LimitedChannel | None:
        """The client's channel, for a tunnel after the node's ``101`` (None: this listener
        cannot carry one)."""
        channel = self._request.channel
        return channel if isinstance(channel, LimitedChannel) else None

    # -- the Stream face ------------------------------------------------------------------------

    def head(
        self,
        status: int,
        phrase: bytes | None,
        headers: Headers,
        length: int | None,
        own: Pairs = (),
    ) -> None:
        request = self._request
        request.setResponseCode(status, phrase)
        out = forward_headers(headers, into=request.responseHeaders)
        for name, value in own:
            out.setRawHeaders(name, [value])
        if length is not None and request.method != b"HEAD" and status not in (204, 304):
            # Twisted's client moves Content-Length into ``response.length``; keep the framing.
            # A number in the name's canonical case, into the table as forward_headers writes.
            out._rawHeaders[b"Content-Length"] = [b"%d" % length]

    def first(self, data: bytes) -> None:
        self._request.write(data)  # b"": the head goes out now, even before a body byte

    def body_writer(self) -> Callable[[bytes], None]:
        """After the head, Twisted's ``Request.write`` only adds the chunk framing on its way
        through three calls to the transport; on an HTTP/1.1 channel the same bytes are written
        to the transport here, one write per upstream read (docs/performance.md, "Many slow
        streams"). Anything unusual (HEAD, a body-less status, an encoder, another channel
        type) keeps ``Request.write``."""
        request = self._request
        channel = request.channel
        if (
            not isinstance(channel, HTTPChannel)
            or channel.transport is None
            or not request.startedWriting
            or request.finished
            or request.method == b"HEAD"
            or request.code in NO_BODY_CODES
            or getattr(request, "_encoder", None) is not None
        ):
            return request.write
        transport = channel.transport
        if not request.chunked:
            return transport.write

        def write_chunk(data: bytes) -> None:
            if data:
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))

        return write_chunk

    def write(self, data: bytes) -> None:
        """One more body chunk, through ``Request.write`` (a fan-out's lines)."""
        if self._open:
            self._request.write(data)

    def register(self, producer: IPushProducer) -> bool:
        if not self.connected:
            return False
        self._request.registerProducer(producer, True)
        return True

    def unregister(self) -> None:
        if self.connected:
            self._request.unregisterProducer()

    def finish(self) -> None:
        if self._open:
            self._request.finish()

    def reset(self) -> None:
        abort(self._request.transport)

    def cut(self, clock: IReactorTime, budget: float) -> None:
        _cut(self._request, clock, budget)


def _cut(request: Request, clock: IReactorTime, budget: float) -> None:
    """End ``request``'s unfinished answer so the client can tell (docs/behaviour.md §6.2).

    Chunked or ``Content-Length`` framing: close after the bytes already written (FIN); the
    missing terminating chunk or the short count tells the client, and a client that does not
    read what is left is reset after ``budget``. Close-delimited framing (an HTTP/1.0 client, no
    length): a clean close would look complete, so reset. Nothing written yet: a plain close."""
    transport = request.transport
    if request.channel is None or transport is None:
        return
    close_delimited = (
        bool(request.startedWriting)
        and not request.chunked
        and not request.responseHeaders.hasHeader(b"content-length")
    )
    if close_delimited:
        abort(transport)
        return
    lost = request.notifyFinish()
    timer: IDelayedCall | None = clock.callLater(budget, abort, transport) if budget > 0 else None

    def ended(_: object) -> None:
        if timer is not None and timer.active():
            timer.cancel()

    lost.addBoth(ended)
    close(transport)
