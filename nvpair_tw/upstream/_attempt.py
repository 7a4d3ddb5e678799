# -*- test-case-name: tests.upstream.test_attempt -*-
"""One attempt against one node: the shared pool, the replayed body, the header deadline, the body gate.

The response-header deadline is armed by :class:`ReplayBodyProducer` when the last request byte has been
handed to the transport, so dial, TLS and pool wait never count (docs/behaviour.md §6.3). :class:`BodyGate` holds the
first body chunk (or a clean empty end) so the caller can decide to commit before anything reaches the
client (docs/behaviour.md §6.2), then relays the rest as it arrives.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Hashable
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from attrs import frozen
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.error import ConnectError, ConnectingCancelledError, DNSLookupError
from twisted.internet.interfaces import (
    IConsumer,
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IPushProducer,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
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

from nvpair_tw.core import IllegalCall, IProxyReactor
from nvpair_tw.nodes import tls_endpoint

__all__ = [
    "TRANSPORT_FAILURES",
    "BodyEnd",
    "BodyGate",
    "BusyWait",
    "Discard",
    "FirstBodyTimeout",
    "FirstBodyTimer",
    "GateState",
    "HeaderTimeout",
    "NodeEndpointFactory",
    "ReplayBodyProducer",
    "UpstreamClient",
    "describe_failure",
    "is_cancellation",
    "make_pool",
    "node_url",
]


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
        done: Deferred[None] = Deferred()
        self._done = done
        self._pump()
        return done

    def _pump(self) -> None:
        consumer, done = self._consumer, self._done
        if consumer is None or done is None:
            return
        while not self._paused and not self._stopped and self._offset < self.length:
            chunk = self._body[self._offset : self._offset + self._CHUNK]
            self._offset += len(chunk)
            consumer.write(bytes(chunk))
        if self._offset >= self.length and not self._stopped:
            on_written = self._on_written
            self._let_go()
            on_written()
            done.callback(None)

    def _let_go(self) -> None:
        # The consumer holds this producer: dropping both references when the body is written
        # (or stopped) leaves no cycle, so reference counting frees the request's objects at
        # once instead of the cyclic collector later (docs/performance.md).
        self._consumer = None
        self._done = None
        self._on_written = _nothing

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if not self._stopped:
            self._pump()

    def stopProducing(self) -> None:
        self._stopped = True
        self._let_go()


def _nothing() -> None:
    pass


@implementer(IAgentEndpointFactory)
class NodeEndpointFactory:
    """Endpoints for node URLs: IP literals dial directly (a refusal is seen in ~1 ms, not 0.3 s).

    https: TLS per ``tls`` (default: the system trust store); ``connect`` fires after the handshake,
    which the connect timeout also bounds (:func:`nvpair_tw.nodes._tls.tls_endpoint`).
    """

    def __init__(
        self, reactor: IProxyReactor, connect_timeout: float, tls: IPolicyForHTTPS | None = None
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


@implementer(IStreamClientEndpoint)
class _QuietEndpoint:
    """Connects through ``endpoint`` with the factory silenced (``Factory.noisy``, public): the
    pool's per-connection factory otherwise logs "Starting/Stopping factory" on open and close."""

    def __init__(self, endpoint: IStreamClientEndpoint) -> None:
        self._endpoint = endpoint

    def __repr__(self) -> str:
        return repr(self._endpoint)  # the pool names its connections after the endpoint

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        if isinstance(protocolFactory, Factory):
            protocolFactory.noisy = False
        return self._endpoint.connect(protocolFactory)


class _QuietPool(HTTPConnectionPool):
    """A pool whose connections log nothing on open and close (one pair per inventory poll).

    It overrides only ``getConnection``, the public method ``Agent`` asks a pool for a connection
    with, so no private part of Twisted's pool is relied on.
    """

    def getConnection(self, key: Hashable, endpoint: IStreamClientEndpoint) -> Deferred[Any]:
        return super().getConnection(key, _QuietEndpoint(endpoint))


def make_pool(
    reactor: IReactorTime, max_per_host: int = 32, idle_seconds: int = 4
) -> HTTPConnectionPool:
    """The one shared pool: we own failover, so no automatic retries; idle below engine keep-alives."""
    pool = _QuietPool(reactor, persistent=True)
    pool.retryAutomatically = False
    pool.maxPersistentPerHost = max_per_host
    pool.cachedConnectionTimeout = idle_seconds
    return pool


@frozen
class BusyWait:
    """When the header deadline may be extended because the node shows progress (docs/behaviour.md §6.4).

    ``working()`` answers whether the node delivered body bytes to another attempt within the last
    deadline period; while it does, an expired deadline is re-armed for another period (shortened
    so the extra wait never exceeds ``max_wait``) and ``on_wait()`` is called once per re-arm.
    """

    working: Callable[[], bool]
    max_wait: float
    on_wait: Callable[[], None]


class UpstreamClient:
    """Sends one attempt with a response-header deadline measured from the end of the write."""

    def __init__(
        self,
        reactor: IProxyReactor,
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
        *,
        first_extra: float = 0.0,
        busy: BusyWait | None = None,
    ) -> Deferred[IResponse]:
        """Start an attempt; a silent node fails the Deferred with :class:`HeaderTimeout`.

        The first deadline is ``header_timeout + first_extra`` (a cold-load allowance); each busy
        wait (see :class:`BusyWait`) adds at most one more ``header_timeout``.
        """
        deadline = _HeaderDeadline(self._clock, header_timeout, first_extra, busy, on_written)
        attempt: Deferred[IResponse] = self.agent.request(
            method, url, headers, ReplayBodyProducer(body, deadline.written)
        )
        deadline.attempt = attempt
        attempt.addBoth(deadline.settle)
        return attempt


class _HeaderDeadline:
    """One attempt's wait for response headers, from the last body byte written.

    An object, not closures: a closure that schedules itself holds itself through its own cell,
    a reference cycle that kept every request's objects for the cyclic collector.
    """

    def __init__(
        self,
        clock: IReactorTime,
        header_timeout: float,
        first_extra: float,
        busy: BusyWait | None,
        on_written: Callable[[], None] | None,
    ) -> None:
        self._clock = clock
        self._header_timeout = header_timeout
        self._busy = busy
        self._on_written = on_written
        self.attempt: Deferred[IResponse] | None = None
        self._timer: IDelayedCall | None = None
        self._timed_out = False
        self._total = header_timeout + first_extra  # the deadline so far
        self._extended = 0.0  # of which busy extensions

    def written(self) -> None:
        self._timer = self._clock.callLater(self._total, self._expire)
        if self._on_written is not None:
            self._on_written()

    def _expire(self) -> None:
        self._timer = None
        busy = self._busy
        if busy is not None and self._extended < busy.max_wait and busy.working():
            step = min(self._header_timeout, busy.max_wait - self._extended)
            self._total += step
            self._extended += step
            self._timer = self._clock.callLater(step, self._expire)
            busy.on_wait()
            return
        self._timed_out = True
        if self.attempt is not None:
            self.attempt.cancel()

    def settle(self, result: IResponse | Failure) -> IResponse | Failure:
        timer, self._timer, self.attempt = self._timer, None, None
        if timer is not None and timer.active():
            timer.cancel()
        if self._timed_out and isinstance(result, Failure):
            raise HeaderTimeout(f"no response headers within {self._total:g}s") from result.value
        return result


class Discard(Protocol):
    """Body sink for a response we will not relay: closes the connection at once."""

    def connectionMade(self) -> None:
        assert self.transport is not None
        IPushProducer(self.transport).stopProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        pass


class GateState(Enum):
    """Where a :class:`BodyGate` is in its life (see the class docstring for the transitions)."""

    AWAITING_FIRST = "awaiting-first"
    HOLDING = "holding"
    RELAYING = "relaying"
    ENDED = "ended"


class BodyEnd(Enum):
    """How a response body ended cleanly: what the framing can tell the relay."""

    COMPLETE = "complete"
    """The framing said so: every ``Content-Length`` byte, or the terminating chunk."""

    CLOSED = "closed"
    """Framed by the node closing the connection: complete or cut short, the framing cannot tell."""


class FirstBodyTimer(Protocol):
    """What both body gates share: the opt-in first-body timer, and :meth:`stop`.

    :ivar _timer: The first-body timer, armed by :meth:`_arm` when the budget is positive.
    :ivar _timed_out: Whether the timer cut the body (a cut that looks clean is still a timeout).
    :ivar _timeout: The budget, for the error text.
    """

    _timer: IDelayedCall | None = None
    _timed_out = False
    _timeout = 0.0

    def _arm(self, clock: IReactorTime, first_body_timeout: float) -> None:
        self._timeout = first_body_timeout
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
        """Close the upstream body (caller gone, timer expired, or given up); legal in every
        state."""
        self._disarm()
        if self.transport is not None:
            IPushProducer(self.transport).stopProducing()


class BodyGate(FirstBodyTimer):
    """Holds a response body until the caller commits, then relays it; a named state machine.

    :ivar _state: One of :class:`GateState`:

        - ``AWAITING_FIRST``: no body byte yet. ``first`` is unfired; the first-body timer runs
          when enabled. A chunk, or a clean empty end, fires ``first`` and moves to ``HOLDING``;
          a drop or the timer fails ``first`` and moves to ``ENDED``; :meth:`start_relay`
          (commit on headers) moves straight to ``RELAYING`` and ``first`` never fires.
        - ``HOLDING``: ``first`` has fired; later chunks, and the end, are held in order.
          :meth:`start_relay` flushes them and moves to ``RELAYING`` (or ``ENDED`` if the body
          already ended).
        - ``RELAYING``: every chunk goes to the sink as it arrives; the end fires ``done`` and
          moves to ``ENDED``.
        - ``ENDED``: nothing more happens. Calling :meth:`start_relay` here, or twice, raises
          :class:`IllegalCall`.
    :ivar first: Fires with the first non-empty chunk, ``b""`` on a clean empty end, or fails
        (:class:`FirstBodyTimeout` when the enabled timer expired, else the transport's reason).
    :ivar done: After :meth:`start_relay`: fires with a :class:`BodyEnd` at a clean end, or fails
        with the transport's reason when the body was dropped.
    :ivar _on_bytes: Called for every non-empty chunk, in every state (the progress record).
    :ivar _sink: Where relayed chunks go (``RELAYING`` only).
    :ivar _held: Chunks received in ``HOLDING``, in order.
    :ivar _ending: The transport's reason once the body ended in ``HOLDING``.
    :ivar _timer: The first-body timer, armed in ``AWAITING_FIRST`` when enabled.
    :ivar _timed_out: Whether the timer cut the body (a cut that looks clean is still a timeout).
    """

    def __init__(
        self,
        clock: IReactorTime,
        first_body_timeout: float,
        on_bytes: Callable[[], None] | None = None,
    ) -> None:
        self.first: Deferred[bytes] = Deferred()
        self._on_bytes = on_bytes
        self.done: Deferred[BodyEnd] = Deferred()
        self._state = GateState.AWAITING_FIRST
        self._sink: Callable[[bytes], None] | None = None
        self._held: list[bytes] = []
        self._ending: Failure | None = None
        self._arm(clock, first_body_timeout)

    @property
    def state(self) -> GateState:
        """The current state (read-only; transitions happen through the methods)."""
        return self._state

    def producer(self) -> IPushProducer:
        """The upstream socket as a push producer (pause it when the client cannot keep up)."""
        assert self.transport is not None
        return IPushProducer(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if not data:
            return
        if self._on_bytes is not None:
            self._on_bytes()  # progress: the node is delivering (docs/behaviour.md §6.4)
        state = self._state
        if state is GateState.RELAYING:
            assert self._sink is not None
            self._sink(data)
        elif state is GateState.AWAITING_FIRST:
            self._disarm()
            self._state = GateState.HOLDING
            self.first.callback(data)
        elif state is GateState.HOLDING:
            self._held.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        state = self._state
        if state is GateState.RELAYING:
            self._end(reason)
        elif state is GateState.HOLDING:
            self._ending = reason
        elif state is GateState.AWAITING_FIRST:
            # Our own cut after the timer can look clean (a close-delimited body): a timeout wins.
            if self._timed_out:
                self._state = GateState.ENDED
                self.first.errback(
                    Failure(FirstBodyTimeout(f"no response body within {self._timeout:g}s"))
                )
            elif reason.check(ResponseDone, PotentialDataLoss):
                self._state = GateState.HOLDING
                self._ending = reason
                self.first.callback(b"")
            else:
                self._state = GateState.ENDED
                self.first.errback(reason)

    def start_relay(self, sink: Callable[[bytes], None]) -> None:
        """Commit: flush held chunks to ``sink`` and relay the rest as it arrives."""
        if self._state not in (GateState.AWAITING_FIRST, GateState.HOLDING):
            raise IllegalCall(f"start_relay in state {self._state.value}")
        self._disarm()
        self._state = GateState.RELAYING
        self._sink = sink
        held, self._held = self._held, []
        for chunk in held:
            sink(chunk)
        if self._ending is not None:
            self._end(self._ending)

    def _end(self, reason: Failure) -> None:
        self._state = GateState.ENDED
        self._ending = None
        # isinstance, not Failure.check: this runs for every response, and check qualifies the
        # names of every class of the exception's MRO to compare them.
        if isinstance(reason.value, ResponseDone):
            self.done.callback(BodyEnd.COMPLETE)
        elif isinstance(reason.value, PotentialDataLoss):
            self.done.callback(BodyEnd.CLOSED)
        else:
            self.done.errback(reason)


def node_url(base: str, path_and_query: bytes) -> bytes:
    """Join a node base URL (which may carry a path prefix) and the client's raw target."""
    return _base_of(base) + path_and_query


@functools.lru_cache(maxsize=256)
def _base_of(base: str) -> bytes:
    parts = urlsplit(base)
    host = parts.netloc.rpartition("@")[2]  # userinfo is sent as Authorization, never in the URL
    return f"{parts.scheme}://{host}".encode() + parts.path.rstrip("/").encode()
