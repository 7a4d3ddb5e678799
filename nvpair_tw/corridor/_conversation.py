# -*- test-case-name: tests.corridor.test_conversations, tests.corridor.test_caches -*-
"""A request's conversation (docs/behaviour.md §5.3): its chain of prefix digests, the session its
client names, where it is expected warm — and, once it was answered whole, where it now is.

The chain is made from the parsed request value, the same on every conversation route of every
facade (:func:`~nvpair_tw.selection.affinity_key`); the session is the caller's
(:class:`~nvpair_tw.selection.Session`). Both are recorded only after a complete success, on the
node that answered (:func:`remember`), and so is the conversation's place in that node's prompt
cache (§5.3.1): a node is expected warm only while the conversation can still be in its cache,
and what the engine says it found cached corrects how many conversations that cache holds
(:func:`judge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import frozen

from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.dialects import Usage
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    AffinityKey,
    Place,
    RequestSize,
    Session,
    Warm,
    affinity_key,
    session_name,
    warm_node,
)

__all__ = ["Conversation", "conversation", "judge", "place", "pushing_out", "remember", "root"]

_ROUTES = CHAT_PATHS | COMPLETION_PATHS


@frozen
class Conversation:
    """What a request's route knows of its conversation: its chain (None: no digests), the
    session its client named (None: none), and the node it is expected warm on."""

    key: AffinityKey | None = None
    session: Session | None = None
    warm: Warm | None = None


def conversation(
    facade: FacadeState, inbound: Inbound, model: str, parsed: dict[str, Any]
) -> Conversation:
    """The conversation of an inference request for the public ``model`` (§5.3, §11.4)."""
    path = inbound.path
    if path not in _ROUTES:
        return Conversation()
    normalised = facade.profile.normalise(model.strip())
    key = affinity_key(path, normalised, parsed)  # read up to its bound, whatever the body holds
    named = session_name(inbound.head.headers, parsed, facade.shared.settings.session_header)
    session = None if named is None else Session.of(inbound.caller.name, normalised, named)
    match = None if key is None else facade.affinity.match(key)
    home = None if session is None else facade.sessions.home(session)
    warm = warm_node(match, home)
    if warm is not None and key is not None:
        held = facade.caches.place(warm.node, key.model, root(key))
        if held is not None and not held.resident:
            warm = None  # pushed out of that node's cache since (§5.3.1)
    return Conversation(key, session, warm)


def pushing_out(
    facade: FacadeState, known: Conversation, nodes: Sequence[Node], model: str, size: RequestSize
) -> dict[str, float]:
    """Per node where the conversation is not expected warm, the seconds an active conversation
    it would push out of that node's full prompt cache would take there to be read again: its
    tokens there (else this request's prompt) over the node's prefill rate (§5.3.1). Added to
    the node's predicted time when the candidates are ordered, it sends the conversation where it
    pushes no active one out while the predicted times are that close."""
    key = known.key
    if key is None:
        return {}
    warm = None if known.warm is None else known.warm.node
    costs = {}
    for node in nodes:
        tokens = None if node.id == warm else facade.caches.pushed_out(node.id, key.model)
        if tokens is not None:
            prefill = facade.speeds.prefill(node.id, model)
            costs[node.id] = (tokens or size.prompt_tokens) / prefill
    return costs


def root(key: AffinityKey) -> bytes:
    """The conversation's root: its first boundary, which every later turn shares (§5.3.1)."""
    return key.lookups[-1]


def place(facade: FacadeState, key: AffinityKey | None, node: str) -> Place | None:
    """Where the conversation stands in ``node``'s prompt cache as an attempt is sent there."""
    return None if key is None else facade.caches.place(node, key.model, root(key))


def judge(
    facade: FacadeState, key: AffinityKey | None, node: str, at: Place | None, usage: Usage | None
) -> None:
    """What the engine said it found cached for a turn sent to ``node`` (its conversation there
    ``at``) corrects that cache's capacity (§5.3.1); an engine that states no cached count
    (Ollama) corrects nothing."""
    if key is None or at is None or usage is None:
        return
    cached, prompt = usage.cached_tokens, usage.prompt_tokens
    if cached is not None and prompt is not None:
        facade.caches.judge(node, key.model, at, cached, prompt)


def remember(
    facade: FacadeState,
    key: AffinityKey | None,
    session: Session | None,
    node: str,
    held: int | None = None,
) -> None:
    """A request was answered whole by ``node``: its prefix is warm there, and its session's home
    moves there (wherever it was before: a cooling, cordoned or draining home is left); the
    conversation is the most recent in that node's cache, which holds ``held`` tokens of it (its
    stated prompt and completion; None: not stated)."""
    if key is not None:
        facade.affinity.record(key, node)
        facade.caches.note(node, key.model, root(key), held)
    if session is not None:
        depth = 0 if key is None else len(key.lookups)
        facade.sessions.record(session, node, depth)
