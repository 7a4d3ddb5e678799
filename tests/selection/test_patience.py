"""Late binding by prediction (nvpair_tw.selection._patience and its use by Admission,
docs/behaviour.md §15.2 amending §6.4), on a Clock: the choice is made again at every look."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from twisted.internet.task import Clock

from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._admission import QUEUE_FULL, Admission, Slot, Waiter, slot_limit
from nvpair_tw.selection._patience import (
    HELD_RECHECK,
    RECHECK_MIN,
    Choice,
    Outlook,
    Patience,
    choose,
)

FAST, SLOW = "b-fast", "a-slow"
NODES = [Node(i, f"http://{i}.test:11434", ("llama3",), slots=1) for i in (FAST, SLOW)]
ONE = {FAST: 1, SLOW: 1}.__getitem__


def _admission(clock: Clock, queue_size: int = 256, timeout: float = 600.0) -> Admission:
    by_id = {n.id: n for n in NODES}
    return Admission(clock, slot_limit(by_id.get, 0), queue_size, timeout)


def _fixed(views: Mapping[str, Outlook]) -> Patience:
    return Patience(lambda: views)


def _late_fast(clock: Clock, end: float, fast: float = 1.0, slow: float = 3.9) -> Patience:
    """The fast node's request in flight, dispatched at 0, is predicted to end at clock time
    ``end``: waited for to that end, then for as long again as it has run (as the flights book
    predicts it)."""

    def read() -> dict[str, Outlook]:
        now = clock.seconds()
        return {FAST: Outlook(fast, end - now if now < end else now), SLOW: Outlook(slow)}

    return Patience(read)


# -- the choice ---------------------------------------------------------------------------------


def test_the_free_node_predicted_to_finish_first_is_taken() -> None:
    views = {FAST: Outlook(1.0), SLOW: Outlook(4.0)}
    assert choose([SLOW, FAST], views, {FAST, SLOW}, {}, ONE) == Choice(FAST, 1.0, True)


def test_a_free_worse_node_is_passed_over_for_a_busy_better_one_until_the_margin_runs_out() -> None:
    """The fast node is busy 0.7 s more and takes 0.7 s: 1.4 s against 3.9 s on the idle slow
    one; looked at again after the 2.5 s it is ahead by, unless a slot frees first."""
    views = {FAST: Outlook(0.7, wait=0.7), SLOW: Outlook(3.9)}
    assert choose([FAST, SLOW], views, {SLOW}, {}, ONE) == Choice(FAST, 1.4, False, 2.5)


def test_the_work_queued_ahead_counts_over_the_nodes_slots() -> None:
    views = {FAST: Outlook(0.7, wait=0.7), SLOW: Outlook(3.9)}
    assert choose([FAST, SLOW], views, {SLOW}, {FAST: 1.4}, ONE) == Choice(FAST, 2.8, False, 1.1)
    two = {FAST: 2, SLOW: 1}.__getitem__
    assert choose([FAST, SLOW], views, {SLOW}, {FAST: 2.8}, two) == Choice(FAST, 2.8, False, 1.1)
    assert choose([FAST, SLOW], views, {SLOW}, {FAST: 2.8}, ONE) == Choice(SLOW, 3.9, True)


def test_a_held_node_is_never_taken_but_may_be_waited_for() -> None:
    """A node whose first request has not shown its speed takes no second one; a request that
    predicts it best waits, and looks again soon (it may show its speed any moment)."""
    views = {FAST: Outlook(1.0, wait=0.1, held=True), SLOW: Outlook(3.0)}
    assert choose([FAST, SLOW], views, {FAST, SLOW}, {}, ONE) == Choice(
        FAST, 1.1, False, HELD_RECHECK
    )
    both = {FAST: views[FAST], SLOW: Outlook(3.0, wait=0.2, held=True)}
    assert choose([FAST, SLOW], both, {FAST, SLOW}, {}, ONE) == Choice(
        FAST, 1.1, False, HELD_RECHECK
    )


def test_with_nothing_free_it_waits_for_a_slot_and_looks_again_no_sooner_than_the_minimum() -> None:
    views = {FAST: Outlook(0.7, wait=0.7), SLOW: Outlook(3.9, wait=2.0)}
    assert choose([FAST, SLOW], views, set(), {}, ONE) == Choice(FAST, 1.4, False, None)
    close = {FAST: Outlook(1.0, wait=0.01), SLOW: Outlook(1.02)}
    assert choose([FAST, SLOW], close, {SLOW}, {}, ONE) == Choice(FAST, 1.01, False, RECHECK_MIN)
    assert choose([FAST], {}, {FAST}, {}, ONE) is None


# -- in the admission ---------------------------------------------------------------------------


def test_a_free_worse_node_is_passed_over_for_the_best_one() -> None:
    clock = Clock()
    admission = _admission(clock)
    first = admission.admit(NODES)
    assert isinstance(first, Slot) and first.node_id == FAST
    second = admission.admit(NODES, patience=_late_fast(clock, end=0.7, fast=0.7))
    assert isinstance(second, Waiter)
    bound: list[Slot] = []
    second.bound.addCallback(bound.append)
    clock.advance(0.7)
    first.release()
    assert [s.node_id for s in bound] == [FAST]
    bound[0].release()
    assert not clock.getDelayedCalls()


def test_a_slot_the_oldest_waiter_declines_goes_to_the_next() -> None:
    clock = Clock()
    admission = _admission(clock)
    fast = admission.admit(NODES[:1])
    slow = admission.admit(NODES[1:])
    assert isinstance(fast, Slot) and isinstance(slow, Slot)
    picky = admission.admit(NODES, patience=_late_fast(clock, end=5.0, slow=9.0))
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


def test_a_late_best_node_is_waited_for_while_waiting_still_pays() -> None:
    """The fast node was predicted to free at 1.0 s and is late; the slow one is free. Waiting
    for the fast node (1 s there) beats 3.9 s on the slow one while its request is predicted to
    run less than 2.9 s more, as long again as it has run: it frees at 2.5 s, and the request
    takes it."""
    clock = Clock()
    admission = _admission(clock)
    fast = admission.admit(NODES[:1])
    assert isinstance(fast, Slot)
    waiter = admission.admit(NODES, patience=_late_fast(clock, end=1.0))
    assert isinstance(waiter, Waiter)
    got: list[Slot] = []
    waiter.bound.addCallback(got.append)
    clock.advance(2.5)
    assert not got
    fast.release()
    assert [s.node_id for s in got] == [FAST]
    got[0].release()
    assert not clock.getDelayedCalls()


def test_a_best_node_too_late_to_pay_is_given_up_for_the_free_one() -> None:
    """The same, but the fast node's request is still running at 2.9 s: as long again is more
    than the slow node takes, and the request takes the slow node then."""
    clock = Clock()
    admission = _admission(clock)
    fast = admission.admit(NODES[:1])
    assert isinstance(fast, Slot)
    waiter = admission.admit(NODES, patience=_late_fast(clock, end=1.0))
    assert isinstance(waiter, Waiter)
    got: list[tuple[float, str | None]] = []
    waiter.bound.addCallback(lambda slot: got.append((clock.seconds(), slot.node_id)))
    clock.pump([0.05] * 100)
    [(when, node)] = got
    assert node == SLOW and when == pytest.approx(2.9, abs=RECHECK_MIN)
    assert not [c for c in clock.getDelayedCalls() if c.active()]
    fast.release()


def test_a_queue_timeout_also_stops_the_patience_timer() -> None:
    clock = Clock()
    admission = _admission(clock, timeout=1.0)
    fast = admission.admit(NODES[:1])
    assert isinstance(fast, Slot)
    waiter = admission.admit(NODES, patience=_late_fast(clock, end=1.5, fast=0.5))
    assert isinstance(waiter, Waiter)
    waiter.bound.addErrback(lambda failure: None)
    clock.advance(1.0)
    assert not clock.getDelayedCalls()


def test_work_queued_for_a_node_counts_the_service_of_the_waiters_that_chose_it() -> None:
    clock = Clock()
    admission = _admission(clock)
    admission.admit(NODES[:1])
    admission.admit(NODES[1:])
    views = {FAST: Outlook(0.7, wait=0.7), SLOW: Outlook(3.9, wait=3.0)}
    waiters = [admission.admit(NODES, patience=_fixed(views)) for _ in range(2)]
    assert admission.queued_for(FAST) == 1.4
    assert admission.queued_for(SLOW) == 0.0
    for waiter in waiters:  # leaving takes its work away
        assert isinstance(waiter, Waiter)
        waiter.bound.addErrback(lambda failure: None)
        waiter.bound.cancel()
        assert admission.queued_for(FAST) == pytest.approx(0.7 * (1 - waiters.index(waiter)))
    assert admission.queued_for(FAST) == 0.0


def test_a_full_queue_binds_a_request_to_the_free_node_it_declined_rather_than_refuse_it() -> None:
    """With no room to wait, a free node (even one its patience would pass over) beats a 503;
    with no free node at all, the queue is full."""
    clock = Clock()
    admission = _admission(clock, queue_size=0)
    fast = admission.admit(NODES[:1])
    assert isinstance(fast, Slot)
    declined = admission.admit(NODES, patience=_late_fast(clock, end=0.7, fast=0.7))
    assert isinstance(declined, Slot) and declined.node_id == SLOW
    assert admission.admit(NODES, patience=_late_fast(clock, end=0.7)) is QUEUE_FULL
