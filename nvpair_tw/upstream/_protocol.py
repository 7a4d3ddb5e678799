# -*- test-case-name: tests.upstream.test_protocol -*-
"""One keep-alive HTTP/1.1 connection to a node: :class:`NodeClientProtocol`, a named state
machine whose legal moves are all in one table (:data:`TRANSITIONS`, as h11 keeps them), and the
``IResponse`` it fires with.

The endings are Twisted's (``upstream.BodyGate``, ``attempts.classify_failure`` and
``upstream.is_cancellation`` read them): a complete body ends with ``ResponseDone``, a
close-delimited one with ``PotentialDataLoss``, a cut one with ``ResponseFailed([reason,
_DataLoss])`` (built by :func:`cut_body`, the one place that names Twisted's private class); a
connection lost before any response byte fails the request with ``ResponseNeverReceived``, a write
failure with ``RequestTransmissionFailed``, a body producer failure with
``RequestGenerationFailed``, a cancellation while awaiting the head with
``ResponseNeverReceived([CancelledError])``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from enum import Enum
from typing import Any, cast

from attrs import define
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IConsumer, IProducer, IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss, _DataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IClientRequest, IResponse
from zope.interface import implementer

from nvpair_tw.core import IdentityEnum, IllegalCall, abort, close
from nvpair_tw.upstream._http1 import BadResponse, BodyReader, HeadParser, ResponseHead

__all__ = [
    "TRANSITIONS",
    "ClientEvent",
    "ClientRequest",
    "ClientState",
    "NodeClientProtocol",
    "Response",
    "cut_body",
]


class ClientState(IdentityEnum):
    """Where a :class:`NodeClientProtocol` is in its life; the moves are :data:`TRANSITIONS`.

    - ``IDLE``: connected, no request (in the agent's idle set, or just made). :meth:`request`
      → ``WRITING``; bytes from the node → ``ABORTING``; :meth:`close_idle` → ``CLOSING``.
    - ``WRITING``: the head is written, the body producer runs (registered with the transport).
      Its end → ``AWAITING_HEADERS``; a response byte → ``HEAD``; a loss fails the request with
      ``RequestTransmissionFailed``, a producer failure with ``RequestGenerationFailed``.
    - ``AWAITING_HEADERS``: the request is written, no byte back; a loss: ``ResponseNeverReceived``.
    - ``HEAD``: part of the head is read (1xx heads skipped; the request body may still be
      written). Complete → fires with a :class:`Response`, ``BODY``; malformed →
      ``ResponseFailed([BadResponse])``, ``ABORTING``; a loss → ``ResponseFailed``.
    - ``BODY``, ``PAUSED`` (the body protocol paused the transport): body bytes go to the
      response, one call per read. Complete → ``IDLE`` (event ``KEEP``: HTTP/1.1, no
      ``Connection: close`` from either side, not close-delimited, nothing after it, the request
      body whole; the agent takes it back) or ``CLOSING`` (``DONE``). A loss ends the body:
      ``PotentialDataLoss`` if close-delimited, else :func:`cut_body`.
    - ``ABORTING``: given up (the body protocol's ``stopProducing``, a failure, a cancellation),
      the connection aborted; bytes are dropped; a loss ends a body still open as in ``BODY``.
    - ``CLOSING``: over and never reused; closing. ``CLOSED``: gone (terminal).

    Cancelling the request before its head fails it with ``ResponseNeverReceived([CancelledError])``.
    """

    IDLE = "idle"
    WRITING = "writing"
    AWAITING_HEADERS = "awaiting-headers"
    HEAD = "head"
    BODY = "body"
    PAUSED = "paused"
    ABORTING = "aborting"
    CLOSING = "closing"
    CLOSED = "closed"


class ClientEvent(IdentityEnum):
    """What moves a :class:`NodeClientProtocol` from one state to another."""

    REQUEST = "request"  # request(): the head is written
    WRITTEN = "written"  # the whole request body was handed to the transport
    BYTES = "bytes"  # the first byte of the response head
    HEAD = "head"  # the response head is complete: the request fires
    PAUSE = "pause"  # the body protocol paused the body
    RESUME = "resume"  # the body protocol resumed it
    KEEP = "keep"  # the body is complete and the connection may serve another request
    DONE = "done"  # the body is complete but the connection must close
    ABORT = "abort"  # a failure, a cancellation or the body protocol's stop: abort
    CLOSE = "close"  # close_idle(): the agent closes an idle connection
    LOST = "lost"  # connectionLost


_S, _E = ClientState, ClientEvent
_ANY_LIVE = {_E.ABORT: _S.ABORTING, _E.LOST: _S.CLOSED}
TRANSITIONS: dict[ClientState, dict[ClientEvent, ClientState]] = {
    _S.IDLE: {_E.REQUEST: _S.WRITING, _E.CLOSE: _S.CLOSING, **_ANY_LIVE},
    _S.WRITING: {_E.WRITTEN: _S.AWAITING_HEADERS, _E.BYTES: _S.HEAD, **_ANY_LIVE},
    _S.AWAITING_HEADERS: {_E.BYTES: _S.HEAD, **_ANY_LIVE},
    _S.HEAD: {_E.WRITTEN: _S.HEAD, _E.HEAD: _S.BODY, **_ANY_LIVE},
    _S.BODY: {
        _E.WRITTEN: _S.BODY,
        _E.PAUSE: _S.PAUSED,
        _E.RESUME: _S.BODY,
        _E.KEEP: _S.IDLE,
        _E.DONE: _S.CLOSING,
        **_ANY_LIVE,
    },
    _S.PAUSED: {
        _E.WRITTEN: _S.PAUSED,
        _E.PAUSE: _S.PAUSED,
        _E.RESUME: _S.BODY,
        _E.KEEP: _S.IDLE,
        _E.DONE: _S.CLOSING,
        **_ANY_LIVE,
    },
    _S.ABORTING: {
        _E.PAUSE: _S.ABORTING,
        _E.RESUME: _S.ABORTING,
        _E.CLOSE: _S.ABORTING,
        _E.LOST: _S.CLOSED,
    },
    _S.CLOSING: {_E.CLOSE: _S.CLOSING, _E.LOST: _S.CLOSED},
    _S.CLOSED: {},
}
"""Every legal move, ``{state: {event: next state}}``; any other (state, event) is an
:class:`~nvpair_tw.core.IllegalCall`. A move to the same state is a tolerated repeat."""

_Notify = Callable[["NodeClientProtocol"], None]
_READING = (ClientState.BODY, ClientState.PAUSED)
_GIVEN_UP = (ClientState.ABORTING, ClientState.CLOSING, ClientState.CLOSED)

_LOST_REQUEST: dict[ClientState, type[Exception]] = {
    ClientState.WRITING: RequestTransmissionFailed,
    ClientState.AWAITING_HEADERS: ResponseNeverReceived,
    ClientState.HEAD: ResponseFailed,
}
"""How a request still waiting for its response fails when the connection is lost."""


def cut_body(reason: Failure) -> Failure:
    """A body cut by ``reason``: ``ResponseFailed([reason, _DataLoss])``, as Twisted's client ends
    one (``twisted.web._newclient``); ``tests/upstream/test_twisted_internals.py`` guards it."""
    return Failure(ResponseFailed([reason, Failure(_DataLoss())]))


@implementer(IClientRequest)
class ClientRequest:
    """What :attr:`Response.request` shows of the request (``IClientRequest``)."""

    def __init__(self, method: bytes, absoluteURI: bytes, headers: Headers) -> None:
        self.method = method
        self.absoluteURI = absoluteURI
        self.headers = headers


@implementer(IPushProducer)
class _BodyTransport:
    """What a body protocol gets as its transport: the connection as a push producer, until the
    response ends (then every call is a no-op, the connection may be serving another request)."""

    def __init__(self, protocol: NodeClientProtocol) -> None:
        self._protocol: NodeClientProtocol | None = protocol

    def detach(self) -> None:
        self._protocol = None

    def pauseProducing(self) -> None:
        if self._protocol is not None:
            self._protocol.body_flow(ClientEvent.PAUSE)

    def resumeProducing(self) -> None:
        if self._protocol is not None:
            self._protocol.body_flow(ClientEvent.RESUME)

    def stopProducing(self) -> None:
        if self._protocol is not None:
            self._protocol.stop_body()


class _ResponseState(Enum):
    WAITING = "waiting"  # no body protocol yet: body bytes and the end are buffered
    CONNECTED = "connected"  # a body protocol receives the body
    DEFERRED_CLOSE = "deferred-close"  # the body ended before deliverBody
    FINISHED = "finished"  # the body protocol has been told the end


@implementer(IResponse)
class Response:
    """One response (``IResponse``): body bytes before :meth:`deliverBody` are buffered and handed
    over in one call; ``deliverBody`` twice, or after the end was delivered, raises."""

    def __init__(
        self,
        version: tuple[bytes, int, int],
        code: int,
        phrase: bytes,
        headers: Headers,
        length: int | object,
        request: IClientRequest,
        transport: _BodyTransport,
    ) -> None:
        self.version = version
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = length
        self.request = request
        self.previousResponse: IResponse | None = None
        self._transport = transport
        self._state = _ResponseState.WAITING
        self._buffer: list[bytes] = []
        self._protocol: Protocol | None = None
        self._ending: Failure | None = None

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response

    def deliverBody(self, protocol: Any) -> None:
        if self._state not in (_ResponseState.WAITING, _ResponseState.DEFERRED_CLOSE):
            raise IllegalCall(f"deliverBody in state {self._state.value}")
        body = cast(Protocol, protocol)
        ended = self._state is _ResponseState.DEFERRED_CLOSE
        self._state = _ResponseState.CONNECTED
        self._protocol = body
        body.makeConnection(self._transport)  # type: ignore[arg-type]
        buffered, self._buffer = self._buffer, []
        if buffered:
            body.dataReceived(b"".join(buffered))
        if ended:
            assert self._ending is not None
            self._state = _ResponseState.FINISHED
            body.connectionLost(self._ending)
            self._ending = None

    def body_data(self, data: bytes) -> None:
        """Body bytes from the connection (one call per read)."""
        if self._state is _ResponseState.CONNECTED:
            assert self._protocol is not None
            self._protocol.dataReceived(data)
        elif self._state is _ResponseState.WAITING:
            self._buffer.append(data)
        else:
            raise IllegalCall(f"body data in state {self._state.value}")

    def body_ended(self, reason: Failure) -> None:
        """The body's end: ``ResponseDone``, ``PotentialDataLoss`` or a failure."""
        self._transport.detach()
        if self._state is _ResponseState.CONNECTED:
            assert self._protocol is not None
            self._state = _ResponseState.FINISHED
            self._protocol.connectionLost(reason)
        elif self._state is _ResponseState.WAITING:
            self._state = _ResponseState.DEFERRED_CLOSE
            self._ending = reason
        else:
            raise IllegalCall(f"body end in state {self._state.value}")


@implementer(IConsumer)
class _RequestBody:
    """The request body on its way: the producer registered with the transport (so a full socket
    pauses it) writes through this consumer, counted against its declared length."""

    def __init__(self, protocol: NodeClientProtocol, producer: IBodyProducer) -> None:
        self._protocol = protocol
        self.producer = producer
        self._length = cast(int, producer.length)
        self.written = 0

    def detach(self) -> None:
        """Unregister the producer from the transport (it ended)."""
        if self._protocol.transport is not None:
            cast(IConsumer, self._protocol.transport).unregisterProducer()

    def stop(self) -> None:
        """Unregister the producer and stop it (the exchange ended before the body did)."""
        self.detach()
        self.producer.stopProducing()

    def start(self) -> None:
        """Register the producer and start it; the protocol hears of its end."""
        transport = cast(IConsumer, self._protocol.transport)
        transport.registerProducer(self.producer, True)
        try:
            producing = self.producer.startProducing(self)
        except Exception:
            self._protocol.body_sent(self, Failure())
        else:
            producing.addCallbacks(self._produced, lambda f: self._protocol.body_sent(self, f))

    def _produced(self, _: object) -> None:
        if self.written != self._length:
            error = ValueError(f"body producer wrote {self.written} of {self._length}")
            self._protocol.body_sent(self, Failure(error))
        else:
            self._protocol.body_sent(self, None)

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        pass  # start() registered the body producer with the transport already

    def unregisterProducer(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self._protocol.state not in _GIVEN_UP:
            cast(IConsumer, self._protocol.transport).write(data)


@define
class _Exchange:
    """One request on the connection and what came back of it: the Deferred the request fires,
    then the body's framing and the response while the body is read."""

    request: ClientRequest
    persistent: bool
    """What the request said: no ``Connection: close``."""
    deferred: Deferred[IResponse] | None
    reader: BodyReader | None = None
    response: Response | None = None

    def fail(self, error: Exception) -> None:
        """Fail the request with ``error``, unless it has fired already."""
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            deferred.errback(Failure(error))

    def answer(self, head: ResponseHead, transport: _BodyTransport) -> None:
        """The head is complete (and :attr:`reader` frames its body): fire with the response."""
        assert self.reader is not None and self.deferred is not None
        length, request = self.reader.length, self.request
        self.response = Response(
            head.version, head.code, head.phrase, head.headers, length, request, transport
        )
        deferred, self.deferred = self.deferred, None
        deferred.callback(self.response)

    def body_bytes(self, data: bytes) -> bytes | None:
        """Hand the payload in ``data`` to the response; what follows the body once it is
        complete. Raises :class:`BadResponse` on bad framing."""
        assert self.reader is not None and self.response is not None
        payload, after = self.reader.feed(data)
        if payload:
            self.response.body_data(payload)
        return after

    def detach(self) -> Response:
        """The body is complete: the response, its transport detached from the connection."""
        response, self.response = self.response, None
        assert response is not None
        response._transport.detach()
        return response

    def reusable(self, after: bytes) -> bool:
        """Whether both sides allow reuse, the body complete and ``after`` it."""
        assert self.reader is not None
        return self.persistent and self.reader.reusable and not after

    def end_body(self, reason: Failure) -> None:
        response, self.response = self.response, None
        if response is not None:
            response.body_ended(reason)

    def lost(self, state: ClientState, reason: Failure) -> None:
        """The connection was lost in ``state``: fail the request, or end a body still open."""
        if state in _LOST_REQUEST:
            self.fail(_LOST_REQUEST[state]([reason]))
        elif self.reader is not None:
            close_delimited = self.reader.close_delimited
            self.end_body(Failure(PotentialDataLoss()) if close_delimited else cut_body(reason))


class NodeClientProtocol(Protocol):
    """One keep-alive HTTP/1.1 connection to a node, one request at a time: a named state machine.
    Its state (:class:`ClientState`, documented there) changes only through :meth:`_move`, by the
    one table :data:`TRANSITIONS`; an event its state has no move for raises
    :class:`~nvpair_tw.core.IllegalCall`."""

    def __init__(self, release: _Notify, lost: _Notify) -> None:
        self._release, self._lost = release, lost
        self._state = ClientState.IDLE
        self._parser = HeadParser()
        self._exchange: _Exchange | None = None
        self._body: _RequestBody | None = None
        self._gone = Deferred[None]()

    @property
    def state(self) -> ClientState:
        """The current state (read-only; transitions happen through the methods)."""
        return self._state

    def _move(self, event: ClientEvent) -> ClientState:
        """Take ``event`` (:data:`TRANSITIONS`); the state before. Raises ``IllegalCall``."""
        before = self._state
        after = TRANSITIONS[before].get(event)
        if after is None:
            raise IllegalCall(f"{event.value} in state {before.value}")
        self._state = after
        return before

    def connectionMade(self) -> None:
        _no_delay(self.transport)

    def request(
        self, head: bytes, request: ClientRequest, producer: IBodyProducer | None, persistent: bool
    ) -> Deferred[IResponse]:
        """Write ``head`` (request line and headers) and the body; fires with the response."""
        self._move(ClientEvent.REQUEST)
        assert self.transport is not None
        deferred = Deferred[IResponse](self._cancel)
        self._exchange = _Exchange(request, persistent, deferred)
        self.transport.write(head)
        if producer is None:
            self._move(ClientEvent.WRITTEN)
        else:
            self._body = _RequestBody(self, producer)
            self._body.start()
        return deferred

    def body_sent(self, body: _RequestBody, failure: Failure | None) -> None:
        """The producer's end: the whole body written (``failure`` None) or its failure."""
        if body is self._body:
            self._body = None
            body.detach()
            if failure is None:
                self._move(ClientEvent.WRITTEN)
            else:
                self._abort(RequestGenerationFailed([failure]))

    def _stop_producer(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.stop()

    def _cancel(self, deferred: Deferred[IResponse]) -> None:
        if self._exchange is not None and deferred is self._exchange.deferred:
            self._abort(ResponseNeverReceived([Failure(CancelledError())]))

    def _abort(self, error: Exception | None = None) -> None:
        """Give up: the producer stopped, the request failed with ``error``, an abort."""
        self._move(ClientEvent.ABORT)
        self._stop_producer()
        if error is not None and self._exchange is not None:
            self._exchange.fail(error)
        abort(self.transport)

    def dataReceived(self, data: bytes) -> None:
        state = self._state
        if state in _READING:
            self._body_bytes(data)
        elif state in (ClientState.WRITING, ClientState.AWAITING_HEADERS, ClientState.HEAD):
            if state is not ClientState.HEAD:
                self._move(ClientEvent.BYTES)
            self._head(data)
        elif state is ClientState.IDLE:  # nothing was asked: the connection is unusable
            self._abort()

    def _head(self, data: bytes) -> None:
        exchange = self._exchange
        assert exchange is not None
        try:
            head = self._parser.feed(data)
            if head is None:
                return
            self._parser = HeadParser()
            exchange.reader = reader = BodyReader(exchange.request.method, head)
        except BadResponse as error:
            self._abort(ResponseFailed([Failure(error)]))
            return
        self._move(ClientEvent.HEAD)
        exchange.answer(head, _BodyTransport(self))
        if self._state in _READING:
            if reader.empty:
                self._body_done(head.rest)
            elif head.rest:
                self._body_bytes(head.rest)

    def _body_bytes(self, data: bytes) -> None:
        exchange = self._exchange
        assert exchange is not None
        try:
            after = exchange.body_bytes(data)
        except BadResponse as error:
            self._abort()
            exchange.end_body(Failure(ResponseFailed([Failure(error)], exchange.response)))
            return
        if after is not None and self._state in _READING:
            self._body_done(after)

    def _body_done(self, after: bytes) -> None:
        """The body is complete: release (or close) the connection, then tell the body."""
        exchange = self._exchange
        assert exchange is not None
        keep = exchange.reusable(after) and self._body is None
        before = self._move(ClientEvent.KEEP if keep else ClientEvent.DONE)
        response = exchange.detach()
        self._stop_producer()  # the node answered before the body was written
        if before is ClientState.PAUSED:
            cast(IPushProducer, self.transport).resumeProducing()
        if keep:
            self._exchange = None
            self._release(self)
        else:
            close(self.transport)
        response.body_ended(Failure(ResponseDone()))

    def body_flow(self, event: ClientEvent) -> None:
        """The body protocol's ``PAUSE`` or ``RESUME``; a repeat (same state) is a no-op."""
        if self._move(event) is not self._state:
            producer = cast(IPushProducer, self.transport)
            producer.pauseProducing() if event is ClientEvent.PAUSE else producer.resumeProducing()

    def stop_body(self) -> None:
        """The body protocol wants no more: the connection is aborted, never reused."""
        if self._state is not ClientState.ABORTING:
            self._abort()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        before = self._move(ClientEvent.LOST)
        self._stop_producer()
        if self._exchange is not None:
            self._exchange.lost(before, reason)
        self._lost(self)
        self._gone.callback(None)

    def close_idle(self) -> Deferred[None]:
        """Close an idle connection; fires once it is gone."""
        if self._state is ClientState.CLOSED:
            return succeed(None)
        self._move(ClientEvent.CLOSE)
        close(self.transport)
        return _after(self._gone)


def _after(gone: Deferred[None]) -> Deferred[None]:
    """A Deferred of its own that fires (with None) once ``gone`` has."""
    waiter = Deferred[None]()

    def fire(_: None) -> None:
        waiter.callback(None)

    gone.addCallback(fire)
    return waiter


def _no_delay(transport: Any) -> None:
    """A request goes out whole and its answer is awaited: never hold a segment back for the
    node's delayed ACK (Nagle's algorithm), as nginx's proxy does not either."""
    no_delay = getattr(transport, "setTcpNoDelay", None)
    if no_delay is not None:
        with contextlib.suppress(OSError):
            no_delay(True)
