"""Ingress hardening over real loopback sockets (the ingress/hardening issue's acceptance checks).

A fuzzer throws malformed requests at a running proxy while a well-behaved stream flows; slowloris
connections are cut by the header-read deadline; a client that stops reading is dropped and its
upstream paused; non-loopback callers meet the key matrix (their peer address is injected).
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import os
import socket
from collections.abc import Callable
from typing import Any, Literal

import pytest
import pytest_twisted
import treq
from attrs import define, field, frozen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IAddress, IDelayedCall, IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

from nvpair_tw.core._resolved import Settings
from nvpair_tw.corridor._facade import FacadeResource
from nvpair_tw.events import Event
from nvpair_tw.inbound._limits import LimitedChannel, LimitedSite
from nvpair_tw.nodes._directory import Node
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    ProxyCluster,
    SimulatedEngine,
    http_client,
)
from tests.helpers import refusal_code

pytestmark = pytest.mark.e2e

MODEL = ("llama3:latest",)
CHAT = json.dumps(
    {"model": "llama3", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
).encode()
FOREIGN = IPv4Address("TCP", "192.0.2.10", 40123)
KEY = "nvk-7c1e9a44d02b"


def ndjson_contents(body: bytes) -> tuple[list[str], bool]:
    """The message contents of an NDJSON chat stream and whether its last frame says done."""
    frames = [json.loads(line) for line in body.splitlines() if line]
    contents = [f["message"]["content"] for f in frames if "message" in f]
    return contents, bool(frames) and frames[-1].get("done") is True


def assert_proxy_error(status: int, headers: Any, body: bytes, code: str) -> None:
    """A proxy-made JSON error: status, exact keys, content type and nosniff."""
    assert headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert headers.getRawHeaders(b"x-content-type-options") == [b"nosniff"]
    document = json.loads(body)
    assert set(document) == {"error", "code"}
    assert document["code"] == code, (status, document)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


async def fds_back_to(reactor: Any, baseline: int, tries: int = 100) -> int:
    """Wait (bounded) for closes on both ends of loopback pairs to land; return the final count."""
    count = fd_count()
    for _ in range(tries):
        if count <= baseline:
            break
        await deferLater(reactor, 0.02, lambda: None)
        count = fd_count()
    return count


class ForeignPeer(ProtocolWrapper):
    """Makes the wrapped channel see a non-loopback TCP peer (the socket itself stays on loopback)."""

    def getPeer(self) -> IAddress:
        return FOREIGN


def foreign(site: Site) -> WrappingFactory:
    factory = WrappingFactory(site)
    factory.protocol = ForeignPeer
    return factory


@define
class Stack(ProxyCluster):
    """A proxy cluster that can open more limited sites on its facade and await a future event."""

    def site(self, **limits: Any) -> LimitedSite:
        """Another limited site on the proxy's facade, with limits of the test's choosing."""
        return FacadeResource(self.facade).site(clock=self.reactor, **limits)

    def when(self, name: str, predicate: Callable[[dict[str, Any]], bool]) -> Deferred[Event]:
        """Fires with the first future event called ``name`` whose payload matches."""
        assert self.proxy is not None
        d: Deferred[Event] = Deferred()

        def sink(event: Event) -> None:
            if event.name == name and predicate(dict(event.payload)) and not d.called:
                subscription.close()
                d.callback(event)

        subscription = self.proxy.runtime.shared.bus.subscribe(sink, name=f"when {name}")
        return d


@pytest.fixture
def stack(clusters: Clusters) -> Stack:
    """A stack stopped (proxy, then engines) after the test."""
    return clusters(Stack)


# --- 1. fuzz ---------------------------------------------------------------------------------------


@frozen
class Exchange:
    """What one raw request got back: a parsed response, a close without one, or silence."""

    outcome: Literal["response", "closed", "silent"]
    status: int = 0
    headers: http.client.HTTPMessage | None = None
    body: bytes = b""


def raw_exchange(port: int, data: bytes, timeout: float) -> Exchange:
    """Send ``data`` on a fresh connection and parse the first response with ``http.client``.

    Runs in a thread. A response that does not parse raises (the fuzz test then fails).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the proxy may answer and close before taking it all
            sock.sendall(data)
        head = data.lstrip(b"\r\n")
        response = http.client.HTTPResponse(sock, method="HEAD" if head[:5] == b"HEAD " else "GET")
        try:
            response.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return Exchange("closed")
        except TimeoutError:
            return Exchange("silent")
        return Exchange("response", response.status, response.msg, response.read())


def check_exchange(exchange: Exchange) -> None:
    """Every response is well formed; every error the proxy makes itself is our JSON error."""
    if exchange.outcome != "response":
        return
    assert exchange.headers is not None
    assert 100 <= exchange.status <= 599
    if exchange.status < 400 or exchange.headers.get("x-nvpair-node") is not None:
        return  # relayed from the engine, or a success
    assert exchange.headers.get_all("content-type") == ["application/json"]
    assert exchange.headers.get_all("x-content-type-options") == ["nosniff"]
    if exchange.body:  # HEAD answers carry none
        document = json.loads(exchange.body)
        assert set(document) in ({"error", "code"}, {"error"}, {"type", "error", "code"})
        assert refusal_code(document) != "internal-error", document


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` seven times in eight, else ``bad``: most examples are wrong in one place at most."""
    return st.integers(0, 7).flatmap(lambda n: bad if n == 0 else good)


EOL = mostly(st.just(b"\r\n"), st.just(b"\n"))
METHODS = mostly(
    st.sampled_from([b"GET", b"POST", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS"]),
    st.sampled_from([b"P\x00ST", b"", b"G\xc3\xa9T", b"GET\t", b"(POST)"]) | st.binary(max_size=8),
)
TARGETS = mostly(
    st.sampled_from(
        [
            b"/api/chat",
            b"/api/chat",
            b"/api/generate",
            b"/api/tags",
            b"/api/version",
            b"/v1/chat/completions",
            b"/v1/models",
            b"*",
            b"http://elsewhere/api/chat",
            b"/api/chat?stream=1&x=%ff",
            b"//api//chat",
        ]
    ),
    st.sampled_from([b"/\x80", b"/api/chat?q=\xb0", b"/\x7f", b"/\xff"])
    | st.binary(max_size=40)
    | st.integers(0, 12_000).map(lambda n: b"/" + b"a" * n),
)
VERSIONS = mostly(
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"]),
    st.sampled_from(
        [b"HTTP/2.0", b"HTTP/1.1 x", b"", b"http/1.1", b"HTTP/1.1\x00", b"HTTP/1.1\xb0"]
    ),
)
HEADER_NAMES = mostly(
    st.sampled_from(
        [
            b"Content-Type",
            b"Transfer-Encoding",
            b"Content-Length",
            b"Expect",
            b"Connection",
            b"Authorization",
            b"X-Api-Key",
            b"X-NVPAIR-Engine-Identity-Probe",
            b"X-Forwarded-For",
            b"Accept-Encoding",
        ]
    ),
    st.binary(min_size=1, max_size=20),
)
HEADER_VALUES = mostly(
    st.sampled_from(
        [
            b"1",
            b"-1",
            b"0",
            b"chunked",
            b"gzip, chunked",
            b"chunked, chunked",
            b"100-continue",
            b"close",
            b"Bearer x",
            b"application/json",
            b"99999999999999999999",
            b"\xb0\xff",
        ]
    ),
    st.binary(max_size=60) | st.integers(0, 20_000).map(lambda n: b"v" * n),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MODELS = mostly(st.sampled_from(["llama3", "llama3:latest", "no-such-model"]), JSON_VALUES)


@st.composite
def json_bodies(draw: st.DrawFn) -> bytes:
    """A JSON-ish body: a chat request, any JSON, broken JSON, deep nesting or raw bytes."""
    kind = draw(
        st.sampled_from(["chat", "chat", "chat", "json", "truncated", "deep", "raw", "big"])
    )
    if kind == "chat":
        document = {
            "model": draw(MODELS),
            "stream": draw(st.booleans()),
            "messages": draw(JSON_VALUES),
        }
        return json.dumps(document).encode()
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "truncated":
        text = json.dumps({"model": "llama3", "messages": [{"content": "x" * 50}]}).encode()
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "deep":
        depth = draw(st.integers(500, 200_000))
        return b'{"model":"llama3","x":' + b"[" * depth
    if kind == "big":  # around the 64 KiB body cap of the fuzzed site
        return b'{"model":"llama3","x":"' + b"x" * draw(st.integers(65_000, 70_000)) + b'"}'
    return bytes(draw(st.binary(max_size=300)))


@st.composite
def chunked(draw: st.DrawFn, body: bytes, eol: bytes) -> bytes:
    """``body`` in chunked encoding, sometimes with a broken size line, framing or trailer."""
    cut = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    pieces = [body[a:b] for a, b in zip([0, *cut], [*cut, len(body)], strict=True)]
    out = b""
    for piece in pieces:
        size = draw(
            mostly(
                st.just(b"%x" % len(piece)),
                st.sampled_from([b"zz", b"-1", b"f" * 20, b"5;ext=1", b" 5", b"0x5", b""]),
            )
        )
        out += size + eol + piece + draw(mostly(st.just(eol), st.sampled_from([b"", b"xx"])))
    end = mostly(
        st.just(b"0" + eol + eol), st.sampled_from([b"0" + eol + b"T: 1" + eol + eol, b""])
    )
    return bytes(out + draw(end))


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """A request with some of its parts malformed, or plain noise."""
    if draw(st.integers(0, 9)) == 0:
        return bytes(draw(st.binary(min_size=1, max_size=400)))
    eol = draw(EOL)
    line = draw(METHODS) + b" " + draw(TARGETS) + b" " + draw(VERSIONS)
    headers = [b"Host: localhost"] if draw(st.booleans()) else []
    pairs = draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=3))
    headers += [name + b": " + value for name, value in pairs]
    body = draw(json_bodies()) if draw(st.integers(0, 3)) else b""
    framing = draw(
        st.sampled_from(["length", "length", "length", "chunked", "wrong-length", "none"])
    )
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
    elif framing == "wrong-length":
        headers.append(b"Content-Length: %d" % draw(st.integers(0, max(0, len(body) - 1))))
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        body = draw(chunked(body, eol))
    if draw(st.integers(0, 15)) == 0:
        headers.append(b"X-Long: " + b"1" * draw(st.integers(1, 20_000)))
    if draw(st.integers(0, 15)) == 0:
        headers += [b"X-H%d: %d" % (i, i) for i in range(draw(st.integers(90, 130)))]
    return bytes(line + eol + b"".join(h + eol for h in headers) + eol + body)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw_requests())
def exchange_examples(port: int, seen: dict[str, int], data: bytes) -> None:
    """One example: send ``data`` (blocking, in a worker thread) and check what comes back."""
    exchange = raw_exchange(port, data, 0.6)
    check_exchange(exchange)
    kind: str = exchange.outcome
    if exchange.headers is not None:
        relayed = exchange.headers.get("x-nvpair-node") is not None
        kind = "relayed" if relayed else "refused" if exchange.status >= 400 else "answered"
    seen[kind] = seen.get(kind, 0) + 1


@pytest_twisted.ensureDeferred
async def test_fuzzed_requests_get_well_formed_answers_while_a_stream_flows(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """Malformed request lines, headers, bodies, JSON and chunking each get a well-formed answer (or
    a close, or silence while more input is awaited); proxy errors are JSON; a concurrent stream
    arrives intact and the proxy still serves afterwards."""
    frames = 400
    # The first inference request streams slowly; every later one is answered at once.
    engine = SimulatedEngine(
        reactor,
        MODEL,
        lambda n, _path: Behaviour.HEALTHY if n == 1 else Behaviour.STATUS_404,
        chunks=frames,
        chunk_delay=0.1,
        reply_text="steady",
    )
    await stack.start([engine], Settings())
    port = listen(stack.site(header_timeout=0.25, max_body_size=64 * 1024))
    url = f"http://127.0.0.1:{port}"

    async def stream() -> bytes:
        response = await http_client(reactor).post(url + "/api/chat", data=CHAT)
        assert response.code == 200
        return bytes(await treq.content(response))

    streaming = Deferred.fromCoroutine(stream())
    seen: dict[str, int] = {}
    # Hypothesis drives blocking raw sockets from a worker thread; the reactor serves meanwhile.
    await deferToThread(exchange_examples, port, seen)
    assert not streaming.called, "the stream must span the whole fuzz run"
    assert seen.get("relayed", 0) > 10 and seen.get("refused", 0) > 10, seen
    engine.chunk_delay = 0.001  # let the rest of the stream go now
    body = await streaming.addTimeout(20, reactor)
    assert ndjson_contents(body) == ([f"steady{i}" for i in range(frames)], True)

    response = await http_client(reactor).get(url + "/api/tags")
    assert response.code == 200
    tags = json.loads(await treq.content(response))
    assert [m["name"] for m in tags["models"]] == ["llama3:latest"]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"GET /\x80 HTTP/1.1", id="0x80-in-path"),
        pytest.param(b"GET /api/tags?q=\xb0 HTTP/1.1", id="0xb0-in-query"),
        pytest.param(b"GET w HTTP/1.1", id="no-leading-slash"),
        pytest.param(b"PUT * HTTP/1.1", id="star-not-options"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_request_line_with_a_target_the_facade_cannot_map_gets_400_json(
    reactor: Any, stack: Stack, listen: Callable[[Any], int], line: bytes
) -> None:
    """Non-ASCII bytes (Twisted lets 0x7F-0xB0 through) and targets that are neither origin-form,
    absolute-form nor OPTIONS * are refused with 400 JSON before reaching the facade."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], Settings())
    port = listen(stack.site())
    exchange = await deferToThread(raw_exchange, port, line + b"\r\nHost: localhost\r\n\r\n", 5.0)
    assert exchange.status == 400
    assert exchange.headers is not None
    assert exchange.headers.get_all("content-type") == ["application/json"]
    assert json.loads(exchange.body)["code"] == "bad-request"
    assert engine.received == []


@pytest.mark.parametrize(
    ("line", "status"),
    [
        pytest.param(b"OPTIONS * HTTP/1.1", 200, id="options-star"),
        pytest.param(b"GET http://elsewhere/api/tags HTTP/1.1", 200, id="absolute-form"),
        pytest.param(b"GET /api/tags?q=%C3%A9 HTTP/1.1", 200, id="percent-encoded"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_well_formed_request_targets_are_still_served(
    reactor: Any, stack: Stack, listen: Callable[[Any], int], line: bytes, status: int
) -> None:
    """OPTIONS *, absolute-form and percent-encoded targets pass the request-line check."""
    await stack.start([SimulatedEngine(reactor, MODEL)], Settings())
    port = listen(stack.site())
    exchange = await deferToThread(raw_exchange, port, line + b"\r\nHost: localhost\r\n\r\n", 5.0)
    assert exchange.status == status


@pytest.mark.parametrize(
    "target",
    [
        pytest.param(b"//[x/api/tags", id="origin-form-like-a-bad-authority"),
        pytest.param(b"http://[x/api/tags", id="absolute-form-bad-authority"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_targets_urlsplit_rejects_get_a_well_formed_answer_not_a_crash(
    reactor: Any, stack: Stack, listen: Callable[[Any], int], target: bytes
) -> None:
    """A target urllib cannot split is answered (JSON if the proxy refuses it), never with
    Twisted's HTML 500 and a logged traceback."""
    await stack.start([SimulatedEngine(reactor, MODEL)], Settings())
    port = listen(stack.site())
    raw = b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"
    exchange = await deferToThread(raw_exchange, port, raw, 5.0)
    assert exchange.outcome == "response"
    assert exchange.status != 500
    check_exchange(exchange)


# --- 2. slowloris ----------------------------------------------------------------------------------


class Trickler(Protocol):
    """Sends a request line, then one header byte per interval, forever."""

    def __init__(self, clock: Any, interval: float) -> None:
        self._clock = clock
        self._interval = interval
        self._timer: IDelayedCall | None = None
        self.received = b""
        self.closed: Deferred[bytes] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        self._drip()

    def _drip(self) -> None:
        assert self.transport is not None
        self.transport.write(b"a")
        self._timer = self._clock.callLater(self._interval, self._drip)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self.closed.callback(self.received)


def parse_raw(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.lower(): v for k, v in (line.split(b": ", 1) for line in lines)}
    return int(status.split()[1]), headers, body


@pytest_twisted.ensureDeferred
async def test_slowloris_connections_get_408_and_normal_clients_are_served(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """Fifty connections trickling header bytes do not keep a normal client waiting; each is closed
    with a 408 JSON error at the header deadline, and the file descriptors and the per-connection
    objects (channels, their timers) are all released afterwards."""
    await stack.start([SimulatedEngine(reactor, MODEL, reply_text="fine")], Settings())
    assert stack.proxy is not None
    site = stack.site(header_timeout=1.0)
    port = listen(site)
    url = f"http://127.0.0.1:{port}"
    await stack.proxy.runtime.close_idle()
    baseline = fd_count()

    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    slow = [Trickler(reactor, 0.05) for _ in range(50)]
    await gatherResults([connectProtocol(endpoint, t) for t in slow])

    response = await http_client(reactor).post(url + "/api/chat", data=CHAT)
    body = await treq.content(response)
    assert response.code == 200
    assert ndjson_contents(body) == (["fine0", "fine1", "fine2"], True)
    assert not any(t.closed.called for t in slow), "normal client served while they trickle"

    answers = await gatherResults([t.closed for t in slow]).addTimeout(10, reactor)
    for raw in answers:
        status, headers, payload = parse_raw(raw)
        assert status == 408
        assert headers[b"content-type"] == b"application/json"
        assert json.loads(payload)["code"] == "header-timeout"

    await stack.proxy.runtime.close_idle()
    assert await fds_back_to(reactor, baseline) == baseline
    assert site.open_connections == 0
    del slow, answers
    gc.collect()
    assert [o for o in gc.get_objects() if isinstance(o, LimitedChannel)] == []


# --- 3. stalled reader -----------------------------------------------------------------------------

FRAME = (
    json.dumps({"message": {"role": "assistant", "content": "z" * 65_000}, "done": False}).encode()
    + b"\n"
)
DONE = b'{"done":true}\n'


@implementer(IPushProducer)
@define(eq=False)
class Pump:
    """Writes ``total`` NDJSON frames as fast as the connection to the proxy takes them."""

    request: Request
    total: int
    sent: int = 0
    paused: bool = False
    stopped: bool = False
    first_pause: Deferred[None] = field(factory=Deferred)

    def start(self) -> None:
        self.request.setHeader(b"content-type", b"application/x-ndjson")
        self.request.registerProducer(self, True)
        self.resumeProducing()

    def pauseProducing(self) -> None:
        self.paused = True
        if not self.first_pause.called:
            self.first_pause.callback(None)

    def resumeProducing(self) -> None:
        self.paused = False
        while not (self.paused or self.stopped) and self.sent < self.total:
            self.sent += 1
            self.request.write(FRAME)
        if self.sent == self.total and not self.stopped:
            self.stopped = True
            self.request.write(DONE)
            self.request.unregisterProducer()
            self.request.finish()

    def stopProducing(self) -> None:
        self.stopped = True


class PumpEngine(Resource):
    """An engine honouring backpressure: POST bodies name how many 64 KB frames to stream."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.pumps: list[Pump] = []
        self.first: Deferred[Pump] = Deferred()

    def render_GET(self, request: Request) -> bytes:
        return json.dumps({"models": [{"name": m, "model": m} for m in MODEL]}).encode()

    def render_POST(self, request: Request) -> int:
        assert request.content is not None
        pump = Pump(request, int(json.loads(request.content.read())["frames"]))
        self.pumps.append(pump)
        if not self.first.called:
            self.first.callback(pump)
        pump.start()
        return NOT_DONE_YET


def open_stalled_reader(port: int, frames: int) -> socket.socket:
    """A client with a tiny receive buffer that sends a streaming request and never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    body = json.dumps({"model": "llama3", "stream": True, "frames": frames}).encode()
    head = b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body)
    sock.sendall(head + body)
    return sock


def drain_until_closed(sock: socket.socket) -> bool:
    """Read until the proxy closes the connection; ``False`` if it stays open (10 s)."""
    with sock:
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            pass
        return True


@pytest_twisted.ensureDeferred
async def test_a_client_that_stops_reading_is_dropped_and_its_upstream_paused(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """A stream to a client that reads nothing pauses the engine and is cut at the write-stall
    deadline (workload cancelled); a normal client is served in the meantime."""
    engine = PumpEngine()
    engine_port = listen(Site(engine))
    nodes = [Node("n0", f"http://127.0.0.1:{engine_port}", MODEL)]
    proxy = await stack.start_proxy(nodes, Settings(write_stall_timeout=0.5))
    errored = stack.when("workload:errored", lambda p: p["workload"]["id"] == 1)
    port = proxy.ports["ollama"].getHost().port  # type: ignore[attr-defined]
    frames = 1024  # 64 MiB: far more than every socket buffer on the way

    sock = await deferToThread(open_stalled_reader, port, frames)
    pump = await engine.first.addTimeout(10, reactor)
    await pump.first_pause.addTimeout(10, reactor)

    data = json.dumps({"model": "llama3", "stream": True, "frames": 3}).encode()
    response = await http_client(reactor).post(proxy.url() + "/api/chat", data=data)
    body = await treq.content(response)
    assert response.code == 200
    assert body == FRAME * 3 + DONE
    assert [w.id for w in proxy.runtime.shared.workloads.live()] == [1], "still streaming"

    event = await errored.addTimeout(10, reactor)
    assert event.payload["workload"]["state"] == "cancelled"
    assert event.payload["workload"]["error"] == "client stopped reading"
    assert await deferToThread(drain_until_closed, sock), "the stalled client was dropped"
    assert pump.sent < frames, "the engine was held back while the client did not read"
    records = [r for r in stack.named("proxy/request") if r["error"] == "client stopped reading"]
    assert len(records) == 1


# --- 4. non-loopback callers and keys --------------------------------------------------------------


async def foreign_port(stack: Stack, listen: Callable[[Any], int]) -> str:
    return f"http://127.0.0.1:{listen(foreign(stack.site()))}"


@pytest_twisted.ensureDeferred
async def test_non_loopback_caller_without_keys_configured_gets_403_loopback_only(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """With no API keys, a non-loopback peer is refused with 403 loopback-only JSON."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], Settings())
    url = await foreign_port(stack, listen)
    response = await http_client(reactor).post(url + "/api/chat", data=CHAT)
    assert response.code == 403
    assert_proxy_error(403, response.headers, await treq.content(response), "loopback-only")
    assert engine.received == []
    assert [r["status"] for r in stack.named("proxy/request")] == [403]


@pytest.mark.parametrize(
    ("headers", "code", "challenge"),
    [
        pytest.param({}, "auth-required", b'Bearer realm="nvpair"', id="missing"),
        pytest.param(
            {"Authorization": "Bearer nope"},
            "invalid-api-key",
            b'Bearer realm="nvpair", error="invalid_token"',
            id="wrong-bearer",
        ),
        pytest.param(
            {"X-Api-Key": "nope"},
            "invalid-api-key",
            b'Bearer realm="nvpair", error="invalid_token"',
            id="wrong-x-api-key",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_non_loopback_caller_without_the_right_key_gets_401_with_a_challenge(
    reactor: Any,
    stack: Stack,
    listen: Callable[[Any], int],
    headers: dict[bytes | str, bytes | str],
    code: str,
    challenge: bytes,
) -> None:
    """With keys configured, a missing or wrong key gets 401 JSON with WWW-Authenticate."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], Settings(), environ={"NVPAIR_PROXY_API_KEYS": KEY})
    url = await foreign_port(stack, listen)
    response = await http_client(reactor).post(url + "/api/chat", data=CHAT, headers=headers)
    assert response.code == 401
    assert response.headers.getRawHeaders(b"www-authenticate") == [challenge]
    assert_proxy_error(401, response.headers, await treq.content(response), code)
    assert engine.received == []


@pytest.mark.parametrize(
    ("headers", "forwarded_authorization"),
    [
        pytest.param({"Authorization": f"Bearer {KEY}"}, None, id="bearer"),
        pytest.param({"X-Api-Key": KEY}, None, id="x-api-key"),
        pytest.param(
            {"X-Api-Key": KEY, "Authorization": "Bearer callers-own"},
            [b"Bearer callers-own"],
            id="x-api-key-with-own-bearer",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_non_loopback_caller_with_the_key_is_served_and_the_engine_never_sees_it(
    reactor: Any,
    stack: Stack,
    listen: Callable[[Any], int],
    headers: dict[bytes | str, bytes | str],
    forwarded_authorization: list[bytes] | None,
) -> None:
    """The right key lets a non-loopback caller through; the key is stripped before forwarding,
    while an Authorization value that is not our key goes on to the engine."""
    engine = SimulatedEngine(reactor, MODEL, reply_text="ok")
    await stack.start([engine], Settings(), environ={"NVPAIR_PROXY_API_KEYS": f"other,{KEY}"})
    url = await foreign_port(stack, listen)
    response = await http_client(reactor).post(url + "/api/chat", data=CHAT, headers=headers)
    assert response.code == 200
    assert ndjson_contents(await treq.content(response)) == (["ok0", "ok1", "ok2"], True)
    [seen] = engine.received
    assert b"x-api-key" not in seen.headers
    assert seen.headers.get(b"authorization") == forwarded_authorization
    assert not any(KEY.encode() in v for values in seen.headers.values() for v in values)
    assert seen.headers[b"x-forwarded-for"] == [FOREIGN.host.encode()]


@pytest_twisted.ensureDeferred
async def test_loopback_caller_keeps_its_own_authorization_when_keys_are_configured(
    reactor: Any, stack: Stack
) -> None:
    """Loopback callers need no key, and their Authorization header reaches the engine untouched."""
    engine = SimulatedEngine(reactor, MODEL)
    proxy = await stack.start([engine], Settings(), environ={"NVPAIR_PROXY_API_KEYS": KEY})
    headers: dict[bytes | str, bytes | str] = {
        "Authorization": "Bearer loopback-own",
        "X-Api-Key": "loopback-key",
    }
    response = await http_client(reactor).post(
        proxy.url() + "/api/chat", data=CHAT, headers=headers
    )
    await treq.content(response)
    assert response.code == 200
    [seen] = engine.received
    assert seen.headers[b"authorization"] == [b"Bearer loopback-own"]
    assert seen.headers[b"x-api-key"] == [b"loopback-key"]


@pytest.mark.parametrize("caller", ["loopback", "non-loopback"])
@pytest_twisted.ensureDeferred
async def test_identity_probe_gets_409_proxy_facade(
    reactor: Any, stack: Stack, listen: Callable[[Any], int], caller: str
) -> None:
    """The engine-identity probe header is answered by the proxy with 409 proxy-facade."""
    engine = SimulatedEngine(reactor, MODEL)
    proxy = await stack.start([engine], Settings(), environ={"NVPAIR_PROXY_API_KEYS": KEY})
    url = proxy.url() if caller == "loopback" else await foreign_port(stack, listen)
    headers: dict[bytes | str, bytes | str] = {
        "X-NVPAIR-Engine-Identity-Probe": "1",
        "X-Api-Key": KEY,
    }
    response = await http_client(reactor).get(url + "/api/version", headers=headers)
    assert response.code == 409
    assert_proxy_error(409, response.headers, await treq.content(response), "proxy-facade")
    assert engine.received == []


# --- browsers on other origins (docs/behaviour.md §13.4) -------------------------------------------

ORIGIN = "https://chat.example:8443"
CORS = Settings(cors_origins=(ORIGIN,))


def sent(**headers: str) -> dict[bytes | str, bytes | str]:
    """Request headers for treq, ``Access_Control_Request_Method`` as ``Access-Control-Request-Method``."""
    return {name.replace("_", "-"): value for name, value in headers.items()}


@pytest_twisted.ensureDeferred
async def test_a_preflight_from_an_allowed_origin_is_answered_here_without_a_key(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """OPTIONS with Origin and Access-Control-Request-Method from an allowed origin: 204 with the
    grants, no key asked, no node contacted."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], CORS, environ={"NVPAIR_PROXY_API_KEYS": KEY})
    url = await foreign_port(stack, listen)
    response = await http_client(reactor).request(
        "OPTIONS",
        url + "/api/chat",
        headers=sent(
            Origin=ORIGIN,
            Access_Control_Request_Method="POST",
            Access_Control_Request_Headers="authorization, content-type",
        ),
    )
    assert response.code == 204
    headers = response.headers
    assert headers.getRawHeaders(b"access-control-allow-origin") == [ORIGIN.encode()]
    assert headers.getRawHeaders(b"vary") == [b"Origin"]
    allowed = headers.getRawHeaders(b"access-control-allow-headers", [b""])[0].lower()
    assert all(h in allowed for h in (b"authorization", b"content-type", b"x-api-key"))
    assert b"POST" in headers.getRawHeaders(b"access-control-allow-methods", [b""])[0]
    await treq.content(response)
    assert engine.received == []


@pytest_twisted.ensureDeferred
async def test_the_request_itself_still_needs_its_key_and_carries_the_grant(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """After the preflight the request needs a key like any other; its answer, a 401 or the
    node's 200, carries Access-Control-Allow-Origin and Vary: Origin so the page can read it."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], CORS, environ={"NVPAIR_PROXY_API_KEYS": KEY})
    url = await foreign_port(stack, listen)
    client = http_client(reactor)
    refused = await client.post(url + "/api/chat", data=CHAT, headers=sent(Origin=ORIGIN))
    assert refused.code == 401
    assert refused.headers.getRawHeaders(b"access-control-allow-origin") == [ORIGIN.encode()]
    await treq.content(refused)
    served = await client.post(
        url + "/api/chat", data=CHAT, headers=sent(Origin=ORIGIN, Authorization=f"Bearer {KEY}")
    )
    assert served.code == 200
    assert served.headers.getRawHeaders(b"access-control-allow-origin") == [ORIGIN.encode()]
    assert b"Origin" in served.headers.getRawHeaders(b"vary", [b""])[0]
    exposed = served.headers.getRawHeaders(b"access-control-expose-headers", [b""])[0]
    assert b"X-NVPair-Node" in exposed
    await treq.content(served)


@pytest_twisted.ensureDeferred
async def test_another_origin_gets_no_grant_and_a_preflight_is_not_answered_for_it(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """An origin not named: no CORS header from the proxy, and its preflight is an ordinary
    request (here: refused without a key), as with CORS off."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], CORS, environ={"NVPAIR_PROXY_API_KEYS": KEY})
    url = await foreign_port(stack, listen)
    response = await http_client(reactor).request(
        "OPTIONS",
        url + "/api/chat",
        headers=sent(Origin="https://evil.example", Access_Control_Request_Method="POST"),
    )
    assert response.code == 401
    assert response.headers.getRawHeaders(b"access-control-allow-origin") is None
    await treq.content(response)


@pytest_twisted.ensureDeferred
async def test_cors_is_off_by_default(
    reactor: Any, stack: Stack, listen: Callable[[Any], int]
) -> None:
    """Without --cors-origin a preflight is not answered here and no grant is added."""
    engine = SimulatedEngine(reactor, MODEL)
    await stack.start([engine], Settings(), environ={"NVPAIR_PROXY_API_KEYS": KEY})
    url = await foreign_port(stack, listen)
    response = await http_client(reactor).request(
        "OPTIONS",
        url + "/api/chat",
        headers=sent(Origin=ORIGIN, Access_Control_Request_Method="POST"),
    )
    assert response.code == 401
    assert response.headers.getRawHeaders(b"access-control-allow-origin") is None
    await treq.content(response)
