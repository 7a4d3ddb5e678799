"""Late binding by prediction (nvpair_tw.selection._patience and its use by Admission,
docs/behaviour.md §15.2 amending §6.4), on a Clock."""

from __future__ import annotations

from twisted.internet.task import Clock

from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._admission import Admission, Slot, Waiter, slot_limit
from nvpair_tw.selection._patience import Patience, patience

FAST, SLOW = "b-fast", "a-slow"
NODES = [Node(i, f"http://{i}.test:11434", ("llama3",), slots=1) for i in (FAST, SLOW)]


def _admission(clock: Clock) -> Admission:
    by_id = {n.id: n for n in NODES}
    return Admission(clock, slot_limit(by_id.get, 0), 256, 600.0)


def test_a_freed_node_is_taken_only_if_it_finishes_no_later_than_the_best() -> None:
    waiting = Patience(FAST, best_finish=10.0, service={FAST: 1.0, SLOW: 4.0})
    assert waiting.accepts(FAST, 0.0)
    assert not waiting.accepts(SLOW, 6.5)
    assert waiting.accepts(SLOW, 6.0)
    assert waiting.accepts(SLOW, 10.0)  # the best node is late: anything goes
    assert waiting.accepts("unknown", 0.0)


def test_patience_starts_from_the_head_of_the_predicted_order() -> None:
    made = patience([FAST, SLOW], {FAST: 1.4, SLOW: 3.9}, {FAST: 0.7}, now=100.0)
    assert made == Patience(FAST, 101.4, {FAST: 0.7, SLOW: 3.9})


def test_no_patience_when_the_head_was_not_the_best_prediction() -> None:
    """A pin or a cooling demotion put another node first: first free binding, as before."""
    assert patience([SLOW, FAST], {FAST: 1.4, SLOW: 3.9}, {}, now=0.0) is None
    assert patience([], {}, {}, now=0.0) is None


def test_a_free_worse_node_is_passed_over_for_the_best_one() -> None:
    clock = Clock()
    admission = _admission(clock)
    first = admission.admit(NODES)
    assert isinstance(first, Slot) and first.node_id == FAST
    waiting = Patience(FAST, best_finish=1.4, service={FAST: 0.7, SLOW: 3.9})
    second = admission.admit(NODES, patience=waiting)
    assert isinstance(second, Waiter)
    bound: list[Slot] = []
    second.bound.addCallback(bound.append)
    clock.advance(0.7)
    first.release()
    assert [s.node_id for s in bound] == [FAST]
    bound[0].release()


def test_a_slot_the_oldest_waiter_declines_goes_to_the_next() -> None:
    clock = Clock()
    admission = _admission(clock)
    fast = admission.admit(NODES[:1])
    slow = admission.admit(NODES[1:])
    assert isinstance(fast, Slot) and isinstance(slow, Slot)
    picky = admission.admit(NODES, patience=Patience(FAST, 5.0, {FAST: 1.0, SLOW: 9.0}))
    plain = admission.admit(NODES)
    assert isinstance(picky, Waiter) and isinstance(plain, Waiter)
    got: dict[str, str | None] = {}
    picky.bound.addCallback(lambda s: got.setdefault("picky", s.node_id))
    plain.bound.addCallback(lambda s: got.setdefault("plain", s.node_id))
    slow.release()
    assert got == {"plain": SLOW}
    fast.release()
    assert got == {"plain": SLOW, "picky": FAST}
    assert admission.queue_depth == 0


def test_when_the_best_node_is_late_the_waiter_takes_any_free_one() -> None:
    """The patience timer wakes the queue at the best node's predicted finish."""
    clock = Clock()
    admission = _admission(clock)
    fast = admission.admit(NODES[:1])
    assert isinstance(fast, Slot)
    waiter = admission.admit(NODES, patience=Patience(FAST, 2.0, {FAST: 1.0, SLOW: 3.9}))
    assert isinstance(waiter, Waiter)
    got: list[Slot] = []
    waiter.bound.addCallback(got.append)
    clock.advance(1.9)
    assert not got
    clock.advance(0.1)
    assert [s.node_id for s in got] == [SLOW]
    assert not clock.getDelayedCalls()


def test_a_queue_timeout_also_stops_the_patience_timer() -> None:
    clock = Clock()
    by_id = {n.id: n for n in NODES}
    admission = Admission(clock, slot_limit(by_id.get, 0), 256, 1.0)
    fast = admission.admit(NODES[:1])
    slow = admission.admit(NODES[1:])
    assert isinstance(fast, Slot) and isinstance(slow, Slot)
    waiter = admission.admit(NODES, patience=Patience(FAST, 50.0, {}))
    assert isinstance(waiter, Waiter)
    waiter.bound.addErrback(lambda failure: None)
    clock.advance(1.0)
    assert not clock.getDelayedCalls()


def test_work_queued_for_a_node_counts_its_waiters_service_there() -> None:
    clock = Clock()
    admission = _admission(clock)
    admission.admit(NODES[:1])
    admission.admit(NODES[1:])
    for _ in range(2):
        admission.admit(NODES, patience=Patience(FAST, 9.0, {FAST: 0.7, SLOW: 3.9}))
    assert admission.queued_for(FAST) == 1.4
    assert admission.queued_for(SLOW) == 0.0
