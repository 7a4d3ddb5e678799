# -*- test-case-name: tests.test_testing -*-
"""Simulated engines that misbehave on purpose, for the test suite, the benchmarks and ``--demo``.

A :class:`SimulatedEngine` answers the Ollama and OpenAI-style routes the proxy uses. Its
:class:`Behaviour` decides, per request, whether it answers, freezes before the headers, sends
headers and then nothing, drops the connection, or fails with a status. Every request it receives is
kept (method, path, headers, body) so tests can compare replayed bodies byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

from attrs import define, field, frozen
from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IDelayedCall, IListeningPort, IReactorTime
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

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
