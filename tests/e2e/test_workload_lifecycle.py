"""Acceptance checks of the workloads issue over real loopback sockets.

Every inference request is one workload with one id across failover, ends with exactly one terminal
event whatever way it ends (completed, failed upstream, cancelled by the client or by request), and
a consumer of the event bus that stops reading never holds the requests back.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import pytest_twisted
import treq
from attrs import define
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from nvpair_tw.events import Event
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    ProxyCluster,
    SimulatedEngine,
    always,
    http_client,
)
from tests.helpers import chat_body, eventually

pytestmark = pytest.mark.e2e

TERMINAL = ("workload:completed", "workload:errored")


class Reader(Protocol):
    """Reads a streamed body; hangs up after ``cut`` frames, or on the terminal frame if asked.

    ``done`` fires with ``"complete"`` (clean end) or ``"broken"`` (aborted either side).
    """

    def __init__(self, separator: bytes, cut: int | None = None, terminal: bytes | None = None):
        self.done: Deferred[str] = Deferred()
        self.data = b""
        self._separator = separator
        self._cut = cut
        self._terminal = terminal

    def connectionMade(self) -> None:
        if self._cut == 0:
            self._hang_up()

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        cut = self._cut is not None and self.data.count(self._separator) >= self._cut
        if cut or (self._terminal is not None and self._terminal in self.data):
            self._hang_up()

    def _hang_up(self) -> None:
        assert self.transport is not None
        self.transport.stopProducing()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        clean = reason.check(ResponseDone, PotentialDataLoss) is not None
        self.done.callback("complete" if clean else "broken")


@define
class Cluster(ProxyCluster):
    """A proxy cluster that also streams responses into a reader and picks out workload events."""

    async def stream(self, path: str, data: bytes, reader: Reader) -> str:
        """POST and read the body with ``reader``; its outcome."""
        response = await http_client(self.reactor).post(self.url + path, data=data, unbuffered=True)
        response.deliverBody(reader)
        return await reader.done

    def workload_events(self) -> list[Event]:
        return [e for e in self.events if e.name.startswith("workload:")]

    def terminals(self) -> list[dict[str, Any]]:
        return [dict(e.payload["workload"]) for e in self.events if e.name in TERMINAL]


@pytest.fixture
def cluster(clusters: Clusters) -> Cluster:
    """A cluster stopped (proxy, then engines) after the test."""
    return clusters(Cluster)


def engine(
    reactor: Any, models: tuple[str, ...], behaviour: Behaviour, **kw: Any
) -> SimulatedEngine:
    """A simulated engine with one behaviour for every request."""
    return SimulatedEngine(reactor, models, always(behaviour), **kw)


@pytest_twisted.ensureDeferred
async def test_failover_is_one_workload_with_a_running_event_per_node(
    reactor: Any, cluster: Cluster
) -> None:
    """started(A), started(B), completed(B) with one id; the record lists both attempts; the response
    names the serving node and the record's request id."""
    await cluster.start(
        {
            "a": engine(reactor, ("llama3:latest",), Behaviour.STATUS_503),
            "b": engine(reactor, ("llama3:latest",), Behaviour.HEALTHY),
        }
    )
    response = await http_client(reactor).post(cluster.url + "/api/chat", data=chat_body("llama3"))
    await treq.content(response)
    assert response.code == 200
    workload = [
        (e.name, e.payload["workload"]["scheduledOn"], e.payload["workload"]["id"])
        for e in cluster.workload_events()
    ]
    ident = workload[0][2]
    assert workload == [
        ("workload:started", "a", ident),
        ("workload:started", "b", ident),
        ("workload:completed", "b", ident),
    ]
    [record] = cluster.named("proxy/request")
    assert [(a["node_id"], a["outcome"]) for a in record["attempts"]] == [
        ("a", "status-503"),
        ("b", "committed"),
    ]
    assert (record["node_id"], record["status"]) == ("b", 200)
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"b"]
    assert response.headers.getRawHeaders(b"x-nvpair-request-id") == [record["id"].encode()]


@pytest_twisted.ensureDeferred
async def test_many_streams_ending_every_way_each_end_exactly_once(
    reactor: Any, cluster: Cluster
) -> None:
    """200 concurrent streams: a third cut by their clients at random points, a third dropped
    upstream mid-stream, a third completing; each workload ends once, in the right state."""
    frames = dict(chunks=20, chunk_delay=0.01)
    await cluster.start(
        {
            "steady": engine(reactor, ("ok:latest", "cut:latest"), Behaviour.HEALTHY, **frames),
            "flaky": engine(reactor, ("drops:latest",), Behaviour.DROP_MID_STREAM, **frames),
        }
    )
    rng = random.Random(20240601)
    plan = [*["ok"] * 66, *["cut"] * 67, *["drops"] * 67]
    rng.shuffle(plan)
    pending: list[Deferred[str]] = []
    # Batches below the listen backlog (50), each admitted before the next, so none waits for a
    # SYN retry; cuts happen before frame 13 of 21, far from the end of the stream.
    for start in range(0, len(plan), 40):
        for model in plan[start : start + 40]:
            reader = Reader(b"\n", cut=rng.randrange(0, 13) if model == "cut" else None)
            pending.append(
                Deferred.fromCoroutine(cluster.stream("/api/chat", chat_body(model), reader))
            )
        await eventually(reactor, lambda: len(cluster.named("workload:started")) >= len(pending))
    outcomes = await gatherResults(pending)
    assert Counter(zip(plan, outcomes, strict=True)) == Counter(
        {("ok", "complete"): 66, ("cut", "broken"): 67, ("drops", "broken"): 67}
    )
    await eventually(reactor, lambda: len(cluster.terminals()) >= 200)
    assert cluster.proxy is not None
    assert cluster.proxy.runtime.shared.workloads.live() == []
    terminals = cluster.terminals()
    assert len({t["id"] for t in terminals}) == len(terminals) == 200
    assert Counter((t["model"], t["state"], t["error"]) for t in terminals) == Counter(
        {
            ("ok", "completed", None): 66,
            ("cut", "cancelled", "client disconnected"): 67,
            ("drops", "failed", "upstream dropped mid-stream"): 67,
        }
    )
    last_seq: dict[int, int] = {}
    for event in cluster.workload_events():
        info = event.payload["workload"]
        assert info["seq"] > last_seq.get(info["id"], 0), "an event after the terminal one"
        last_seq[info["id"]] = info["seq"]
    assert all(t["seq"] == last_seq[t["id"]] for t in terminals)


@pytest.mark.parametrize(
    ("path", "extra", "terminal"),
    [
        ("/api/chat", {}, b'"done": true'),
        ("/v1/chat/completions", {"stream": True}, b"data: [DONE]"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_client_leaving_right_after_the_terminal_frame_is_completed(
    reactor: Any, cluster: Cluster, path: str, extra: dict[str, Any], terminal: bytes
) -> None:
    """The engine lingers after its terminal frame; a client hanging up on that frame got its whole
    answer, so the workload is completed, not cancelled."""
    await cluster.start(
        {"a": engine(reactor, ("llama3:latest",), Behaviour.HEALTHY, chunks=1, chunk_delay=0.3)}
    )
    reader = Reader(b"\n", terminal=terminal)
    outcome = await cluster.stream(path, chat_body("llama3", **extra), reader)
    assert outcome == "broken" and terminal in reader.data
    await eventually(reactor, lambda: bool(cluster.terminals()))
    [ended] = cluster.terminals()
    assert (ended["state"], ended["error"]) == ("completed", None)
    await eventually(reactor, lambda: bool(cluster.named("proxy/request")))
    [record] = cluster.named("proxy/request")
    assert record["error"] is None


@pytest_twisted.ensureDeferred
async def test_workload_cancel_aborts_a_live_stream(reactor: Any, cluster: Cluster) -> None:
    """``workload/cancel`` on a streaming workload aborts the client's stream; the terminal event
    says cancelled by request, not client disconnected."""
    await cluster.start(
        {"a": engine(reactor, ("llama3:latest",), Behaviour.HEALTHY, chunks=50, chunk_delay=0.05)}
    )
    assert cluster.proxy is not None
    workloads = cluster.proxy.runtime.shared.workloads
    reader = Reader(b"\n")
    streaming = Deferred.fromCoroutine(cluster.stream("/api/chat", chat_body("llama3"), reader))
    await eventually(reactor, lambda: reader.data.count(b"\n") >= 2)
    [live] = workloads.live()
    assert not workloads.cancel(live.id + 1)
    assert workloads.cancel(live.id)
    assert await streaming == "broken"
    assert reader.data.count(b"\n") < 50
    await eventually(reactor, lambda: bool(cluster.terminals()))
    [ended] = cluster.terminals()
    assert (ended["id"], ended["state"]) == (live.id, "cancelled")
    assert ended["error"] == "cancelled by request"
    assert workloads.live() == []


@pytest_twisted.ensureDeferred
async def test_subscriber_that_never_reads_is_dropped_without_slowing_requests(
    reactor: Any, cluster: Cluster
) -> None:
    """A paused bus subscriber queues up to its bound while requests complete, then is dropped and
    its queue freed; requests keep completing and other subscribers keep receiving."""
    await cluster.start({"a": engine(reactor, ("llama3:latest",), Behaviour.HEALTHY)})
    assert cluster.proxy is not None
    bus = cluster.proxy.runtime.shared.bus

    def never_called(event: Event) -> None:
        raise AssertionError("a paused subscriber was handed an event")

    stuck = bus.subscribe(never_called, name="stuck", max_pending=20)
    stuck.pause()

    async def ask(n: int) -> int:
        response = await http_client(reactor).post(
            cluster.url + "/api/chat", data=chat_body("llama3", f"q{n}")
        )
        await treq.content(response)
        return int(response.code)

    assert [await ask(n) for n in range(2)] == [200] * 2
    assert stuck.active and stuck.pending == len(cluster.events) <= 20
    assert [await ask(n) for n in range(2, 15)] == [200] * 13
    assert not stuck.active and stuck.pending == 0
    assert stuck.dropped == "more than 20 events pending"
    assert stuck not in bus.subscriptions
    assert len(cluster.named("workload:completed")) == 15
    assert len(cluster.named("proxy/request")) == 15
