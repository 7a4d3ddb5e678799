# -*- test-case-name: tests.inbound.test_limits,tests.inbound.test_limits_gate,tests.inbound.test_limits_sources,tests.inbound.test_cors_owned,tests.inbound.test_limits_refusals,tests.inbound.test_limits_channel -*-
"""Inbound protocol limits for a facade's ``Site`` (docs/behaviour.md §9, §14.1, §14.4, §14.5;
TWISTED.md §3.1 and §3.6).

Twisted has no request-body cap, answers header-limit violations with a bare 400 and drops an
over-long line silently. ``make_site`` builds a ``Site`` whose channel and request enforce a body
cap (413), header count and size (431), request-line length (414), a head deadline that runs
from accept and from the end of each response (408 for a head begun and not finished; a
connection that sent nothing of a next request is closed silently), a body that stops arriving
(408), an idle keep-alive timeout, a per-site connection cap, a per-source one, and a share of the
per-site cap that loopback cannot take (503), each answered with JSON. When a request's head is
complete, before any ``100 Continue`` and before any body byte is read, the site's ``head_gate``
decides whether it goes on (§14.1's order of checks); a refused request is answered and its
connection closed, its body never read. Everything here speaks HTTP/1.1 only: an HTTP/2 channel
would bypass these limits.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

from attrs import field, frozen
from attrs.validators import gt
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import Resource

from nvpair_tw.core import ErrorShape, one_send, raw_error_response, shape_of
from nvpair_tw.inbound._cors import CorsPolicy, grant
from nvpair_tw.inbound._ingress import Rejection
from nvpair_tw.inbound._sources import SourceCounts, source_of
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "MIB",
    "SERVER",
    "HeadGate",
    "LimitedChannel",
    "LimitedRequest",
    "LimitedSite",
    "Limits",
    "RawSink",
    "allow_origin",
    "make_site",
]

MIB = 1024 * 1024
SERVER = b"nvpair-tw"
"""The ``Server`` header of every answer the proxy makes itself: no version (§14.4)."""
_TOO_LARGE = b"Request Header Fields Too Large"
_TOO_MANY = Rejection(503, "too-many-connections", "too many connections")
_TOO_MANY_FROM_SOURCE = Rejection(
    503, "too-many-connections", "too many connections from this source"
)
_TOO_MANY_LOCAL = Rejection(
    503,
    "too-many-connections",
    "too many connections from this machine (the rest are kept for remote callers)",
)
_GATE_FAILED = Rejection(500, "internal-error", "internal proxy error")
_log = LevelledLogger(namespace=__name__)


def _valid_request_line(line: bytes) -> bool:
    """ASCII, with an origin-form or absolute-form target (or ``OPTIONS *``).

    Twisted lets the bytes 0x7F-0xB0 through and accepts any target; the facade maps only these.
    A line not split in three is left to Twisted, which answers it as malformed.
    """
    if not line.isascii():
        return False
    parts = line.split(b" ")
    if len(parts) != 3:
        return True
    method, target, _ = parts
    if target == b"*":
        return method == b"OPTIONS"
    return target.startswith(b"/") or target[:8].lower().startswith((b"http://", b"https://"))


def _describe_size(size: int) -> str:
    return f"{size // MIB} MiB" if size % MIB == 0 else f"{size} bytes"


@frozen
class Limits:
    """The configured inbound limits of one ``Site``."""

    max_body_size: int = field(default=32 * MIB, validator=gt(0))
    max_connections: int = field(default=256, validator=gt(0))
    idle_timeout: float = field(default=90.0, validator=gt(0))
    header_timeout: float = field(default=10.0, validator=gt(0))
    max_headers: int = field(default=100, validator=gt(0))
    max_header_bytes: int = field(default=16384, validator=gt(0))
    max_request_line: int = field(default=8192, validator=gt(0))
    body_timeout: float = field(default=30.0, validator=gt(0))
    """Seconds a request body may deliver nothing before it is dropped with 408 (§14.4)."""
    max_connections_per_source: int = field(default=64, validator=gt(0))
    """Open connections per remote source address (IPv6: per /64); loopback is not counted."""
    remote_share: int = field(default=0)
    """Of ``max_connections``, how many loopback and unix-socket peers may not take: kept for
    remote callers (docs/behaviour.md §14.4); 0 = none kept."""

    @remote_share.validator
    def _within(self, _attribute: object, value: int) -> None:
        if not 0 <= value < self.max_connections:
            raise ValueError(f"remote_share must be from 0 to max_connections - 1, not {value}")

    @property
    def local_cap(self) -> int:
        """Open connections loopback and unix-socket peers may hold together."""
        return self.max_connections - self.remote_share


class RawSink(Protocol):
    """Takes every byte of a channel handed over after an accepted upgrade (a tunnel)."""

    def client_data(self, data: bytes) -> None: ...

    def client_lost(self, reason: Failure) -> None: ...


def allow_origin(request: server.Request, origin: bytes) -> None:
    """Answer ``request`` with the CORS grants for ``origin`` (docs/behaviour.md §13.4).

    On a ``LimitedSite`` that knows the ``CorsPolicy`` this is redundant: the site grants as the
    head is written (§14.5)."""
    grant(request.responseHeaders, origin)
    if isinstance(request, LimitedRequest):
        request.cors_origin = origin


class LimitedRequest(server.Request):
    """A ``Request`` that refuses a body larger than the site's cap with 413 JSON, and whose
    answer's head is the proxy's: a versionless ``Server`` and the site's CORS (§14.4, §14.5).

    The body check runs in ``gotLength`` (before any automatic ``100 Continue``) for a declared
    length, and per chunk for chunked uploads.
    """

    _rejected = False
    recorded = False
    """The facade recorded this request's refusal itself (its head gate knew the caller's key):
    the site does not record it again."""
    passed: object = None
    """What the site's head gate passed on to the resource for this request (the facade's
    checked head), read when the body is in."""
    cors_origin: bytes | None = None
    """An allowed browser origin (§13.4) when the site knows no ``CorsPolicy``: its grants are
    set as the head is written, last, so they win over any CORS header a node sent."""

    def write(self, data: bytes) -> None:
        if self.startedWriting:
            super().write(data)
            return
        self._own_head()
        channel = self.channel
        # The head and the first body bytes leave in one send (one packet, one system call).
        with one_send(channel.transport if channel is not None else None):
            super().write(data)

    def _own_head(self) -> None:
        headers = self.responseHeaders
        if headers.getRawHeaders(b"server") == [server.version]:
            headers.setRawHeaders(b"server", [SERVER])  # Twisted's, with its version (§14.4)
        channel = self.channel
        policy = channel.cors if isinstance(channel, LimitedChannel) else None
        if policy is not None:
            policy.own_head(self)
        elif self.cors_origin is not None:
            grant(headers, self.cors_origin)

    def _max_body_size(self) -> int:
        channel = self.channel
        if isinstance(channel, LimitedChannel):
            return channel.limits.max_body_size
        return Limits().max_body_size

    def gotLength(self, length: int | None) -> None:
        super().gotLength(length)
        if length is not None and length > self._max_body_size():
            self._reject()

    def handleContentChunk(self, data: bytes) -> None:
        if self._rejected:
            return
        if self.content is None or self.content.tell() + len(data) > self._max_body_size():
            self._reject()
            return
        super().handleContentChunk(data)

    def _reject(self) -> None:
        self._rejected = True
        channel = self.channel
        message = f"request body exceeds {_describe_size(self._max_body_size())} limit"
        if isinstance(channel, LimitedChannel):
            channel.reject(413, b"Content Too Large", message, "body-too-large", self)
        elif channel is not None and channel.transport is not None:
            channel.transport.write(
                raw_error_response(413, b"Content Too Large", message, "body-too-large")
            )
            channel.loseConnection()


HeadGate = Callable[[LimitedRequest], Rejection | None]
"""Decides on a request whose head is complete (method, target, headers and peer known; no body
byte read, no ``100 Continue`` sent): ``None`` lets it go on, a ``Rejection`` answers it."""


class _HandOver(http.HTTPChannel):
    """The part of a channel that can hand its connection over to a tunnel (a WebSocket upgrade)."""

    _sink: RawSink | None = None

    def hand_over(self, sink: RawSink) -> bytes:
        """From now on every byte read goes to ``sink`` untouched (an upgraded connection), and
        its loss is told to it; returns the bytes already read after the request head.

        Only while the request that asked for the upgrade is being handled (the channel then
        buffers what follows its head and its idle timeout is off)."""
        if not self._handlingRequest or self._sink is not None:
            raise RuntimeError("hand_over is only for the request being handled, once")
        self._sink = sink
        self._handed_over()
        buffered = b"".join(self._dataBuffer)
        self._dataBuffer = []
        self._networkProducer.resumeProducing()  # the channel may have paused a busy reader
        return buffered

    def _handed_over(self) -> None:
        """What the channel stops doing once its connection is a tunnel's."""


class _Phase(Enum):
    """Where a :class:`LimitedChannel` is in its input, as far as its limits care."""

    OUTSIDE_HEAD = "outside-head"
    """No request head or body being read: between requests (the next line is a request line)
    or handling a request."""

    IN_HEAD = "in-head"
    """The request line is in, the headers are being read (a long line is a header's)."""

    IN_BODY = "in-body"
    """The head passed, the body is being read: it must keep arriving (the body deadline)."""

    REJECTED = "rejected"
    """A JSON error was written: every further input is ignored until the connection is gone."""


class _Deadline:
    """The one timer of a channel's input: the header read's, then (same call, moved) the
    body's; one ``callLater`` per request, moved rather than replaced. Only the pending call
    holds ``expired`` (a method of the channel that holds this deadline), so no reference cycle
    outlives the timer (docs/performance.md)."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._call: IDelayedCall | None = None

    @property
    def running(self) -> bool:
        return self._call is not None

    def start(self, seconds: float, expired: Callable[[], None]) -> None:
        """Call ``expired`` ``seconds`` from now (a running deadline is moved)."""
        if self._call is None:
            self._call = self._clock.callLater(seconds, self._fire, expired)
        else:
            self._call.reset(seconds)

    def _fire(self, expired: Callable[[], None]) -> None:
        self._call = None
        expired()

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


class _Answering(_HandOver):
    """The part of a limited channel that answers for itself: a JSON error with a versionless
    ``Server`` and the site's CORS grants, then the close (§14.4, §14.5); the limits and site it
    answers by, and the one deadline of its input."""

    site: server.Site | None = None

    def __init__(self, limits: Limits, clock: IReactorTime) -> None:
        super().__init__()
        self.limits = limits
        self._clock = clock
        self._deadline = _Deadline(clock)
        self._phase = _Phase.OUTSIDE_HEAD
        self._lost = False

    def callLater(self, period: float, func: Any) -> IDelayedCall:
        """Schedule the idle timeout on the injected clock (``TimeoutMixin`` calls this)."""
        return self._clock.callLater(period, func)

    def _limited_site(self) -> LimitedSite | None:
        return self.site if isinstance(self.site, LimitedSite) else None

    @property
    def cors(self) -> CorsPolicy | None:
        """The site's CORS policy (§14.5), ``None`` when CORS is off."""
        site = self._limited_site()
        return site.cors if site is not None else None

    def refuse(self, rejection: Rejection, request: server.Request | None = None) -> None:
        """Answer with ``rejection`` (its status, code, message and headers) and close."""
        reason = http.RESPONSES.get(rejection.status, b"Error")
        self.reject(
            rejection.status, reason, rejection.message, rejection.code, request, rejection.headers
        )

    def reject(
        self,
        status: int,
        reason: bytes,
        message: str,
        code: str,
        request: server.Request | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        """Write a JSON error response, ignore all further input and close the connection.

        The answer carries ``headers``, a versionless ``Server`` and, for an allowed origin,
        the CORS grants (§14.4, §14.5); never a request id."""
        if self._phase is _Phase.REJECTED:
            return
        self._phase = _Phase.REJECTED
        self._deadline.stop()
        site = self._limited_site()
        if site is not None:
            site.rejected(status, code, request)
        if self.transport is not None:
            own = (*headers, (b"Server", SERVER), *self._grants(request))
            path = getattr(request, "path", None) if request is not None else None
            shape = (
                shape_of(path.decode("latin-1")) if isinstance(path, bytes) else ErrorShape.PROXY
            )
            answer = raw_error_response(status, reason, message, code, own, shape)
            self.transport.write(answer)
            self.loseConnection()

    def _grants(self, request: server.Request | None) -> tuple[tuple[bytes, bytes], ...]:
        """CORS grants for the request being read (as much of its head as was read)."""
        policy = self.cors
        if policy is None:
            return ()
        current = request if request is not None else (self.requests[-1] if self.requests else None)
        return policy.raw_grants(current.requestHeaders if current is not None else None)

    def _deadline_passed(self) -> None:
        """The input's deadline is due: a body or a head begun and not finished is 408; a
        connection that sent nothing of a next request closes without an answer (it asked
        nothing); while a request is being answered nothing happens (its end starts the next
        head's deadline)."""
        if self._phase is _Phase.IN_BODY:
            self._body_stalled()
        elif self._phase is _Phase.IN_HEAD or self._buffer:
            self._header_timed_out()
        elif not self._handlingRequest and self._sink is None:
            self._idle()

    def _expect_head(self) -> None:
        """A next request's head is due within the head deadline from now (at accept, and at
        the end of each response): the one timer of the input, moved, not made again."""
        self._deadline.start(self.limits.header_timeout, self._deadline_passed)

    def requestDone(self, request: http.Request) -> None:
        super().requestDone(request)
        if (
            self.persistent
            and not self._lost
            and not self._handlingRequest
            and self._sink is None
            and self._phase in (_Phase.OUTSIDE_HEAD, _Phase.IN_HEAD)
        ):
            self._expect_head()  # from the end of each response (§14.4)

    def _idle(self) -> None:
        _log.debug("closing a connection that sent no request within the head deadline")
        self._phase = _Phase.REJECTED
        self.loseConnection()

    def _header_timed_out(self) -> None:
        message = f"request headers not received within {self.limits.header_timeout:g} seconds"
        self.reject(408, b"Request Timeout", message, "header-timeout")

    def _body_stalled(self) -> None:
        message = f"request body stalled for {self.limits.body_timeout:g} seconds"
        request = self.requests[-1] if self.requests else None
        self.reject(408, b"Request Timeout", message, "body-timeout", request)

    def _send100Continue(self) -> None:
        if self._phase is not _Phase.REJECTED:
            super()._send100Continue()

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.reject(400, b"Bad Request", "malformed request", "bad-request")


class LimitedChannel(_Answering):
    """An ``HTTPChannel`` that answers limit violations with JSON errors and then closes.

    States (``_phase``, a :class:`_Phase`): between requests and reading a request head (the head
    deadline runs, from accept or from the end of the last response, whatever bytes arrive; due,
    it is 408 for a head begun, a silent close for none), reading a body (the body deadline, moved
    by each read), handling a request (the deadline may still be pending: due then, it does
    nothing), and rejected (everything further is ignored until the connection is gone). Twisted's
    idle timeout runs beside it. At the end of a head the site's ``head_gate`` runs, before
    Twisted's ``gotLength``.

    Twisted has no public hook for two of the answers: it overrides ``HTTPChannel``'s private
    ``_send100Continue`` and ``_respondToBadRequestAndDisconnect``, and reads its header count and
    size, ``_handlingRequest``, ``_dataBuffer``, ``_networkProducer`` and ``LineReceiver``'s
    ``_buffer``; ``tests/test_dependency_internals.py`` guards each of them.
    """

    def __init__(self, limits: Limits, clock: IReactorTime) -> None:
        super().__init__(limits, clock)
        self._request_line = b""
        self._counted = False  # admitted by (and so counted in) the site's connection caps
        self._source: str | None = None
        self.maxHeaders = limits.max_headers
        self.totalHeadersSize = limits.max_header_bytes
        self.MAX_LENGTH = max(limits.max_request_line, limits.max_header_bytes)
        # TimeoutMixin annotates an int but takes any number of seconds.
        self.timeOut = limits.idle_timeout  # type: ignore[assignment]

    def connectionMade(self) -> None:
        super().connectionMade()
        site = self._limited_site()
        if site is None or self.transport is None:
            return
        self._source = source_of(self.transport.getPeer())
        refused = site.admit(self._source)
        self._counted = refused is None
        if refused is not None:
            self.refuse(refused)
            return
        self._expect_head()  # the head deadline runs from accept (§14.4)

    def _handed_over(self) -> None:
        self._deadline.stop()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._sink is not None:
            self._sink.client_lost(reason)
        self._lost = True  # no deadline is armed again
        self._deadline.stop()
        site = self._limited_site()
        if self._counted and site is not None:
            site.release(self._source)
            self._counted = False
        super().connectionLost(reason)

    def dataReceived(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink.client_data(data)
            return
        if self._phase is _Phase.REJECTED:
            return
        super().dataReceived(data)
        self._arm()

    def _arm(self) -> None:
        """Once a read is taken in: while a body is arriving, the deadline is the body's, moved
        (it must keep arriving). A head's deadline is not moved by its bytes: it runs from
        accept or from the end of the last response. Moved after the read rather than before it,
        so a request whose head and body came in one read moves nothing (the clock does not move
        inside a read)."""
        if not self._lost and self._phase is _Phase.IN_BODY:
            self._deadline.start(self.limits.body_timeout, self._deadline_passed)

    def lineReceived(self, line: bytes) -> None:
        if self._phase is _Phase.REJECTED:
            return
        if self._phase is _Phase.OUTSIDE_HEAD and line:
            if len(line) > self.limits.max_request_line:
                self._request_line_too_long()
                return
            if not _valid_request_line(line):
                self._respondToBadRequestAndDisconnect()
                return
            self._phase = _Phase.IN_HEAD
            self._request_line = line
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._headers_too_large()
            return
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        if self._phase is _Phase.IN_HEAD:
            self._headers_too_large()
        else:
            self._request_line_too_long()

    def headerReceived(self, line: bytes) -> bool:
        if self._phase is _Phase.REJECTED:
            return False
        if self._receivedHeaderCount >= self.maxHeaders:
            message = f"more than {self.maxHeaders} request headers"
            self.reject(431, _TOO_LARGE, message, "too-many-headers")
            return False
        return bool(super().headerReceived(line))

    def allHeadersReceived(self) -> None:
        """The head is complete: the gate, then Twisted (``gotLength``, ``100 Continue``), then
        the body deadline when a body follows."""
        self._phase = _Phase.OUTSIDE_HEAD
        request = self.requests[-1]
        _describe(request, self._request_line)
        if not self._passes_gate(request):
            return
        super().allHeadersReceived()
        if self._phase is _Phase.OUTSIDE_HEAD and self.length != 0:
            self._phase = _Phase.IN_BODY  # the read's end moves the head's deadline to the body's
        # A bodiless request keeps the deadline pending: due while it is answered, it does
        # nothing; the answer's end moves it to the next head's.

    def _passes_gate(self, request: server.Request) -> bool:
        site = self._limited_site()
        gate = site.head_gate if site is not None else None
        if gate is None or not isinstance(request, LimitedRequest):
            return True
        try:
            refused = gate(request)
        except Exception:
            _log.failure("the head gate failed", Failure())
            refused = _GATE_FAILED
        if refused is not None:
            self.refuse(refused, request)
        return refused is None

    def rawDataReceived(self, data: bytes) -> None:
        if self._phase is _Phase.REJECTED:
            return
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        if self._phase is _Phase.REJECTED:
            return
        if self._phase is _Phase.IN_BODY:
            self._phase = _Phase.OUTSIDE_HEAD  # the deadline stays pending, as for no body
        super().allContentReceived()

    def _request_line_too_long(self) -> None:
        message = f"request line exceeds {self.limits.max_request_line} bytes"
        self.reject(414, b"URI Too Long", message, "request-line-too-long")

    def _headers_too_large(self) -> None:
        message = f"request headers exceed {self.totalHeadersSize} bytes"
        self.reject(431, _TOO_LARGE, message, "headers-too-large")


def _describe(request: server.Request, line: bytes) -> None:
    """Give ``request`` its method, target and version from its request line as soon as its
    head is complete, for the gate and for records (Twisted sets the same when the body is in)."""
    parts = line.split(b" ")
    if len(parts) == 3:
        request.method, request.uri, request.clientproto = parts
        request.path = parts[1].split(b"?", 1)[0]


class LimitedSite(server.Site):
    """A ``Site`` building ``LimitedChannel``s and counting its open connections (overall and
    per remote source).

    ``head_gate`` (a :data:`HeadGate`, ``None`` = every head passes) runs once per request when
    its head is complete; ``cors`` (``None`` = CORS off) makes every answer's CORS the proxy's;
    ``on_reject`` is told of each answer made below the facade.
    """

    noisy = False

    def __init__(
        self, root: Resource, limits: Limits, clock: IReactorTime, cors: CorsPolicy | None = None
    ) -> None:
        super().__init__(
            root,
            LimitedRequest,
            parsePOSTFormSubmission=False,
            timeout=limits.idle_timeout,
            reactor=clock,
        )
        self.limits = limits
        self.max_body_size = limits.max_body_size
        self.open_connections = 0
        self.local_connections = 0
        """Of :attr:`open_connections`, those of loopback and unix-socket peers."""
        self.sources = SourceCounts(limits.max_connections_per_source)
        self.cors = cors
        self.head_gate: HeadGate | None = None
        self._clock = clock
        self.on_reject: Callable[[int, str, str, str], None] | None = None

    def admit(self, source: str | None) -> Rejection | None:
        """Count a new connection from ``source`` (``None``: a local peer), or say why not."""
        if self.open_connections >= self.limits.max_connections:
            _log.warn(
                "refusing a connection: {open} open, cap {cap}",
                open=self.open_connections,
                cap=self.limits.max_connections,
            )
            return _TOO_MANY
        if source is None and self.local_connections >= self.limits.local_cap:
            _log.warn(
                "refusing a local connection: {open} open from this machine, cap {cap} ({kept}"
                " kept for remote callers)",
                open=self.local_connections,
                cap=self.limits.local_cap,
                kept=self.limits.remote_share,
            )
            return _TOO_MANY_LOCAL
        if source is not None and not self.sources.admit(source):
            _log.warn(
                "refusing a connection: {cap} open from one source",
                cap=self.limits.max_connections_per_source,
            )
            return _TOO_MANY_FROM_SOURCE
        self.open_connections += 1
        if source is None:
            self.local_connections += 1
        return None

    def release(self, source: str | None) -> None:
        """An admitted connection from ``source`` closed."""
        self.open_connections -= 1
        if source is None:
            self.local_connections -= 1
        else:
            self.sources.release(source)

    def rejected(self, status: int, code: str, request: server.Request | None) -> None:
        """Tell ``on_reject`` (the request record) about a rejection made below the facade."""
        if self.on_reject is None or (isinstance(request, LimitedRequest) and request.recorded):
            return
        method = request.method.decode("latin-1") if request is not None else "-"
        path = request.uri.partition(b"?")[0].decode("latin-1") if request is not None else "-"
        self.on_reject(status, code, method, path)

    def log(self, request: http.Request) -> None:
        """No access log: every request already ends in a structured ``proxy/request`` record,
        which leaves out query strings and client headers (and costs ~15 % throughput if doubled)."""

    def buildProtocol(self, addr: Any) -> Any:
        channel = LimitedChannel(self.limits, self._clock)
        channel.factory = self
        channel.site = self
        channel.requestFactory = self.requestFactory
        return channel


def make_site(
    root: Resource,
    *,
    clock: IReactorTime,
    max_body_size: int = 32 * MIB,
    max_connections: int = 256,
    idle_timeout: float = 90.0,
    header_timeout: float = 10.0,
    max_headers: int = 100,
    max_header_bytes: int = 16384,
    max_request_line: int = 8192,
    body_timeout: float = 30.0,
    max_connections_per_source: int = 64,
    remote_share: int = 0,
    cors: CorsPolicy | None = None,
) -> LimitedSite:
    """Build the facade's ``Site`` with every inbound limit enforced; see ``Limits``. ``cors``
    (the ``--cors-origin`` policy) makes CORS the proxy's (§14.5); set ``head_gate`` on the
    result to decide on each request at the end of its head (§14.1)."""
    limits = Limits(
        max_body_size=max_body_size,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
        max_headers=max_headers,
        max_header_bytes=max_header_bytes,
        max_request_line=max_request_line,
        body_timeout=body_timeout,
        max_connections_per_source=max_connections_per_source,
        remote_share=remote_share,
    )
    return LimitedSite(root, limits, clock, cors)
