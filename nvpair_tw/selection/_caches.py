# -*- test-case-name: tests.selection.test_caches -*-
"""The nodes' prompt caches as the proxy sees them (docs/behaviour.md §5.3.1): which conversations
it sent to each (node, model) most recently, how many of them that cache can hold, and which one a
new conversation would push out.

A conversation is known here by the first boundary of its chain (its system prompt, tools and
first message, :class:`~nvpair_tw.selection.AffinityKey`), which every later turn shares: its
*root*. Each (node, model) keeps the roots it served, most recent last, with when and how many
tokens the engine held for it after that turn (its stated prompt and completion tokens), at most
:data:`TRACKED` of them. A conversation's *position* there is 1 for the most recent, 2 for the
one before, and so on; it can still be cached while its position is within the capacity.

The **capacity**, in conversations, is the nodes file's ``cache_conversations``; else unbounded
above the slots the engine states (llama.cpp's ``/props`` ``total_slots``: a slot holds one
conversation, and a host-memory prompt cache, which no engine states, may hold more); else
unknown (unbounded). Whichever it started from, what the engine says it found cached corrects it
(:meth:`CacheBook.judge`): a conversation found cold at a position the capacity covers shrinks it
to the position before (never below the stated slots), one found warm beyond it grows it to that
position. Only digests are kept: never a prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from enum import Enum

from attrs import define, field, frozen
from twisted.internet.interfaces import IReactorTime

__all__ = ["HIT_SHARE", "TRACKED", "CacheBook", "Capacity", "CapacitySource", "Place"]

TRACKED = 256
"""Conversations remembered per (node, model): one pushed further is beyond any capacity learnt
from positions here."""
HIT_SHARE = 0.75
"""A turn found at least this share of what its conversation's last turn left on the node
cached is a hit; less is a miss (the shared system prompt alone is not its conversation)."""


class CapacitySource(Enum):
    """Where a (node, model)'s capacity came from."""

    FILE = "file"
    """The nodes file's ``cache_conversations``."""
    ENGINE = "engine"
    """The slots the engine states (at least that many; a host cache may hold more)."""
    LEARNT = "learnt"
    """Corrected by what the engine reported cached."""
    UNKNOWN = "unknown"
    """Nothing said or learnt yet: unbounded."""


@frozen
class Capacity:
    """How many conversations a (node, model) is believed to keep cached (None: unbounded), the
    least a correction leaves (the stated slots), and where the figure came from."""

    conversations: int | None
    floor: int = 0
    source: CapacitySource = CapacitySource.UNKNOWN


@frozen
class Place:
    """Where a conversation stands in one node's cache: its position (1: the most recent sent
    there), the tokens the engine held for it after that turn (None: not stated), and whether it
    can still be there."""

    position: int
    tokens: int | None
    resident: bool


@frozen
class _Held:
    at: float
    tokens: int | None


Book = OrderedDict[bytes, _Held]
Noted = Callable[[str, str, bytes, int | None], None]
"""Told ``(node, model, sealed root, tokens)`` of each conversation this proxy notes."""


@define
class CacheBook:
    """One facade's view of its nodes' prompt caches (see the module docstring).

    ``configured(node_id)`` is the nodes file's ``cache_conversations`` (None: unset) and
    ``stated(node_id)`` the slots the engine states (None: unknown); ``active_within`` is how
    long after its last turn a conversation counts as active (the affinity idle time).
    """

    _clock: IReactorTime
    _configured: Callable[[str], int | None] = field(default=lambda _node: None)
    _stated: Callable[[str], int | None] = field(default=lambda _node: None)
    active_within: float = 300.0
    _books: dict[tuple[str, str], Book] = field(init=False, factory=dict)
    _learnt: dict[tuple[str, str], tuple[int | None, int]] = field(init=False, factory=dict)
    """Per (node, model): the nodes file's figure a correction was made under, and the corrected
    capacity (a changed figure in the file starts again from it)."""
    _seal: Callable[[bytes], bytes] = field(init=False, default=lambda root: root)
    _listeners: list[Noted] = field(init=False, factory=list)

    def shared(self, seal: Callable[[bytes], bytes], listener: Noted) -> None:
        """Keep roots sealed by ``seal`` (a fleet's HMAC, so a peer's note and a local lookup
        meet) and tell ``listener`` of every conversation this proxy notes (§6.6)."""
        self._seal = seal
        self._listeners.append(listener)

    def capacity(self, node_id: str, model: str) -> Capacity:
        """The (node, model)'s capacity now: corrected by the engine's reports, from the nodes
        file's figure, else the engine's stated slots, else unknown."""
        given = self._given(node_id)
        learnt = self._learnt.get((node_id, model))
        if learnt is None or learnt[0] != self._configured(node_id):
            return given
        return Capacity(max(learnt[1], given.floor), given.floor, CapacitySource.LEARNT)

    def _limit(self, node_id: str, model: str) -> int | None:
        """:meth:`capacity`'s conversations, without making it (asked on every request)."""
        configured = self._configured(node_id)
        learnt = self._learnt.get((node_id, model))
        if learnt is not None and learnt[0] == configured:
            floor = 0 if configured is not None else self._stated(node_id) or 0
            return max(learnt[1], floor)
        return configured

    def _given(self, node_id: str) -> Capacity:
        configured = self._configured(node_id)
        if configured is not None:
            return Capacity(configured, 0, CapacitySource.FILE)
        stated = self._stated(node_id)
        if stated:
            return Capacity(None, stated, CapacitySource.ENGINE)
        return Capacity(None)

    def place(self, node_id: str, model: str, root: bytes) -> Place | None:
        """Where the conversation ``root`` stands on ``node_id`` (None: not sent there lately)."""
        root = self._seal(root)
        book = self._books.get((node_id, model))
        if book is None or root not in book:
            return None
        position = 1
        for key in reversed(book):
            if key == root:
                break
            position += 1
        limit = self._limit(node_id, model)
        return Place(position, book[root].tokens, limit is None or position <= limit)

    def note(self, node_id: str, model: str, root: bytes, tokens: int | None) -> None:
        """The conversation ``root`` was just served whole by ``node_id``; the engine holds
        ``tokens`` for it now (its prompt and completion, None: not stated)."""
        sealed = self._seal(root)
        self.fold(node_id, model, sealed, tokens)
        for listener in self._listeners:
            listener(node_id, model, sealed, tokens)

    def fold(self, node_id: str, model: str, sealed: bytes, tokens: int | None) -> None:
        """A conversation (its root already sealed) was served whole by ``node_id``: by this
        proxy, or by a peer (nobody is told)."""
        book = self._books.setdefault((node_id, model), OrderedDict())
        book[sealed] = _Held(self._clock.seconds(), tokens)
        book.move_to_end(sealed)
        while len(book) > TRACKED:
            book.popitem(last=False)

    def pushed_out(self, node_id: str, model: str) -> int | None:
        """The tokens of the active conversation a new one sent to ``node_id`` would push out of
        its cache (0 when their count is unknown), or None: none would be (room left, an unknown
        capacity, or the one at its edge idle longer than :attr:`active_within`)."""
        book = self._books.get((node_id, model))
        if book is None:
            return None
        limit = self._limit(node_id, model)
        if limit is None or len(book) < limit or limit == 0:
            return None
        edge = None
        for index, held in enumerate(reversed(book.values()), start=1):
            if index == limit:
                edge = held
                break
        if edge is None or self._clock.seconds() - edge.at >= self.active_within:
            return None
        return edge.tokens or 0

    def judge(self, node_id: str, model: str, place: Place, cached: int, prompt: int) -> None:
        """Correct the capacity by what the engine said it found cached for a turn of the
        conversation at ``place`` (``cached`` of its ``prompt`` tokens): a miss the capacity
        covered shrinks it, a hit beyond it grows it. Without the tokens its last turn left there,
        nothing is judged."""
        if place.tokens is None:
            return
        hit = cached >= HIT_SHARE * min(place.tokens, prompt)
        now = self.capacity(node_id, model)
        limit = now.conversations
        if hit and limit is not None and place.position > limit:
            corrected = place.position
        elif not hit and (limit is None or place.position <= limit):
            corrected = max(now.floor, place.position - 1)
        else:
            return
        self._learnt[node_id, model] = (self._configured(node_id), corrected)

    def to_json(self, node_id: str) -> dict[str, dict[str, int | str | None]]:
        """Per model served on ``node_id`` lately, as ``nodes/list`` shows it: the capacity in
        conversations (None: unbounded), where it came from, and how many conversations this
        book holds for it (at most :data:`TRACKED`)."""
        return {
            model: {
                "conversations": (capacity := self.capacity(node, model)).conversations,
                "source": capacity.source.value,
                "recent": len(book),
            }
            for (node, model), book in sorted(self._books.items())
            if node == node_id
        }
