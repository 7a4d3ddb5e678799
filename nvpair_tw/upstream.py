# -*- test-case-name: tests.test_upstream -*-
"""One attempt against one node: the shared pool, the replayed body, the header deadline, the body gate.

The response-header deadline is armed by :class:`ReplayBodyProducer` when the last request byte has been
handed to the transport, so dial, TLS and pool wait never count (SPEC §6.3). :class:`BodyGate` holds the
first body chunk (or a clean empty end) so the caller can decide to commit before anything reaches the
client (SPEC §6.2), then relays the rest as it arrives.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.error import ConnectError, ConnectingCancelledError, DNSLookupError
from twisted.internet.interfaces import (
    IConsumer,
    IDelayedCall,
    IPushProducer,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import (
    IAgent,
    IAgentEndpointFactory,
    IBodyProducer,
    IPolicyForHTTPS,
    IResponse,
)
from zope.interface import implementer

from nvpair_tw.tls import tls_endpoint


class HeaderTimeout(Exception):
    """No response headers within the deadline after the request was written (a stall)."""


class FirstBodyTimeout(Exception):
    """Headers arrived, then no body byte within the enabled first-body timeout (a stall)."""


TRANSPORT_FAILURES: tuple[type[BaseException], ...] = (
    HeaderTimeout,
    FirstBodyTimeout,
    ConnectError,
    DNSLookupError,
    ResponseNeverReceived,
    RequestTransmissionFailed,
    RequestGenerationFailed,
    ResponseFailed,
)


def is_cancellation(failure: Failure) -> bool:
    """Whether a (possibly wrapped) failure is a cancellation rather than an upstream fault."""
    if failure.check(CancelledError, ConnectingCancelledError):
        return True
    value = failure.value
    if isinstance(value, RequestGenerationFailed | ResponseNeverReceived | ResponseFailed):
        return any(is_cancellation(reason) for reason in value.reasons)
    return False


def describe_failure(failure: Failure) -> str:
    """A short, body-free reason for logs, records and the 502 text."""
    value = failure.value
    if isinstance(value, HeaderTimeout | FirstBodyTimeout):
        return str(value)
    if isinstance(value, RequestGenerationFailed | ResponseNeverReceived | ResponseFailed):
        inner = [describe_failure(reason) for reason in value.reasons]
        return f"{type(value).__name__}({', '.join(inner)})"
    args = getattr(value, "args", ())
    if any(isinstance(arg, bytes | bytearray) for arg in args):
        # e.g. a ParseError carries the upstream's raw bytes, which may echo the prompt
        text = ", ".join(arg for arg in args if isinstance(arg, str))
    else:
        text = str(value).strip()
    name = type(value).__name__
    return f"{name}: {text}" if text and text != name else name


@implementer(IBodyProducer)
class ReplayBodyProducer:
    """Writes one immutable body; calls ``on_written`` once the last byte is handed to the transport."""

    _CHUNK = 65536

    def __init__(self, body: bytes, on_written: Callable[[], None]) -> None:
        self._body = memoryview(body)
        self.length = len(body)
        self._on_written = on_written
        self._paused = False
        self._stopped = False
        self._offset = 0
        self._consumer: IConsumer | None = None
        self._done: Deferred[None] | None = None

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        self._consumer = consumer
        self._done = Deferred()
        self._pump()
        return self._done

    def _pump(self) -> None:
        assert self._consumer is not None and self._done is not None
        while not self._paused and not self._stopped and self._offset < self.length:
            chunk = self._body[self._offset : self._offset + self._CHUNK]
            self._offset += len(chunk)
            self._consumer.write(bytes(chunk))
        if self._offset >= self.length and not self._stopped and not self._done.called:
            self._on_written()
            self._done.callback(None)

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._consumer is not None and not self._stopped:
            self._pump()

    def stopProducing(self) -> None:
        self._stopped = True


@implementer(IAgentEndpointFactory)
class NodeEndpointFactory:
    """Endpoints for node URLs: IP literals dial directly (a refusal is seen in ~1 ms, not 0.3 s).

    https: TLS per ``tls`` (default: the system trust store); ``connect`` fires after the handshake,
    which the connect timeout also bounds (:func:`nvpair_tw.tls.tls_endpoint`).
    """

    def __init__(
        self, reactor: Any, connect_timeout: float, tls: IPolicyForHTTPS | None = None
    ) -> None:
        self._reactor = reactor
        self._timeout = connect_timeout
        self._tls = tls if tls is not None else BrowserLikePolicyForHTTPS()
        self._cache: dict[tuple[bytes, bytes, int], IStreamClientEndpoint] = {}

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._cache.get(key)
        if endpoint is None:
            endpoint = self._cache[key] = self._endpoint(uri)
        return endpoint

    def _endpoint(self, uri: URI) -> IStreamClientEndpoint:
        host = uri.host.decode("ascii")
        endpoint: IStreamClientEndpoint
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            endpoint = HostnameEndpoint(self._reactor, uri.host, uri.port, timeout=self._timeout)
        else:
            if address.version == 4:
                endpoint = TCP4ClientEndpoint(self._reactor, host, uri.port, timeout=self._timeout)
            else:
                endpoint = TCP6ClientEndpoint(
                    self._reactor, host.strip("[]"), uri.port, timeout=self._timeout
                )
        if uri.scheme == b"https":
            creator = self._tls.creatorForNetloc(uri.host, uri.port)
            endpoint = tls_endpoint(self._reactor, creator, endpoint, self._timeout)
        return endpoint


def make_pool(reactor: Any, max_per_host: int = 32, idle_seconds: int = 4) -> HTTPConnectionPool:
    """The one shared pool: we own failover, so no automatic retries; idle below engine keep-alives."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.retryAutomatically = False
    pool.maxPersistentPerHost = max_per_host
    pool.cachedConnectionTimeout = idle_seconds
    return pool


class UpstreamClient:
    """Sends one attempt with a response-header deadline measured from the end of the write."""

    def __init__(
        self,
        reactor: Any,
        pool: HTTPConnectionPool,
        connect_timeout: float,
        endpoints: IAgentEndpointFactory | None = None,
    ) -> None:
        self._clock: IReactorTime = reactor
        if endpoints is None:
            endpoints = NodeEndpointFactory(reactor, connect_timeout)
        self.agent: IAgent = Agent.usingEndpointFactory(reactor, endpoints, pool=pool)

    @classmethod
    def from_agent(cls, agent: IAgent, clock: IReactorTime) -> UpstreamClient:
        """A client over any agent, its deadlines on ``clock`` (tests: an in-memory agent)."""
        client = cls.__new__(cls)
        client._clock = clock
        client.agent = agent
        return client

    def request(
        self,
        method: bytes,
        url: bytes,
        headers: Headers,
        body: bytes,
        header_timeout: float,
        on_written: Callable[[], None] | None = None,
    ) -> Deferred[IResponse]:
        """Start an attempt; a silent node fails the Deferred with :class:`HeaderTimeout`."""
        timer: list[IDelayedCall] = []
        timed_out: list[bool] = []

        def written() -> None:
            timer.append(self._clock.callLater(header_timeout, expire))
            if on_written is not None:
                on_written()

        def expire() -> None:
            timed_out.append(True)
            attempt.cancel()

        def settle(result: IResponse | Failure) -> IResponse | Failure:
            if timer and timer[0].active():
                timer[0].cancel()
            if timed_out and isinstance(result, Failure):
                raise HeaderTimeout(
                    f"no response headers within {header_timeout:g}s"
                ) from result.value
            return result

        attempt: Deferred[IResponse] = self.agent.request(
            method, url, headers, ReplayBodyProducer(body, written)
        )
        attempt.addBoth(settle)
        return attempt


class Discard(Protocol):
    """Body sink for a response we will not relay: closes the connection at once."""

    def connectionMade(self) -> None:
        assert self.transport is not None
        IPushProducer(self.transport).stopProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        pass


class BodyGate(Protocol):
    """Holds the first body chunk (or a clean empty end) until the caller commits, then relays.

    ``first`` fires with the first non-empty chunk, ``b""`` on a clean empty end, or fails
    (:class:`FirstBodyTimeout` when the enabled timer expired). After :meth:`start_relay` every chunk
    goes to ``sink`` and ``done`` fires at a clean end or fails on a dropped stream.
    """

    def __init__(self, clock: IReactorTime, first_body_timeout: float) -> None:
        self.first: Deferred[bytes] = Deferred()
        self.done: Deferred[None] = Deferred()
        self._sink: Callable[[bytes], None] | None = None
        self._pending: list[bytes] = []
        self._ended: Failure | None = None
        self._timed_out = False
        self._timeout = first_body_timeout
        self._timer: IDelayedCall | None = None
        if first_body_timeout > 0:
            self._timer = clock.callLater(first_body_timeout, self._no_first_body)

    def _no_first_body(self) -> None:
        self._timer = None
        self._timed_out = True
        self.stop()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stop(self) -> None:
        """Close the upstream body (caller gone, or timer expired)."""
        self._disarm()
        if self.transport is not None:
            IPushProducer(self.transport).stopProducing()

    def producer(self) -> IPushProducer:
        """The upstream socket as a push producer (pause it when the client cannot keep up)."""
        assert self.transport is not None
        return IPushProducer(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if not data:
            return
        if self._sink is not None:
            self._sink(data)
        elif not self.first.called:
            self._disarm()
            self.first.callback(data)
        else:
            self._pending.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        clean = reason.check(ResponseDone, PotentialDataLoss) is not None
        if self._sink is not None:
            self._finish(reason)
        elif not self.first.called:
            # Our own cut after the timer can look clean (a close-delimited body): a timeout wins.
            if self._timed_out:
                self.first.errback(
                    Failure(FirstBodyTimeout(f"no response body within {self._timeout:g}s"))
                )
            elif clean:
                self._ended = reason
                self.first.callback(b"")
            else:
                self.first.errback(reason)
        else:
            self._ended = reason

    def start_relay(self, sink: Callable[[bytes], None]) -> None:
        """Commit: flush held chunks to ``sink`` and relay the rest as it arrives."""
        self._sink = sink
        pending, self._pending = self._pending, []
        for chunk in pending:
            sink(chunk)
        if self._ended is not None:
            self._finish(self._ended)

    def _finish(self, reason: Failure) -> None:
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(None)
        else:
            self.done.errback(reason)


def node_url(base: str, path_and_query: bytes) -> bytes:
    """Join a node base URL (which may carry a path prefix) and the client's raw target."""
    return _base_of(base) + path_and_query


@functools.lru_cache(maxsize=256)
def _base_of(base: str) -> bytes:
    parts = urlsplit(base)
    return f"{parts.scheme}://{parts.netloc}".encode() + parts.path.rstrip("/").encode()
