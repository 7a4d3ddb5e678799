# -*- test-case-name: tests.selection.test_sessions -*-
"""Sessions the client names (docs/behaviour.md §5.3): the name read from the request, the
per-caller table of where each session was last served, and which evidence leads a conversation
to its node when the prefix and the session disagree.

A session belongs to its caller: it is kept under (key name, public model, SHA-256 of its name),
each key with a bound of its own, so one key can neither steer nor evict another's sessions. The
name itself is never kept, logged or sent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from attrs import define, field, frozen, setters
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers

from nvpair_tw.events import Choice
from nvpair_tw.selection._affinity import Match

__all__ = [
    "SESSION_HEADERS",
    "Home",
    "Session",
    "SessionTable",
    "Warm",
    "session_name",
    "warm_node",
]

SESSION_HEADERS = (
    b"x-session-id",
    b"x-claude-code-session-id",
    b"session_id",
    b"conversation_id",
)
"""The headers that name a session, in the order they are read: the generic one, Claude Code's,
Codex's (``session_id``; ``conversation_id`` in its older releases)."""
MAX_NAME = 256
"""Bytes: a longer session name is not one."""
_NAME = re.compile(r"[\x21-\x7e]{1,256}")
_LEGACY_USER = re.compile(r"user_[0-9A-Za-z_-]*?_session_([0-9A-Fa-f-]{8,64})")


@frozen
class Session:
    """A session a client named: its caller's key name, the public model, and the SHA-256 of
    the name (the name itself is not kept)."""

    key: str
    model: str
    digest: bytes = field(repr=False)

    @classmethod
    def of(cls, key: str, model: str, name: str) -> Session:
        digest = hashlib.sha256(json.dumps([key, model, name]).encode()).digest()
        return cls(key, model, digest)


@frozen
class Home:
    """Where a session was last served, and how many boundaries of its conversation (§5.3) that
    request had (0: it had none)."""

    node: str
    depth: int


@frozen
class Warm:
    """The node a conversation's cache is expected on, and why: its prefix (``AFFINITY``) or its
    session (``SESSION``)."""

    node: str
    by: Choice


_warm = lru_cache(maxsize=512)(Warm)
"""The frozen :class:`Warm` of a node and a reason, made once for each and given again (every
turn of a conversation is warm on the same node)."""


def session_name(headers: Headers, doc: Mapping[str, Any], named: bytes | None) -> str | None:
    """The session the request names, or None: the operator's header (``named``), then
    :data:`SESSION_HEADERS`, then the body's ``prompt_cache_key`` (Codex) and the session in
    ``metadata.user_id`` (Claude Code). A header given twice, or a value that is not 1 to 256
    visible ASCII characters, names none."""
    for header in (named, *SESSION_HEADERS) if named else SESSION_HEADERS:
        values = headers.getRawHeaders(header)
        if values is not None and len(values) == 1:
            text = values[0].decode("latin-1").strip()
            if _NAME.fullmatch(text):
                return text
    key = doc.get("prompt_cache_key")
    if isinstance(key, str) and _NAME.fullmatch(key):
        return key
    metadata = doc.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return _claude_session(user) if isinstance(user, str) else None


def _claude_session(user: str) -> str | None:
    """The session in Claude Code's ``metadata.user_id``: ``user_…_session_<uuid>`` (older
    releases) or a JSON object with ``session_id`` (newer ones); any other value is a user. A
    value over 1 KiB is not read (Claude Code's are about 160 bytes)."""
    if len(user) > 4 * MAX_NAME:
        return None
    if user.startswith("{"):
        try:
            found = json.loads(user)
        except ValueError:
            return None
        session = found.get("session_id") if isinstance(found, dict) else None
        return session if isinstance(session, str) and _NAME.fullmatch(session) else None
    legacy = _LEGACY_USER.fullmatch(user)
    return legacy.group(1) if legacy is not None else None


def warm_node(match: Match | None, home: Home | None) -> Warm | None:
    """Which node the conversation is expected warm on: the prefix match says where the cache
    is, the session's home where the conversation lives. When they disagree, the one that holds
    more of it wins: the prefix when its match is at least as deep as the conversation last
    served at home, else home (its prefix changed: history compacted, a system prompt edited;
    or its entries idled out while the session did not)."""
    if home is None:
        return None if match is None else _warm(match.node, Choice.AFFINITY)
    if match is None or (match.node != home.node and match.depth < home.depth):
        return _warm(home.node, Choice.SESSION)
    return _warm(match.node, Choice.AFFINITY)


def _count(_instance: object, _attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"sessions per key must be an integer >= 1, not {value!r}")


def _seconds(_instance: object, _attribute: object, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"session idle_ttl must be > 0 seconds, not {value!r}")


@define(on_setattr=setters.NO_OP)
class SessionTable:
    """Each caller's sessions: (model, digest) → :class:`Home`, at most ``per_key`` per key name
    (least recently used forgotten first), idle ones forgotten after ``idle_ttl`` seconds, checked
    lazily against the clock (no timer)."""

    _clock: IReactorTime
    per_key: int = field(default=10_000, validator=_count)
    idle_ttl: float = field(default=3600.0, validator=_seconds)
    _books: dict[str, OrderedDict[tuple[str, bytes], tuple[Home, float]]] = field(
        init=False, factory=dict, repr=False
    )

    def home(self, session: Session) -> Home | None:
        """Where ``session`` was last served, or None; a hit refreshes its idle time."""
        book = self._books.get(session.key)
        slot = (session.model, session.digest)
        entry = book.get(slot) if book is not None else None
        if book is None or entry is None:
            return None
        now = self._clock.seconds()
        home, last_used = entry
        if now - last_used >= self.idle_ttl:
            del book[slot]
            return None
        book[slot] = (home, now)
        book.move_to_end(slot)
        return home

    def record(self, session: Session, node_id: str, depth: int) -> None:
        """``session`` was served by ``node_id`` (after a complete success): its home moves there."""
        now = self._clock.seconds()
        book = self._books.setdefault(session.key, OrderedDict())
        slot = (session.model, session.digest)
        book[slot] = (Home(node_id, depth), now)
        book.move_to_end(slot)
        while len(book) > self.per_key or now - next(iter(book.values()))[1] >= self.idle_ttl:
            book.popitem(last=False)

    def __len__(self) -> int:
        now = self._clock.seconds()
        return sum(
            1
            for book in self._books.values()
            for _, used in book.values()
            if now - used < self.idle_ttl
        )
