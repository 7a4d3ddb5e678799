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
from typing import Any

from attrs import define, field, frozen, setters
from twisted.internet.interfaces import IReactorTime

__all__ = ["CHAT_PATHS", "COMPLETION_PATHS", "AffinityKey", "AffinityTable", "affinity_key"]

CHAT_PATHS = frozenset({"/v1/chat/completions", "/api/chat", "/api/v0/chat/completions"})
COMPLETION_PATHS = frozenset({"/v1/completions", "/api/generate", "/api/v0/completions"})
PROMPT_PREFIX_BYTES = 1024

# Generation settings: they change the answer, not the prefix the engine caches.
GENERATION_SETTINGS = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "context",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "user",
        "metadata",
        "store",
        "keep_alive",
    }
)


@frozen
class AffinityKey:
    """One request's digests: ``key`` is recorded after success, ``lookups`` are tried in order."""

    model: str
    key: bytes
    lookups: tuple[bytes, ...]


# What json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) would build
# for every call (an encoder holds no state between calls).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def _sha256(*parts: bytes) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.digest()


def affinity_key(path: str, model: str, body: Mapping[str, Any]) -> AffinityKey | None:
    """The affinity digests of a POST inference request, or None when it has no affinity.

    ``path`` is the request path (a query is ignored), ``model`` the normalised model name and
    ``body`` the parsed JSON body. Malformed shapes give None, never an exception.
    """
    path = path.partition("?")[0]
    if path not in CHAT_PATHS and path not in COMPLETION_PATHS:
        return None
    try:
        envelope = {k: v for k, v in body.items() if k not in GENERATION_SETTINGS}
        base = _sha256(_canonical([path, envelope]))
        if path in CHAT_PATHS:
            return _chat_key(model, base, body.get("messages"))
        return _completion_key(path, model, base, body)
    except (TypeError, ValueError, RecursionError, AttributeError):
        return None


def _chat_key(model: str, base: bytes, messages: Any) -> AffinityKey | None:
    if not isinstance(messages, list) or not messages:
        return None
    if not all(isinstance(message, dict) for message in messages):
        return None
    boundaries = []
    digest = base
    for message in messages:
        encoded = _canonical(message)
        digest = _sha256(digest, len(encoded).to_bytes(8, "big"), encoded)
        boundaries.append(digest)
    # The key itself comes first, so an exact resend goes back where it went.
    return AffinityKey(model, digest, tuple(reversed(boundaries)))


def _completion_key(
    path: str, model: str, base: bytes, body: Mapping[str, Any]
) -> AffinityKey | None:
    context = body.get("context")
    if path == "/api/generate" and isinstance(context, list) and context:
        digest = _sha256(base, b"context", _canonical(context))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        encoded = prompt.encode()
        if len(encoded) < PROMPT_PREFIX_BYTES:
            return None
        digest = _sha256(base, b"prompt", encoded[:PROMPT_PREFIX_BYTES])
    return AffinityKey(model, digest, (digest,))


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
        now = self._clock.seconds()
        for digest in key.lookups:
            slot = (key.model, digest)
            entry = self._entries.get(slot)
            if entry is None:
                continue
            node_id, last_used = entry
            if now - last_used >= self.idle_ttl:
                del self._entries[slot]
                continue
            self._entries[slot] = (node_id, now)
            self._entries.move_to_end(slot)
            return node_id
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
