"""Tests for nvpair_tw.exchange through ``MemoryCluster``: busy waits and the cold-load allowance.

The whole corridor runs in memory on one ``task.Clock`` (docs/behaviour.md §6.4): a node that is
streaming one answer while it withholds another's headers is waited for, not cooled; a node known
not to have the model loaded gets the cold-load allowance on its first deadline.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from attrs import define, field
from twisted.internet.task import Clock
from twisted.web.server import Request

from nvpair_tw.inventory import InventoryBook
from nvpair_tw.settings import Settings
from nvpair_tw.simulated import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]
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
    answer = cluster.result(second)
    assert (answer.status, answer.headers_at, answer.header("x-nvpair-node")) == (200, 11.0, "a")
    cluster.advance(1.0)  # the engine ends its answer one chunk delay after the frame
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
    assert asked == [("a", "llama3")]
    [cooldown] = cluster.named("node/cooldown")
    assert cooldown["reason"] == f"no response headers within {deadline:g}s"
