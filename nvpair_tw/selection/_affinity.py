# -*- test-case-name: tests.selection.test_affinity -*-
"""Prefix affinity (docs/behaviour.md §5.3): request digests and the per-facade warm-node table.

Requests that share a conversation prefix should go back to the node that served it, so the
engine's KV cache is reused. :func:`affinity_key` turns a request into digests (pure, no state);
:class:`AffinityTable` remembers which node served which digest, in memory only, bounded by an
LRU size and an idle TTL checked lazily against the injected clock. Neither ever logs or keeps a
prompt: only SHA-256 digests are stored.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from attrs import define, field, frozen, setters
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.selection._canonical import Bound, canonical

__all__ = [
    "CHAT_PATHS",
    "COMPLETION_PATHS",
    "AffinityKey",
    "AffinityTable",
    "Match",
    "affinity_key",
]

CHAT_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/api/chat",
        "/api/v0/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "/api/v1/chat",
    }
)
"""The conversation routes of every facade: chat completions, Ollama's chat, LM Studio's v0 and
v1 chat, Anthropic Messages and the Responses API. The route says whether a request is a
conversation; it is not part of the digest, so one conversation has one chain on all of them."""
COMPLETION_PATHS = frozenset({"/v1/completions", "/api/generate", "/api/v0/completions"})
PROMPT_PREFIX_BYTES = 1024
BOUND = Bound(text=2 << 20, steps=16_384, atoms=2048)
"""How much of a conversation is digested: 2 MiB of its text, 16,384 steps of the walk, 2,048
atoms. A longer one is known by its beginning, which its later turns share (docs/affinity.md,
"Size bound", measured by ``bench/digests.py``)."""


@frozen
class AffinityKey:
    """One request's digests: ``key`` is recorded after success, ``lookups`` are tried in order
    (the key first, then each earlier boundary, longest first)."""

    model: str
    key: bytes
    lookups: tuple[bytes, ...]


@frozen
class Match:
    """Where a request's longest known prefix is warm: the node, and how many boundaries of the
    request that prefix covers (its depth: 1 for the first atom)."""

    node: str
    depth: int


_matched = lru_cache(maxsize=1024)(Match)
"""The frozen :class:`Match` of a node and a depth, made once for each and given again (every
turn of a conversation of that depth on that node finds the same)."""


def _sha256(*parts: bytes) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.digest()


def affinity_key(path: str, model: str, body: Mapping[str, Any]) -> AffinityKey | None:
    """The affinity digests of a POST inference request, or None when it has no affinity.

    ``path`` is the request path (a query is ignored): a conversation route (:data:`CHAT_PATHS`)
    chains the canonical form of its conversation (:mod:`~nvpair_tw.selection._canonical`), the
    same on every route; a completion route digests its prompt's beginning. ``model`` is the
    normalised model name and ``body`` the parsed JSON body. Malformed shapes give None, never
    an exception.
    """
    path = path.partition("?")[0]
    try:
        if path in CHAT_PATHS:
            return _chat_key(model, body)
        if path in COMPLETION_PATHS:
            return _completion_key(path, model, body)
    except (TypeError, ValueError, RecursionError, AttributeError):
        return None
    return None


def _chat_key(model: str, body: Mapping[str, Any]) -> AffinityKey | None:
    found = canonical(body, BOUND)
    if found is None:
        return None
    # One running SHA-256 over the preamble and the atoms; its value after each atom is a
    # boundary. Each atom is prefix-free, so nothing is needed between them.
    running = hashlib.sha256(found.preamble)
    boundaries = []
    for atom in found.atoms:
        running.update(atom)
        boundaries.append(running.copy().digest())
    digest = boundaries[-1]
    # The key itself comes first, so an exact resend goes back where it went.
    return AffinityKey(model, digest, tuple(reversed(boundaries)))


def _completion_key(path: str, model: str, body: Mapping[str, Any]) -> AffinityKey | None:
    base = _sha256(b"completion", _preamble(body))
    context = body.get("context")
    if path == "/api/generate" and isinstance(context, list) and context:
        digest = _sha256(base, b"context", json.dumps(context, separators=(",", ":")).encode())
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        encoded = prompt.encode("utf-8")
        if len(encoded) < PROMPT_PREFIX_BYTES:
            return None
        digest = _sha256(base, b"prompt", encoded[:PROMPT_PREFIX_BYTES])
    return AffinityKey(model, digest, (digest,))


def _preamble(body: Mapping[str, Any]) -> bytes:
    """A completion's system prompt and suffix (Ollama's ``system``, ``suffix``), as JSON."""
    return json.dumps(
        [body.get("system"), body.get("suffix")], separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def _positive_entries(_instance: object, _attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"affinity max_entries must be an integer >= 1, not {value!r}")


def _positive_ttl(_instance: object, _attribute: object, value: float) -> None:
    if not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"affinity idle_ttl must be > 0 seconds, not {value!r}")


@define(on_setattr=setters.NO_OP)
class AffinityTable:
    """The per-facade warm-node table: (model, digest) → node id, LRU-bounded, idle entries expire.

    Expiry is checked lazily against ``clock.seconds()``; the table never schedules a timer.
    """

    _clock: IReactorTime
    max_entries: int = field(default=10_000, validator=_positive_entries)
    idle_ttl: float = field(default=300.0, validator=_positive_ttl)
    # (model, digest) → (node id, last use); least recently used first.
    _entries: OrderedDict[tuple[str, bytes], tuple[str, float]] = field(
        init=False, factory=OrderedDict, repr=False
    )

    def lookup(self, key: AffinityKey) -> str | None:
        """The warm node for the longest known prefix, or None; a hit refreshes its idle time."""
        found = self.match(key)
        return None if found is None else found.node

    def match(self, key: AffinityKey) -> Match | None:
        """The warm node for the longest known prefix and that prefix's depth, or None; a hit
        refreshes its idle time."""
        now = self._clock.seconds()
        depth = len(key.lookups)
        for digest in key.lookups:
            slot = (key.model, digest)
            entry = self._entries.get(slot)
            if entry is not None:
                node_id, last_used = entry
                if now - last_used < self.idle_ttl:
                    self._entries[slot] = (node_id, now)
                    self._entries.move_to_end(slot)
                    return _matched(node_id, depth)
                del self._entries[slot]
            depth -= 1
        return None

    def holds(self, key: AffinityKey) -> bool:
        """Whether an entry for ``key``'s own digest is remembered, without refreshing it (a
        look that must not keep an entry alive, docs/behaviour.md §2.1)."""
        entry = self._entries.get((key.model, key.key))
        return entry is not None and self._clock.seconds() - entry[1] < self.idle_ttl

    def record(self, key: AffinityKey, node_id: str) -> None:
        """Remember that ``node_id`` served ``key`` (call only after a complete success)."""
        now = self._clock.seconds()
        slot = (key.model, key.key)
        self._entries[slot] = (node_id, now)
        self._entries.move_to_end(slot)
        self._expire(now)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        self._expire(self._clock.seconds())
        return len(self._entries)

    def _expire(self, now: float) -> None:
        # Least recently used first, so the idle ones are at the front.
        while self._entries:
            slot, (_node_id, last_used) = next(iter(self._entries.items()))
            if now - last_used < self.idle_ttl:
                return
            del self._entries[slot]
