# -*- test-case-name: tests.test_testing -*-
"""The in-memory cluster: real facades over simulated engines, every connection held in a
:class:`~nvpair_tw.testing.MemoryNetwork` and every timer on one ``task.Clock``."""

from __future__ import annotations

import json as jsonlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import treq
from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from twisted.web.resource import IResource
from twisted.web.server import Site

from nvpair_tw.core import ENGINES, IProxyReactor, Settings
from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import BusEvent, Event
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import Runtime, StallTrackerFactory, build_runtime, tcp_listener
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing._network import MemoryNetwork
from nvpair_tw.upstream import UpstreamClient, WholeBody, make_http_client, make_pool

__all__ = ["MemoryCluster", "MemoryResponse"]

E = TypeVar("E", bound=BusEvent)
"""A class of event (`nvpair_tw.events`)."""


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
    _body_transport: Any = field(default=None, repr=False)

    def hang_up(self) -> None:
        """The client leaves now, in the middle of the body: its connection is closed."""
        if self._body_transport is not None and self.ended is None:
            self._body_transport.stopProducing()

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

    def connectionMade(self) -> None:
        self._response._body_transport = self.transport

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
            WholeBody(body) if body is not None else None,
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
    :param keys_file: a ``--keys`` file of named keys (docs/behaviour.md §12.1).
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
        nodes_file: str | None = None,
        keys_file: str | None = None,
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
            nodes_file=nodes_file,
            environ=environ if environ is not None else {},
            allow_hosts=[f"{kind}.facade.test" for kind in facades],
            keys_file=keys_file,
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
        """A node for engine ``node_id``, advertising a simulated engine's models; a simulated
        engine of a kind (``SimulatedEngine(kind=…)``) is a node of that kind (§11.1)."""
        engine = self.engines[node_id]
        models = tuple(engine.models) if isinstance(engine, SimulatedEngine) else ()
        kind = engine.kind if isinstance(engine, SimulatedEngine) else None
        return Node(node_id, self.url(node_id), models, kind=kind)

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

    def values(self, kind: type[E]) -> list[E]:
        """The typed values of the recorded events of class ``kind`` (``ProxyRequest``, ...)."""
        return [e.value for e in self.events if isinstance(e.value, kind)]

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
