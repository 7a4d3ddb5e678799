# -*- test-case-name: tests.bench.test_kvcache -*-
"""The slots of the engine double of ``bench/kvengine.py`` and how a prompt picks one, as
llama-server does it (issue 39).

Each slot holds the tokens of the prompt it last read plus the answer it wrote. A request takes an
idle slot the way llama-server's ``get_available_slot`` chooses one: among the idle slots holding
tokens, the one whose tokens share the longest prefix with the prompt, if that prefix is more than
:data:`SIMILARITY` of the prompt (the first such on a tie); else the least recently used idle slot
(the last on a tie). So a conversation that shares only the agent's system prompt with an idle
slot (two thirds of a first turn) takes that slot, and the conversation it held is gone from it.
What the slot shares with the prompt is read from the cache; the rest, and at least the last
token, is read again. A request naming a slot (llama-server's ``id_slot``) takes that slot,
whatever it holds, or waits for it while other requests go ahead.

**llama-server's host-memory prompt cache** (``--cache-ram``, 8 GiB by default in current builds)
is imitated when a :class:`HostCache` is given: when a slot chosen for a request is taken by
least-recent use, or for its prefix while keeping less than half of what it held, what it held is
saved to host memory (an entry a longer one contains is dropped; the oldest go beyond the
capacity), and the saved prompt that keeps more of itself and shares more with the request than
the slot does (keeping at least a quarter of itself) is restored into the slot, and leaves the
cache. Restoring costs time (:attr:`Taken.restored` tokens at the engine's restore rate).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from attrs import define, field, frozen

__all__ = ["SIMILARITY", "HostCache", "PrefixCache", "Slot", "Taken", "common_prefix"]

SIMILARITY = 0.1
"""llama-server's ``--slot-prompt-similarity``: a slot is chosen for its prefix only when the
shared prefix is more than this share of the new prompt."""
KEEP = 0.5
"""A slot chosen for its prefix that keeps less than this share of what it held is saved first."""
RESTORE_KEEP = 0.25
"""A saved prompt is restored only if the request keeps at least this share of it."""


@define
class Slot:
    """One slot: the tokens it holds, when it was last used, whether a request runs in it."""

    tokens: list[str] = field(factory=list)
    used: float = -1.0
    busy: bool = False


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@frozen
class Taken:
    """A slot taken for a prompt: its index, the prompt tokens found cached there, and how many
    tokens were restored into it from host memory first (0: none)."""

    index: int
    cached: int
    restored: int = 0


@define
class HostCache:
    """llama-server's host-memory prompt cache: saved prompts, oldest first, up to ``capacity``
    tokens in all (at least one is kept)."""

    capacity: int
    entries: deque[list[str]] = field(factory=deque)

    @property
    def tokens(self) -> int:
        return sum(len(e) for e in self.entries)

    def save(self, held: list[str]) -> None:
        """Save what a slot held, unless an entry already contains it; drop the entries it
        contains."""
        if any(common_prefix(e, held) == len(held) for e in self.entries):
            return
        self.entries = deque(e for e in self.entries if common_prefix(e, held) < len(e))
        self.entries.append(list(held))

    def load(self, held: Sequence[str], prompt: Sequence[str]) -> list[str] | None:
        """The saved prompt to restore into a slot holding ``held`` for ``prompt`` (taken out of
        the cache), or None when none would keep more than the slot does."""
        shared = common_prefix(held, prompt)
        keep_best = shared / len(held) if held else -1.0
        sim_best = shared / len(prompt)
        found = None
        for entry in self.entries:
            common = common_prefix(entry, prompt)
            keep, sim = common / len(entry), common / len(prompt)
            if keep >= RESTORE_KEEP and keep > keep_best and sim > sim_best:
                keep_best, sim_best, found = keep, sim, entry
        if found is not None:
            self.entries.remove(found)
        return found

    def trim(self) -> None:
        """Drop the oldest entries beyond the capacity (one always stays)."""
        while len(self.entries) > 1 and self.tokens > self.capacity:
            self.entries.popleft()


@define
class PrefixCache:
    """The slots of one engine and how a prompt picks one (see the module docstring)."""

    slots: list[Slot]
    host: HostCache | None = None

    @classmethod
    def of(cls, count: int, host: HostCache | None = None) -> PrefixCache:
        """``count`` empty slots (and ``host``, a host-memory prompt cache, or none)."""
        return cls([Slot() for _ in range(count)], host)

    def take(self, prompt: Sequence[str], now: float, wanted: int | None = None) -> Taken | None:
        """Take an idle slot for ``prompt`` (see the module docstring), or None when every slot
        is busy (or the ``wanted`` one is: a request naming llama-server's ``id_slot`` gets that
        slot, with what it holds, or waits for it). The slot is busy until :meth:`release`."""
        if wanted is not None:
            if self.slots[wanted].busy:
                return None
            chosen, best, save = wanted, common_prefix(self.slots[wanted].tokens, prompt), False
        else:
            choice = self._choose(prompt)
            if choice is None:
                return None
            chosen, best, save = choice
        slot = self.slots[chosen]
        slot.busy, slot.used = True, now
        restored = 0
        if save and self.host is not None and slot.tokens:
            self.host.save(slot.tokens)
            found = self.host.load(slot.tokens, prompt)
            self.host.trim()
            if found is not None:
                slot.tokens, restored = found, len(found)
                best = common_prefix(found, prompt)
        return Taken(chosen, min(best, len(prompt) - 1), restored)

    def _choose(self, prompt: Sequence[str]) -> tuple[int, int, bool] | None:
        """llama-server's ``get_available_slot``: (the slot, the tokens it shares with the
        prompt, whether what it holds is saved to host memory first), or None: all are busy."""
        idle = [i for i, s in enumerate(self.slots) if not s.busy]
        if not idle:
            return None
        chosen, best = None, 0
        for i in idle:
            held = self.slots[i].tokens
            shared = common_prefix(held, prompt) if held else 0
            if shared > best and shared > SIMILARITY * len(prompt):
                chosen, best = i, shared
        if chosen is None:
            chosen = max(idle, key=lambda i: (-self.slots[i].used, i))
            return chosen, common_prefix(self.slots[chosen].tokens, prompt), True
        return chosen, best, best < KEEP * len(self.slots[chosen].tokens)

    def release(self, index: int, tokens: list[str], now: float) -> None:
        """The request in slot ``index`` ended: the slot now holds ``tokens``."""
        slot = self.slots[index]
        slot.tokens, slot.used, slot.busy = tokens, now, False
