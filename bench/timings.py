"""Wall-clock timings and memory that the test suite pins on an injected clock instead.

``python bench/timings.py [--rounds N]`` measures, on loopback, what the tests used to assert with
wall-clock thresholds (which flake on a shared machine); each line shows the median and worst of
N rounds next to the budget the tests once asserted:

- ``drain``: SIGTERM → exit of a real ``twistd nvpair`` with 20 open streams, grace 1 s
  (budget grace + 1 s; tests/test_drain.py pins the grace deadline on a ``task.Clock``);
- ``refused``: a refused IP-literal dial through ``UpstreamClient`` (budget 0.25 s; the test pins
  "before any timer fires");
- ``get_json``: a stall before headers and one mid-body, timeout 0.2 s (budget 0.15-2 s);
- ``aggregate``: four failing nodes, one stalled, timeout 0.2 s (budget 2 s);
- ``backpressure``: a client that reads nothing while the upstream offers 128 MiB: what the
  upstream sent before it was paused and the growth of this process's resident memory
  (budgets 24 MiB and 16 MiB; tests/test_relay.py pins the byte bound from the kernel's limits).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from twisted.internet import task
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, ProcessProtocol, Protocol
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nvpair_tw.core._engines import TAGS  # noqa: E402
from nvpair_tw.core._resolved import Settings  # noqa: E402
from nvpair_tw.corridor._aggregate import aggregate_model_list  # noqa: E402
from nvpair_tw.nodes._directory import Node  # noqa: E402
from nvpair_tw.selection._inventory import ReadError, get_json, make_http_client  # noqa: E402
from nvpair_tw.testing import SimulatedEngine, start_engine, start_proxy  # noqa: E402
from nvpair_tw.upstream._attempt import UpstreamClient, make_pool  # noqa: E402

__all__ = ["main"]

MiB = 1024 * 1024
STREAM = json.dumps(
    {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Twistd(ProcessProtocol):
    def __init__(self) -> None:
        self.output = b""
        self.ended: Deferred[None] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output += data

    def errReceived(self, data: bytes) -> None:
        self.output += data

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(None)


class _Drop(Protocol):
    """Reads and discards a body; ``lost`` fires when it ends."""

    def __init__(self) -> None:
        self.lost: Deferred[None] = Deferred()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.lost.callback(None)


async def _sleep(reactor: Any, seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def drain(reactor: Any) -> float:
    """Seconds from SIGTERM to the exit of a twistd with 20 open streams (grace 1 s)."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=400, chunk_delay=0.05))
    facade, admin = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PYTHONPATH"] = str(REPO)
    twistd = _Twistd()
    args = [
        sys.executable,
        "-c",
        "from twisted.scripts.twistd import run; run()",
        "--nodaemon",
        "--pidfile=",
        "nvpair",
        "--engine",
        "ollama",
        "--usage-db",
        "none",
        "--listen",
        f"tcp:{facade}:interface=127.0.0.1",
        "--admin",
        f"tcp:{admin}:interface=127.0.0.1",
        "--node",
        f"sim={engine.url}",
        "--shutdown-grace",
        "1s",
    ]
    process = reactor.spawnProcess(twistd, sys.executable, args, env=env, path=str(REPO))
    pool = HTTPConnectionPool(reactor, persistent=False)
    agent = Agent(reactor, pool=pool)
    try:
        for _ in range(200):
            try:
                ready = await agent.request(b"GET", f"http://127.0.0.1:{admin}/readyz".encode())
                ready.deliverBody(_Drop())
                if ready.code == 200:
                    break
            except ConnectError:
                pass
            await _sleep(reactor, 0.1)
        headers = Headers({b"content-type": [b"application/json"]})
        responses = await gatherResults(
            [
                agent.request(
                    b"POST",
                    f"http://127.0.0.1:{facade}/api/chat".encode(),
                    headers,
                    FileBodyProducer(io.BytesIO(STREAM)),
                )
                for _ in range(20)
            ]
        )
        for response in responses:
            response.deliverBody(_Drop())
        started = reactor.seconds()
        process.signalProcess("TERM")
        await twistd.ended
        return float(reactor.seconds() - started)
    finally:
        if not twistd.ended.called:
            process.signalProcess("KILL")
            await twistd.ended
        await engine.stop()


async def refused(reactor: Any) -> float:
    """Seconds until a refused IP-literal dial fails."""
    port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
    number = port.getHost().port
    await port.stopListening()
    pool = make_pool(reactor)
    upstream = UpstreamClient(reactor, pool, connect_timeout=5.0)
    started = reactor.seconds()
    try:
        await upstream.request(
            b"POST", b"http://127.0.0.1:%d/api/chat" % number, Headers(), STREAM, 5.0
        )
    except ConnectError:
        return float(reactor.seconds() - started)
    finally:
        await pool.closeCachedConnections()
    raise AssertionError("the dial was not refused")


class _Stalling(Resource):
    isLeaf = True

    def render_GET(self, request: Request) -> bytes | int:
        if request.path == b"/slow-body":
            request.write(b'{"models": [')
        return NOT_DONE_YET


async def _listen(reactor: Any, resource: Resource) -> tuple[Any, str]:
    site = Site(resource)
    site.noisy = False
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    return port, f"http://127.0.0.1:{port.getHost().port}"


async def get_json_stalls(reactor: Any) -> float:
    """The slower of: a stall before headers, a stall mid-body (timeout 0.2 s)."""
    port, base = await _listen(reactor, _Stalling())
    pool = HTTPConnectionPool(reactor, persistent=False)
    http = make_http_client(Agent(reactor, pool=pool))
    worst = 0.0
    try:
        for path in ("/slow-headers", "/slow-body"):
            started = reactor.seconds()
            try:
                await get_json(http, reactor, base + path, timeout=0.2)
            except ReadError:
                worst = max(worst, reactor.seconds() - started)
    finally:
        await port.stopListening()
    return worst


async def aggregate(reactor: Any) -> float:
    """Seconds to the 503 of four failing nodes, one of them stalled (timeout 0.2 s)."""
    port, base = await _listen(reactor, _Stalling())
    closed = reactor.listenTCP(0, Factory(), interface="127.0.0.1")
    down = f"http://127.0.0.1:{closed.getHost().port}"
    await closed.stopListening()
    pool = HTTPConnectionPool(reactor, persistent=False)
    http = make_http_client(Agent(reactor, pool=pool))
    nodes = [Node("down", down), Node("slow", base)]
    started = reactor.seconds()
    try:
        result = await aggregate_model_list(TAGS, nodes, "/api/tags", http, reactor, timeout=0.2)
        assert result.status == 503, result
        return float(reactor.seconds() - started)
    finally:
        await port.stopListening()


class _Firehose(Resource):
    """Offers ``total`` bytes as fast as the connection takes them, pausing when told."""

    isLeaf = True
    CHUNK = b"x" * 65536

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total, self.sent, self.paused, self.stopped = total, 0, False, False
        self._request: Request | None = None

    def render(self, request: Request) -> int:  # type: ignore[override]
        self._request = request
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"content-length", b"%d" % self.total)
        request.registerProducer(_FirehoseProducer(self), True)
        self.pump()
        return NOT_DONE_YET

    def pump(self) -> None:
        assert self._request is not None
        while not self.paused and not self.stopped and self.sent < self.total:
            self.sent += len(self.CHUNK)
            self._request.write(self.CHUNK)


@implementer(IPushProducer)
class _FirehoseProducer:
    def __init__(self, firehose: _Firehose) -> None:
        self._firehose = firehose

    def pauseProducing(self) -> None:
        self._firehose.paused = True

    def resumeProducing(self) -> None:
        self._firehose.paused = False
        self._firehose.pump()

    def stopProducing(self) -> None:
        self._firehose.stopped = True


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def backpressure(reactor: Any) -> tuple[float, float]:
    """(MiB the upstream sent before it stayed paused, MiB of resident growth) for a client that
    reads nothing while 128 MiB are offered."""
    firehose = _Firehose(128 * MiB)
    port, base = await _listen(reactor, firehose)
    proxy = await start_proxy(
        reactor,
        {"ollama": [Node("n0", base, ("llama3:latest",))]},
        Settings(write_stall_timeout=120.0),
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        before = _resident()
        sock.connect(("127.0.0.1", int(proxy.url().rsplit(":", 1)[1])))
        sock.sendall(
            b"POST /api/chat HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(STREAM), STREAM)
        )
        stable, last = 0, -1
        for _ in range(200):
            await _sleep(reactor, 0.1)
            stable = stable + 1 if firehose.paused and firehose.sent == last else 0
            last = firehose.sent
            if stable >= 5:
                break
        return firehose.sent / MiB, (_resident() - before) / MiB
    finally:
        sock.close()
        firehose.stopped = True
        await proxy.stop()
        await port.stopListening()


async def _rounds(reactor: Any, rounds: int, measure: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    return [await measure(reactor) for _ in range(rounds)]


def _line(name: str, values: list[float], budget: str, unit: str = "s") -> str:
    return (
        f"{name:<22} median {statistics.median(values):9.4f} {unit:<3} "
        f"worst {max(values):9.4f} {unit:<3} (budget {budget})"
    )


async def _main(reactor: Any, rounds: int) -> None:
    lines = [
        _line("drain (SIGTERM→exit)", await _rounds(reactor, rounds, drain), "< 2 s"),
        _line("refused connect", await _rounds(reactor, rounds, refused), "< 0.25 s"),
        _line("get_json stall", await _rounds(reactor, rounds, get_json_stalls), "0.15-2 s"),
        _line("aggregate 503", await _rounds(reactor, rounds, aggregate), "< 2 s"),
    ]
    pressure = await _rounds(reactor, rounds, backpressure)
    lines.append(_line("upstream sent", [p[0] for p in pressure], "< 24 MiB", "MiB"))
    lines.append(_line("resident growth", [p[1] for p in pressure], "< 16 MiB", "MiB"))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    task.react(lambda reactor: Deferred.fromCoroutine(_main(reactor, options.rounds)))


if __name__ == "__main__":
    main()
