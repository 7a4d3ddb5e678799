# -*- test-case-name: tests.selection.test_admission -*-
"""Per-node slots of one facade (docs/behaviour.md §6.4, §16.3): how many are set, how many are
held, which candidate has one free for a request of a given priority, and the :class:`Slot` one
request holds.

``slots_reserved = N`` on a node keeps N of its slots for interactive work: a ``batch`` request
takes a slot only while fewer than ``slots - N`` are held there (§16.3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum

from attrs import define, field

from nvpair_tw.core import Priority
from nvpair_tw.nodes import Node

__all__ = ["Cordons", "Slot", "SlotCounts", "SlotLimit", "slot_limit"]


class Cordons(Enum):
    """Whether a cordon keeps a request from a node (docs/behaviour.md §13.1)."""

    APPLY = "apply"
    """The proxy picks the node: a cordoned one takes no new work."""
    WAIVED = "waived"
    """The client named the node (``X-NVPair-Node``): maintenance reaches it through a cordon."""


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


def priority_note(batch_keys: int, nodes: Iterable[Node], default_slots: int) -> str | None:
    """The start-up note of §16.3: keys with ``priority = "batch"`` on a fleet whose every node
    has unlimited slots (nothing queues, so priorities change nothing); None otherwise."""
    if not batch_keys or default_slots or any(node.slots for node in nodes):
        return None
    keys = "key has" if batch_keys == 1 else "keys have"
    return (
        f'{batch_keys} {keys} priority = "batch", but every node has unlimited slots: nothing'
        " queues, so priorities change nothing; set slots = N on the nodes (or --default-slots)"
        " (docs/behaviour.md §16.3)"
    )


@define(eq=False)
class SlotCounts:
    """The slots held on each node, and where a request may take one now."""

    _limit: SlotLimit
    _reserved: Callable[[str], int]
    """A node's ``slots_reserved`` (§16.3)."""
    _accepts: Callable[[str], bool]
    """Whether a node takes new work now: a cordoned one does not (§13.1)."""
    _in_use: dict[str, int] = field(init=False, factory=dict)

    def slots(self, node_id: str) -> int:
        """The node's slots (0 = unlimited; a node gone counts as 0)."""
        return self._limit(node_id) or 0

    def in_use(self, node_id: str) -> int:
        return self._in_use.get(node_id, 0)

    def free(self, candidates: Iterable[str], priority: Priority, cordons: Cordons) -> str | None:
        """The first of ``candidates`` with a slot free for ``priority``, passing over a cordoned
        node unless ``cordons`` is :attr:`Cordons.WAIVED`."""
        for node_id in candidates:
            if cordons is Cordons.APPLY and not self._accepts(node_id):
                continue
            limit = self._limit(node_id)
            if limit is None:
                continue
            if limit == 0:
                return node_id
            kept = self._reserved(node_id) if priority is Priority.BATCH else 0
            if self._in_use.get(node_id, 0) < limit - kept:
                return node_id
        return None

    def take(self, node_id: str) -> None:
        self._in_use[node_id] = self._in_use.get(node_id, 0) + 1

    def give_back(self, node_id: str) -> None:
        remaining = self._in_use.get(node_id, 0) - 1
        if remaining > 0:
            self._in_use[node_id] = remaining
        else:
            self._in_use.pop(node_id, None)


@define(eq=False)
class Slot:
    """One request's slot: on one node at a time, moved with the attempt, released once."""

    _take: Callable[[str], None]
    _give_back: Callable[[str], None]
    """Gives a node's slot back and wakes who waits for it."""
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
        self._take(node_id)
        self._give_back(held)

    def release(self) -> None:
        """Give the slot back (waking a waiter); a second release does nothing."""
        held, self._node_id = self._node_id, None
        if held is not None:
            self._give_back(held)
