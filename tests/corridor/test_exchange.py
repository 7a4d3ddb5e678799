"""One request's walk and its conclusion (nvpair_tw.corridor._exchange), in memory: what each relay outcome
does to the workload, the affinity table and the record, the small parsers at the door, and the
deadline's view of a busy node (busy waits and the cold-load allowance, docs/behaviour.md §6.4)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from attrs import define, field
from twisted.internet.task import Clock
from twisted.web.server import Request

from nvpair_tw.core._resolved import Settings
from nvpair_tw.selection._inventory import InventoryBook
from nvpair_tw.simulated._engine import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]
TURN = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def cluster_of(memory_cluster: Make, **engines: SimulatedEngine) -> tuple[MemoryCluster, Clock]:
    clock = next(iter(engines.values())).clock
    assert isinstance(clock, Clock)
    return memory_cluster(clock, dict(engines)), clock


def terminal(cluster: MemoryCluster) -> list[tuple[str, str | None, str | None]]:
    """(event, state, error) of every terminal workload event."""
    return [
        (e.name, e.payload["workload"]["state"], e.payload["workload"]["error"])
        for e in cluster.events
        if e.name in ("workload:completed", "workload:errored")
    ]


def test_a_finished_stream_completes_the_workload_and_records_affinity(
    memory_cluster: Make,
) -> None:
    """FINISHED with the terminal frame: completed, and turn 2 of the conversation is warm."""
    clock = Clock()
    cluster, _ = cluster_of(memory_cluster, a=SimulatedEngine(clock), b=SimulatedEngine(clock))
    first = cluster.fetch("POST", "/api/chat", json=TURN)
    assert first.status == 200 and first.complete
    assert terminal(cluster) == [("workload:completed", "completed", None)]
    served = first.header("x-nvpair-node")
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    follow_up = {**TURN, "messages": said}
    second = cluster.fetch("POST", "/api/chat", json=follow_up)
    assert second.header("x-nvpair-node") == served
    assert cluster.named("proxy/request")[1]["cache_affinity"] is True


def test_a_truncated_stream_fails_the_workload_and_records_no_affinity(
    memory_cluster: Make,
) -> None:
    """TRUNCATED: the workload fails with the drop, the record says so, nothing becomes warm."""
    clock = Clock()
    dropping = SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM), chunks=4)
    cluster, _ = cluster_of(memory_cluster, a=dropping)
    response = cluster.fetch("POST", "/api/chat", json=TURN)
    assert response.truncated
    assert terminal(cluster) == [("workload:errored", "failed", "upstream dropped mid-stream")]
    [record] = cluster.named("proxy/request")
    assert (record["node_id"], record["error"]) == ("a", "upstream dropped mid-stream")
    assert len(cluster.facade().affinity) == 0


def test_a_non_2xx_answer_relayed_to_the_end_fails_the_workload(memory_cluster: Make) -> None:
    """A 400 from the last node is the client's answer; its workload fails naming the status."""
    clock = Clock()
    cluster, _ = cluster_of(
        memory_cluster, a=SimulatedEngine(clock, policy=always(Behaviour.STATUS_400))
    )
    response = cluster.fetch("POST", "/api/chat", json=TURN)
    assert response.status == 400 and response.complete
    assert terminal(cluster) == [("workload:errored", "failed", "upstream answered 400")]
    assert cluster.named("proxy/request")[0]["error"] is None


def test_exhausted_candidates_answer_502_and_fail_the_workload(memory_cluster: Make) -> None:
    """Every candidate dropped before the first byte: 502 JSON, the workload fails with the reason."""
    clock = Clock()
    drop = always(Behaviour.DROP_AFTER_HEADERS)
    cluster, _ = cluster_of(
        memory_cluster, a=SimulatedEngine(clock, policy=drop), b=SimulatedEngine(clock, policy=drop)
    )
    response = cluster.fetch("POST", "/api/chat", json=TURN)
    assert response.status == 502 and response.json()["code"] == "upstream-error"
    [(name, state, error)] = terminal(cluster)
    assert (name, state) == ("workload:errored", "failed") and error == response.json()["error"]
    assert [a["outcome"] for a in cluster.named("proxy/request")[0]["attempts"]] == [
        "dropped",
        "dropped",
    ]


def test_every_request_releases_its_reservation(memory_cluster: Make) -> None:
    """Whatever the end (served, truncated), the ledger holds nothing afterwards."""
    clock = Clock()
    cluster, _ = cluster_of(
        memory_cluster,
        a=SimulatedEngine(clock),
        b=SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM)),
    )
    for _ in range(4):
        cluster.fetch("POST", "/api/chat", json=TURN)
    ledger = cluster.runtime.shared.ledger
    assert ledger.reservations("a") == ledger.reservations("b") == 0


def test_a_truncated_whole_answer_records_no_affinity(memory_cluster: Make) -> None:
    """A non-streaming answer cut before the end of its framing is TRUNCATED: however much JSON
    arrived, the node is not remembered as warm (affinity needs a clean end)."""
    clock = Clock()
    dropping = SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM))
    cluster = memory_cluster(clock, {"a": dropping}, settings=Settings(assemble={"ollama": False}))
    response = cluster.fetch("POST", "/v1/chat/completions", json={**TURN, "stream": False})
    assert response.truncated
    assert terminal(cluster) == [("workload:errored", "failed", "upstream dropped mid-stream")]
    assert len(cluster.facade().affinity) == 0


# --- Busy is not stalled: progress elsewhere and the cold-load allowance (§6.4) -----------------

DEADLINE = 2.0
STREAM = {"model": "llama3", "messages": [{"role": "user", "content": "one"}]}
ONE_SHOT = {"model": "llama3", "messages": [{"role": "user", "content": "two"}], "stream": False}


@define
class OneSlotEngine(SimulatedEngine):
    """Like Ollama with ``OLLAMA_NUM_PARALLEL=1``: one request is answered at a time; the others
    wait in the engine's own queue, their headers withheld, until it has finished."""

    _busy: bool = False
    _queue: list[tuple[Request, Behaviour, bytes]] = field(factory=list)

    def _act(self, request: Request, behaviour: Behaviour, body: bytes) -> None:
        if self._busy:
            self._queue.append((request, behaviour, body))
            return
        self._busy = True
        request.notifyFinish().addBoth(self._freed)
        super()._act(request, behaviour, body)

    def _freed(self, _: object) -> None:
        self._busy = False
        if self._queue:
            self._act(*self._queue.pop(0))


def one_slot_node(memory_cluster: Make, settings: Settings) -> MemoryCluster:
    """One node streaming 10 frames a second apart (its answer ends at t = 11)."""
    clock = Clock()
    engine = OneSlotEngine(clock, chunks=10, chunk_delay=1.0)
    return memory_cluster(clock, {"a": engine}, settings=settings)


def test_a_node_streaming_one_answer_is_waited_for_on_the_next(memory_cluster: Make) -> None:
    """Two concurrent requests on a one-slot node with a 2 s deadline: the second's headers are
    withheld for 11 s while the first streams. It is answered by the same node with busy waits
    counted (at 2, 4, 6, 8 and 10 s), and no cooldown starts."""
    cluster = one_slot_node(memory_cluster, Settings(response_header_timeout=DEADLINE))
    first = cluster.request("POST", "/api/chat", json=STREAM)
    second = cluster.request("POST", "/api/chat", json=ONE_SHOT)
    streaming = cluster.result(first)
    cluster.advance(10.0)
    assert not second.called
    assert cluster.facade().progress.busy_waits("a") == 5
    cluster.advance(1.0)
    assert streaming.complete
    # the second is non-streaming: its stream starts at 11 s and is assembled into one answer,
    # written whole at its terminal frame (10 frames a second apart, §6.5)
    assert not second.called
    cluster.advance(10.0)
    answer = cluster.result(second)
    assert (answer.status, answer.headers_at, answer.header("x-nvpair-node")) == (200, 21.0, "a")
    assert answer.complete and answer.json()["done"] is True
    records = cluster.named("proxy/request")
    assert [
        [(a["node_id"], a["outcome"], a["busy_waits"]) for a in r["attempts"]] for r in records
    ] == [
        [("a", "committed", 0)],
        [("a", "committed", 5)],
    ]
    assert cluster.named("node/cooldown") == []
    assert cluster.facade().stalls.cooling() == frozenset()


def test_without_busy_waits_the_same_node_is_stalled_and_cooled(memory_cluster: Make) -> None:
    """Negative control: with --busy-max-wait 0 the second request stalls at exactly 2 s, gets a
    502 and the healthy, streaming node is cooled (the issue's measured failure)."""
    settings = Settings(response_header_timeout=DEADLINE, busy_max_wait=0.0)
    cluster = one_slot_node(memory_cluster, settings)
    cluster.request("POST", "/api/chat", json=STREAM)
    second = cluster.request("POST", "/api/chat", json=ONE_SHOT)
    cluster.advance(DEADLINE - 2**-10)
    assert not second.called
    cluster.advance(2**-10)
    assert cluster.result(second).status == 502
    assert [c["node_id"] for c in cluster.named("node/cooldown")] == ["a"]


def test_a_lone_frozen_request_still_stalls_and_cools_with_busy_waits_on(
    memory_cluster: Make,
) -> None:
    """No bytes from the node anywhere: the default busy-max-wait changes nothing, the request
    stalls at exactly the deadline and the node cools."""
    clock = Clock()
    engine = SimulatedEngine(clock, policy=always(Behaviour.FROZEN))
    cluster = memory_cluster(clock, {"a": engine}, settings=Settings(response_header_timeout=30.0))
    pending = cluster.request("POST", "/api/chat", json=ONE_SHOT)
    cluster.advance(30.0 - 2**-10)
    assert not pending.called
    cluster.advance(2**-10)
    assert cluster.result(pending).status == 502
    [record] = cluster.named("proxy/request")
    assert record["attempts"] == [
        {"node_id": "a", "outcome": "stall", "ms": 30000, "busy_waits": 0}
    ]
    assert [c["node_id"] for c in cluster.named("node/cooldown")] == ["a"]


@pytest.mark.parametrize(
    ("resident", "deadline"),
    [(False, 30.0 + 45.0), (None, 30.0), (True, 30.0)],
    ids=["cold", "unknown", "resident"],
)
def test_first_deadline_adds_the_load_allowance_only_on_a_node_known_cold(
    memory_cluster: Make, monkeypatch: pytest.MonkeyPatch, resident: bool | None, deadline: float
) -> None:
    """--load-timeout 45s: a node known not to have the model loaded stalls at exactly 30 + 45 s;
    unknown residency or a resident model keeps the plain 30 s."""
    clock = Clock()
    engine = SimulatedEngine(clock, policy=always(Behaviour.FROZEN))
    settings = Settings(response_header_timeout=30.0, load_timeout=45.0)
    cluster = memory_cluster(clock, {"a": engine}, settings=settings)
    asked: list[tuple[str, str]] = []

    def residency(book: InventoryBook, node_id: str, model: str) -> bool | None:
        asked.append((node_id, model))
        return resident

    monkeypatch.setattr(InventoryBook, "resident", residency)
    pending = cluster.request("POST", "/api/chat", json=ONE_SHOT)
    cluster.advance(deadline - 2**-10)
    assert not pending.called
    cluster.advance(2**-10)
    assert cluster.result(pending).status == 502
    assert set(asked) == {("a", "llama3")}  # head selection and the allowance both ask
    [cooldown] = cluster.named("node/cooldown")
    assert cooldown["reason"] == f"no response headers within {deadline:g}s"
