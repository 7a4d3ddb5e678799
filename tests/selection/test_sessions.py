"""Tests for nvpair_tw.selection._sessions: the session a request names, each caller's table of
homes, and which evidence leads when the prefix and the session disagree (docs/behaviour.md §5.3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers

from nvpair_tw.events import Choice
from nvpair_tw.selection import Home, Match, Session, SessionTable, Warm, session_name, warm_node

pytestmark = pytest.mark.timeout(10)

UUID = "0b9c7e0a-6b1e-4c7e-9a55-2f7d3c1e8a41"


def named(
    headers: dict[str, list[str]] | None = None, operator: bytes | None = None, **doc: Any
) -> str | None:
    raw = Headers({k.encode(): [v.encode() for v in vs] for k, vs in (headers or {}).items()})
    return session_name(raw, doc, operator)


@pytest.mark.parametrize(
    "header", ["X-Session-Id", "X-Claude-Code-Session-Id", "session_id", "conversation_id"]
)
def test_each_session_header_names_a_session(header: str) -> None:
    assert named({header: [UUID]}) == UUID


def test_the_operators_header_is_read_first() -> None:
    headers = {"X-Team-Thread": ["thread-7"], "X-Session-Id": [UUID]}
    assert named(headers, operator=b"x-team-thread") == "thread-7"
    assert named(headers) == UUID


def test_codex_names_its_session_in_prompt_cache_key_too() -> None:
    assert named(prompt_cache_key=UUID) == UUID


@pytest.mark.parametrize(
    ("user_id", "session"),
    [
        (f"user_{'ab' * 32}_account_{UUID}_session_{UUID}", UUID),
        (f"user_{'ab' * 32}_account__session_{UUID}", UUID),
        (json.dumps({"device_id": "ab" * 32, "account_uuid": "", "session_id": UUID}), UUID),
        ("user-42", None),
        (f"user_{'ab' * 32}", None),
        ('{"device_id": "x"}', None),
        ("{not json", None),
        (json.dumps({"session_id": 7}), None),
        ("user_" + "_session_" * 200_000 + UUID, None),  # too long to be read: no backtracking
    ],
)
def test_claude_codes_user_id_names_a_session_only_when_it_holds_one(
    user_id: str, session: str | None
) -> None:
    """``user_…_session_<uuid>`` (older releases) or a JSON string with ``session_id`` (newer);
    any other ``user_id`` is a user, not a session."""
    assert named(metadata={"user_id": user_id}) == session


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Session-Id": ["a", "b"]},  # given twice: ambiguous
        {"X-Session-Id": ["has space"]},
        {"X-Session-Id": ["x" * 257]},
        {"X-Session-Id": [""]},
    ],
)
def test_a_header_that_is_not_one_name_names_none(headers: dict[str, list[str]]) -> None:
    assert named(headers) is None


def test_a_session_is_its_callers() -> None:
    """The same name under another key or model is another session."""
    one = Session.of("alice", "qwen3:8b", UUID)
    assert one == Session.of("alice", "qwen3:8b", UUID)
    assert one != Session.of("bob", "qwen3:8b", UUID)
    assert one != Session.of("alice", "llama3:latest", UUID)
    assert UUID not in repr(one) and UUID.encode() not in one.digest


def test_a_home_is_where_the_session_was_last_served_and_idles_out() -> None:
    clock = Clock()
    table = SessionTable(clock, idle_ttl=3600.0)
    session = Session.of("alice", "m", UUID)
    assert table.home(session) is None
    table.record(session, "b", 7)
    clock.advance(3000)
    assert table.home(session) == Home("b", 7)  # a hit refreshes it
    table.record(session, "a", 9)
    assert table.home(session) == Home("a", 9)
    clock.advance(3600)
    assert table.home(session) is None
    assert len(table) == 0 and clock.getDelayedCalls() == []


def test_one_key_cannot_evict_anothers_sessions() -> None:
    """Each key has its own bound: bob's flood of sessions forgets bob's oldest, never alice's."""
    table = SessionTable(Clock(), per_key=2)
    alice = Session.of("alice", "m", "mine")
    table.record(alice, "b", 1)
    bob = [Session.of("bob", "m", f"s{i}") for i in range(5)]
    for session in bob:
        table.record(session, "a", 1)
    assert table.home(alice) == Home("b", 1)
    assert [table.home(s) is not None for s in bob] == [False, False, False, True, True]


@pytest.mark.parametrize(
    ("match", "home", "warm"),
    [
        (None, None, None),
        (Match("a", 3), None, Warm("a", Choice.AFFINITY)),
        (None, Home("b", 3), Warm("b", Choice.SESSION)),
        (Match("b", 5), Home("b", 5), Warm("b", Choice.AFFINITY)),
        # the prefix changed (compacted): a short match elsewhere loses to the home
        (Match("a", 1), Home("b", 40), Warm("b", Choice.SESSION)),
        # the prefix holds at least as much as the home had: the cache is there
        (Match("a", 40), Home("b", 40), Warm("a", Choice.AFFINITY)),
        (Match("a", 41), Home("b", 40), Warm("a", Choice.AFFINITY)),
    ],
)
def test_the_evidence_that_holds_more_of_the_conversation_leads(
    match: Match | None, home: Home | None, warm: Warm | None
) -> None:
    assert warm_node(match, home) == warm


@pytest.mark.parametrize(("per_key", "idle_ttl"), [(0, 1.0), (True, 1.0), (1, 0), (1, -1.0)])
def test_invalid_table_settings_are_refused(per_key: Any, idle_ttl: Any) -> None:
    with pytest.raises(ValueError, match="session"):
        SessionTable(Clock(), per_key, idle_ttl)
