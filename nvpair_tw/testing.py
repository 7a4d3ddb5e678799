# -*- test-case-name: tests.test_testing -*-
"""Simulated engines that misbehave on purpose, for the test suite, the benchmarks and ``--demo``.

A :class:`SimulatedEngine` answers the Ollama and OpenAI-style routes the proxy uses. Its
:class:`Behaviour` decides, per request, whether it answers, freezes before the headers, sends
headers and then nothing, drops the connection, or fails with a status. Every request it receives is
kept (method, path, headers, body) so tests can compare replayed bodies byte for byte.
:class:`ProxyCluster` puts simulated engines behind an in-process proxy and records its event bus.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

import treq
from attrs import define, field, frozen
from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IDelayedCall, IListeningPort, IReactorTime
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.events import Event
from nvpair_tw.facade import Facade
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import Runtime, StallTrackerFactory, build_runtime
from nvpair_tw.settings import Settings


class Behaviour(Enum):
    """What the engine does with one request."""

    HEALTHY = "healthy"
    FROZEN = "frozen"  # reads the request, never sends headers
    HEADERS_ONLY = "headers-only"  # sends headers, then silence
    DROP_AFTER_HEADERS = "drop-after-headers"  # sends headers, then closes before any body byte
    DROP_MID_STREAM = "drop-mid-stream"  # sends part of the stream, then resets
    STATUS_503 = "status-503"
    STATUS_404 = "status-404"
    STATUS_400 = "status-400"
    EMPTY_200 = "empty-200"  # Content-Length: 0
    SLOW_BODY = "slow-body"  # sends headers, then the body after ``body_delay``


@frozen
class Received:
    """One request as the engine saw it."""

    method: bytes
    path: bytes
    headers: dict[bytes, list[bytes]]
    body: bytes


Policy = Callable[[int, bytes], Behaviour]


def always(behaviour: Behaviour) -> Policy:
    """The same behaviour for every request."""
    return lambda _number, _path: behaviour


def alternate(first: Behaviour, second: Behaviour) -> Policy:
    """``first`` on odd-numbered inference requests, ``second`` on even ones (1-based)."""
    return lambda number, _path: first if number % 2 == 1 else second


@define
class SimulatedEngine(Resource):
    """A fake Ollama/OpenAI-style engine over real sockets (listen it with :meth:`site`)."""

    clock: IReactorTime
    models: Sequence[str] = ("llama3:latest",)
    policy: Policy = field(factory=lambda: always(Behaviour.HEALTHY))
    chunks: int = 3
    chunk_delay: float = 0.0
    header_delay: float = 0.0
    body_delay: float = 0.0
    reply_text: str = "hello"
    received: list[Received] = field(factory=list)
    inference_count: int = 0
    _timers: list[IDelayedCall] = field(factory=list)
    _open: list[Request] = field(factory=list)

    isLeaf = True

    def __attrs_post_init__(self) -> None:
        Resource.__init__(self)

    def site(self) -> Site:
        """A quiet Site serving this engine."""
        site = Site(self)
        site.noisy = False
        return site

    def stop(self) -> None:
        """Cancel pending timers and close any request left open (frozen or silent)."""
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        self._timers.clear()
        for request in self._open:
            if request.transport is not None:
                request.transport.abortConnection()  # type: ignore[attr-defined]
        self._open.clear()

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        assert request.content is not None
        body = request.content.read()
        path = request.path
        self.received.append(
            Received(
                request.method,
                request.uri,
                {k.lower(): list(v) for k, v in request.requestHeaders.getAllRawHeaders()},
                body,
            )
        )
        if request.method == b"GET" and path == b"/api/tags":
            return self._json(request, {"models": [{"name": m, "model": m} for m in self.models]})
        if request.method == b"GET" and path == b"/v1/models":
            return self._json(
                request,
                {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]},
            )
        if request.method != b"POST":
            return self._json(request, {"version": "0.0.0-simulated"})
        self.inference_count += 1
        behaviour = self.policy(self.inference_count, path)
        self._open.append(request)
        request.notifyFinish().addBoth(self._closed, request)
        if self.header_delay > 0 and behaviour is not Behaviour.FROZEN:
            self._later(self.header_delay, self._act, request, behaviour, body)
        else:
            self._act(request, behaviour, body)
        return NOT_DONE_YET

    def _closed(self, _result: object, request: Request) -> None:
        if request in self._open:
            self._open.remove(request)

    def _later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self._timers = [t for t in self._timers if t.active()]
        self._timers.append(self.clock.callLater(delay, fn, *args))

    def _act(self, request: Request, behaviour: Behaviour, body: bytes) -> None:
        if behaviour is Behaviour.FROZEN:
            return
        if behaviour in (Behaviour.STATUS_503, Behaviour.STATUS_404, Behaviour.STATUS_400):
            code = int(behaviour.value.rsplit("-", 1)[1])
            request.setResponseCode(code)
            request.setHeader(b"content-type", b"application/json")
            request.write(json.dumps({"error": f"simulated {code}"}).encode())
            request.finish()
            return
        if behaviour is Behaviour.EMPTY_200:
            request.setHeader(b"content-length", b"0")
            request.finish()
            return
        streaming, content_type = _stream_kind(request.path, body)
        request.setHeader(b"content-type", content_type)
        if behaviour is Behaviour.HEADERS_ONLY:
            request.write(b"")
            return
        if behaviour is Behaviour.DROP_AFTER_HEADERS:
            request.write(b"")
            self._later(0, _hang_up, request)
            return
        frames = _frames(request.path, streaming, self.chunks, self.reply_text)
        if behaviour is Behaviour.SLOW_BODY:
            request.write(b"")
            self._later(self.body_delay, self._send, request, frames, 0)
            return
        if behaviour is Behaviour.DROP_MID_STREAM:
            frames = [*frames[: max(1, len(frames) // 2)], b""]
        self._send(request, frames, 0)

    def _send(self, request: Request, frames: list[bytes], index: int) -> None:
        if request.channel is None:
            return
        if index == len(frames):
            request.finish()
            return
        frame = frames[index]
        if frame == b"":
            _hang_up(request)
            return
        request.write(frame)
        if self.chunk_delay > 0:
            self._later(self.chunk_delay, self._send, request, frames, index + 1)
        else:
            self._send(request, frames, index + 1)

    def _json(self, request: Request, document: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(document).encode()


def _hang_up(request: Request) -> None:
    """Close after flushing what was written (the client sees a truncated response)."""
    if request.transport is not None:
        request.transport.loseConnection()


def _abort(request: Request) -> None:
    if request.transport is not None:
        request.transport.abortConnection()  # type: ignore[attr-defined]


def _stream_kind(path: bytes, body: bytes) -> tuple[bool, bytes]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    if path.startswith(b"/api/"):
        streaming = bool(parsed.get("stream", True)) and path in (b"/api/chat", b"/api/generate")
        return streaming, b"application/x-ndjson" if streaming else b"application/json"
    streaming = bool(parsed.get("stream", False))
    return streaming, b"text/event-stream" if streaming else b"application/json"


def _frames(path: bytes, streaming: bool, chunks: int, text: str) -> list[bytes]:
    if path.startswith(b"/api/"):
        if not streaming:
            return [
                json.dumps(
                    {"message": {"role": "assistant", "content": text}, "done": True}
                ).encode()
            ]
        parts = [
            json.dumps(
                {"message": {"role": "assistant", "content": f"{text}{i}"}, "done": False}
            ).encode()
            + b"\n"
            for i in range(chunks)
        ]
        return [*parts, json.dumps({"done": True, "done_reason": "stop"}).encode() + b"\n"]
    if not streaming:
        return [
            json.dumps(
                {
                    "object": "chat.completion",
                    "choices": [{"message": {"role": "assistant", "content": text}}],
                }
            ).encode()
        ]
    parts = [
        b"data: "
        + json.dumps({"choices": [{"delta": {"content": f"{text}{i}"}}]}).encode()
        + b"\n\n"
        for i in range(chunks)
    ]
    return [*parts, b"data: [DONE]\n\n"]


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
) -> ProxyHandle:
    """Build and start a runtime with a facade per key of ``nodes``, each on its own loopback port."""
    runtime = build_runtime(
        reactor,
        settings if settings is not None else Settings(),
        list(nodes),
        nodes=nodes,
        environ=environ,
        stall_tracker=stall_tracker,
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
    def facade(self) -> Facade:
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
