"""Models across nodes (docs/behaviour.md §13.2): ``X-NVPair-Node: *`` or a list runs pull, create,
copy and delete on several nodes at once; delete without the header goes to every owner. Real
facades over simulated engines in memory (``MemoryCluster``), every timer on one ``task.Clock``."""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.core import Settings
from nvpair_tw.nodes import Node
from nvpair_tw.simulated import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import MemoryCluster, MemoryResponse, start_proxy
from tests.corridor.test_relay import PROXY_ALLOWANCE, MiB, kernel_buffer_bound
from tests.helpers import PumpProducer, RecordingProducer

Make = Callable[..., MemoryCluster]
PULL = {"model": "llama3"}
EVERY = {"x-nvpair-node": "*"}


def lines(response: MemoryResponse) -> list[dict[str, Any]]:
    """The NDJSON lines of a response, each parsed (a split or merged line fails here)."""
    return [json.loads(line) for line in response.body.split(b"\n") if line]


def progress_of(response: MemoryResponse, node: str) -> list[dict[str, Any]]:
    """One node's lines, without the tag."""
    return [
        {k: v for k, v in line.items() if k != "nvpair_node"}
        for line in lines(response)
        if line.get("nvpair_node") == node
    ]


def posts_to(engine: SimulatedEngine, path: bytes) -> int:
    return sum(1 for r in engine.received if r.path == path)


def settled(cluster: MemoryCluster, pending: Deferred[MemoryResponse]) -> MemoryResponse:
    """The whole answer once every node had time to answer (b's headers come after 0.5 s)."""
    cluster.advance(5)
    response = cluster.result(pending)
    assert response.complete
    return response


def two_nodes(
    make: Make, clock: Clock, **b: Any
) -> tuple[MemoryCluster, SimulatedEngine, SimulatedEngine]:
    """Nodes a (a line every second) and b (a line every second, half a second later)."""
    a = SimulatedEngine(clock, ("llama3:latest",), chunk_delay=1.0)
    b.setdefault("chunk_delay", 1.0)
    b.setdefault("header_delay", 0.5)
    engine_b = SimulatedEngine(clock, ("llama3:latest", "qwen:latest"), **b)
    return make(clock, {"a": a, "b": engine_b}), a, engine_b


def test_pull_on_every_node_interleaves_both_progress_streams_and_ends_with_success(
    memory_cluster: Make,
) -> None:
    """``X-NVPair-Node: *`` on ``/api/pull``: one 200 NDJSON stream, each node's own progress lines
    tagged with ``nvpair_node`` in arrival order (a, b, a, b, …), then one final success line."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    pending = cluster.request("POST", "/api/pull", json=PULL, headers=EVERY)
    response = cluster.result(pending)
    assert response.status == 200
    assert response.header("content-type") == "application/x-ndjson"
    assert response.header("x-nvpair-node") == "a,b"
    cluster.advance(30)
    assert response.complete
    got = lines(response)
    *progress, final = got
    assert final == {"status": "success", "nodes": {"a": "success", "b": "success"}}
    order = [line["nvpair_node"] for line in progress]
    assert order[:6] == ["a", "b", "a", "b", "a", "b"]
    expected = [
        {"status": "pulling manifest"},
        *[
            {
                "status": "downloading",
                "digest": "sha256:" + "5a" * 32,
                "total": 3000,
                "completed": c,
            }
            for c in (1000, 2000, 3000)
        ],
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]
    assert progress_of(response, "a") == expected
    assert progress_of(response, "b") == expected
    assert posts_to(a, b"/api/pull") == posts_to(b, b"/api/pull") == 1
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["error"], record["fan_out"]) == (200, None, ["a", "b"])
    assert sorted(p["node_id"] for p in record["attempts"]) == ["a", "b"]


def test_a_line_that_arrives_in_pieces_is_relayed_whole(memory_cluster: Make) -> None:
    """Node b writes every line in two halves half a second apart while a's lines arrive in
    between: every chunk the client gets is whole lines, never a half line or two nodes mixed."""
    clock = Clock()
    cluster, _a, _b = two_nodes(memory_cluster, clock, split_lines=True, header_delay=0.25)
    response = cluster.result(cluster.request("POST", "/api/pull", json=PULL, headers=EVERY))
    cluster.advance(60)
    assert response.complete
    for chunk in response.chunks:
        assert chunk.endswith(b"\n"), chunk
        for line in chunk.split(b"\n")[:-1]:
            assert json.loads(line)  # a whole JSON object
    assert len(progress_of(response, "b")) == 7
    assert lines(response)[-1]["status"] == "success"


def test_a_node_error_line_makes_the_pull_partial_with_its_own_text(memory_cluster: Make) -> None:
    """b ends its stream with Ollama's ``{"error": ...}`` line: the line reaches the client
    tagged, a still succeeds, the final line is ``partial`` naming b's error."""
    clock = Clock()
    cluster, _a, _b = two_nodes(memory_cluster, clock, policy=always(Behaviour.ERROR_LINE))
    response = cluster.result(cluster.request("POST", "/api/pull", json=PULL, headers=EVERY))
    cluster.advance(30)
    final = lines(response)[-1]
    assert final == {"status": "partial", "nodes": {"a": "success", "b": "simulated error"}}
    assert {"error": "simulated error", "nvpair_node": "b"} in lines(response)
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["error"]) == (200, "partial")


def test_a_node_cut_mid_stream_is_reported_and_its_half_line_never_sent(
    memory_cluster: Make,
) -> None:
    """b resets in the middle of its progress (and its lines come in halves, so it is cut
    inside a line): the client gets b's whole lines only, then an error line for b, and
    ``partial`` with the drop."""
    clock = Clock()
    cluster, _a, _b = two_nodes(
        memory_cluster, clock, policy=always(Behaviour.DROP_MID_STREAM), split_lines=True
    )
    response = cluster.result(cluster.request("POST", "/api/pull", json=PULL, headers=EVERY))
    cluster.advance(30)
    got = lines(response)  # every line parses: no half line went out
    assert got[-1] == {
        "status": "partial",
        "nodes": {"a": "success", "b": "upstream dropped mid-stream"},
    }
    assert {"error": "upstream dropped mid-stream", "nvpair_node": "b"} in got
    assert len(progress_of(response, "a")) == 7


def test_a_refused_node_and_a_failing_status_each_get_their_own_text(memory_cluster: Make) -> None:
    """A node nobody serves (connection refused) and a node answering 503: both named in an error
    line and in the final line; the healthy node's pull succeeds."""
    clock = Clock()
    healthy = SimulatedEngine(clock, ("llama3:latest",))
    failing = SimulatedEngine(clock, ("llama3:latest",), policy=always(Behaviour.STATUS_503))
    cluster = memory_cluster(
        clock,
        {"a": healthy, "b": failing},
        nodes={"ollama": ["a", "b", Node("gone", "http://gone.node.test:11434", ())]},
    )
    response = cluster.fetch("POST", "/api/pull", json=PULL, headers={"x-nvpair-node": "gone,b,a"})
    final = lines(response)[-1]
    assert final["status"] == "partial"
    assert final["nodes"]["a"] == "success"
    assert final["nodes"]["b"] == "upstream answered 503: simulated 503"
    assert final["nodes"]["gone"].startswith("ConnectionRefusedError")
    assert list(final["nodes"]) == ["gone", "b", "a"]
    errors = {line["nvpair_node"] for line in lines(response) if "error" in line}
    assert errors == {"gone", "b"}


def test_the_client_leaving_cancels_every_node_part(memory_cluster: Make) -> None:
    """The client hangs up mid-stream: both nodes' requests are closed at once (no connection
    left open), nothing more is sent, and the record says 499 with both parts cancelled."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    response = cluster.result(cluster.request("POST", "/api/pull", json=PULL, headers=EVERY))
    cluster.advance(2)
    assert progress_of(response, "a") and progress_of(response, "b")
    assert a._open and b._open  # both nodes are mid-stream
    response.hang_up()
    cluster.flush()
    assert not a._open and not b._open
    assert cluster.network.open == 0
    [record] = cluster.named("proxy/request")
    assert record["status"] == 499
    assert sorted((p["node_id"], p["outcome"]) for p in record["attempts"]) == [
        ("a", "cancelled"),
        ("b", "cancelled"),
    ]


def test_the_client_leaving_before_headers_cancels_every_pending_node(memory_cluster: Make) -> None:
    """Both nodes are still silent (no headers yet) when the client leaves: both pending
    requests are cancelled."""
    clock = Clock()
    frozen = [SimulatedEngine(clock, policy=always(Behaviour.FROZEN)) for _ in range(2)]
    cluster = memory_cluster(clock, {"a": frozen[0], "b": frozen[1]})
    response = cluster.result(cluster.request("POST", "/api/pull", json=PULL, headers=EVERY))
    cluster.advance(1)
    assert all(e._open for e in frozen)
    response.hang_up()
    cluster.flush()
    assert cluster.network.open == 0
    [record] = cluster.named("proxy/request")
    assert record["status"] == 499


def _progress(cluster: MemoryCluster) -> list[tuple[float, dict[str, Any]]]:
    """Each ``fan-out/progress`` event: when (clock seconds) and its payload."""
    return [(e.time, dict(e.payload)) for e in cluster.events if e.name == "fan-out/progress"]


def _parts(payload: dict[str, Any]) -> dict[str, tuple[str, int, int, str | None]]:
    return {
        n["node_id"]: (n["state"], n["completed"], n["total"], n["error"]) for n in payload["nodes"]
    }


def test_a_pull_publishes_each_nodes_progress_at_most_every_half_second_and_its_end(
    memory_cluster: Make,
) -> None:
    """A pull on two nodes sending ten progress lines a second: the first event names both nodes
    as asked, the events in between say how far each node is (its lines' ``completed`` of
    ``total``) no closer than half a second apart, each part's end is published at once, and the
    last event has every part ended with all its bytes done."""
    clock = Clock()
    a = SimulatedEngine(clock, ("llama3:latest",), chunks=20, chunk_delay=0.1)
    b = SimulatedEngine(clock, ("llama3:latest",), chunks=20, chunk_delay=0.1, header_delay=0.05)
    cluster = memory_cluster(clock, {"a": a, "b": b})
    pending = cluster.request("POST", "/api/pull", json=PULL, headers=EVERY)
    for _ in range(40):
        cluster.advance(0.1)
    assert cluster.result(pending).complete
    events = _progress(cluster)
    first, *between, last = [payload for _, payload in events]
    assert {k: first[k] for k in ("engine", "path", "model")} == {
        "engine": "ollama",
        "path": "/api/pull",
        "model": "llama3",
    }
    assert _parts(first) == {"a": ("asked", 0, 0, None), "b": ("asked", 0, 0, None)}
    assert len({payload["id"] for _, payload in events}) == 1
    ends = [t for t, p in events if any(s in ("success",) for s, *_ in _parts(p).values())]
    moving = [t for t, p in events[1:] if t < ends[0]]
    assert len(moving) >= 3  # a two-second pull is seen moving
    assert all(later - earlier >= 0.5 for earlier, later in itertools.pairwise(moving))
    halfway = [_parts(p)["a"] for p in between if _parts(p)["a"][0] == "running"]
    assert any(0 < done < total == 20000 for _, done, total, _ in halfway)
    assert _parts(last) == {
        "a": ("success", 20000, 20000, None),
        "b": ("success", 20000, 20000, None),
    }
    assert len(ends) == 2  # one event as each part ended, the second is the last
    assert events[-1][0] == ends[-1]


def test_a_failed_and_a_cancelled_part_are_published_as_such(memory_cluster: Make) -> None:
    """A node answering 503 is a failed part with its error text; the client leaving makes the
    other part cancelled, in the last event; copy and delete publish no progress."""
    clock = Clock()
    slow = SimulatedEngine(clock, ("llama3:latest",), chunk_delay=1.0)
    failing = SimulatedEngine(clock, ("llama3:latest",), policy=always(Behaviour.STATUS_503))
    cluster = memory_cluster(clock, {"a": slow, "b": failing})
    response = cluster.result(cluster.request("POST", "/api/pull", json=PULL, headers=EVERY))
    cluster.advance(1.5)
    failed = _parts(_progress(cluster)[-1][1])["b"]
    assert failed == ("failed", 0, 0, "upstream answered 503: simulated 503")
    response.hang_up()
    cluster.flush()
    assert _parts(_progress(cluster)[-1][1]) == {"a": ("cancelled", 1000, 3000, None), "b": failed}
    before = len(_progress(cluster))
    cluster.fetch("POST", "/api/copy", json={"source": "llama3", "destination": "x"}, headers=EVERY)
    assert len(_progress(cluster)) == before


def test_an_unknown_id_in_the_list_is_404_and_no_node_is_contacted(memory_cluster: Make) -> None:
    """``X-NVPair-Node: a,zz``: 404 ``unknown-node`` (the name a caller sent is never repeated,
    docs/behaviour.md §14.2), and neither node got the pull."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    response = cluster.fetch("POST", "/api/pull", json=PULL, headers={"x-nvpair-node": "a,zz"})
    assert response.status == 404
    assert response.json() == {
        "error": "X-NVPair-Node names a node this facade does not know",
        "code": "unknown-node",
    }
    assert posts_to(a, b"/api/pull") == posts_to(b, b"/api/pull") == 0


def test_every_node_on_another_route_is_400_and_no_node_is_contacted(memory_cluster: Make) -> None:
    """``*`` or a list on ``/api/chat`` (or ``/api/tags``): 400 ``fan-out-not-supported``."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    chat = {"model": "llama3", "messages": []}
    for method, path, header, body in (
        ("POST", "/api/chat", "*", chat),
        ("GET", "/api/tags", "a,b", None),
    ):
        response = cluster.fetch(method, path, json=body, headers={"x-nvpair-node": header})
        assert response.status == 400
        assert response.json()["code"] == "fan-out-not-supported"
    assert a.received == [] and b.received == []


def test_a_single_id_still_runs_the_call_on_that_node_alone(memory_cluster: Make) -> None:
    """``X-NVPair-Node: b`` on ``/api/pull`` is today's pass-through to b (its stream verbatim)."""
    clock = Clock()
    cluster, a, _b = two_nodes(memory_cluster, clock)
    pending = cluster.request("POST", "/api/pull", json=PULL, headers={"x-nvpair-node": "b"})
    cluster.advance(30)
    response = cluster.result(pending)
    assert response.header("x-nvpair-node") == "b"
    assert all("nvpair_node" not in line for line in lines(response))
    assert lines(response)[-1] == {"status": "success"}
    assert posts_to(a, b"/api/pull") == 0


def test_pull_without_the_header_goes_to_one_node(memory_cluster: Make) -> None:
    """No header: ``/api/pull`` goes to one node as before."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    cluster.result(cluster.request("POST", "/api/pull", json=PULL))
    cluster.advance(30)
    assert posts_to(a, b"/api/pull") + posts_to(b, b"/api/pull") == 1


def test_create_on_a_list_streams_both_nodes_progress(memory_cluster: Make) -> None:
    """``/api/create`` with ``X-NVPair-Node: b,a``: both nodes' progress, then success."""
    clock = Clock()
    cluster, a, _b = two_nodes(memory_cluster, clock)
    body = {"model": "llama3-copy", "from": "llama3"}
    response = cluster.result(
        cluster.request("POST", "/api/create", json=body, headers={"x-nvpair-node": "b, a"})
    )
    cluster.advance(30)
    assert lines(response)[-1] == {"status": "success", "nodes": {"b": "success", "a": "success"}}
    assert progress_of(response, "a")[-1] == {"status": "success"}
    assert [r.body for r in a.received if r.path == b"/api/create"] == [json.dumps(body).encode()]


def test_copy_on_every_node_answers_each_node_status(memory_cluster: Make) -> None:
    """``/api/copy`` on ``*``: 200 and ``{"status": "success", "nodes": {ID: {"status": 200}}}``."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    body = {"source": "llama3", "destination": "llama3-backup"}
    response = settled(cluster, cluster.request("POST", "/api/copy", json=body, headers=EVERY))
    assert response.status == 200
    assert response.json() == {
        "status": "success",
        "nodes": {"a": {"status": 200}, "b": {"status": 200}},
    }
    assert posts_to(a, b"/api/copy") == posts_to(b, b"/api/copy") == 1


def test_delete_on_every_node_where_one_lacks_the_model_is_207(memory_cluster: Make) -> None:
    """``DELETE /api/delete`` of qwen on ``*``: b deletes it, a answers Ollama's 404: 207 with
    a's error text."""
    clock = Clock()
    cluster, _a, _b = two_nodes(memory_cluster, clock)
    pending = cluster.request("DELETE", "/api/delete", json={"model": "qwen"}, headers=EVERY)
    response = settled(cluster, pending)
    assert response.status == 207
    assert response.json() == {
        "status": "partial",
        "nodes": {
            "a": {"status": 404, "error": "upstream answered 404: model 'qwen' not found"},
            "b": {"status": 200},
        },
    }


def test_delete_failing_on_every_node_is_502_with_the_proxy_error(memory_cluster: Make) -> None:
    """Every node fails (one refused, one 503): 502 with ``error``/``code`` and each node's part."""
    clock = Clock()
    failing = SimulatedEngine(clock, ("llama3:latest",), policy=always(Behaviour.STATUS_503))
    cluster = memory_cluster(
        clock,
        {"b": failing},
        nodes={"ollama": ["b", Node("gone", "http://gone.node.test:11434", ())]},
    )
    response = cluster.fetch("DELETE", "/api/delete", json={"model": "llama3"}, headers=EVERY)
    assert response.status == 502
    document = response.json()
    assert (document["error"], document["code"], document["status"]) == (
        "no node succeeded",
        "fan-out-failed",
        "partial",
    )
    assert document["nodes"]["b"] == {
        "status": 503,
        "error": "upstream answered 503: simulated 503",
    }
    assert document["nodes"]["gone"]["status"] == 502


def test_delete_without_the_header_goes_to_every_owner_only(memory_cluster: Make) -> None:
    """No header: ``DELETE /api/delete`` of llama3 goes to a and c (its owners), never to b."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",)),
        "b": SimulatedEngine(clock, ("qwen:latest",)),
        "c": SimulatedEngine(clock, ("llama3:latest", "qwen:latest")),
    }
    cluster = memory_cluster(clock, engines)
    response = cluster.fetch("DELETE", "/api/delete", json={"model": "llama3"})
    assert response.status == 200
    assert response.json() == {
        "status": "success",
        "nodes": {"a": {"status": 200}, "c": {"status": 200}},
    }
    assert [posts_to(engines[n], b"/api/delete") for n in "abc"] == [1, 0, 1]
    [record] = cluster.named("proxy/request")
    assert record["fan_out"] == ["a", "c"]


def test_delete_without_the_header_of_a_model_nobody_has_is_404(memory_cluster: Make) -> None:
    """No owner: 404 ``model-not-found`` with Ollama's text, and no node is contacted."""
    clock = Clock()
    cluster, a, b = two_nodes(memory_cluster, clock)
    response = cluster.fetch("DELETE", "/api/delete", json={"model": "mistral"})
    assert response.status == 404
    assert response.json() == {"error": "model 'mistral' not found", "code": "model-not-found"}
    assert a.received == [] and b.received == []


def test_each_node_gets_its_own_credential_and_no_hop_by_hop_header(memory_cluster: Make) -> None:
    """Each node receives its own bearer key in place of the client's, never the other's, and no
    ``X-NVPair-Node`` or hop-by-hop header."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",), api_key="key-a"),
        "b": SimulatedEngine(clock, ("llama3:latest",), api_key="key-b"),
    }
    nodes = [
        Node("a", "http://a.node.test:11434", ("llama3:latest",), api_key="key-a"),
        Node("b", "http://b.node.test:11434", ("llama3:latest",), api_key="key-b"),
    ]
    cluster = memory_cluster(clock, engines, nodes={"ollama": nodes})
    headers = {**EVERY, "authorization": "Bearer client", "connection": "x-hop", "x-hop": "1"}
    response = cluster.fetch(
        "POST", "/api/copy", json={"source": "x", "destination": "y"}, headers=headers
    )
    assert response.status == 200
    for node_id, engine in engines.items():
        [received] = engine.received
        assert received.headers[b"authorization"] == [f"Bearer key-{node_id}".encode()]
        assert b"x-nvpair-node" not in received.headers and b"x-hop" not in received.headers


def test_a_slow_client_pauses_every_node_body(memory_cluster: Make) -> None:
    """The facade pauses every node's body while the client's transport is full, and resumes them
    all (the merge as the client's producer)."""
    from nvpair_tw.corridor._fanout import _Lines, _Merge

    merge = _Merge(lambda: None)
    bodies = []
    for name in "ab":
        body = _Lines(name, lambda _line: None, merge.paused, lambda _seen: None)
        body.transport = RecordingProducer()  # type: ignore[assignment]
        merge.bodies.append(body)
        bodies.append(body)
    merge.pauseProducing()
    late = _Lines("c", lambda _line: None, merge.paused, lambda _seen: None)
    late.makeConnection(RecordingProducer())  # type: ignore[arg-type]
    merge.resumeProducing()
    assert [b.transport.calls for b in bodies] == [["pause", "resume"]] * 2  # type: ignore[union-attr]
    assert late.transport.calls == ["pause"]  # type: ignore[union-attr]


# --- backpressure over loopback: a client that reads nothing pauses every node -----------------


class ProgressHose(Resource):
    """A node that streams pull progress lines as fast as its transport allows, up to ``total``
    bytes, then ``{"status": "success"}`` (chunked)."""

    isLeaf = True
    LINE = json.dumps({"status": "downloading", "digest": "sha256:" + "5a" * 480}).encode() + b"\n"

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total
        self.sent = 0
        self.pauses = 0
        self.paused = False
        self.stopped = False
        self.finished = False
        self._request: Request | None = None

    def render(self, request: Request) -> int:  # type: ignore[override]
        self._request = request
        request.setHeader(b"content-type", b"application/x-ndjson")
        request.registerProducer(PumpProducer(self), True)
        self.pump()
        return NOT_DONE_YET

    def pump(self) -> None:
        request = self._request
        assert request is not None
        while not self.paused and not self.stopped and self.sent < self.total:
            self.sent += len(self.LINE)
            request.write(self.LINE)
        if self.sent >= self.total and not self.finished and not self.stopped:
            self.finished = True
            request.unregisterProducer()
            request.write(b'{"status":"success"}\n')
            request.finish()


def _read_lines(sock: socket.socket) -> list[bytes]:
    """Blocking (in a thread): read to the close (``Connection: close``), undo the chunked
    framing; the body's lines."""
    sock.setblocking(True)
    sock.settimeout(30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
    raw = bytearray()
    while data := sock.recv(1 << 20):
        raw += data
    _head, _, rest = bytes(raw).partition(b"\r\n\r\n")
    body, view = bytearray(), memoryview(rest)
    offset = 0
    while True:
        line_end = rest.index(b"\r\n", offset)
        size = int(rest[offset:line_end].split(b";")[0], 16)
        if size == 0:
            return bytes(body).split(b"\n")
        body += view[line_end + 2 : line_end + 2 + size]
        offset = line_end + 2 + size + 2


@pytest_twisted.ensureDeferred
async def test_a_client_that_reads_nothing_pauses_every_node_of_a_pull(
    reactor: Any, listen: Callable[[Any], int]
) -> None:
    """Two nodes offer 64 MiB of progress each to a client that reads nothing: both are paused
    once the socket buffers are full, each having sent no more than those buffers hold plus
    PROXY_ALLOWANCE; once the client reads, every line arrives whole and the pull succeeds."""
    total = 64 * MiB
    limit = kernel_buffer_bound(client_rcvbuf=4096) + PROXY_ALLOWANCE
    assert limit < total, "the kernel's socket buffers could hold the whole stream"
    hoses = {"a": ProgressHose(total), "b": ProgressHose(total)}
    nodes = []
    for node_id, hose in hoses.items():
        site = Site(hose)
        site.noisy = False
        nodes.append(Node(node_id, f"http://127.0.0.1:{listen(site)}", ("llama3:latest",)))
    proxy = await start_proxy(reactor, {"ollama": nodes}, Settings(write_stall_timeout=120.0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", int(proxy.url().rsplit(":", 1)[1])))
        body = json.dumps(PULL).encode()
        sock.sendall(
            b"POST /api/pull HTTP/1.1\r\nHost: localhost\r\nX-NVPair-Node: *\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        sock.setblocking(False)
        stable, last = 0, (-1, -1)
        for _ in range(200):  # at most 20 s: the streams either stall or run to the end
            await deferLater(reactor, 0.1, lambda: None)
            sent = (hoses["a"].sent, hoses["b"].sent)
            paused = all(h.paused for h in hoses.values())
            stable = stable + 1 if paused and sent == last else 0
            last = sent
            if stable >= 5 or all(h.finished for h in hoses.values()):
                break
        for hose in hoses.values():
            assert not hose.finished
            assert hose.paused and hose.pauses > 0
            assert hose.sent <= limit, (hose.sent, limit)
        received = await deferToThread(_read_lines, sock)
    finally:
        sock.close()
        await proxy.stop()
    *progress, final, _empty = received
    assert json.loads(final) == {"status": "success", "nodes": {"a": "success", "b": "success"}}
    assert len(progress) == 2 * (-(-total // len(ProgressHose.LINE)) + 1)
    assert all(json.loads(line)["nvpair_node"] in ("a", "b") for line in progress[:1000])
