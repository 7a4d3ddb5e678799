"""Priorities in the queue (docs/behaviour.md §16.3), on a ``task.Clock`` against
:class:`Admission` alone: interactive before batch, aging past ``batch_max_wait``, reserved slots,
and the depth and waits counted per priority."""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.task import Clock

from nvpair_tw.core import Priority
from nvpair_tw.nodes import Node
from nvpair_tw.selection import Admission, Slot, Waited, Waiter, slot_limit

BATCH = Priority.BATCH


def _node(node_id: str, slots: int, reserved: int = 0) -> Node:
    return Node(node_id, f"http://{node_id}.test:1", ("m",), slots=slots, slots_reserved=reserved)


def _admission(clock: Clock, nodes: Sequence[Node], batch_max_wait: float = 120.0) -> Admission:
    by_id = {n.id: n for n in nodes}
    return Admission(
        clock,
        slot_limit(by_id.get, 0),
        256,
        600.0,
        reserved=lambda n: by_id[n].slots_reserved,
        batch_max_wait=batch_max_wait,
    )


def _slot(ticket: object) -> Slot:
    assert isinstance(ticket, Slot), ticket
    return ticket


def _order(waiters: dict[str, object], slots: dict[str, Slot] | None = None) -> list[str]:
    """The names of ``waiters`` in the order they are bound (their slots into ``slots``)."""
    bound: list[str] = []
    held = {} if slots is None else slots

    def note(slot: Slot, name: str) -> None:
        bound.append(name)
        held[name] = slot

    for name, waiter in waiters.items():
        assert isinstance(waiter, Waiter), waiter
        waiter.bound.addCallback(note, name)
    return bound


def test_a_freed_slot_goes_to_the_oldest_interactive_request_then_the_oldest_batch_one() -> None:
    clock = Clock()
    node = _node("a", 1)
    admission = _admission(clock, [node])
    held = _slot(admission.admit([node]))
    waiters: dict[str, object] = {}
    for name, priority in [
        ("batch-1", BATCH),
        ("interactive-1", Priority.INTERACTIVE),
        ("batch-2", BATCH),
        ("interactive-2", Priority.INTERACTIVE),
    ]:
        clock.advance(1)
        waiters[name] = admission.admit([node], priority=priority)
    slots: dict[str, Slot] = {}
    bound = _order(waiters, slots)
    held.release()
    for _ in range(3):
        clock.advance(1)
        assert admission.slots_in_use("a") == 1
        slots[bound[-1]].release()
    assert bound == ["interactive-1", "interactive-2", "batch-1", "batch-2"]


def test_a_batch_request_waiting_past_batch_max_wait_is_served_as_interactive_by_its_age() -> None:
    clock = Clock()
    node = _node("a", 1)
    admission = _admission(clock, [node], batch_max_wait=10)
    held = _slot(admission.admit([node]))
    old_batch = admission.admit([node], priority=BATCH)
    clock.advance(5)
    interactive = admission.admit([node])
    clock.advance(5)  # the batch request has waited 10 s: it is served as interactive now
    bound = _order({"batch": old_batch, "interactive": interactive})
    held.release()
    assert bound == ["batch"]


def test_before_batch_max_wait_a_younger_interactive_request_goes_first() -> None:
    clock = Clock()
    node = _node("a", 1)
    admission = _admission(clock, [node], batch_max_wait=10)
    held = _slot(admission.admit([node]))
    old_batch = admission.admit([node], priority=BATCH)
    clock.advance(5)
    interactive = admission.admit([node])
    clock.advance(4.9)
    bound = _order({"batch": old_batch, "interactive": interactive})
    held.release()
    assert bound == ["interactive"]


def test_reserved_slots_are_kept_for_interactive_work() -> None:
    """``slots = 3``, ``slots_reserved = 1``: two batch requests run, the third waits while the
    reserved slot is free, and an interactive request takes that slot at once. Batch work holds
    at most ``slots - slots_reserved`` slots counting the interactive ones."""
    clock = Clock()
    node = _node("a", 3, reserved=1)
    admission = _admission(clock, [node])
    first = _slot(admission.admit([node], priority=BATCH))
    _slot(admission.admit([node], priority=BATCH))
    third = admission.admit([node], priority=BATCH)
    assert isinstance(third, Waiter)
    assert admission.depth_of(BATCH) == 1
    interactive = _slot(admission.admit([node]))
    assert admission.slots_in_use("a") == 3
    bound = _order({"third": third})
    first.release()
    assert bound == []
    interactive.release()
    assert bound == ["third"]


def test_a_batch_request_takes_a_reserved_slot_once_it_has_waited_batch_max_wait() -> None:
    clock = Clock()
    node = _node("a", 2, reserved=1)
    admission = _admission(clock, [node], batch_max_wait=30)
    _slot(admission.admit([node], priority=BATCH))
    waiting = admission.admit([node], priority=BATCH)
    bound = _order({"waiting": waiting})
    clock.advance(29.9)
    assert bound == []
    clock.advance(0.1)
    assert bound == ["waiting"] and admission.slots_in_use("a") == 2


def test_depth_and_waits_are_counted_per_priority() -> None:
    clock = Clock()
    node = _node("a", 1)
    admission = _admission(clock, [node])
    held = _slot(admission.admit([node]))
    batch = admission.admit([node], priority=BATCH)
    clock.advance(2)
    interactive = admission.admit([node])
    clock.advance(3)
    assert (admission.depth_of(Priority.INTERACTIVE), admission.depth_of(BATCH)) == (1, 1)
    assert (admission.oldest_wait(Priority.INTERACTIVE), admission.oldest_wait(BATCH)) == (3, 5)
    slots: dict[str, Slot] = {}
    _order({"interactive": interactive, "batch": batch}, slots)
    held.release()
    slots["interactive"].release()
    assert admission.waited(Priority.INTERACTIVE) == Waited(1, 3.0)
    assert admission.waited(BATCH) == Waited(1, 5.0)
    assert admission.queue_depth == 0 and admission.oldest_wait(BATCH) == 0
