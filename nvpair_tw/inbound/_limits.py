# -*- test-case-name: tests.inbound.test_limits -*-
"""Inbound protocol limits for a facade's ``Site`` (docs/behaviour.md §9, TWISTED.md §3.1 and §3.6).

Twisted has no request-body cap, answers header-limit violations with a bare 400 and drops an
over-long line silently. ``make_site`` builds a ``Site`` whose channel and request enforce a body
cap (413), header count and size (431), request-line length (414), a header-read deadline (408),
an idle keep-alive timeout and a per-site connection cap (503), each answered with JSON.
Everything here speaks HTTP/1.1 only: an HTTP/2 channel would bypass these limits.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

from attrs import field, frozen
from attrs.validators import gt
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import Resource

from nvpair_tw.core import raw_error_response
from nvpair_tw.inbound._cors import grant
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "MIB",
    "LimitedChannel",
    "LimitedRequest",
    "LimitedSite",
    "Limits",
    "RawSink",
    "allow_origin",
    "make_site",
]

MIB = 1024 * 1024
_TOO_LARGE = b"Request Header Fields Too Large"
_log = LevelledLogger(namespace="nvpair_tw.limits")


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


class RawSink(Protocol):
    """Takes every byte of a channel handed over after an accepted upgrade (a tunnel)."""

    def client_data(self, data: bytes) -> None: ...

    def client_lost(self, reason: Failure) -> None: ...


def allow_origin(request: server.Request, origin: bytes) -> None:
    """Answer ``request`` with the CORS grants for ``origin`` (docs/behaviour.md §13.4)."""
    grant(request.responseHeaders, origin)
    if isinstance(request, LimitedRequest):
        request.cors_origin = origin


class LimitedRequest(server.Request):
    """A ``Request`` that refuses a body larger than the site's cap with 413 JSON.

    The check runs in ``gotLength`` (before any automatic ``100 Continue``) for a declared
    length, and per chunk for chunked uploads.
    """

    _rejected = False
    cors_origin: bytes | None = None
    """An allowed browser origin (§13.4): its grants are set as the head is written, last, so
    they win over any CORS header a node sent."""

    def write(self, data: bytes) -> None:
        if not self.startedWriting and self.cors_origin is not None:
            grant(self.responseHeaders, self.cors_origin)
        super().write(data)

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
    """No request head being read: between requests (the next line is a request line), or
    reading a body, or handling a request."""

    IN_HEAD = "in-head"
    """The request line is in, the headers are being read (a long line is a header's)."""

    REJECTED = "rejected"
    """A JSON error was written: every further input is ignored until the connection is gone."""


class LimitedChannel(_HandOver):
    """An ``HTTPChannel`` that answers limit violations with JSON errors and then closes.

    States: between requests (the idle timeout runs), reading a request head (the header-read
    timer runs as well, armed by the first byte), reading a body or handling a request (no timer
    of ours), and rejected (everything further is ignored until the connection is gone); what the
    limits tell apart of these is ``_phase`` (a :class:`_Phase`).

    Twisted has no public hook for two of the answers: it overrides ``HTTPChannel``'s private
    ``_send100Continue`` and ``_respondToBadRequestAndDisconnect``, and reads its header count and
    size, ``_handlingRequest``, ``_dataBuffer`` and ``_networkProducer``. Twisted is pinned below
    its next major and ``tests/test_dependency_internals.py`` guards each of them.
    """

    site: server.Site | None = None

    def __init__(self, limits: Limits, clock: IReactorTime) -> None:
        super().__init__()
        self.limits = limits
        self._clock = clock
        self._head_timer: IDelayedCall | None = None
        self._phase = _Phase.OUTSIDE_HEAD
        self._counted = False  # admitted by (and so counted in) the site's connection cap
        self.maxHeaders = limits.max_headers
        self.totalHeadersSize = limits.max_header_bytes
        self.MAX_LENGTH = max(limits.max_request_line, limits.max_header_bytes)
        # TimeoutMixin annotates an int but takes any number of seconds.
        self.timeOut = limits.idle_timeout  # type: ignore[assignment]

    def callLater(self, period: float, func: Any) -> IDelayedCall:
        """Schedule the idle timeout on the injected clock (``TimeoutMixin`` calls this)."""
        return self._clock.callLater(period, func)

    def _limited_site(self) -> LimitedSite | None:
        return self.site if isinstance(self.site, LimitedSite) else None

    def connectionMade(self) -> None:
        super().connectionMade()
        site = self._limited_site()
        self._counted = site is not None and site.admit()
        if site is not None and not self._counted:
            self.reject(503, b"Service Unavailable", "too many connections", "too-many-connections")

    def _handed_over(self) -> None:
        self._cancel_head_timer()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._sink is not None:
            self._sink.client_lost(reason)
        self._cancel_head_timer()
        site = self._limited_site()
        if self._counted and site is not None:
            site.open_connections -= 1
            self._counted = False
        super().connectionLost(reason)

    def reject(
        self,
        status: int,
        reason: bytes,
        message: str,
        code: str,
        request: server.Request | None = None,
    ) -> None:
        """Write a JSON error response, ignore all further input and close the connection."""
        if self._phase is _Phase.REJECTED:
            return
        self._phase = _Phase.REJECTED
        self._cancel_head_timer()
        site = self._limited_site()
        if site is not None:
            site.rejected(status, code, request)
        if self.transport is not None:
            self.transport.write(raw_error_response(status, reason, message, code))
            self.loseConnection()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None and self._head_timer.active():
            self._head_timer.cancel()
        self._head_timer = None

    def _header_timed_out(self) -> None:
        self._head_timer = None
        message = f"request headers not received within {self.limits.header_timeout:g} seconds"
        self.reject(408, b"Request Timeout", message, "header-timeout")

    def dataReceived(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink.client_data(data)
            return
        if self._phase is _Phase.REJECTED:
            return
        if data and self._head_timer is None and self.line_mode and not self._handlingRequest:
            self._head_timer = self._clock.callLater(
                self.limits.header_timeout, self._header_timed_out
            )
        super().dataReceived(data)

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
        self._cancel_head_timer()
        if self._phase is _Phase.IN_HEAD:
            self._phase = _Phase.OUTSIDE_HEAD
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        if self._phase is not _Phase.REJECTED:
            super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        if self._phase is not _Phase.REJECTED:
            super().allContentReceived()

    def _send100Continue(self) -> None:
        if self._phase is not _Phase.REJECTED:
            super()._send100Continue()

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.reject(400, b"Bad Request", "malformed request", "bad-request")

    def _request_line_too_long(self) -> None:
        message = f"request line exceeds {self.limits.max_request_line} bytes"
        self.reject(414, b"URI Too Long", message, "request-line-too-long")

    def _headers_too_large(self) -> None:
        message = f"request headers exceed {self.totalHeadersSize} bytes"
        self.reject(431, _TOO_LARGE, message, "headers-too-large")


class LimitedSite(server.Site):
    """A ``Site`` building ``LimitedChannel``s and counting its open connections."""

    noisy = False

    def __init__(self, root: Resource, limits: Limits, clock: IReactorTime) -> None:
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
        self._clock = clock
        self.on_reject: Callable[[int, str, str, str], None] | None = None

    def admit(self) -> bool:
        """Count a new connection, or refuse it (False) at the cap."""
        if self.open_connections >= self.limits.max_connections:
            _log.warn(
                "refusing a connection: {open} open, cap {cap}",
                open=self.open_connections,
                cap=self.limits.max_connections,
            )
            return False
        self.open_connections += 1
        return True

    def rejected(self, status: int, code: str, request: server.Request | None) -> None:
        """Tell ``on_reject`` (the request record) about a rejection made below the facade."""
        if self.on_reject is None:
            return
        method = request.method.decode("latin-1") if request is not None else "-"
        path = request.uri.partition(b"?")[0].decode("latin-1") if request is not None else "-"
        self.on_reject(status, code, method, path)

    def log(self, request: http.Request) -> None:
        """No access log: every request already ends in a structured ``proxy/request`` record,
        which leaves out query strings and client headers (and costs ~15 % throughput if doubled)."""

    def buildProtocol(self, addr: IAddress | None) -> Any:
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
) -> LimitedSite:
    """Build the facade's ``Site`` with every inbound limit enforced; see ``Limits``."""
    limits = Limits(
        max_body_size=max_body_size,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
        max_headers=max_headers,
        max_header_bytes=max_header_bytes,
        max_request_line=max_request_line,
    )
    return LimitedSite(root, limits, clock)
