# -*- test-case-name: tests.upstream.test_nodeclient -*-
"""A lean keep-alive HTTP/1.1 client for the upstream hop, behind Twisted's ``IAgent``.

Twisted's ``Agent`` decodes a chunked body one chunk at a time and hands every chunk to the body
protocol on its own, so a token stream costs several method calls and one relay write per token.
:class:`NodeAgent` decodes all complete chunks found in one socket read at once and delivers their
payloads in **one** ``dataReceived`` call (likewise one call per read for ``Content-Length`` and
close-delimited bodies): the relay writes once per read.

The endings the rest of the proxy relies on are Twisted's (``upstream.BodyGate``,
``attempts.classify_failure``, ``upstream.is_cancellation``): a complete body ends with
``ResponseDone``, a close-delimited one with ``PotentialDataLoss``, a cut one with
``ResponseFailed([reason, _DataLoss])``; a connection lost before any response byte fails the
request with ``ResponseNeverReceived``, a write failure with ``RequestTransmissionFailed``, a body
producer failure with ``RequestGenerationFailed``; cancelling while connecting is the endpoint's
``ConnectingCancelledError``, while awaiting headers ``ResponseNeverReceived([CancelledError])``.

No automatic retry: the proxy owns failover. A connection is reused only after its whole response
was read, neither side said ``Connection: close`` and the body was not close-delimited.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from enum import Enum
from typing import Any, cast

from attrs import frozen
from twisted.internet.abstract import isIPv6Address
from twisted.internet.defer import CancelledError, Deferred, fail, gatherResults, succeed
from twisted.internet.interfaces import (
    IConsumer,
    IDelayedCall,
    IProducer,
    IPushProducer,
    IReactorTime,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss, _DataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import (
    UNKNOWN_LENGTH,
    IAgent,
    IAgentEndpointFactory,
    IBodyProducer,
    IClientRequest,
    IResponse,
)
from zope.interface import implementer

from nvpair_tw.core import IllegalCall, IProxyReactor, abort, close, header_tokens

__all__ = [
    "MAX_HEADERS",
    "MAX_LINE",
    "BadResponse",
    "BodyReader",
    "ChunkedDecoder",
    "ClientRequest",
    "ClientState",
    "HeadParser",
    "NodeAgent",
    "NodeClientProtocol",
    "Response",
    "ResponseHead",
]

MAX_LINE = 16384
"""Longest status, header, chunk-size or trailer line accepted (Twisted's ``LineReceiver``)."""

MAX_HEADERS = 500
"""Most header (or trailer) lines accepted in one response head (Twisted's server limit)."""

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_TARGET = re.compile(rb"[\x21-\x7e]+\Z")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])\Z")
_HEX = frozenset(b"0123456789abcdefABCDEF")
# A whole chunk-size line as engines send it (size, optional extensions, CRLF): the fast path.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]*)?\r\n")
_Key = tuple[bytes, bytes, int]


class BadResponse(Exception):
    """The node's answer is not HTTP/1.x as we can read it; the text never holds its bytes."""


class ClientState(Enum):
    """Where a :class:`NodeClientProtocol` is in its life (see its docstring)."""

    IDLE = "idle"
    WRITING = "writing"
    AWAITING_HEADERS = "awaiting-headers"
    BODY = "body"
    DONE = "done"
    CLOSED = "closed"


@implementer(IClientRequest)
class ClientRequest:
    """What :attr:`Response.request` shows of the request (``IClientRequest``)."""

    def __init__(self, method: bytes, absoluteURI: bytes, headers: Headers) -> None:
        self.method = method
        self.absoluteURI = absoluteURI
        self.headers = headers


class _Chunk(Enum):
    SIZE = "size"
    DATA = "data"
    DATA_END = "data-end"
    TRAILER = "trailer"
    DONE = "done"


class ChunkedDecoder:
    """Decodes ``Transfer-Encoding: chunked`` in bulk: :meth:`feed` returns every payload byte found
    in the bytes it is given, joined, however many chunks (or parts of chunks) they hold."""

    def __init__(self) -> None:
        self._state = _Chunk.SIZE
        self._remaining = 0
        self._partial = b""
        self._trailers = 0

    @staticmethod
    def _whole_chunks(data: bytes, pos: int, parts: list[bytes | memoryview]) -> int:
        """Append the payloads of the run of complete, regular, non-empty chunks at ``pos`` to
        ``parts``; where the run ends."""
        end = len(data)
        match = _SIZE_LINE.match
        while pos < end:
            line = match(data, pos)
            if line is None:
                break
            size = int(line.group(1), 16)
            start = line.end()
            stop = start + size
            if not size or data[stop : stop + 2] != b"\r\n":
                break
            parts.append(data[start:stop])
            pos = stop + 2
        return pos

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """The payload in ``data`` and, once the last chunk and the trailers are complete, the
        bytes after them (``None`` while the body goes on). Raises :class:`BadResponse`.

        Runs of whole, regular chunks (a token stream's usual read) go through
        :meth:`_whole_chunks`, one regular-expression match each; anything else (a chunk cut by
        the read, the last chunk and trailers, lenient or bad framing) line by line, after which
        the next chunk boundary goes back to the fast path.
        """
        if self._state is _Chunk.DONE:
            raise IllegalCall("feed after the last chunk")
        if self._partial:
            data, self._partial = self._partial + data, b""
        view = memoryview(data)
        parts: list[bytes | memoryview] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._state is _Chunk.SIZE:
                pos = self._whole_chunks(data, pos, parts)
                if pos >= end:
                    break
            if self._state is _Chunk.DATA:
                take = min(self._remaining, end - pos)
                parts.append(view[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _Chunk.DATA_END
                continue
            eol = data.find(b"\n", pos, pos + MAX_LINE + 1)
            if eol < 0:
                if end - pos > MAX_LINE:
                    raise BadResponse("chunk line too long")
                self._partial = data[pos:]
                break
            line = data[pos:eol]
            pos = eol + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if self._line(line):
                return b"".join(parts), data[pos:]
        return b"".join(parts), None

    def _line(self, line: bytes) -> bool:
        """One framing line; whether it ended the body."""
        if self._state is _Chunk.SIZE:
            size = line.split(b";", 1)[0].strip(b" \t")
            if not size or len(size) > 16 or not _HEX.issuperset(size):
                raise BadResponse("malformed chunk size")
            self._remaining = int(size, 16)
            self._state = _Chunk.DATA if self._remaining else _Chunk.TRAILER
        elif self._state is _Chunk.DATA_END:
            if line:
                raise BadResponse("chunk data not followed by CRLF")
            self._state = _Chunk.SIZE
        elif line:  # a trailer: read past, bounded
            self._trailers += 1
            if self._trailers > MAX_HEADERS:
                raise BadResponse("too many trailers")
        else:
            self._state = _Chunk.DONE
            return True
        return False


class _Framing(Enum):
    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    CLOSE = "close"


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
            self._protocol.pause_body()

    def resumeProducing(self) -> None:
        if self._protocol is not None:
            self._protocol.resume_body()

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
class _BodyConsumer:
    """Hands the request body to the transport and counts it against the declared length."""

    def __init__(self, protocol: NodeClientProtocol) -> None:
        self._protocol = protocol
        self.written = 0

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        pass  # the protocol registered the body producer with the transport already

    def unregisterProducer(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self._protocol.write_body(data)


@frozen
class ResponseHead:
    """A complete response head (interim 1xx heads skipped) and the bytes that followed it."""

    version: tuple[bytes, int, int]
    code: int
    phrase: bytes
    headers: Headers
    rest: bytes


class HeadParser:
    """Reads one response head from successive reads; raises :class:`BadResponse` on a bad one
    (line or header count over the limits, a malformed status line or header)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._status: tuple[tuple[bytes, int, int], int, bytes] | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []

    def feed(self, data: bytes) -> ResponseHead | None:
        """The head once it is complete, else None (the bytes are kept for the next read)."""
        buffer = self._buffer
        buffer += data
        start = 0
        while True:
            eol = buffer.find(b"\n", start, start + MAX_LINE + 1)
            if eol < 0:
                if len(buffer) - start > MAX_LINE:
                    raise BadResponse("response head line too long")
                del buffer[:start]
                return None
            line = bytes(buffer[start:eol]).removesuffix(b"\r")
            start = eol + 1
            if self._status is None:
                self._status = _status_line(line)
            elif line:
                self._header_line(line)
            elif 100 <= self._status[1] < 200 and self._status[1] != 101:
                self._status, self._raw_headers = None, []  # interim: skip
            else:
                version, code, phrase = self._status
                headers = Headers()
                for name, value in self._raw_headers:
                    headers.addRawHeader(name, value)
                return ResponseHead(version, code, phrase, headers, bytes(buffer[start:]))

    def _header_line(self, line: bytes) -> None:
        if len(self._raw_headers) >= MAX_HEADERS:
            raise BadResponse("too many response headers")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise BadResponse("malformed response header")
        self._raw_headers.append((name, value.strip(b" \t")))


class BodyReader:
    """The framing of one response body: what :meth:`feed` returns is the payload of a read and,
    once the body is complete, the bytes after it (None while it goes on).

    @ivar length: ``Response.length``: an int, or ``UNKNOWN_LENGTH``.
    @ivar reusable: Whether the framing and the head allow the connection to be reused.
    """

    def __init__(self, method: bytes, head: ResponseHead) -> None:
        headers = head.headers
        self._chunks: ChunkedDecoder | None = None
        self._remaining = 0
        self.length: int | object = UNKNOWN_LENGTH
        if method == b"HEAD" or head.code in (204, 304):
            self.framing, self.length = _Framing.NONE, 0
        elif headers.hasHeader(b"transfer-encoding"):
            if header_tokens(headers, b"transfer-encoding")[-1:] == [b"chunked"]:
                self.framing = _Framing.CHUNKED
                self._chunks = ChunkedDecoder()
            else:
                self.framing = _Framing.CLOSE
        elif headers.hasHeader(b"content-length"):
            lengths = set(header_tokens(headers, b"content-length"))
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                raise BadResponse("malformed Content-Length")
            self._remaining = self.length = int(next(iter(lengths)))
            self.framing = _Framing.LENGTH if self.length else _Framing.NONE
        else:
            self.framing = _Framing.CLOSE
        self.reusable = not (
            head.version[1:] != (1, 1)
            or self.framing is _Framing.CLOSE
            or b"close" in header_tokens(headers, b"connection")
        )

    @property
    def empty(self) -> bool:
        """No body at all (HEAD, 204, 304, ``Content-Length: 0``)."""
        return self.framing is _Framing.NONE

    @property
    def close_delimited(self) -> bool:
        return self.framing is _Framing.CLOSE

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """Raises :class:`BadResponse` on bad chunk framing."""
        if self._chunks is not None:
            return self._chunks.feed(data)
        if self.framing is _Framing.LENGTH:
            take = data[: self._remaining]
            self._remaining -= len(take)
            return take, (data[len(take) :] if not self._remaining else None)
        return data, None


class NodeClientProtocol(Protocol):
    """One keep-alive HTTP/1.1 connection to a node; one request at a time; a named state machine.

    @ivar _state: One of L{ClientState}:
        - C{IDLE}: connected, no request; in the agent's idle set, or just made. :meth:`request`
          writes the head and moves to C{WRITING}. Bytes from the node here close the connection.
        - C{WRITING}: the head is written and the body producer runs (registered with the
          transport, so a full socket pauses it). Its end moves to C{AWAITING_HEADERS}; a producer
          failure fails the request with C{RequestGenerationFailed}, a lost connection with
          C{RequestTransmissionFailed}. A response head may already arrive here (C{BODY}).
        - C{AWAITING_HEADERS}: status line and headers are parsed (1xx interim heads skipped).
          A complete head fires the request with a L{Response} and moves to C{BODY}; a malformed
          one fails it with C{ResponseFailed([BadResponse])}; a loss with
          C{ResponseNeverReceived} (no byte seen) or C{ResponseFailed} (part of a head).
        - C{BODY}: body bytes go to the response, one call per read; its end moves to C{DONE}.
        - C{DONE}: the response is complete; the agent takes the connection back (C{IDLE}) or it
          is closed.
        - C{CLOSED}: the connection is gone; every later call but :meth:`connectionLost` is a
          no-op or raises L{IllegalCall}.
        Cancelling the request's Deferred in C{WRITING} or C{AWAITING_HEADERS} aborts the
        connection and fails it with C{ResponseNeverReceived([CancelledError])}.
    @ivar _reusable: Whether both sides allow reuse once this response is complete.
    """

    def __init__(
        self,
        release: Callable[[NodeClientProtocol], None],
        lost: Callable[[NodeClientProtocol], None],
    ) -> None:
        self._release = release
        self._lost = lost
        self._state = ClientState.IDLE
        self._parser = HeadParser()
        self._seen = False
        self._deferred: Deferred[IResponse] | None = None
        self._request: ClientRequest | None = None
        self._producer: IBodyProducer | None = None
        self._length = 0
        self._consumer: _BodyConsumer | None = None
        self._response: Response | None = None
        self._reader: BodyReader | None = None
        self._reusable = False
        self._stopped = False
        self._paused = False
        self._closed_waiters: list[Deferred[None]] = []

    @property
    def state(self) -> ClientState:
        """The current state (read-only; transitions happen through the methods)."""
        return self._state

    def connectionMade(self) -> None:
        # A request goes out whole and its answer is awaited: never hold a segment back for the
        # node's delayed ACK (Nagle's algorithm), as nginx's proxy does not either.
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            with contextlib.suppress(OSError):
                no_delay(True)

    # ---- request ----------------------------------------------------------------------------

    def request(
        self,
        head: bytes,
        request: ClientRequest,
        producer: IBodyProducer | None,
        persistent: bool,
    ) -> Deferred[IResponse]:
        """Write ``head`` (request line and headers) and the body; fires with the response."""
        if self._state is not ClientState.IDLE:
            raise IllegalCall(f"request in state {self._state.value}")
        assert self.transport is not None
        self._state = ClientState.WRITING
        self._request = request
        self._reusable = persistent
        self._seen = False
        self._stopped = False
        deferred: Deferred[IResponse] = Deferred(self._cancel)
        self._deferred = deferred
        self.transport.write(head)
        if producer is None:
            self._written()
            return deferred
        self._producer = producer
        self._length = cast(int, producer.length)
        self._consumer = _BodyConsumer(self)
        cast(IConsumer, self.transport).registerProducer(producer, True)
        try:
            producing = producer.startProducing(self._consumer)
        except Exception:
            self._generation_failed(producer, Failure())
        else:
            producing.addCallbacks(
                lambda _: self._produced(producer), lambda f: self._generation_failed(producer, f)
            )
        return deferred

    def write_body(self, data: bytes) -> None:
        if self._state is ClientState.CLOSED or self._stopped:
            return
        assert self.transport is not None
        self.transport.write(data)

    def _produced(self, producer: IBodyProducer) -> None:
        if producer is not self._producer:
            return
        assert self._consumer is not None
        if self._consumer.written != self._length:
            error = ValueError(f"body producer wrote {self._consumer.written} of {self._length}")
            self._generation_failed(producer, Failure(error))
            return
        self._written()

    def _written(self) -> None:
        """The whole request is handed to the transport."""
        if self._producer is not None:
            self._producer = None
            self._consumer = None
            if self.transport is not None:
                cast(IConsumer, self.transport).unregisterProducer()
        if self._state is ClientState.WRITING:
            self._state = ClientState.AWAITING_HEADERS
        elif self._state is ClientState.DONE:  # the response ended before the request did
            self._finish_connection()

    def _generation_failed(self, producer: IBodyProducer, failure: Failure) -> None:
        if producer is not self._producer:
            return
        self._producer = None
        self._consumer = None
        self._reusable = False
        if self.transport is not None:
            cast(IConsumer, self.transport).unregisterProducer()
        self._fail_request(RequestGenerationFailed([failure]))
        abort(self.transport)

    def _cancel(self, deferred: Deferred[IResponse]) -> None:
        """The caller gave up before the head arrived: abort, fail with a cancellation."""
        if self._deferred is not deferred:
            return
        self._reusable = False
        self._stop_producer()
        self._fail_request(ResponseNeverReceived([Failure(CancelledError())]))
        abort(self.transport)

    def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            if self.transport is not None:
                cast(IConsumer, self.transport).unregisterProducer()
            producer.stopProducing()

    def _fail_request(self, error: Exception) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred.errback(Failure(error))

    # ---- response ---------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self._state
        if state is ClientState.BODY:
            if not self._stopped:
                self._body(data)
        elif state in (ClientState.WRITING, ClientState.AWAITING_HEADERS):
            self._seen = True
            self._head(data)
        elif state is ClientState.IDLE:  # nothing was asked: the connection is unusable
            self._reusable = False
            abort(self.transport)

    def _head(self, data: bytes) -> None:
        try:
            head = self._parser.feed(data)
            if head is None:
                return
            assert self._request is not None
            self._parser = HeadParser()
            self._reader = reader = BodyReader(self._request.method, head)
        except BadResponse as error:
            self._reusable = False
            self._stop_producer()
            self._fail_request(ResponseFailed([Failure(error)]))
            abort(self.transport)
            return
        if not reader.reusable:
            self._reusable = False
        self._response = Response(
            head.version,
            head.code,
            head.phrase,
            head.headers,
            reader.length,
            self._request,
            _BodyTransport(self),
        )
        self._state = ClientState.BODY
        deferred, self._deferred = self._deferred, None
        assert deferred is not None
        deferred.callback(self._response)
        if self._state is not ClientState.BODY or self._stopped:
            return
        if reader.empty:
            if head.rest:
                self._reusable = False
            self._body_done()
        elif head.rest:
            self._body(head.rest)

    def _body(self, data: bytes) -> None:
        assert self._response is not None and self._reader is not None
        try:
            payload, after = self._reader.feed(data)
        except BadResponse as error:
            self._reusable = False
            self._end_body(Failure(ResponseFailed([Failure(error)], self._response)))
            abort(self.transport)
            return
        if payload:
            self._response.body_data(payload)
        if after is not None and self._state is ClientState.BODY and not self._stopped:
            if after:
                self._reusable = False
            self._body_done()

    def _body_done(self) -> None:
        """The framing says the body is complete: release the connection, then tell the body."""
        self._state = ClientState.DONE
        response, self._response = self._response, None
        assert response is not None
        response._transport.detach()
        if self._producer is None:
            self._finish_connection()
        else:  # the node answered before the body was written: never reuse
            self._reusable = False
            self._stop_producer()
            self._finish_connection()
        response.body_ended(Failure(ResponseDone()))

    def _finish_connection(self) -> None:
        if self._state is not ClientState.DONE:
            return
        if self._paused:
            self._paused = False
            assert self.transport is not None
            cast(IPushProducer, self.transport).resumeProducing()
        if self._reusable:
            self._state = ClientState.IDLE
            self._request = None
            self._release(self)
        else:
            close(self.transport)

    def _end_body(self, reason: Failure) -> None:
        response, self._response = self._response, None
        self._state = ClientState.DONE if self._state is not ClientState.CLOSED else self._state
        if response is not None:
            response.body_ended(reason)

    # ---- the body protocol's producer calls -------------------------------------------------

    def pause_body(self) -> None:
        if self._state is ClientState.BODY and not self._paused:
            self._paused = True
            cast(IPushProducer, self.transport).pauseProducing()

    def resume_body(self) -> None:
        if self._state is ClientState.BODY and self._paused:
            self._paused = False
            cast(IPushProducer, self.transport).resumeProducing()

    def stop_body(self) -> None:
        """The body protocol wants no more: the connection is aborted, never reused."""
        if self._state is ClientState.BODY and not self._stopped:
            self._stopped = True
            self._reusable = False
            self._stop_producer()
            abort(self.transport)

    # ---- the end ----------------------------------------------------------------------------

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        state, self._state = self._state, ClientState.CLOSED
        if state is ClientState.WRITING and not self._seen:
            self._stop_producer()
            self._fail_request(RequestTransmissionFailed([reason]))
        elif state in (ClientState.WRITING, ClientState.AWAITING_HEADERS):
            self._stop_producer()
            kind = ResponseFailed if self._seen else ResponseNeverReceived
            self._fail_request(kind([reason]))
        elif state is ClientState.BODY:
            self._stop_producer()
            if self._reader is not None and self._reader.close_delimited:
                self._end_body(Failure(PotentialDataLoss()))
            else:
                self._end_body(Failure(ResponseFailed([reason, Failure(_DataLoss())])))
        self._lost(self)
        waiters, self._closed_waiters = self._closed_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def close_idle(self) -> Deferred[None]:
        """Close an idle connection; fires once it is gone."""
        if self._state is ClientState.CLOSED:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._closed_waiters.append(waiter)
        close(self.transport)
        return waiter


def _status_line(line: bytes) -> tuple[tuple[bytes, int, int], int, bytes]:
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        raise BadResponse("malformed status line")
    version = _VERSION.match(parts[0])
    if version is None or version.group(1) != b"1":
        raise BadResponse("not an HTTP/1.x status line")
    if len(parts[1]) != 3 or not parts[1].isdigit():
        raise BadResponse("malformed status code")
    phrase = parts[2] if len(parts) == 3 else b""
    return (b"HTTP", 1, int(version.group(2))), int(parts[1]), phrase


class _ClientFactory(Factory):
    noisy = False

    def __init__(self, agent: NodeAgent) -> None:
        self._agent = agent

    def buildProtocol(self, addr: Any) -> NodeClientProtocol:
        return NodeClientProtocol(self._agent._release, self._agent._lost)


def _host_value(scheme: bytes, host: bytes, port: int) -> bytes:
    if isIPv6Address(host.decode("ascii", "replace")):
        host = b"[" + host + b"]"
    if (scheme, port) in ((b"http", 80), (b"https", 443)):
        return host
    return b"%b:%d" % (host, port)


@implementer(IAgent)
class NodeAgent:
    """An ``IAgent`` over :class:`NodeClientProtocol` with a keep-alive idle set per node.

    Connections come from ``endpoints`` (``upstream.NodeEndpointFactory``: TLS, IPv6, the connect
    timeout). A connection goes back to the idle set of its (scheme, host, port) once its response
    was complete and reusable; it expires after ``idle_seconds`` on ``reactor``'s clock, and at most
    ``max_idle_per_host`` are kept. Nothing is retried.
    """

    def __init__(
        self,
        reactor: IProxyReactor | IReactorTime,
        endpoints: IAgentEndpointFactory,
        *,
        max_idle_per_host: int = 32,
        idle_seconds: float = 4,
    ) -> None:
        self._clock: IReactorTime = reactor
        self._endpoints = endpoints
        self.max_idle_per_host = max_idle_per_host
        self.idle_seconds = idle_seconds
        self._factory = _ClientFactory(self)
        self._idle: dict[_Key, list[NodeClientProtocol]] = {}
        self._keys: dict[NodeClientProtocol, _Key] = {}
        self._timers: dict[NodeClientProtocol, IDelayedCall] = {}

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        try:
            parsed = URI.fromBytes(uri)
            if parsed.scheme not in (b"http", b"https"):
                raise ValueError("only http and https node URLs")
            head, persistent = _head(method, parsed, headers, bodyProducer)
        except Exception:
            return fail()
        request = ClientRequest(method, uri, headers if headers is not None else Headers())
        key: _Key = (parsed.scheme, parsed.host, parsed.port)
        idle = self._take_idle(key)
        if idle is not None:
            return idle.request(head, request, bodyProducer, persistent)
        try:
            endpoint = self._endpoints.endpointForURI(parsed)
        except Exception:
            return fail()
        connecting = cast("Deferred[NodeClientProtocol]", endpoint.connect(self._factory))

        def connected(protocol: NodeClientProtocol) -> Deferred[IResponse]:
            self._keys[protocol] = key
            return protocol.request(head, request, bodyProducer, persistent)

        return connecting.addCallback(connected)

    def close(self) -> Deferred[None]:
        """Close every idle connection; fires once all of them are gone."""
        closing: list[Deferred[None]] = []
        for protocols in list(self._idle.values()):
            for protocol in list(protocols):
                self._forget(protocol)
                closing.append(protocol.close_idle())
        self._idle.clear()
        return gatherResults(closing).addCallback(lambda _: None)

    def idle_count(self, key: _Key | None = None) -> int:
        """Idle connections kept (for one node, or all)."""
        if key is not None:
            return len(self._idle.get(key, ()))
        return sum(len(p) for p in self._idle.values())

    def _take_idle(self, key: _Key) -> NodeClientProtocol | None:
        protocols = self._idle.get(key)
        while protocols:
            protocol = protocols.pop()
            timer = self._timers.pop(protocol, None)
            if timer is not None and timer.active():
                timer.cancel()
            if protocol.state is ClientState.IDLE:
                return protocol
        return None

    def _release(self, protocol: NodeClientProtocol) -> None:
        key = self._keys.get(protocol)
        if key is None:
            close(protocol.transport)
            return
        protocols = self._idle.setdefault(key, [])
        if len(protocols) >= self.max_idle_per_host:
            close(protocol.transport)
            return
        protocols.append(protocol)
        self._timers[protocol] = self._clock.callLater(self.idle_seconds, self._expire, protocol)

    def _expire(self, protocol: NodeClientProtocol) -> None:
        self._timers.pop(protocol, None)
        self._forget(protocol)
        close(protocol.transport)

    def _forget(self, protocol: NodeClientProtocol) -> None:
        timer = self._timers.pop(protocol, None)
        if timer is not None and timer.active():
            timer.cancel()
        key = self._keys.get(protocol)
        if key is not None:
            protocols = self._idle.get(key, [])
            if protocol in protocols:
                protocols.remove(protocol)
            if not protocols:
                self._idle.pop(key, None)

    def _lost(self, protocol: NodeClientProtocol) -> None:
        self._forget(protocol)
        self._keys.pop(protocol, None)


def _head(
    method: bytes, uri: URI, headers: Headers | None, producer: IBodyProducer | None
) -> tuple[bytes, bool]:
    """The request line and headers, and whether the request allows keep-alive."""
    if not _TOKEN.match(method):
        raise ValueError("invalid request method")
    target = uri.originForm
    if not _TARGET.match(target):
        raise ValueError("invalid request target")
    lines = [method, b" ", target, b" HTTP/1.1\r\n"]
    persistent = True
    if headers is None or not headers.hasHeader(b"host"):
        lines += [b"Host: ", _host_value(uri.scheme, uri.host, uri.port), b"\r\n"]
    if headers is not None:
        persistent = b"close" not in header_tokens(headers, b"connection")
        for name, values in headers.getAllRawHeaders():
            for value in values:
                lines += [name, b": ", value, b"\r\n"]
    if producer is not None:
        if producer.length is UNKNOWN_LENGTH:
            raise ValueError("a request body of unknown length is not supported")
        lines.append(b"Content-Length: %d\r\n" % cast(int, producer.length))
    elif method in (b"PUT", b"POST"):
        lines.append(b"Content-Length: 0\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), persistent
