# -*- test-case-name: tests.selection.test_admission -*-
"""Admission and late binding: per-node slots and one facade's queue (docs/behaviour.md §6.4,
§16.3).

Each node of a facade has ``slots``: how many requests this process runs on it at once (0 =
unlimited). :meth:`Admission.admit` binds an inference request to the first candidate, in its own
candidate order, that has a free slot for its priority, and returns the :class:`Slot` it holds.
When every candidate is full the request waits as a :class:`Waiter` in the facade's queue (bounded
by ``queue_size``, each waiter by ``queue_timeout``); a slot freed on a node is offered to the
waiters in turn (interactive oldest first, then batch oldest first; a batch request that has
waited ``batch_max_wait`` counts as interactive), and :meth:`Admission.wake` (after the facade's
nodes change) binds every waiter that has a free node, each to the first free node of its own
candidates. A queue that is full answers :data:`QUEUE_FULL` at once and keeps nothing — unless a
free candidate was declined by the request's patience: it then takes the first free one.

A request with a :class:`~nvpair_tw.selection._patience.Patience` (§15.2) binds instead to the
node its patience chooses (:func:`~nvpair_tw.selection._patience.choose`) each time it is looked
at: on arrival, whenever a slot frees that it could take, and at its patience's own re-checks;
the work of the waiters ahead of it (in turn) counts against the nodes they chose.

A :class:`Slot` moves with the attempt on failover (:meth:`Slot.move`) and is released once
(:meth:`Slot.release`). A move goes over the next node's slots rather than waiting: see
docs/behaviour.md §6.4 for why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.core import Priority
from nvpair_tw.nodes import Node
from nvpair_tw.selection._patience import Choice, Patience, choose
from nvpair_tw.selection._queue import (
    QUEUE_FULL,
    RETRY_AFTER_SECONDS,
    QueueFull,
    QueueTimeout,
    Waited,
    Waiter,
    WaitQueue,
)
from nvpair_tw.selection._slots import Cordons, Slot, SlotCounts, SlotLimit, slot_limit

__all__ = [
    "QUEUE_FULL",
    "RETRY_AFTER_SECONDS",
    "Admission",
    "Cordons",
    "QueueFull",
    "QueueTimeout",
    "Slot",
    "SlotLimit",
    "Waited",
    "Waiter",
    "slot_limit",
]

DEFAULT_BATCH_MAX_WAIT = 120.0
"""``--batch-max-wait``: past it a batch request is served as interactive (§16.3)."""


@define(eq=False)
class Admission:
    """One facade's slot counts and queue; the clock is the only timer source."""

    _clock: IReactorTime
    _limit: SlotLimit
    queue_size: int
    queue_timeout: float
    _accepts: Callable[[str], bool] = field(default=lambda _: True, kw_only=True)
    """Whether a node takes new work now: a cordoned one does not (§13.1), so no waiter binds to it."""
    _reserved: Callable[[str], int] = field(default=lambda _: 0, kw_only=True)
    """A node's ``slots_reserved``: slots a batch request does not take (§16.3)."""
    batch_max_wait: float = field(default=DEFAULT_BATCH_MAX_WAIT, kw_only=True)
    _counts: SlotCounts = field(init=False)
    _queue: WaitQueue = field(init=False)

    def __attrs_post_init__(self) -> None:
        self._counts = SlotCounts(self._limit, self._reserved, self._accepts)
        self._queue = WaitQueue(self.batch_max_wait)

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._queue)

    def depth_of(self, priority: Priority) -> int:
        """Requests of ``priority`` waiting for a slot now (§16.3)."""
        return self._queue.depth(priority)

    def oldest_wait(self, priority: Priority) -> float:
        """Seconds the oldest waiting request of ``priority`` has waited so far."""
        return self._queue.oldest_wait(priority, self._clock.seconds())

    def waited(self, priority: Priority) -> Waited:
        """The requests of ``priority`` that have left the queue, and their time in it."""
        return self._queue.waited(priority)

    def slots(self, node_id: str) -> int:
        """The node's slots (0 = unlimited; a node gone counts as 0)."""
        return self._counts.slots(node_id)

    def queued_for(self, node_id: str) -> float:
        """The predicted service seconds there of the waiters that chose ``node_id`` (§15.2)."""
        return self._queue.chosen(node_id)

    def waiting_for(self, node_id: str) -> int:
        """Requests in the queue that ``node_id`` would take (it is among their candidates)."""
        return sum(1 for w in self._queue if node_id in w.candidates)

    def slots_in_use(self, node_id: str) -> int:
        """Requests of this facade holding a slot on the node now (counted when unlimited too)."""
        return self._counts.in_use(node_id)

    def admit(
        self,
        candidates: Sequence[Node],
        *,
        cordons: Cordons = Cordons.APPLY,
        patience: Patience | None = None,
        priority: Priority = Priority.INTERACTIVE,
    ) -> Slot | Waiter | QueueFull:
        """A slot on the first candidate with one free, else a place in the queue, else full.

        ``cordons``: :attr:`Cordons.WAIVED` when the client named the node (a cordon lets it in).
        ``patience`` (§15.2): a free node it declines is passed over, and the request waits for
        its best node instead, until that node's predicted finish at the latest. ``priority``
        (§16.3): a batch request does not take a node's reserved slots, and waits behind every
        interactive one until it has waited ``batch_max_wait``."""
        ids = tuple(node.id for node in candidates)
        if patience is None and priority is Priority.INTERACTIVE:  # nothing to choose, as asked:
            free = self._counts.free(ids, priority, cordons)  # a free slot binds, no waiter made
            if free is not None:
                return self._bind(free)
        waiter = Waiter(ids, self._clock.seconds(), cordons, patience, priority)
        ahead = {n: self.queued_for(n) for n in ids} if patience is not None else {}
        free = self._first_free_for(waiter, ahead)
        if free is not None:
            return self._bind(free)
        if len(self._queue) >= self.queue_size:
            declined = self._counts.free(ids, priority, cordons)
            return QUEUE_FULL if declined is None else self._bind(declined)
        waiter.bound = Deferred(lambda _: self._leave(waiter))
        waiter.timers.append(self._clock.callLater(self.queue_timeout, self._expire, waiter))
        if priority is Priority.BATCH:
            waiter.timers.append(self._clock.callLater(self.batch_max_wait, self.wake))
        self._queue.append(waiter)
        _recheck(waiter, self._clock, self.wake)
        return waiter

    def wake(self) -> None:
        """Bind waiters to every slot free now, in turn (after any change of slots, and at a
        patience's re-check)."""
        self._scan(None)

    def _scan(self, freed: str | None) -> None:
        """Look at the waiters in turn: when a slot ``freed`` on a node, those that could take it,
        while it has room (a waiter may choose another free node meanwhile); else all of them.
        Each counts the work of those ahead of it that keep waiting."""
        bindings: list[tuple[Waiter, Slot]] = []
        ahead: dict[str, float] = {}
        looked: list[Waiter] = []
        for waiter in self._queue.in_turn(self._clock.seconds()):
            if freed is not None:
                if self._counts.free((freed,), Priority.INTERACTIVE, Cordons.WAIVED) is None:
                    break
                if freed not in waiter.candidates:
                    continue
            free = self._first_free_for(waiter, ahead)
            looked.append(waiter)
            if free is not None:
                bindings.append((waiter, self._bind(free)))
            elif waiter.choice is not None:  # cordoned, declined (§15.2), reserved (§16.3)
                ahead[waiter.choice] = ahead.get(waiter.choice, 0.0) + waiter.service
        for waiter, _ in bindings:
            self._leave(waiter)
        for waiter in looked:
            _recheck(waiter, self._clock, self.wake)
        # Fired after the scan: a woken request runs at once and may release or admit in turn.
        for waiter, slot in bindings:
            waiter.bound.callback(slot)

    def _first_free_for(self, waiter: Waiter, ahead: Mapping[str, float]) -> str | None:
        """The node the waiter takes now: its first candidate with a slot free for it, or with
        a patience the node it chooses (:func:`choose`, ``ahead``: the work queued before it per
        node), if that one can take it now."""
        counts, cordons = self._counts, waiter.cordons
        priority = self._queue.served_as(waiter, self._clock.seconds())
        if waiter.patience is None:
            return counts.free(waiter.candidates, priority, cordons)
        free = [n for n in waiter.candidates if counts.free((n,), priority, cordons) is not None]
        choice = _chosen(waiter, waiter.patience, free, ahead, self.slots)
        if choice is None:
            return free[0] if free else None
        self._queue.choose(waiter, choice.node, waiter.patience.last[choice.node].service)
        return choice.node if choice.bind else None

    def _bind(self, node_id: str) -> Slot:
        self._counts.take(node_id)
        return Slot(self._counts.take, self._give_back, node_id)

    def _give_back(self, node_id: str) -> None:
        self._counts.give_back(node_id)
        if self._queue:
            self._scan(node_id)

    def _leave(self, waiter: Waiter) -> None:
        """Take ``waiter`` out of the queue (bound, gone or expired) and stop its timers."""
        if waiter in self._queue:
            self._queue.remove(waiter, self._clock.seconds())
        waiter.pending_recheck = None
        _recheck(waiter, self._clock, self.wake)
        for timer in waiter.timers:
            if timer.active():
                timer.cancel()
        waiter.timers.clear()

    def _expire(self, waiter: Waiter) -> None:
        queued = waiter in self._queue
        self._leave(waiter)
        if queued:
            waiter.bound.errback(QueueTimeout(f"no slot freed within {self.queue_timeout:g}s"))


def _chosen(
    waiter: Waiter,
    patience: Patience,
    free: list[str],
    ahead: Mapping[str, float],
    slots: Callable[[str], int],
) -> Choice | None:
    """``waiter``'s patience's choice now (§15.2) among its candidates (``free``: those with a
    slot free for it; ``ahead``: the work queued before it per node); when to look again is
    kept on the waiter."""
    choice = choose(waiter.candidates, patience.read(), free, ahead, slots)
    waiter.pending_recheck = None if choice is None else choice.recheck
    return choice


def _recheck(waiter: Waiter, clock: IReactorTime, wake: Callable[[], None]) -> None:
    """Set the waiting request's next look (its patience's re-check), replacing the last one;
    none once it has left (its ``pending_recheck`` cleared)."""
    if waiter.recheck is not None and waiter.recheck.active():
        waiter.recheck.cancel()
    waiter.recheck = None
    if waiter.pending_recheck is not None:
        waiter.recheck = clock.callLater(waiter.pending_recheck, wake)
