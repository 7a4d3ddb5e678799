# -*- test-case-name: tests.corridor.test_conversations -*-
"""A request's conversation (docs/behaviour.md §5.3): its chain of prefix digests, the session its
client names, where it is expected warm — and, once it was answered whole, where it now is.

The chain is made from the parsed request value, the same on every conversation route of every
facade (:func:`~nvpair_tw.selection.affinity_key`); the session is the caller's
(:class:`~nvpair_tw.selection.Session`). Both are recorded only after a complete success, on the
node that answered (:func:`remember`).
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.selection import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    AffinityKey,
    Session,
    Warm,
    affinity_key,
    session_name,
    warm_node,
)

__all__ = ["Conversation", "conversation", "remember"]

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
    return Conversation(key, session, warm_node(match, home))


def remember(
    facade: FacadeState, key: AffinityKey | None, session: Session | None, node: str
) -> None:
    """A request was answered whole by ``node``: its prefix is warm there, and its session's home
    moves there (wherever it was before: a cooling, cordoned or draining home is left)."""
    if key is not None:
        facade.affinity.record(key, node)
    if session is not None:
        depth = 0 if key is None else len(key.lookups)
        facade.sessions.record(session, node, depth)
