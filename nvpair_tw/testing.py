# -*- test-case-name: tests.test_testing -*-
"""Test doubles for the proxy: in-memory (no sockets) and loopback clusters of simulated engines.

:class:`MemoryCluster` is to the proxy what ``treq.testing.StubTreq`` is to a treq client: it runs
one or more real facades (built by :func:`nvpair_tw.runtime._process.build_runtime`) over
:class:`~nvpair_tw.simulated._engine.SimulatedEngine` nodes, with every connection (client to facade, facade
to node) held in memory and every timer on one ``task.Clock``. Nothing listens and nothing waits: a
test sends a request, then moves time with :meth:`MemoryCluster.flush` and
:meth:`MemoryCluster.advance` and looks at what arrived. For example::

    clock = Clock()
    cluster = MemoryCluster(clock, {"a": SimulatedEngine(clock, chunk_delay=1.0)})
    pending = cluster.request("POST", "/api/chat", json={"model": "llama3", "messages": []})
    response = cluster.result(pending)      # flushes: the headers are in, the first chunk too
    cluster.advance(1.0)                    # one more chunk per simulated second
    assert response.header("x-nvpair-node") == "a" and len(response.chunks) == 2
    cluster.stop()                          # the clock holds no timer afterwards

Bytes move through ``twisted.test.iosim`` transports, so the proxy sees HTTP/1.1 as on the wire
(framing, keep-alive, a peer that hangs up or resets), but nothing the kernel does: no socket
buffers, backpressure or connection refusal timing. Tests about those use :class:`ProxyCluster`,
:func:`start_engine` and :func:`start_proxy`, which listen on real loopback ports.

The simulated engine itself lives in :mod:`nvpair_tw.simulated._engine` (production code, ``--demo`` uses
it) and is re-exported here for tests.
"""

from __future__ import annotations

import json as jsonlib
import re
from collections.abc import Mapping, Sequence
from itertools import count
from typing import Any, TypeVar, cast

import treq
from attrs import define, field
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, maybeDeferred, succeed
from twisted.internet.error import ConnectionAborted, ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import (
    IConsumer,
    IListeningPort,
    IProtocol,
    IProtocolFactory,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.web.client import URI, Agent, HTTPConnectionPool, ResponseDone
from twisted.web.error import SchemeNotSupported
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IResponse
from twisted.web.resource import IResource
from twisted.web.server import Site
from zope.interface import implementer

from nvpair_tw.core import ENGINES, IProxyReactor, Settings
from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import Event
from nvpair_tw.fleet import StateConfig
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import Runtime, StallTrackerFactory, build_runtime, tcp_listener
from nvpair_tw.simulated import (
    Behaviour,
    Policy,
    Received,
    SimulatedEngine,
    alternate,
    always,
    reply_frames,
    stream_kind,
)
from nvpair_tw.upstream import UpstreamClient, make_http_client, make_pool

__all__ = [
    "Behaviour",
    "Clusters",
    "EngineHandle",
    "MemoryCluster",
    "MemoryNetwork",
    "MemoryResponse",
    "Policy",
    "ProxyCluster",
    "ProxyHandle",
    "Received",
    "SimulatedEngine",
    "alternate",
    "always",
    "http_client",
    "reply_frames",
    "start_engine",
    "start_proxy",
    "stream_kind",
]


# --- in memory ----------------------------------------------------------------------------------


class _MemoryTransport(iosim.FakeTransport):
    """An ``iosim`` transport whose abort is a reset: unsent bytes are dropped, the peer sees
    ``ConnectionLost`` (``FakeTransport`` treats an abort as a clean close)."""

    peer: _MemoryTransport | None = None

    def abortConnection(self) -> None:
        self.stream = []
        # iosim declares ``disconnectReason`` as a ConnectionDone; any reason is reported as given
        self.disconnectReason = ConnectionAborted()  # type: ignore[assignment]
        if self.peer is not None and not self.peer.disconnected:
            self.peer.disconnectReason = ConnectionLost("connection reset")  # type: ignore[assignment]
        self.disconnecting = True


@implementer(IStreamClientEndpoint)
@define
class _MemoryEndpoint:
    network: MemoryNetwork
    host: str
    port: int

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        return self.network.connect(self.host, self.port, protocolFactory)


@implementer(IAgentEndpointFactory)
class MemoryNetwork:
    """Servers addressed by ``host:port``, reached through in-memory connections.

    An ``IAgentEndpointFactory``: give it to ``Agent.usingEndpointFactory`` and every request to
    ``http://host:port/...`` is served by the factory added there with :meth:`add` (``https`` is
    treated as ``http``). Connecting to an address nobody serves fails with
    ``ConnectionRefusedError``. Bytes move only when :meth:`pump` is called; ``connections``
    counts the connections made, :attr:`open` those not yet closed on both sides.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._servers: dict[tuple[str, int], IProtocolFactory] = {}
        self._pumps: list[iosim.IOPump] = []
        self._ports = count(40000)
        self.connections = 0

    def add(self, host: str, port: int, factory: IProtocolFactory) -> None:
        """Serve ``host:port`` (host compared case-insensitively) with ``factory``."""
        self._servers[(host.lower(), port)] = factory

    def remove(self, host: str, port: int) -> None:
        """Stop accepting connections to ``host:port`` (open ones stay open)."""
        self._servers.pop((host.lower(), port), None)

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        if uri.scheme not in (b"http", b"https"):
            raise SchemeNotSupported(f"unsupported scheme: {uri.scheme!r}")
        return _MemoryEndpoint(self, uri.host.decode("ascii"), uri.port)

    def connect(self, host: str, port: int, client: IProtocolFactory) -> Deferred[IProtocol]:
        """Connect ``client`` to the server at ``host:port`` (in memory, at once)."""
        server = self._servers.get((host.lower(), port))
        if server is None:
            return fail(ConnectionRefusedError(host, port))
        client_address = IPv4Address("TCP", "127.0.0.1", next(self._ports))
        server_address = IPv4Address("TCP", host, port)
        client_protocol = client.buildProtocol(server_address)
        server_protocol = server.buildProtocol(client_address)
        if client_protocol is None or server_protocol is None:
            return fail(ConnectionRefusedError(host, port))
        client_io = _MemoryTransport(
            client_protocol, isServer=False, hostAddress=client_address, peerAddress=server_address
        )
        server_io = _MemoryTransport(
            server_protocol, isServer=True, hostAddress=server_address, peerAddress=client_address
        )
        client_io.peer, server_io.peer = server_io, client_io
        self._pumps.append(
            iosim.connect(
                server_protocol,
                server_io,
                client_protocol,
                client_io,
                greet=False,
                clock=self._clock,
            )
        )
        self.connections += 1
        return succeed(client_protocol)

    @property
    def open(self) -> int:
        """How many connections are not yet closed on both sides."""
        return len(self._pumps)

    def pump(self) -> bool:
        """Move pending bytes and closes one step on every connection; whether anything moved."""
        moved = False
        for pump in list(self._pumps):
            if pump.pump(advanceClock=False):
                moved = True
            if pump.clientIO.disconnected and pump.serverIO.disconnected:
                self._pumps.remove(pump)
        return moved


@implementer(IBodyProducer)
class _Body:
    """A request body written in one go (no cooperator, so no global-reactor timer)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


@define
class MemoryResponse:
    """One response as the client saw it, filled in as the cluster's clock moves.

    ``chunks`` are the body pieces in the order they reached the client, ``arrivals`` the clock
    time of each, ``headers_at`` the clock time of the status line. ``ended`` is ``None`` while
    the body is still arriving, then why it ended: see :attr:`complete` and :attr:`truncated`.
    """

    status: int
    phrase: bytes
    headers: Headers
    length: int | None
    headers_at: float
    chunks: list[bytes] = field(factory=list)
    arrivals: list[float] = field(factory=list)
    ended: Failure | None = None

    @property
    def body(self) -> bytes:
        """Every body byte received so far."""
        return b"".join(self.chunks)

    @property
    def complete(self) -> bool:
        """The body ended cleanly."""
        return (
            self.ended is not None and self.ended.check(ResponseDone, PotentialDataLoss) is not None
        )

    @property
    def truncated(self) -> bool:
        """The body ended without its framing's end (the connection was cut)."""
        return self.ended is not None and not self.complete

    def header(self, name: str) -> str | None:
        """The first value of header ``name``, or ``None``."""
        values = self.headers.getRawHeaders(name)
        return values[0] if values else None

    def json(self) -> Any:
        """The body parsed as JSON."""
        return jsonlib.loads(self.body)


class _Collector(Protocol):
    def __init__(self, response: MemoryResponse, clock: Clock) -> None:
        self._response = response
        self._clock = clock

    def dataReceived(self, data: bytes) -> None:
        self._response.chunks.append(data)
        self._response.arrivals.append(self._clock.seconds())

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._response.ended = reason


_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_NODE_PORT = 11434


def _outgoing(
    headers: Mapping[str, str | Sequence[str]] | None, json: Any, data: bytes | None
) -> tuple[Headers, bytes | None]:
    """A request's headers and body: ``json`` serialised (with its content type) or ``data``."""
    sent = Headers()
    for name, value in (headers or {}).items():
        sent.setRawHeaders(name, [value] if isinstance(value, str) else list(value))
    if json is None:
        return sent, data
    if not sent.hasHeader("content-type"):
        sent.setRawHeaders("content-type", ["application/json"])
    return sent, jsonlib.dumps(json).encode()


def _host_names(engines: Mapping[str, object]) -> dict[str, str]:
    """A distinct ``<id>.node.test`` host per engine (``node<i>`` where an id is no host name)."""
    hosts: dict[str, str] = {}
    for index, node_id in enumerate(engines):
        host = (node_id if _HOST.match(node_id) else f"node{index}").lower() + ".node.test"
        if host in hosts.values():  # "A" and "a", or an id that is not a host name
            host = f"node{index}-{len(hosts)}.node.test"
        hosts[node_id] = host
    return hosts


class _Pump:
    """Moves time and bytes for one clock and one in-memory network (a base of MemoryCluster)."""

    def __init__(self, clock: Clock, network: MemoryNetwork) -> None:
        self.clock = clock
        self.network = network

    def flush(self) -> None:
        """Run everything due now: timers at the current time and every byte in flight."""
        for _ in range(100_000):
            now = self.clock.seconds()
            due = any(call.getTime() <= now for call in self.clock.getDelayedCalls())
            if due:
                self.clock.advance(0)
            if not self.network.pump() and not due:
                return
        raise AssertionError("flush did not settle: something keeps sending or rescheduling")

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward, stopping at every timer due on the way.

        Each timer runs at its own time and the bytes it sends are delivered before the next
        one runs, so a stream with a chunk every second arrives chunk by chunk.
        """
        if seconds < 0:
            raise ValueError("the clock does not go back")
        target = self.clock.seconds() + seconds
        self.flush()
        while True:
            pending = [c.getTime() for c in self.clock.getDelayedCalls() if c.active()]
            upcoming = min(pending, default=None)
            if upcoming is None or upcoming > target:
                break
            self._advance_to(upcoming)
        self._advance_to(target)

    def _advance_to(self, when: float) -> None:
        while self.clock.seconds() < when:
            self.clock.advance(when - self.clock.seconds())
        self.flush()


class _Requests(_Pump):
    """Sends requests over the in-memory network and reads their answers (a base of MemoryCluster)."""

    def __init__(self, clock: Clock, network: MemoryNetwork) -> None:
        super().__init__(clock, network)
        self._client_pool = HTTPConnectionPool(clock, persistent=False)
        self._client = Agent.usingEndpointFactory(clock, network, pool=self._client_pool)

    def _base_url(self, facade: str | None, node: str | None) -> str:
        raise NotImplementedError

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str | Sequence[str]] | None = None,
        facade: str | None = None,
        node: str | None = None,
    ) -> Deferred[MemoryResponse]:
        """Send a request to a facade (the first by default); fires at the response headers.

        With ``node``, the request goes straight to that engine instead, bypassing the proxy.
        ``json`` is sent serialised with ``Content-Type: application/json``; ``data`` as is.
        Nothing happens until :meth:`flush` or :meth:`advance`. Cancelling the Deferred before
        the headers arrive is the client hanging up. The body keeps arriving in the
        :class:`MemoryResponse` as time moves.
        """
        sent, body = _outgoing(headers, json, data)
        attempt = self._client.request(
            method.encode("ascii"),
            (self._base_url(facade, node) + path).encode(),
            sent,
            _Body(body) if body is not None else None,
        )
        # A Deferred of our own, so ``called`` means "the headers are in", not "connected".
        arrived: Deferred[MemoryResponse] = Deferred(lambda _: attempt.cancel())

        def deliver(outcome: MemoryResponse | Failure) -> None:
            if arrived.called:
                return
            if isinstance(outcome, Failure):
                arrived.errback(outcome)
            else:
                arrived.callback(outcome)

        attempt.addCallback(self._collect).addBoth(deliver)
        return arrived

    def _collect(self, response: IResponse) -> MemoryResponse:
        length = response.length if isinstance(response.length, int) else None
        result = MemoryResponse(
            response.code, response.phrase, response.headers, length, self.clock.seconds()
        )
        response.deliverBody(_Collector(result, self.clock))
        return result

    def fetch(self, method: str, path: str, **kw: Any) -> MemoryResponse:
        """:meth:`request`, :meth:`flush`, then the finished response (no clock time passes).

        Raises ``AssertionError`` if the response or its body is still waiting on the clock.
        """
        response = self.result(self.request(method, path, **kw))
        assert response.ended is not None, "the response body is still waiting on the clock"
        return response

    def result(self, pending: Deferred[MemoryResponse]) -> MemoryResponse:
        """Flush, then the response ``pending`` fired with (``AssertionError`` if none yet).

        A failed request raises its failure's exception.
        """
        self.flush()
        outcome: list[MemoryResponse | Failure] = []

        def keep(value: MemoryResponse | Failure) -> MemoryResponse | Failure:
            outcome.append(value)
            return value

        pending.addBoth(keep)
        assert outcome, "no response headers yet: the request is waiting on the clock"
        [value] = outcome
        if isinstance(value, Failure):
            pending.addErrback(lambda _: None)  # handed to the caller, not left unhandled
            value.raiseException()
        assert isinstance(value, MemoryResponse)
        return value


class MemoryCluster(_Requests):
    """Facades over in-memory engines on one ``task.Clock``: the proxy, with no socket.

    :param clock: the only clock: the facades, the engines (build them with it), the pools and
        every connection use it. Time moves only in :meth:`flush` and :meth:`advance`.
    :param engines: node id to engine (a :class:`~nvpair_tw.simulated._engine.SimulatedEngine` or any
        ``IResource``), served at :meth:`url` (``http://<id>.node.test:11434``).
    :param facades: the engine kinds to run a facade for (``"ollama"``, ``"lmstudio"``, ``"omlx"``).
    :param settings: the proxy's settings (defaults: ``Settings()``).
    :param nodes: each facade's nodes, in order: an engine's id stands for :meth:`node` (it
        advertises a simulated engine's ``models``, so no inventory poll is needed); a
        :class:`~nvpair_tw.nodes._directory.Node` is taken as is (a URL nobody serves is refused). By
        default every facade gets every engine.
    :param environ: environment for the ingress policy (API keys), as ``build_runtime`` takes it.
    :param stall_tracker: a stall-tracker factory, as ``build_runtime`` takes it.

    The cluster is started on construction. :meth:`request` sends a request to a facade (or,
    with ``node=``, straight to an engine) and :meth:`result` / :meth:`fetch` read the answer;
    :meth:`flush` and :meth:`advance` move bytes and time; :attr:`events` records every event
    of the bus (:meth:`named` filters them) and :meth:`received` what an engine was sent;
    :meth:`stop` stops everything, after which the clock should hold no timer. The parts are
    public for tests that need more: :attr:`runtime` (facades, shared state), :attr:`network`
    (the in-memory connections), :attr:`http` (a treq client reaching the engines, as the
    facades' model-list reads do). The sites are never started, so they keep no access log
    and schedule no log-date timer.
    """

    def __init__(
        self,
        clock: Clock,
        engines: Mapping[str, IResource],
        *,
        facades: Sequence[str] = ("ollama",),
        settings: Settings | None = None,
        nodes: Mapping[str, Sequence[Node | str]] | None = None,
        environ: Mapping[str, str] | None = None,
        stall_tracker: StallTrackerFactory | None = None,
    ) -> None:
        for node_id, engine in engines.items():
            engine_clock = getattr(engine, "clock", clock)
            if engine_clock is not clock:
                raise ValueError(f"engine {node_id!r} runs on another clock than the cluster")
        super().__init__(clock, MemoryNetwork(clock))
        self.engines: dict[str, IResource] = dict(engines)
        self.events: list[Event] = []
        self._hosts = _host_names(self.engines)
        for node_id, host in self._hosts.items():
            site = Site(self.engines[node_id], reactor=clock)
            site.noisy = False
            self.network.add(host, _NODE_PORT, site)
        self._node_pool = make_pool(clock)
        node_agent = Agent.usingEndpointFactory(clock, self.network, pool=self._node_pool)
        #: The treq client the facades read model lists and inventories with (usable on its own).
        self.http: treq.client.HTTPClient = make_http_client(node_agent)
        chosen = nodes if nodes is not None else {kind: list(self.engines) for kind in facades}
        resolved = {
            kind: [self.node(n) if isinstance(n, str) else n for n in listed]
            for kind, listed in chosen.items()
        }
        self.runtime: Runtime = build_runtime(
            cast(IProxyReactor, clock),  # only its clock is used: both clients are injected
            settings if settings is not None else Settings(),
            list(facades),
            nodes=resolved,
            environ=environ,
            stall_tracker=stall_tracker,
            client=UpstreamClient.from_agent(node_agent, clock),
            http=self.http,
        )
        self.runtime.shared.bus.subscribe(self.events.append, name="memory-cluster")
        self.runtime.start()
        self._facade_ports = {kind: self._serve_facade(kind) for kind in facades}
        self._stopped = False

    # -- addresses and parts

    def url(self, node_id: str) -> str:
        """The base URL engine ``node_id`` is served at."""
        return f"http://{self._hosts[node_id]}:{_NODE_PORT}"

    def node(self, node_id: str) -> Node:
        """A node for engine ``node_id``, advertising a simulated engine's models."""
        engine = self.engines[node_id]
        models = tuple(engine.models) if isinstance(engine, SimulatedEngine) else ()
        return Node(node_id, self.url(node_id), models)

    def facade_url(self, facade: str | None = None) -> str:
        """The base URL of a facade (the first one by default)."""
        kind = facade if facade is not None else next(iter(self._facade_ports))
        return f"http://{kind}.facade.test:{self._facade_ports[kind]}"

    def _serve_facade(self, kind: str) -> int:
        """Serve facade ``kind`` at ``<kind>.facade.test`` on its engine's default port."""
        listener = tcp_listener(ENGINES[kind].default_listen)
        port = listener.port if listener is not None else 80
        self.network.add(f"{kind}.facade.test", port, self.runtime.site_for(kind))
        return port

    def _base_url(self, facade: str | None, node: str | None) -> str:
        return self.url(node) if node is not None else self.facade_url(facade)

    def facade(self, facade: str | None = None) -> FacadeState:
        """A facade's state (the first one by default)."""
        return self.runtime.facades[
            facade if facade is not None else next(iter(self._facade_ports))
        ]

    def named(self, name: str) -> list[dict[str, Any]]:
        """The payloads of the recorded events called ``name``."""
        return [dict(e.payload) for e in self.events if e.name == name]

    def received(self, node_id: str) -> list[bytes]:
        """The inference (POST) bodies simulated engine ``node_id`` received."""
        engine = self.engines[node_id]
        assert isinstance(engine, SimulatedEngine)
        return [r.body for r in engine.received if r.method == b"POST"]

    # -- shutdown

    def stop(self) -> None:
        """Stop the engines (open requests are cut), then the facades, then every connection."""
        if self._stopped:
            return
        self._stopped = True
        for engine in self.engines.values():
            if isinstance(engine, SimulatedEngine):
                engine.stop()
        self.flush()
        stopped = [self.runtime.stop(), self._node_pool.closeCachedConnections()]
        stopped.append(self._client_pool.closeCachedConnections())
        self.flush()
        for done in stopped:
            done.addErrback(lambda failure: None)


# --- over loopback sockets ----------------------------------------------------------------------


@define
class EngineHandle:
    """A simulated engine listening on loopback."""

    engine: SimulatedEngine
    port: IListeningPort

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"  # type: ignore[attr-defined]

    async def stop(self) -> None:
        self.engine.stop()
        await maybeDeferred(self.port.stopListening)


async def start_engine(reactor: Any, engine: SimulatedEngine) -> EngineHandle:
    """Listen a simulated engine on 127.0.0.1, port 0."""
    port = reactor.listenTCP(0, engine.site(), interface="127.0.0.1")
    return EngineHandle(engine, port)


@define
class ProxyHandle:
    """An in-process proxy (one or more facades) listening on loopback port 0."""

    runtime: Runtime
    ports: dict[str, IListeningPort]

    def url(self, engine: str | None = None) -> str:
        name = engine if engine is not None else next(iter(self.ports))
        return f"http://127.0.0.1:{self.ports[name].getHost().port}"  # type: ignore[attr-defined]

    async def stop(self) -> None:
        for port in self.ports.values():
            await maybeDeferred(port.stopListening)
        await self.runtime.stop()


async def start_proxy(
    reactor: Any,
    nodes: Mapping[str, Sequence[Node]],
    settings: Settings | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stall_tracker: StallTrackerFactory | None = None,
    state: StateConfig | None = None,
) -> ProxyHandle:
    """Build and start a runtime with a facade per key of ``nodes``, each on its own loopback port."""
    runtime = build_runtime(
        reactor,
        settings if settings is not None else Settings(),
        list(nodes),
        nodes=nodes,
        environ=environ,
        stall_tracker=stall_tracker,
        state=state,
    )
    runtime.start()
    ports = {
        engine: reactor.listenTCP(0, runtime.site_for(engine), backlog=256, interface="127.0.0.1")
        for engine in nodes
    }
    return ProxyHandle(runtime, ports)


def http_client(reactor: Any) -> treq.client.HTTPClient:
    """A treq client with its own non-persistent pool (nothing left open after a test)."""
    return treq.client.HTTPClient(
        Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
    )


@define
class ProxyCluster:
    """Simulated engines behind one in-process proxy facade, with every bus event recorded.

    :meth:`start` listens the engines, then the proxy over them; :meth:`stop` stops the proxy,
    then the engines. Subclass it for a test module's own helpers.
    """

    reactor: Any
    engine_name: str = "ollama"
    handles: list[EngineHandle] = field(factory=list)
    proxy: ProxyHandle | None = None
    events: list[Event] = field(factory=list)

    async def add_engine(self, node_id: str, engine: SimulatedEngine) -> Node:
        """Listen ``engine`` on loopback (stopped with the cluster); the node advertising its models."""
        handle = await start_engine(self.reactor, engine)
        self.handles.append(handle)
        return Node(node_id, handle.url, tuple(engine.models))

    async def start_proxy(
        self, nodes: Sequence[Node], settings: Settings | None = None, **kw: Any
    ) -> ProxyHandle:
        """Start the proxy over ``nodes`` (any URLs) and record its bus."""
        self.proxy = await start_proxy(
            self.reactor, {self.engine_name: list(nodes)}, settings, **kw
        )
        self.proxy.runtime.shared.bus.subscribe(self.events.append, name="test")
        return self.proxy

    async def start(
        self,
        engines: Sequence[SimulatedEngine] | Mapping[str, SimulatedEngine],
        settings: Settings | None = None,
        **kw: Any,
    ) -> ProxyHandle:
        """Listen ``engines`` (a list is named ``n0``, ``n1``, ...), then start the proxy over them."""
        named = (
            engines if isinstance(engines, Mapping) else {f"n{i}": e for i, e in enumerate(engines)}
        )
        nodes = [await self.add_engine(node_id, engine) for node_id, engine in named.items()]
        return await self.start_proxy(nodes, settings, **kw)

    @property
    def url(self) -> str:
        """The proxy's base URL."""
        assert self.proxy is not None
        return self.proxy.url()

    @property
    def facade(self) -> FacadeState:
        """The proxy's facade."""
        assert self.proxy is not None
        return self.proxy.runtime.facades[self.engine_name]

    async def post(
        self,
        data: bytes,
        path: str = "/api/chat",
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes, IResponse]:
        """POST ``data`` to the proxy (or to ``url``); status, whole body and the response."""
        sent: dict[bytes | str, bytes | str] = {k: v for k, v in (headers or {}).items()}
        response = await http_client(self.reactor).post(
            (url if url is not None else self.url) + path, data=data, headers=sent
        )
        return response.code, await treq.content(response), response

    def named(self, name: str) -> list[dict[str, Any]]:
        """The payloads of the recorded events called ``name``."""
        return [dict(e.payload) for e in self.events if e.name == name]

    def received(self, index: int) -> list[bytes]:
        """The inference (POST) bodies the ``index``-th engine received."""
        return [r.body for r in self.handles[index].engine.received if r.method == b"POST"]

    async def stop(self) -> None:
        """Stop the proxy, then the engines."""
        if self.proxy is not None:
            await self.proxy.stop()
        for handle in self.handles:
            await handle.stop()


_Cluster = TypeVar("_Cluster", bound=ProxyCluster)


@define
class Clusters:
    """Makes proxy clusters on one reactor and stops them all (for a fixture)."""

    reactor: Any
    made: list[ProxyCluster] = field(factory=list)

    def __call__(self, kind: type[_Cluster]) -> _Cluster:
        """A new cluster of class ``kind``, stopped by :meth:`stop`."""
        cluster = kind(self.reactor)
        self.made.append(cluster)
        return cluster

    async def stop(self) -> None:
        """Stop every cluster made, last made first."""
        while self.made:
            await self.made.pop().stop()
