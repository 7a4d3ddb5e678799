# -*- test-case-name: tests.selection.test_admission -*-
"""Admission and late binding: per-node slots and one facade's FIFO queue (docs/behaviour.md §6.4).

Each node of a facade has ``slots``: how many requests this process runs on it at once (0 =
unlimited). :meth:`Admission.admit` binds an inference request to the first candidate, in its own
candidate order, that has a free slot, and returns the :class:`Slot` it holds. When every candidate
is full the request waits as a :class:`Waiter` in the facade's FIFO (bounded by ``queue_size``, each
waiter by ``queue_timeout``); a slot freed on a node binds the oldest waiter that can use that node,
and :meth:`Admission.wake` (after the facade's nodes change) binds every waiter that has a free node,
each to the first free node of its own candidates. A queue that is full answers :data:`QUEUE_FULL`
at once and keeps nothing.

A :class:`Slot` moves with the attempt on failover (:meth:`Slot.move`) and is released once
(:meth:`Slot.release`). A move goes over the next node's slots rather than waiting: see
docs/behaviour.md §6.4 for why.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nvpair_tw.nodes import Node
from nvpair_tw.selection._patience import Patience

__all__ = [
    "QUEUE_FULL",
    "RETRY_AFTER_SECONDS",
    "Admission",
    "QueueFull",
    "QueueTimeout",
    "Slot",
    "SlotLimit",
    "Waiter",
    "slot_limit",
]

RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of both 503s: the queue moves as soon as any slot frees, so there is no better
estimate than "soon"; a client that backs off on its own does better than a guess."""

SlotLimit = Callable[[str], int | None]
"""A node id's slots now: 0 = unlimited, ``None`` = the node is gone (nothing binds to it)."""


def slot_limit(
    nodes: Callable[[str], Node | None],
    default_slots: int,
    reported: Callable[[str], int | None] = lambda node_id: None,
) -> SlotLimit:
    """A :data:`SlotLimit` reading each node's own ``slots``; when unset, what the node itself
    reports (``reported``: llama.cpp's ``/props``, §11.1), else ``default_slots``."""

    def limit(node_id: str) -> int | None:
        node = nodes(node_id)
        if node is None:
            return None
        if node.slots is not None:
            return node.slots
        said = reported(node_id)
        return default_slots if said is None else said

    return limit


@frozen
class QueueFull:
    """Every candidate is full and so is the queue: answer 503 ``queue-full`` at once."""


QUEUE_FULL = QueueFull()


class QueueTimeout(Exception):
    """A waiter's ``queue_timeout`` ran out before a slot freed."""


@define(eq=False)
class Slot:
    """One request's slot: on one node at a time, moved with the attempt, released once."""

    _admission: Admission
    _node_id: str | None

    @property
    def node_id(self) -> str | None:
        """The node held now, or None once released."""
        return self._node_id

    def move(self, node_id: str) -> None:
        """Hold a slot on ``node_id`` instead (even if it is full: a move never waits)."""
        held = self._node_id
        if held is None or held == node_id:
            return
        self._node_id = node_id
        self._admission._take(node_id)
        self._admission._give_back(held)

    def release(self) -> None:
        """Give the slot back (waking a waiter); a second release does nothing."""
        held, self._node_id = self._node_id, None
        if held is not None:
            self._admission._give_back(held)


@define(eq=False)
class Waiter:
    """A request waiting in the queue: :attr:`bound` fires with its :class:`Slot`.

    :attr:`bound` fails with :class:`QueueTimeout` when the queue timeout runs out; cancelling it
    (the caller left) takes the waiter out of the queue. Either way the timer is cancelled.
    """

    candidates: tuple[str, ...]
    since: float
    targeted: bool = False
    """Chosen by ``X-NVPair-Node``: it may bind to a cordoned node (maintenance, §13.1)."""
    patience: Patience | None = None
    """Which freed nodes it declines while its best one may still be worth the wait (§15.2)."""
    bound: Deferred[Slot] = field(init=False)
    _timer: IDelayedCall | None = field(init=False, default=None)
    _patience_timer: IDelayedCall | None = field(init=False, default=None)


@define(eq=False)
class Admission:
    """One facade's slot counts and FIFO queue; the clock is the only timer source."""

    _clock: IReactorTime
    _limit: SlotLimit
    queue_size: int
    queue_timeout: float
    _accepts: Callable[[str], bool] = field(default=lambda _: True, kw_only=True)
    """Whether a node takes new work now: a cordoned one does not (§13.1), so no waiter binds to it."""
    _in_use: dict[str, int] = field(init=False, factory=dict)
    _queue: deque[Waiter] = field(init=False, factory=deque)

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._queue)

    def slots(self, node_id: str) -> int:
        """The node's slots (0 = unlimited; a node gone counts as 0)."""
        return self._limit(node_id) or 0

    def queued_for(self, node_id: str) -> float:
        """The predicted seconds of work queued for ``node_id``: its waiters' service time there,
        of the waiters whose best node it is (§15.2)."""
        return sum(
            w.patience.service.get(node_id, 0.0)
            for w in self._queue
            if w.patience is not None and w.patience.best == node_id
        )

    def slots_in_use(self, node_id: str) -> int:
        """Requests of this facade holding a slot on the node now (counted when unlimited too)."""
        return self._in_use.get(node_id, 0)

    def admit(
        self,
        candidates: Sequence[Node],
        *,
        targeted: bool = False,
        patience: Patience | None = None,
    ) -> Slot | Waiter | QueueFull:
        """A slot on the first candidate with one free, else a place in the queue, else full.

        ``targeted`` (the client named the node): a cordon does not keep it from the node.
        ``patience`` (§15.2): a free node it declines is passed over, and the request waits for
        its best node instead, until that node's predicted finish at the latest."""
        ids = tuple(node.id for node in candidates)
        waiter = Waiter(ids, self._clock.seconds(), targeted, patience)
        free = self._first_free_for(waiter)
        if free is not None:
            return self._bind(free)
        if len(self._queue) >= self.queue_size:
            return QUEUE_FULL
        waiter.bound = Deferred(lambda _: self._leave(waiter))
        waiter._timer = self._clock.callLater(self.queue_timeout, self._expire, waiter)
        if patience is not None:
            late = max(0.0, patience.best_finish - waiter.since)
            waiter._patience_timer = self._clock.callLater(late, self.wake)
        self._queue.append(waiter)
        return waiter

    def wake(self) -> None:
        """Bind waiters to every slot free now, oldest waiter first (after any change of slots)."""
        bindings: list[tuple[Waiter, Slot]] = []
        for waiter in self._queue:
            free = self._first_free_for(waiter)
            if free is not None:
                bindings.append((waiter, self._bind(free)))
        self._dispatch(bindings)

    def _wake_for(self, node_id: str) -> None:
        """A slot freed on ``node_id``: bind the oldest waiters that can use it while it has room."""
        bindings: list[tuple[Waiter, Slot]] = []
        for waiter in self._queue:
            if self._first_free((node_id,), True) is None:
                break
            if node_id in waiter.candidates:
                free = self._first_free_for(waiter)
                if free is None:
                    continue  # cordoned and not named, or declined (§15.2): the next waiter
                bindings.append((waiter, self._bind(free)))
        self._dispatch(bindings)

    def _dispatch(self, bindings: list[tuple[Waiter, Slot]]) -> None:
        for waiter, _ in bindings:
            self._queue.remove(waiter)
            self._stop_timer(waiter)
        # Fired after the scan: a woken request runs at once and may release or admit in turn.
        for waiter, slot in bindings:
            waiter.bound.callback(slot)

    def _first_free_for(self, waiter: Waiter) -> str | None:
        """The waiter's first candidate with a free slot that its patience accepts now."""
        patience = waiter.patience
        if patience is None:
            return self._first_free(waiter.candidates, waiter.targeted)
        now = self._clock.seconds()
        taken = [n for n in waiter.candidates if patience.accepts(n, now)]
        return self._first_free(taken, waiter.targeted)

    def _first_free(self, candidates: Sequence[str], targeted: bool = False) -> str | None:
        for node_id in candidates:
            if not targeted and not self._accepts(node_id):
                continue
            limit = self._limit(node_id)
            if limit is not None and (limit == 0 or self._in_use.get(node_id, 0) < limit):
                return node_id
        return None

    def _bind(self, node_id: str) -> Slot:
        self._take(node_id)
        return Slot(self, node_id)

    def _take(self, node_id: str) -> None:
        self._in_use[node_id] = self._in_use.get(node_id, 0) + 1

    def _give_back(self, node_id: str) -> None:
        remaining = self._in_use.get(node_id, 0) - 1
        if remaining > 0:
            self._in_use[node_id] = remaining
        else:
            self._in_use.pop(node_id, None)
        if self._queue:
            self._wake_for(node_id)

    def _leave(self, waiter: Waiter) -> None:
        if waiter in self._queue:
            self._queue.remove(waiter)
        self._stop_timer(waiter)

    def _expire(self, waiter: Waiter) -> None:
        waiter._timer = None
        self._stop_timer(waiter)
        if waiter in self._queue:
            self._queue.remove(waiter)
            waiter.bound.errback(QueueTimeout(f"no slot freed within {self.queue_timeout:g}s"))

    @staticmethod
    def _stop_timer(waiter: Waiter) -> None:
        for timer in (waiter._timer, waiter._patience_timer):
            if timer is not None and timer.active():
                timer.cancel()
        waiter._timer = waiter._patience_timer = None
