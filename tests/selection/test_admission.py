"""Admission and late binding (docs/behaviour.md §6.4): slots, the FIFO queue, its two 503s.

The slot and queue logic runs on a ``task.Clock`` against :class:`Admission` alone; the corridor
(workload events, records, the 503 answers, a client leaving while queued) runs in a
:class:`MemoryCluster` on the clock; one test runs the same late binding over loopback sockets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest_twisted
from attrs import define, evolve
from twisted.internet.defer import CancelledError, Deferred, gatherResults
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.server import Request

from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._admission import (
    QUEUE_FULL,
    Admission,
    Cordons,
    QueueTimeout,
    Slot,
    Waiter,
    slot_limit,
)
from nvpair_tw.selection._reservations import Booking, ReservationLedger
from nvpair_tw.simulated._engine import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import Clusters, MemoryCluster, ProxyCluster

Make = Callable[..., MemoryCluster]
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


# --- the admission object alone, on a Clock -----------------------------------------------------


def _node(node_id: str, slots: int | None = None) -> Node:
    return Node(node_id, f"http://{node_id}.test:11434", ("llama3",), slots=slots)


def _admission(
    clock: Clock,
    nodes: Sequence[Node],
    *,
    default_slots: int = 0,
    queue_size: int = 256,
    queue_timeout: float = 600.0,
) -> Admission:
    by_id = {n.id: n for n in nodes}
    return Admission(clock, slot_limit(by_id.get, default_slots), queue_size, queue_timeout)


def _slot(ticket: object) -> Slot:
    assert isinstance(ticket, Slot), ticket
    return ticket


def _waiter(ticket: object) -> Waiter:
    assert isinstance(ticket, Waiter), ticket
    return ticket


def _outcome(waiter: Waiter) -> list[Slot | Failure]:
    seen: list[Slot | Failure] = []
    waiter.bound.addBoth(seen.append)
    return seen


def test_no_slots_set_binds_every_request_to_its_first_candidate_at_once() -> None:
    """Unlimited (the default, 0): every request is bound at once to candidates[0]; nothing queues,
    no timer is started, and slots in use are still counted for visibility."""
    clock = Clock()
    a, b = _node("a"), _node("b")
    admission = _admission(clock, [a, b])
    slots = [_slot(admission.admit([a, b])) for _ in range(50)]
    assert {s.node_id for s in slots} == {"a"}
    assert admission.slots_in_use("a") == 50 and admission.queue_depth == 0
    assert admission.slots("a") == 0
    assert clock.getDelayedCalls() == []


def test_dispatch_goes_to_the_first_candidate_in_order_with_a_free_slot() -> None:
    """A full candidate is passed over (a pin only orders); the first free one, in order, binds."""
    clock = Clock()
    a, b, c = _node("a", 1), _node("b", 1), _node("c", 1)
    admission = _admission(clock, [a, b, c])
    assert _slot(admission.admit([b, a, c])).node_id == "b"
    assert _slot(admission.admit([b, a, c])).node_id == "a"
    assert _slot(admission.admit([b, a, c])).node_id == "c"
    assert isinstance(admission.admit([b, a, c]), Waiter)


def test_default_slots_apply_to_a_node_without_its_own_and_a_node_may_override_them() -> None:
    """``--default-slots`` limits a node that sets none; a node's own ``slots`` (even 0) wins."""
    clock = Clock()
    a, b = _node("a"), _node("b", 0)
    admission = _admission(clock, [a, b], default_slots=2)
    assert admission.slots("a") == 2 and admission.slots("b") == 0
    assert [_slot(admission.admit([a])).node_id for _ in range(2)] == ["a", "a"]
    assert isinstance(admission.admit([a]), Waiter)
    assert all(_slot(admission.admit([b])).node_id == "b" for _ in range(5))


def test_a_waiter_binds_to_the_node_that_frees_a_slot_in_fifo_order() -> None:
    """Waiters bind oldest first; a freed slot binds the oldest waiter that can use that node,
    skipping an older waiter whose candidates do not include it."""
    clock = Clock()
    a, b = _node("a", 1), _node("b", 1)
    admission = _admission(clock, [a, b])
    on_a, on_b = _slot(admission.admit([a])), _slot(admission.admit([b]))
    only_b = _waiter(admission.admit([b]))
    first, second = _waiter(admission.admit([a, b])), _waiter(admission.admit([a, b]))
    got_only_b, got_first, got_second = _outcome(only_b), _outcome(first), _outcome(second)
    assert admission.queue_depth == 3
    on_a.release()
    assert got_only_b == [] and got_second == []
    assert [_slot(s).node_id for s in got_first] == ["a"]
    on_b.release()
    assert [_slot(s).node_id for s in got_only_b] == ["b"] and got_second == []
    _slot(got_first[0]).release()
    assert [_slot(s).node_id for s in got_second] == ["a"]
    assert admission.queue_depth == 0
    assert clock.getDelayedCalls() == []  # every bound waiter's timeout was cancelled


def test_waiting_for_counts_the_waiters_a_node_would_take() -> None:
    """A waiter counts for each of its candidates (the status page's "waiting for it"), and no
    longer once it is bound or gone."""
    clock = Clock()
    a, b, c = _node("a", 1), _node("b", 1), _node("c", 1)
    admission = _admission(clock, [a, b, c])
    on_a, _on_b = _slot(admission.admit([a])), _slot(admission.admit([b]))
    only_a = _waiter(admission.admit([a]))
    either = _waiter(admission.admit([a, b]))
    assert [admission.waiting_for(n) for n in "abc"] == [2, 1, 0]
    only_a.bound.addErrback(lambda f: f.trap(CancelledError))
    only_a.bound.cancel()
    assert [admission.waiting_for(n) for n in "abc"] == [1, 1, 0]
    on_a.release()
    assert _outcome(either) and [admission.waiting_for(n) for n in "abc"] == [0, 0, 0]


def test_a_slot_freed_on_a_node_cordoned_meanwhile_binds_only_a_waiter_that_named_it() -> None:
    """docs/behaviour.md §13.1: a node cordoned while requests wait for it takes none of the ones
    the proxy placed there; the one the client named (``X-NVPair-Node``) still binds to it."""
    clock = Clock()
    a = _node("a", 1)
    cordoned: set[str] = set()
    limit = slot_limit({"a": a}.get, 0)
    admission = Admission(clock, limit, 256, 600.0, accepts=lambda n: n not in cordoned)
    held = _slot(admission.admit([a]))
    placed = _outcome(_waiter(admission.admit([a])))
    named = _outcome(_waiter(admission.admit([a], cordons=Cordons.WAIVED)))
    cordoned.add("a")
    held.release()
    assert placed == []
    assert [_slot(s).node_id for s in named] == ["a"]
    assert admission.queue_depth == 1


def test_queue_full_answers_at_once_and_keeps_nothing() -> None:
    """With ``queue_size`` waiters, the next request is told QUEUE_FULL: no waiter, no timer."""
    clock = Clock()
    a = _node("a", 1)
    admission = _admission(clock, [a], queue_size=2)
    _slot(admission.admit([a]))
    _waiter(admission.admit([a]))
    _waiter(admission.admit([a]))
    timers = len(clock.getDelayedCalls())
    assert admission.admit([a]) is QUEUE_FULL
    assert admission.queue_depth == 2 and len(clock.getDelayedCalls()) == timers == 2


def test_queue_timeout_fails_the_waiter_exactly_when_it_runs_out() -> None:
    """A waiter still waiting after ``queue_timeout`` fails with QueueTimeout and leaves the queue;
    a tick earlier it is still waiting; a slot freed afterwards binds nobody."""
    clock = Clock()
    a = _node("a", 1)
    admission = _admission(clock, [a], queue_timeout=10.0)
    held = _slot(admission.admit([a]))
    waiter = _waiter(admission.admit([a]))
    seen = _outcome(waiter)
    clock.advance(9.999)
    assert seen == [] and admission.queue_depth == 1
    clock.advance(0.001)
    [failure] = seen
    assert isinstance(failure, Failure) and failure.check(QueueTimeout)
    assert admission.queue_depth == 0 and clock.getDelayedCalls() == []
    held.release()
    assert admission.slots_in_use("a") == 0


def test_cancelling_a_waiter_leaves_the_queue_and_stops_its_timer() -> None:
    """The caller leaving (the Deferred cancelled) takes the waiter out; no slot is ever taken."""
    clock = Clock()
    a = _node("a", 1)
    admission = _admission(clock, [a])
    held = _slot(admission.admit([a]))
    waiter = _waiter(admission.admit([a]))
    seen = _outcome(waiter)
    waiter.bound.cancel()
    [failure] = seen
    assert isinstance(failure, Failure) and failure.check(CancelledError)
    assert admission.queue_depth == 0 and clock.getDelayedCalls() == []
    held.release()
    assert admission.slots_in_use("a") == 0


def test_a_slot_is_released_once_however_often_release_is_called() -> None:
    """A second release neither frees a second slot nor wakes a second waiter."""
    clock = Clock()
    a = _node("a", 1)
    admission = _admission(clock, [a])
    held = _slot(admission.admit([a]))
    first, second = _waiter(admission.admit([a])), _waiter(admission.admit([a]))
    got_first, got_second = _outcome(first), _outcome(second)
    held.release()
    held.release()
    assert len(got_first) == 1 and got_second == [] and admission.slots_in_use("a") == 1
    assert held.node_id is None


def test_a_move_goes_over_the_next_nodes_slots_and_frees_the_old_one_for_a_waiter() -> None:
    """On failover the slot moves with the attempt, even onto a full node (it never waits again);
    the slot left behind binds the oldest waiter for that node."""
    clock = Clock()
    a, b = _node("a", 1), _node("b", 1)
    admission = _admission(clock, [a, b])
    moving = _slot(admission.admit([a, b]))
    on_b = _slot(admission.admit([b]))
    waiter = _waiter(admission.admit([a]))
    seen = _outcome(waiter)
    moving.move("b")
    assert moving.node_id == "b"
    assert admission.slots_in_use("b") == 2  # over its one slot, for the failover
    assert [_slot(s).node_id for s in seen] == ["a"]
    on_b.release()
    moving.release()
    _slot(seen[0]).release()
    assert (admission.slots_in_use("a"), admission.slots_in_use("b")) == (0, 0)


def test_a_booking_moves_and_releases_its_slot_with_its_reservation() -> None:
    """The slot folded into the reservation booking follows ``booking.move`` and is released by
    ``booking.release`` (once)."""
    clock = Clock()
    a, b = _node("a", 1), _node("b", 1)
    admission = _admission(clock, [a, b])
    ledger = ReservationLedger()
    slot = _slot(admission.admit([a, b]))
    booking = Booking.take(ledger, "a", slot)
    booking.move("b")
    assert (admission.slots_in_use("a"), admission.slots_in_use("b")) == (0, 1)
    assert ledger.reservations("b") == 1
    booking.release()
    booking.release()
    assert admission.slots_in_use("b") == 0 and ledger.reservations("b") == 0


def test_a_node_that_is_gone_binds_nobody_and_a_raised_limit_wakes_waiters() -> None:
    """A waiter never binds to a node no longer in the facade; when a node's slots go up, ``wake``
    binds who can use the new room."""
    clock = Clock()
    nodes = {"a": _node("a", 1)}
    admission = Admission(clock, slot_limit(nodes.get, 0), 10, 60.0)
    held = _slot(admission.admit([nodes["a"]]))
    waiter = _waiter(admission.admit([nodes["a"], _node("gone", 5)]))
    seen = _outcome(waiter)
    admission.wake()
    assert seen == []
    nodes["a"] = _node("a", 2)
    admission.wake()
    assert [_slot(s).node_id for s in seen] == ["a"] and admission.slots_in_use("a") == 2
    held.release()


# --- through the facade, in memory on the clock --------------------------------------------------


@define
class CountingEngine(SimulatedEngine):
    """A simulated engine that tracks how many inference requests it runs at once."""

    running: int = 0
    most: int = 0

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        if request.method == b"POST":
            self.running += 1
            self.most = max(self.most, self.running)
            request.notifyFinish().addBoth(self._ended)
        return super().render(request)

    def _ended(self, _: object) -> None:
        self.running -= 1


def _two_nodes(clock: Clock) -> dict[str, CountingEngine]:
    return {
        "a": CountingEngine(clock, chunks=3, chunk_delay=1.0),
        "b": CountingEngine(clock, chunks=3, chunk_delay=1.0),
    }


def _cluster(
    make: Make,
    clock: Clock,
    engines: Mapping[str, SimulatedEngine],
    slots: int | None,
    **settings: Any,
) -> MemoryCluster:
    """A cluster whose nodes all have ``slots`` (None: not set, the default), at the URLs
    ``MemoryCluster`` serves its engines on."""
    nodes = [
        Node(n, f"http://{n}.node.test:11434", tuple(e.models), slots=slots)
        for n, e in engines.items()
    ]
    return make(clock, engines, settings=Settings(**settings), nodes={"ollama": nodes})


def _events(cluster: MemoryCluster, workload_id: int) -> list[str]:
    return [
        e.name
        for e in cluster.events
        if e.name.startswith("workload:") and e.payload["workload"]["id"] == workload_id
    ]


def test_late_binding_spreads_four_requests_over_two_one_slot_nodes_two_each(
    memory_cluster: Make,
) -> None:
    """Four streams at once on two one-slot nodes: two run, two queue; each queued one binds to the
    node that frees first. Two each, never two at once on one node, all answered whole."""
    clock = Clock()
    engines = _two_nodes(clock)
    cluster = _cluster(memory_cluster, clock, engines, 1)
    pending = [cluster.request("POST", "/api/chat", json=CHAT) for _ in range(4)]
    cluster.flush()
    assert cluster.facade().admission.queue_depth == 2
    cluster.advance(20)
    responses = [cluster.result(p) for p in pending]
    assert all(r.status == 200 and r.complete for r in responses)
    assert (len(cluster.received("a")), len(cluster.received("b"))) == (2, 2)
    assert (engines["a"].most, engines["b"].most) == (1, 1)
    records = cluster.named("proxy/request")
    assert sorted(r["queued_ms"] for r in records) == [0, 0, 4000, 4000]
    assert len(cluster.named("workload:queued")) == 2
    assert cluster.facade().admission.queue_depth == 0
    assert cluster.facade().admission.slots_in_use("a") == 0


def test_workload_queued_comes_before_workload_started(memory_cluster: Make) -> None:
    """The queued workload publishes queued, then started (naming the node it bound to), then its
    end; the one dispatched at once never publishes queued."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=1.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1)
    first = cluster.request("POST", "/api/chat", json=CHAT)
    second = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.flush()
    queued = [e.payload["workload"] for e in cluster.events if e.name == "workload:queued"]
    assert [(w["id"], w["state"], w["scheduledOn"]) for w in queued] == [(2, "queued", None)]
    cluster.advance(10)
    assert cluster.result(first).complete and cluster.result(second).complete
    assert _events(cluster, 1) == ["workload:started", "workload:completed"]
    assert _events(cluster, 2) == ["workload:queued", "workload:started", "workload:completed"]
    [started] = [
        e.payload["workload"]
        for e in cluster.events
        if e.name == "workload:started" and e.payload["workload"]["id"] == 2
    ]
    assert started["scheduledOn"] == "a" and started["seq"] == 2


def test_queue_full_is_a_503_with_retry_after_at_once_and_no_workload(
    memory_cluster: Make,
) -> None:
    """A request finding the queue full is answered 503 queue-full at once (no clock time), with an
    integer Retry-After; it has no workload and reaches no node."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=5.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1, queue_size=1)
    running = cluster.request("POST", "/api/chat", json=CHAT)
    queued = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.flush()
    refused = cluster.fetch("POST", "/api/chat", json=CHAT)
    assert clock.seconds() == 0.0
    assert refused.status == 503
    assert refused.json() == {
        "error": "every node is busy and the queue is full",
        "code": "queue-full",
    }
    assert int(refused.header("retry-after") or "") >= 1
    ids = {e.payload["workload"]["id"] for e in cluster.events if e.name.startswith("workload:")}
    assert ids == {1, 2}
    [record] = [r for r in cluster.named("proxy/request") if r["status"] == 503]
    assert (record["error"], record["node_id"], record["attempts"]) == ("queue-full", None, [])
    cluster.advance(30)
    assert cluster.result(running).complete and cluster.result(queued).complete
    assert len(cluster.received("a")) == 2


def test_queue_timeout_is_a_503_with_retry_after_on_time_and_the_workload_fails(
    memory_cluster: Make,
) -> None:
    """A request still queued after --queue-timeout is answered 503 queue-timeout then, not a tick
    before, with Retry-After; its workload ends failed, its record says how long it queued, and
    no node ever saw it."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=20.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1, queue_timeout=5.0)
    running = cluster.request("POST", "/api/chat", json=CHAT)
    waiting = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(4.99)
    assert not waiting.called
    cluster.advance(0.01)
    response = cluster.result(waiting)
    assert response.status == 503 and clock.seconds() == 5.0
    assert response.json()["code"] == "queue-timeout"
    assert int(response.header("retry-after") or "") >= 1
    [errored] = [e.payload["workload"] for e in cluster.events if e.name == "workload:errored"]
    assert (errored["id"], errored["state"]) == (2, "failed")
    assert "queue timeout" in errored["error"]
    assert _events(cluster, 2) == ["workload:queued", "workload:errored"]
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["error"], record["queued_ms"]) == (503, "queue-timeout", 5000)
    cluster.advance(60)
    assert cluster.result(running).complete
    assert len(cluster.received("a")) == 1


def test_a_client_that_leaves_while_queued_is_cancelled_and_reaches_no_node(
    memory_cluster: Make,
) -> None:
    """The client hanging up while its request waits ends the workload cancelled (499 in the
    record); when the slot frees, nothing is sent to the node for it."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=5.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1)
    running = cluster.request("POST", "/api/chat", json=CHAT)
    leaving = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(2)
    leaving.cancel()
    leaving.addErrback(lambda _: None)
    cluster.advance(1)
    assert _events(cluster, 2) == ["workload:queued", "workload:errored"]
    [errored] = [e.payload["workload"] for e in cluster.events if e.name == "workload:errored"]
    assert errored["state"] == "cancelled"
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["queued_ms"]) == (499, 2000)
    assert cluster.facade().admission.queue_depth == 0
    cluster.advance(30)
    assert cluster.result(running).complete
    assert len(cluster.received("a")) == 1
    assert cluster.facade().admission.slots_in_use("a") == 0


def test_workload_cancel_while_queued_cancels_it_before_any_node(memory_cluster: Make) -> None:
    """``workload/cancel`` on a queued workload ends it cancelled; it never reaches a node."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=5.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1)
    running = cluster.request("POST", "/api/chat", json=CHAT)
    queued = cluster.request("POST", "/api/chat", json=CHAT)
    queued.addErrback(lambda _: None)
    cluster.flush()
    assert cluster.runtime.shared.workloads.cancel(2, "cancelled by request")
    cluster.flush()
    assert _events(cluster, 2) == ["workload:queued", "workload:errored"]
    cluster.advance(30)
    assert cluster.result(running).complete and len(cluster.received("a")) == 1


def test_queue_time_never_counts_against_the_header_deadline(memory_cluster: Make) -> None:
    """A request that queues longer than the response-header timeout is then served by the node it
    binds to: its attempt is committed, nothing stalls, no node cools."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=20.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1, response_header_timeout=10.0)
    first = cluster.request("POST", "/api/chat", json=CHAT)
    second = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(120)
    assert cluster.result(first).complete and cluster.result(second).complete
    records = cluster.named("proxy/request")
    assert [[a["outcome"] for a in r["attempts"]] for r in records] == [["committed"]] * 2
    assert records[1]["queued_ms"] == 60_000
    assert cluster.named("node/cooldown") == []


def test_a_failover_moves_the_slot_over_a_full_node_and_releases_everything(
    memory_cluster: Make,
) -> None:
    """A request bound to a failing node fails over to the next candidate even when that node's
    slot is taken (it goes over), and every slot is given back when the requests end."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, policy=always(Behaviour.STATUS_503)),
        "b": CountingEngine(clock, chunks=2, chunk_delay=5.0),
    }
    cluster = _cluster(memory_cluster, clock, engines, 1)
    cluster.facade().pin = "b"
    on_b = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.flush()
    cluster.facade().pin = None
    moved = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.flush()
    admission = cluster.facade().admission
    assert admission.slots_in_use("b") == 2 and admission.slots_in_use("a") == 0
    cluster.advance(30)
    assert cluster.result(on_b).complete and cluster.result(moved).complete
    [_, record] = cluster.named("proxy/request")
    assert [(a["node_id"], a["outcome"]) for a in record["attempts"]] == [
        ("a", "status-503"),
        ("b", "committed"),
    ]
    assert (admission.slots_in_use("a"), admission.slots_in_use("b")) == (0, 0)


def test_raising_a_nodes_slots_binds_a_waiting_request_at_once(memory_cluster: Make) -> None:
    """A change of the facade's nodes (here a manual node raising a's slots) wakes the queue."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, chunks=2, chunk_delay=5.0)}
    cluster = _cluster(memory_cluster, clock, engines, 1)
    first = cluster.request("POST", "/api/chat", json=CHAT)
    second = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.flush()
    assert cluster.facade().admission.queue_depth == 1 and len(cluster.received("a")) == 1
    cluster.facade().directory.add_manual(evolve(cluster.node("a"), slots=2))
    cluster.flush()
    assert cluster.facade().admission.queue_depth == 0 and len(cluster.received("a")) == 2
    cluster.advance(30)
    assert cluster.result(first).complete and cluster.result(second).complete


def test_without_slots_nothing_queues_and_every_request_is_dispatched_at_once(
    memory_cluster: Make,
) -> None:
    """No slots anywhere (the default), both nodes have answered (one request each): the seed's
    behaviour. All four requests reach a node at once, in the order the facade would pick
    without admission; no queued event, queued_ms 0. (A burst on nodes never measured waits
    for their first tokens: tests/corridor/test_state.py.)"""
    clock = Clock()
    engines = _two_nodes(clock)
    cluster = _cluster(memory_cluster, clock, engines, None)
    first = [cluster.request("POST", "/api/chat", json=CHAT) for _ in engines]
    cluster.advance(5)
    assert sorted(str(r.header("x-nvpair-node")) for r in map(cluster.result, first)) == ["a", "b"]
    before = {n: len(cluster.received(n)) for n in engines}
    expected, _ = cluster.facade().order(cluster.facade().eligible("llama3"), head_selection=True)
    pending = [cluster.request("POST", "/api/chat", json=CHAT) for _ in range(4)]
    cluster.flush()
    assert sum(len(cluster.received(n)) - before[n] for n in engines) == 4
    cluster.advance(20)
    assert all(cluster.result(p).complete for p in pending)
    assert cluster.named("workload:queued") == []
    records = cluster.named("proxy/request")[2:]
    assert [r["queued_ms"] for r in records] == [0, 0, 0, 0]
    assert records[0]["node_id"] == expected[0].id


# --- over loopback sockets ------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_late_binding_over_real_sockets_two_each_never_two_at_once(
    reactor: Any, clusters: Clusters
) -> None:
    """The same burst over loopback: four chats at once, two one-slot nodes, two each, one at a time
    per node, two of them queued first."""
    cluster = clusters(ProxyCluster)
    engines = [CountingEngine(reactor, chunks=3, chunk_delay=0.05) for _ in range(2)]
    nodes = [await cluster.add_engine(f"n{i}", e) for i, e in enumerate(engines)]
    await cluster.start_proxy([evolve(n, slots=1) for n in nodes])
    body = json.dumps(CHAT).encode()
    burst = gatherResults([Deferred.fromCoroutine(cluster.post(body)) for _ in range(4)])
    answers: list[tuple[int, bytes, Any]] = await burst.addTimeout(10, reactor)
    assert [status for status, _, _ in answers] == [200] * 4
    assert all(b'"done": true' in content for _, content, _ in answers)
    assert (len(cluster.received(0)), len(cluster.received(1))) == (2, 2)
    assert [e.most for e in engines] == [1, 1]
    assert len(cluster.named("workload:queued")) == 2
    assert cluster.facade.admission.queue_depth == 0
