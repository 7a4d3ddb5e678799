# -*- test-case-name: tests.selection.test_admission -*-
"""One facade's queue of requests waiting for a slot (docs/behaviour.md §6.4, §16.3).

The queue is served in turn: interactive requests oldest first, then batch ones oldest first; a
batch request that has waited ``batch_max_wait`` is served as interactive (in its place by age).
It counts its depth and the waits of the requests that left it, per priority, for ``/metrics``
and the status page.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall

from nvpair_tw.core import Priority
from nvpair_tw.selection._patience import Patience
from nvpair_tw.selection._slots import Cordons, Slot

__all__ = [
    "QUEUE_FULL",
    "RETRY_AFTER_SECONDS",
    "QueueFull",
    "QueueTimeout",
    "WaitQueue",
    "Waited",
    "Waiter",
]

RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of both 503s: the queue moves as soon as any slot frees, so there is no better
estimate than "soon"; a client that backs off on its own does better than a guess."""


@frozen
class QueueFull:
    """Every candidate is full and so is the queue: answer 503 ``queue-full`` at once."""


QUEUE_FULL = QueueFull()


class QueueTimeout(Exception):
    """A waiter's ``queue_timeout`` ran out before a slot freed."""


@define(eq=False)
class Waiter:
    """A request waiting in the queue: :attr:`bound` fires with its :class:`Slot`.

    :attr:`bound` fails with :class:`QueueTimeout` when the queue timeout runs out; cancelling it
    (the caller left) takes the waiter out of the queue. Either way the timers are cancelled.
    """

    candidates: tuple[str, ...]
    since: float
    cordons: Cordons = Cordons.APPLY
    """:attr:`Cordons.WAIVED` when chosen by ``X-NVPair-Node``: it may bind to a cordoned node
    (maintenance, §13.1)."""
    patience: Patience | None = None
    """How it chooses its node when slots free (§15.2); None: the first free candidate."""
    priority: Priority = Priority.INTERACTIVE
    bound: Deferred[Slot] = field(init=False)
    timers: list[IDelayedCall] = field(init=False, factory=list)
    """Its queue timeout and the wake-up of its aging."""
    choice: str | None = None
    """The node it waits for (its patience's last choice), whose work ahead it counts as."""
    service: float = 0.0
    """Its predicted seconds from dispatch to its last token on :attr:`choice`."""
    recheck: IDelayedCall | None = None
    """When its patience looks again while no slot frees."""
    pending_recheck: float | None = None
    """Seconds from its last look to its next one (its patience's :attr:`Choice.recheck`)."""


@frozen
class Waited:
    """The requests of one priority that left the queue: how many, and their seconds in it."""

    count: int = 0
    seconds: float = 0.0


@define(eq=False)
class WaitQueue:
    """The waiters of each priority in arrival order, and what the queue has seen.

    :meth:`in_turn` is lazy: a freed slot usually binds the first waiter it offers itself to, so
    the scan stops there, whatever the queue's length."""

    batch_max_wait: float
    _waiters: dict[Priority, list[Waiter]] = field(
        init=False, factory=lambda: {p: [] for p in Priority}
    )
    _waited: dict[Priority, Waited] = field(init=False, factory=dict)
    _chosen: dict[str, float] = field(init=False, factory=dict)
    """Per node, the service time there of the waiters that chose it (§15.2)."""

    def __len__(self) -> int:
        return sum(len(waiting) for waiting in self._waiters.values())

    def __contains__(self, waiter: Waiter) -> bool:
        return waiter in self._waiters[waiter.priority]

    def __iter__(self) -> Iterator[Waiter]:
        """Every waiter (interactive ones first)."""
        return iter([w for waiting in self._waiters.values() for w in waiting])

    def served_as(self, waiter: Waiter, now: float) -> Priority:
        """The waiter's priority now: a batch one that has waited long enough is interactive."""
        if waiter.priority is Priority.BATCH and now - waiter.since < self.batch_max_wait:
            return Priority.BATCH
        return Priority.INTERACTIVE

    def in_turn(self, now: float) -> Iterator[Waiter]:
        """The waiters in the order a freed slot is offered to them (§16.3): interactive ones and
        aged batch ones by age, then the other batch ones by age. Nothing may join or leave the
        queue while this is iterated."""
        batch = self._waiters[Priority.BATCH]
        aged = 0  # the aged batch waiters are the oldest: a prefix of the batch list
        while aged < len(batch) and self.served_as(batch[aged], now) is Priority.INTERACTIVE:
            aged += 1
        interactive = self._waiters[Priority.INTERACTIVE]
        if aged:
            yield from heapq.merge(interactive, batch[:aged], key=lambda w: w.since)
        else:
            yield from interactive
        yield from itertools.islice(batch, aged, None)

    def append(self, waiter: Waiter) -> None:
        self._waiters[waiter.priority].append(waiter)
        self._tally(waiter, 1.0)

    def choose(self, waiter: Waiter, node_id: str, service: float) -> None:
        """``waiter`` chose to wait for ``node_id``, where it takes ``service`` seconds."""
        queued = waiter in self
        if queued:
            self._tally(waiter, -1.0)
        waiter.choice, waiter.service = node_id, service
        if queued:
            self._tally(waiter, 1.0)

    def chosen(self, node_id: str) -> float:
        """The service time on ``node_id`` of the waiters that chose it."""
        return max(0.0, self._chosen.get(node_id, 0.0))

    def _tally(self, waiter: Waiter, sign: float) -> None:
        if waiter.choice is not None:
            total = self._chosen.get(waiter.choice, 0.0) + sign * waiter.service
            self._chosen[waiter.choice] = total
        if not len(self):
            self._chosen.clear()  # no rounding left over once the queue is empty

    def remove(self, waiter: Waiter, now: float) -> None:
        """Take ``waiter`` out (bound, timed out or gone), counting its wait."""
        self._waiters[waiter.priority].remove(waiter)
        self._tally(waiter, -1.0)
        seen = self._waited.get(waiter.priority, Waited())
        self._waited[waiter.priority] = Waited(seen.count + 1, seen.seconds + now - waiter.since)

    def depth(self, priority: Priority) -> int:
        """Requests of ``priority`` (as they arrived) waiting now."""
        return len(self._waiters[priority])

    def oldest_wait(self, priority: Priority, now: float) -> float:
        """Seconds the oldest waiting request of ``priority`` has waited (0 when none waits)."""
        waiting = self._waiters[priority]
        return now - waiting[0].since if waiting else 0.0

    def waited(self, priority: Priority) -> Waited:
        """The requests of ``priority`` that have left the queue so far."""
        return self._waited.get(priority, Waited())
