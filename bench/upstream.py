"""A fast fake engine for the benchmarks: ``python bench/upstream.py PORT [--frozen]``.

The default is a minimal asyncio HTTP/1.1 server with pre-built replies, so the "direct" baseline
measures the load generator and the kernel rather than a Python web framework. ``--simulated`` runs
:class:`nvpair_tw.simulated._engine.SimulatedEngine` instead (same routes, slower, used to compare).

Routes: ``GET /api/tags`` and ``/v1/models`` list ``llama3:latest``; ``POST /api/chat`` with
``"stream": false`` answers one JSON object; ``POST /v1/chat/completions`` with ``"stream": true``
answers ``--chunks`` SSE events and ``data: [DONE]``. A body containing ``"bench_slow"`` gets
``--slow-chunks`` events ``--slow-delay`` seconds apart (long-lived streams for the memory scenario).
``--frozen`` reads POST requests and never answers them (the stall scenario).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

MODELS = json.dumps({"models": [{"name": "llama3:latest", "model": "llama3:latest"}]}).encode()
OPENAI_MODELS = json.dumps(
    {"object": "list", "data": [{"id": "llama3:latest", "object": "model"}]}
).encode()
CHAT = json.dumps(
    {"message": {"role": "assistant", "content": "hello"}, "done": True, "model": "llama3"}
).encode()
COMPLETION = json.dumps(
    {"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "hi"}}]}
).encode()


def sse_event(index: int) -> bytes:
    """One SSE chunk of a chat completion stream."""
    return (
        b"data: "
        + json.dumps({"choices": [{"delta": {"content": f"hello{index}"}}]}).encode()
        + b"\n\n"
    )


def chunked(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def head(status: bytes, content_type: bytes, extra: bytes) -> bytes:
    """A response head (status line and headers, with the blank line)."""
    return b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type + b"\r\n" + extra + b"\r\n"


def fixed(status: bytes, content_type: bytes, body: bytes, keep: bool) -> bytes:
    """A complete response with a Content-Length."""
    extra = b"content-length: %d\r\n" % len(body)
    if not keep:
        extra += b"connection: close\r\n"
    return head(status, content_type, extra) + body


class Engine(asyncio.Protocol):
    """One client connection."""

    def __init__(self, config: argparse.Namespace, stream_bodies: tuple[bytes, bytes]) -> None:
        self.config = config
        self.stream_bodies = stream_bodies  # (chunked for keep-alive, raw for close)
        self.buffer = b""
        self.busy = False
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.busy and self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buffer[:end].split(b"\r\n")
            method, target, version = lines[0].split(b" ", 2)
            length = 0
            close = version != b"HTTP/1.1"
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    lowered = value.strip().lower()
                    close = lowered == b"close" or (close and lowered != b"keep-alive")
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self.respond(method, target.split(b"?", 1)[0], body, not close)

    def respond(self, method: bytes, path: bytes, body: bytes, keep: bool) -> None:
        transport = self.transport
        assert transport is not None
        if method == b"GET":
            if path == b"/api/tags":
                transport.write(fixed(b"200 OK", b"application/json", MODELS, keep))
            elif path == b"/v1/models":
                transport.write(fixed(b"200 OK", b"application/json", OPENAI_MODELS, keep))
            else:
                transport.write(fixed(b"200 OK", b"application/json", b'{"version":"0"}', keep))
        elif self.config.frozen:
            self.busy = True  # never answers; the client gives up
            return
        elif b'"stream": true' not in body and b'"stream":true' not in body:
            reply = COMPLETION if path.startswith(b"/v1/") else CHAT
            transport.write(fixed(b"200 OK", b"application/json", reply, keep))
        elif b"bench_slow" in body:
            self.busy = True
            transport.write(self.stream_head(keep))
            self.slow(0, keep)
            return
        else:
            transport.write(self.stream_head(keep) + self.stream_body_for(keep))
        if not keep:
            transport.close()

    def stream_head(self, keep: bool) -> bytes:
        extra = b"transfer-encoding: chunked\r\n" if keep else b"connection: close\r\n"
        return head(b"200 OK", b"text/event-stream", extra)

    def stream_body_for(self, keep: bool) -> bytes:
        return self.stream_bodies[0] if keep else self.stream_bodies[1]

    def slow(self, index: int, keep: bool) -> None:
        self.timer = None
        transport = self.transport
        if transport is None:
            return
        if index == self.config.slow_chunks:
            transport.write(chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n" if keep else b"")
            self.busy = False
            if not keep:
                transport.close()
            return
        event = sse_event(index)
        transport.write(chunked(event) if keep else event)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.config.slow_delay, self.slow, index + 1, keep)


async def serve(config: argparse.Namespace) -> None:
    """Listen on 127.0.0.1 until killed."""
    events = [sse_event(i) for i in range(config.chunks)] + [b"data: [DONE]\n\n"]
    bodies = (b"".join(chunked(e) for e in events) + b"0\r\n\r\n", b"".join(events))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Engine(config, bodies), "127.0.0.1", config.port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def simulated(config: argparse.Namespace) -> None:
    """Serve nvpair_tw.simulated._engine.SimulatedEngine (the Twisted fake engine) instead."""
    from twisted.internet import reactor

    from nvpair_tw.simulated._engine import Behaviour, SimulatedEngine, always

    engine = SimulatedEngine(
        reactor,  # type: ignore[arg-type]
        policy=always(Behaviour.FROZEN if config.frozen else Behaviour.HEALTHY),
        chunks=config.chunks,
    )
    reactor.listenTCP(config.port, engine.site(), backlog=4096, interface="127.0.0.1")  # type: ignore[attr-defined,arg-type]
    reactor.run()  # type: ignore[attr-defined,arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--frozen", action="store_true", help="never answer POST requests")
    parser.add_argument("--chunks", type=int, default=1000, help="SSE events per stream")
    parser.add_argument("--slow-chunks", type=int, default=60)
    parser.add_argument("--slow-delay", type=float, default=1.0)
    parser.add_argument("--simulated", action="store_true", help="use SimulatedEngine (Twisted)")
    config = parser.parse_args()
    if config.simulated:
        simulated(config)
    else:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config))


if __name__ == "__main__":
    main()
