"""The lmstudio facade's WebSocket tunnel over real sockets, with the ``websockets`` library as the
client and WebSocket echo nodes (``websockets`` servers in a child process, so the file
descriptors of this process are the proxy's and the client's only)."""

from __future__ import annotations

import base64
import gc
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.defer import gatherResults
from twisted.internet.interfaces import IAddress
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python import usage
from twisted.web.resource import Resource
from twisted.web.server import Site
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from nvpair_tw.core import IllegalCall
from nvpair_tw.core._resolved import Settings
from nvpair_tw.corridor._facade import FacadeResource
from nvpair_tw.corridor._tunnel import Tunnel, TunnelBook, TunnelState
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import StatusBoard
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.tap import Options
from nvpair_tw.testing import Clusters, ProxyCluster
from tests.helpers import eventually

MIB = 1024 * 1024
FLOOD = 48
"""Messages of 1 MiB the node sends at once for the slow-reader test (far more than the kernel's
socket buffers hold, so the proxy must pause the node)."""

_ECHO = r"""
import json
import sys
import threading
from websockets.sync.server import serve

label = sys.argv[1]

def handler(ws):
    for message in ws:
        if message == "whoami":
            seen = ws.request.headers.get_all("authorization")
            ws.send(json.dumps({"label": label, "path": ws.request.path, "authorization": seen}))
        elif message == "close-me":
            ws.close()
            return
        elif message == "deaf":
            threading.Event().wait()  # never reads again
        elif message == "flood":
            for i in range(FLOOD):
                ws.send(bytes([i % 256]) * MIB)
        else:
            ws.send(message)

with serve(handler, "127.0.0.1", 0, max_size=None, compression=None) as server:
    print(server.socket.getsockname()[1], flush=True)
    server.serve_forever()
""".replace("FLOOD", str(FLOOD)).replace("MIB", str(MIB))


class _Echo:
    def __init__(self, label: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ECHO, label], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def echoes() -> Iterator[dict[str, _Echo]]:
    """Two WebSocket echo nodes, ``a`` and ``b``."""
    made = {label: _Echo(label) for label in ("a", "b")}
    yield made
    for echo in made.values():
        echo.stop()


class LMStudioCluster(ProxyCluster):
    def ws(self, path: str = "/llm") -> str:
        return self.url.replace("http://", "ws://") + path

    @property
    def book(self) -> TunnelBook:
        assert self.proxy is not None
        return self.proxy.runtime.shared.tunnels


def _client(url: str, headers: dict[str, str] | None = None) -> ClientConnection:
    return connect(
        url,
        additional_headers=headers or {},
        max_size=None,
        max_queue=1,
        compression=None,
        open_timeout=30,
        close_timeout=30,
    ).__enter__()


def _whoami(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    with _client(url, headers) as ws:
        ws.send("whoami")
        answer: dict[str, Any] = json.loads(ws.recv(timeout=30))
        return answer


async def _cluster(
    clusters: Clusters, nodes: list[Node], settings: Settings | None = None
) -> LMStudioCluster:
    cluster = clusters(LMStudioCluster)
    cluster.engine_name = "lmstudio"
    await cluster.start_proxy(nodes, settings)
    return cluster


def _when_paused(side: str, event: threading.Event) -> Callable[[Tunnel, str], None]:
    """An ``on_pause`` hook that sets ``event`` when ``side``'s reading is paused."""

    def note(tunnel: Tunnel, paused: str) -> None:
        if paused == side:
            event.set()

    return note


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest_twisted.ensureDeferred
async def test_text_frames_and_a_1_mib_binary_frame_come_back_byte_for_byte(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    big = os.urandom(MIB)

    def talk() -> list[str | bytes]:
        with _client(cluster.ws()) as ws:
            got: list[str | bytes] = []
            for message in ("hello", "ünïcode ✓", big, "x" * 70000):
                ws.send(message)
                got.append(ws.recv(timeout=30))
            return got

    got = await deferToThread(talk)
    assert got == ["hello", "ünïcode ✓", big, "x" * 70000]


@pytest_twisted.ensureDeferred
async def test_the_node_key_replaces_the_client_authorization_and_the_path_is_kept(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url, api_key="node-key-1")])
    seen = await deferToThread(
        _whoami, cluster.ws("/system?x=1"), {"authorization": "Bearer client-own"}
    )
    assert seen == {"label": "a", "path": "/system?x=1", "authorization": ["Bearer node-key-1"]}


@pytest_twisted.ensureDeferred
async def test_a_cooling_node_is_not_chosen_while_a_ready_one_exists(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url), Node("b", echoes["b"].url)])
    first = await deferToThread(_whoami, cluster.ws())
    cluster.facade.stalls.cool("a", "test")
    try:
        second = await deferToThread(_whoami, cluster.ws())
    finally:
        cluster.facade.stalls.clear("a")
    assert (first["label"], second["label"]) == ("a", "b")


@pytest_twisted.ensureDeferred
async def test_x_nvpair_node_targets_one_node_and_is_not_forwarded(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url), Node("b", echoes["b"].url)])
    seen = await deferToThread(_whoami, cluster.ws(), {"x-nvpair-node": "b"})
    assert seen["label"] == "b"


class _Refusing(Resource):
    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        request.setResponseCode(403)
        request.setHeader(b"content-type", b"application/json")
        return b'{"error":"forbidden here"}'


@pytest.fixture
def refusing(listen: Callable[[Any], int]) -> str:
    """A node that answers every upgrade with 403 and a JSON body."""
    return f"http://127.0.0.1:{listen(Site(_Refusing()))}"


@pytest.fixture
def dead(listen: Callable[[Any], int], reactor: Any) -> Iterator[str]:
    """A URL where nothing listens (connection refused)."""
    port = reactor.listenTCP(0, Site(_Refusing()), interface="127.0.0.1")
    number = port.getHost().port
    pytest_twisted.blockon(port.stopListening())
    yield f"http://127.0.0.1:{number}"


@pytest_twisted.ensureDeferred
async def test_a_refused_and_a_non_101_node_move_the_upgrade_on_to_the_next(
    clusters: Clusters, echoes: dict[str, _Echo], refusing: str, dead: str
) -> None:
    nodes = [Node("a", dead), Node("b", refusing), Node("c", echoes["b"].url)]
    cluster = await _cluster(clusters, nodes)
    seen = await deferToThread(_whoami, cluster.ws())
    assert seen["label"] == "b"  # echo "b" listens as node c
    record = [e for e in cluster.events if e.name == "proxy/request"][-1]
    attempts = [(a["node_id"], a["outcome"]) for a in record.payload["attempts"]]
    assert attempts == [("a", "connect-error"), ("b", "status-403"), ("c", "committed")]
    assert (record.payload["status"], record.payload["node_id"]) == (101, "c")


@pytest_twisted.ensureDeferred
async def test_the_last_node_non_101_answer_is_the_client_answer(
    clusters: Clusters, refusing: str, dead: str
) -> None:
    cluster = await _cluster(clusters, [Node("a", dead), Node("b", refusing)])

    def refused() -> tuple[int, bytes]:
        with pytest.raises(InvalidStatus) as caught:
            _client(cluster.ws())
        return caught.value.response.status_code, bytes(caught.value.response.body or b"")

    assert await deferToThread(refused) == (403, b'{"error":"forbidden here"}')
    assert cluster.book.tunnels == set()


@pytest_twisted.ensureDeferred
async def test_beyond_max_tunnels_the_upgrade_gets_503_too_many_tunnels(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)], Settings(max_tunnels=1))
    held = await deferToThread(_client, cluster.ws())
    try:

        def second() -> tuple[int, Any]:
            with pytest.raises(InvalidStatus) as caught:
                _client(cluster.ws())
            response = caught.value.response
            return response.status_code, json.loads(response.body or b"")

        status, body = await deferToThread(second)
    finally:
        await deferToThread(held.close)
    assert (status, body["code"]) == (503, "too-many-tunnels")


def _raw_upgrade(url: str) -> socket.socket:
    """A bare TCP client that did the WebSocket handshake (to close without a closing handshake)."""
    host, port = url.removeprefix("ws://").split("/")[0].split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    conn.sendall(
        b"GET /llm HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(4096)
    assert head.startswith(b"HTTP/1.1 101 ")
    return conn


def _masked(opcode: int, payload: bytes) -> bytes:
    """A client frame with an all-zero mask (the payload goes as it is); at most 65535 bytes."""
    if len(payload) < 126:
        size = bytes([0x80 | len(payload)])
    else:
        size = bytes([0x80 | 126]) + len(payload).to_bytes(2, "big")
    return bytes([0x80 | opcode]) + size + b"\0\0\0\0" + payload


@pytest_twisted.ensureDeferred
async def test_closing_the_client_closes_the_node_and_the_count_follows(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    conn = await deferToThread(_raw_upgrade, cluster.ws())
    [tunnel] = cluster.book.tunnels
    assert cluster.book.count("lmstudio", "a") == 1
    conn.close()  # no closing handshake: only the proxy can end the node's connection
    await tunnel.closed  # fires once the node's connection is gone as well
    assert (tunnel.state, cluster.book.count("lmstudio", "a")) == (TunnelState.CLOSED, 0)


@pytest_twisted.ensureDeferred
async def test_closing_the_node_closes_the_client(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    conn = await deferToThread(_raw_upgrade, cluster.ws())
    [tunnel] = cluster.book.tunnels

    def ask_close() -> bytes:
        conn.sendall(_masked(0x1, b"close-me"))
        got = b""
        while chunk := conn.recv(4096):  # until the proxy closes (a timeout raises)
            if got == b"" and chunk[:1] == b"\x88":
                conn.sendall(_masked(0x8, b""))  # answer the node's close frame
            got += chunk
        return got

    try:
        got = await deferToThread(ask_close)
    finally:
        conn.close()
    assert got[:1] == b"\x88"  # the node's close frame, then the end of the connection
    await tunnel.closed


@pytest_twisted.ensureDeferred
async def test_a_slow_reader_pauses_the_node_and_the_proxy_holds_little(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    paused = threading.Event()
    cluster.book.on_pause = _when_paused("node", paused)

    def slow() -> tuple[bool, int, bool]:
        with _client(cluster.ws()) as ws:
            ws.send("flood")
            stalled = paused.wait(60)  # the node's reading is paused before we read a byte
            peak = cluster.book.peak_held
            ok = all(ws.recv(timeout=60) == bytes([i]) * MIB for i in range(FLOOD))
            return stalled, peak, ok

    stalled, peak, ok = await deferToThread(slow)
    assert (stalled, ok) == (True, True)
    assert peak < 512 * 1024, f"the proxy held {peak} bytes for a reader that stopped"


@pytest_twisted.ensureDeferred
async def test_a_hundred_concurrent_tunnels_leak_no_connection(
    reactor: Any, clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(
        clusters,
        [Node("a", echoes["a"].url), Node("b", echoes["b"].url)],
        Settings(max_tunnels=100),
    )
    warm = await deferToThread(_client, cluster.ws())  # warm up: thread pool, first connection
    [first] = cluster.book.tunnels
    await deferToThread(warm.close)
    await first.closed
    gc.collect()
    baseline = _open_fds()
    sockets = await deferToThread(lambda: [_client(cluster.ws()) for _ in range(100)])
    tunnels = list(cluster.book.tunnels)
    counts = (cluster.book.count("lmstudio", "a"), cluster.book.count("lmstudio", "b"))

    def echo_and_close() -> bool:
        same = True
        for i, ws in enumerate(sockets):
            ws.send(f"m{i}")
            same = same and ws.recv(timeout=30) == f"m{i}"
        for ws in sockets:
            ws.close()
        return same

    assert await deferToThread(echo_and_close)
    await gatherResults([t.closed for t in tunnels])
    assert (len(tunnels), sum(counts)) == (100, 100)
    # The node polls keep a pooled connection or two to each echo node, opened at any moment: a
    # leak of the tunnels' connections would be a hundred or more.
    await eventually(
        reactor, lambda: _open_fds() <= baseline + 4, 5.0, "the baseline of open fds (± 4)"
    )


@pytest_twisted.ensureDeferred
async def test_open_tunnels_show_in_the_state_json_and_metrics(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    assert cluster.proxy is not None
    runtime = cluster.proxy.runtime
    ws = await deferToThread(_client, cluster.ws())
    board, metrics = StatusBoard(runtime), ProxyMetrics(runtime)
    try:
        [node] = board.state(lambda engine: True)["facades"][0]["nodes"]
        text = metrics.exposition().decode()
    finally:
        board.close()
        metrics.close()
        await deferToThread(ws.close)
    assert (node["tunnels"], node["inFlight"]) == (1, 1)
    assert 'nvpair_open_tunnels{engine="lmstudio",node="a"} 1.0' in text


class _ForeignPeer(ProtocolWrapper):
    """Makes the wrapped channel see a non-loopback peer (the socket stays on loopback)."""

    def getPeer(self) -> IAddress:
        return IPv4Address("TCP", "203.0.113.9", 40000)


@pytest_twisted.ensureDeferred
async def test_ingress_keys_apply_to_the_upgrade_and_are_not_forwarded(
    clusters: Clusters, echoes: dict[str, _Echo], listen: Callable[[Any], int]
) -> None:
    cluster = clusters(LMStudioCluster)
    cluster.engine_name = "lmstudio"
    await cluster.start_proxy(
        [Node("a", echoes["a"].url)], environ={"NVPAIR_PROXY_API_KEYS": "ingress-key-1"}
    )
    wrapped = WrappingFactory(FacadeResource(cluster.facade).site(clock=cluster.reactor))
    wrapped.protocol = _ForeignPeer
    url = f"ws://127.0.0.1:{listen(wrapped)}/llm"

    def without_key() -> int:
        with pytest.raises(InvalidStatus) as caught:
            _client(url)
        return caught.value.response.status_code

    assert await deferToThread(without_key) == 401
    seen = await deferToThread(_whoami, url, {"authorization": "Bearer ingress-key-1"})
    assert (seen["label"], seen["authorization"]) == ("a", [])


def test_max_tunnels_is_an_option() -> None:
    options = Options()
    options.parseOptions(["--engine", "lmstudio", "--max-tunnels", "5"])
    assert options.config.settings.max_tunnels == 5
    with pytest.raises(usage.UsageError, match="max-tunnels"):
        Options().parseOptions(["--engine", "lmstudio", "--max-tunnels", "0"])


def test_a_tunnel_refuses_calls_its_state_does_not_allow() -> None:
    book = TunnelBook(2)
    tunnel = book.admit("lmstudio")
    assert isinstance(tunnel, Tunnel)
    with pytest.raises(IllegalCall):
        tunnel.client_data(b"x")
    with pytest.raises(IllegalCall):
        tunnel.node_lost()
    tunnel.close()
    assert (tunnel.state, tunnel.closed.called, book.tunnels) == (TunnelState.CLOSED, True, set())
    with pytest.raises(IllegalCall):
        tunnel.node_data(b"x")


def test_the_book_admits_up_to_its_limit() -> None:
    book = TunnelBook(1)
    first = book.admit("lmstudio")
    assert first is not None and book.admit("lmstudio") is None
    first.close()
    assert book.admit("lmstudio") is not None


@pytest_twisted.ensureDeferred
async def test_stopping_the_proxy_closes_open_tunnels_on_both_sides(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    conn = await deferToThread(_raw_upgrade, cluster.ws())
    [tunnel] = cluster.book.tunnels
    cluster.book.close_all()  # what Runtime.stop does
    assert tunnel._node.disconnecting  # the node's connection is being closed now
    try:
        await tunnel.closed  # both connections gone
        eof = await deferToThread(conn.recv, 1)
    finally:
        conn.close()
    assert (eof, cluster.book.tunnels) == (b"", set())


@pytest_twisted.ensureDeferred
async def test_a_node_that_stops_reading_pauses_the_client_and_the_proxy_holds_little(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    paused = threading.Event()
    cluster.book.on_pause = _when_paused("client", paused)
    conn = await deferToThread(_raw_upgrade, cluster.ws())
    frame = _masked(0x2, b"z" * 60000)

    def flood() -> None:
        conn.sendall(_masked(0x1, b"deaf"))
        try:
            for _ in range(1000):  # 60 MB: far more than the socket buffers on the way hold
                conn.sendall(frame)
        except OSError:
            pass  # the test shut the socket once the proxy paused us

    sender = threading.Thread(target=flood)
    sender.start()
    try:
        stalled = await deferToThread(paused.wait, 60)
    finally:
        conn.shutdown(socket.SHUT_RDWR)
        await deferToThread(sender.join)
        conn.close()
    assert stalled
    assert cluster.book.peak_held < 512 * 1024


@pytest_twisted.ensureDeferred
async def test_bytes_sent_before_the_101_reach_the_node_after_it(
    clusters: Clusters, echoes: dict[str, _Echo]
) -> None:
    """A client that pipelines a frame behind its upgrade request: the channel buffered it, the
    hand-over passes it on."""
    cluster = await _cluster(clusters, [Node("a", echoes["a"].url)])
    port = int(cluster.url.rsplit(":", 1)[1])

    def eager() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(
                b"GET /llm HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                + _masked(0x1, b"early bird")
            )
            got = b""
            while not got.endswith(b"early bird"):
                chunk = conn.recv(4096)
                assert chunk, got
                got += chunk
            return got

    got = await deferToThread(eager)
    assert got.startswith(b"HTTP/1.1 101 ")
    assert got.endswith(b"\x81\x0aearly bird")  # the node's unmasked text frame


# ---- the node's head read by the node client's parser (issue 20) --------------------------------

_GAP = 0.05
"""Seconds between a raw node's writes: each piece reaches the proxy in a read of its own."""


class _RawNode(Protocol):
    """Answers an upgrade request with ``pieces(request)``, one write every ``_GAP`` seconds (any
    other request with a 404); after the answer, any byte from the proxy closes the connection."""

    def __init__(self, reactor: Any, pieces: Callable[[bytes], list[bytes]]) -> None:
        self._reactor = reactor
        self._pieces = pieces
        self._request = b""
        self._answered = False

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        if self._answered:
            self.transport.loseConnection()
            return
        self._request += data
        if b"\r\n\r\n" not in self._request:
            return
        self._answered = True
        if b"upgrade: websocket" not in self._request.lower():  # the proxy's inventory polls
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            self.transport.loseConnection()
        else:
            for i, piece in enumerate(self._pieces(self._request)):
                self._reactor.callLater(_GAP * i, self.transport.write, piece)


def _raw_node(
    reactor: Any, listen: Callable[[Any], int], pieces: Callable[[bytes], list[bytes]]
) -> str:
    return f"http://127.0.0.1:{listen(Factory.forProtocol(lambda: _RawNode(reactor, pieces)))}"


def _accept(request: bytes) -> bytes:
    """``Sec-WebSocket-Accept`` for the request's key (RFC 6455 §4.2.2)."""
    [key] = [
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    ]
    digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    return base64.b64encode(digest)


@pytest_twisted.ensureDeferred
async def test_a_chunked_refusal_split_across_reads_is_relayed_to_the_client(
    clusters: Clusters, reactor: Any, listen: Callable[[Any], int]
) -> None:
    """The node client's parser frames a chunked non-101 answer: the client gets the node's
    status, its end-to-end headers and the decoded body (the old head reader refused it: 502)."""

    def refusal(request: bytes) -> list[bytes]:
        return [
            b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nTrans",
            b'fer-Encoding: chunked\r\n\r\n9\r\n{"err',
            b'or":\r\nd\r\n"chunked no"}\r\n',
            b"0\r\n\r\n",
        ]

    cluster = await _cluster(clusters, [Node("a", _raw_node(reactor, listen, refusal))])

    def refused() -> tuple[int, str | None, bytes]:
        with pytest.raises(InvalidStatus) as caught:
            _client(cluster.ws())
        response = caught.value.response
        return response.status_code, response.headers.get("content-type"), bytes(response.body)

    assert await deferToThread(refused) == (403, "application/json", b'{"error":"chunked no"}')
    record = [e for e in cluster.events if e.name == "proxy/request"][-1]
    attempts = [(a["node_id"], a["outcome"]) for a in record.payload["attempts"]]
    assert attempts == [("a", "status-403")]
    assert record.payload["status"] == 403
    assert cluster.book.tunnels == set()


@pytest_twisted.ensureDeferred
async def test_a_101_head_split_across_reads_is_relayed_verbatim_and_spliced(
    clusters: Clusters, reactor: Any, listen: Callable[[Any], int]
) -> None:
    """A 101 head cut mid-line over three reads, then a frame: the client completes its handshake
    with the node's own ``Sec-WebSocket-Accept`` and receives the frame."""

    def switching(request: bytes) -> list[bytes]:
        return [
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConne",
            b"ction: Upgrade\r\nSec-WebSocket-Acc",
            b"ept: " + _accept(request) + b"\r\n\r\n",
            b"\x81\x05hello",  # an unmasked text frame
        ]

    cluster = await _cluster(clusters, [Node("a", _raw_node(reactor, listen, switching))])

    def hello() -> str | bytes:
        with _client(cluster.ws()) as ws:
            return ws.recv(timeout=30)

    assert await deferToThread(hello) == "hello"
    record = [e for e in cluster.events if e.name == "proxy/request"][-1]
    attempts = [(a["node_id"], a["outcome"]) for a in record.payload["attempts"]]
    assert attempts == [("a", "committed")]
    assert record.payload["status"] == 101
