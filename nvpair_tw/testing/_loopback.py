# -*- test-case-name: tests.test_testing -*-
"""Simulated engines and in-process proxies listening on real loopback ports, for the tests about
what the kernel does (socket buffers, backpressure, refused connections)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import treq
from attrs import define, field
from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IListeningPort
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IResponse

from nvpair_tw.core import Settings
from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import BusEvent, Event
from nvpair_tw.fleet import StateConfig
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import Runtime, StallTrackerFactory, build_runtime, client_url
from nvpair_tw.simulated import SimulatedEngine

__all__ = [
    "Clusters",
    "EngineHandle",
    "ProxyCluster",
    "ProxyHandle",
    "http_client",
    "start_engine",
    "start_proxy",
]

E = TypeVar("E", bound=BusEvent)
"""A class of event (`nvpair_tw.events`)."""


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
    usage_db: str | None = None,
    keys_file: str | None = None,
) -> ProxyHandle:
    """Build and start a runtime with a facade per key of ``nodes``, each on its own loopback port
    (``usage_db``: the usage database, else usage in memory; ``keys_file``: ``--keys``)."""
    runtime = build_runtime(
        reactor,
        settings if settings is not None else Settings(),
        list(nodes),
        nodes=nodes,
        environ=environ if environ is not None or keys_file is None else {},
        keys_file=keys_file,
        stall_tracker=stall_tracker,
        state=state,
        usage_db=usage_db,
    )
    runtime.start()
    ports = {
        engine: runtime.self_guard.listened(
            reactor.listenTCP(0, runtime.site_for(engine), backlog=256, interface="127.0.0.1")
        )
        for engine in nodes
    }
    for engine, port in ports.items():
        runtime.facade_urls[engine] = client_url(port.getHost(), "tcp")
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

    def values(self, kind: type[E]) -> list[E]:
        """The typed values of the recorded events of class ``kind`` (``ProxyRequest``, ...)."""
        return [e.value for e in self.events if isinstance(e.value, kind)]

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
