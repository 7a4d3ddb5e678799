"""Tests for nvpair_tw.fleet._sharing and the routing in nvpair_tw.fleet._store's session hooks: what a
peer published or left in the store reaches local state, on a ``task.Clock`` and a stand-in for
the store's command connection (tests/test_fleet.py covers the same over a real redis-server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from nvpair_tw.fleet._sharing import (
    RESERVATION_BATCH,
    RESERVATION_TTL,
    SharedCaches,
    SharedReservations,
    SharedSessions,
    SharedSessionTable,
)
from nvpair_tw.fleet._store import FleetStore, StateConfig
from nvpair_tw.fleet._wire import Codec, Command
from nvpair_tw.selection._affinity import AffinityKey
from nvpair_tw.selection._caches import CacheBook, Place
from nvpair_tw.selection._reservations import ReservationLedger
from nvpair_tw.selection._sessions import Home, Session, SessionTable
from nvpair_tw.selection._speed import SpeedBook

DIGEST = "ab" * 32


class StoredKeys:
    """Answers SCAN, MGET and PTTL from ``entries`` (key → (value, ttl ms)) in one page."""

    transport = None

    def __init__(self, entries: dict[str, tuple[str, int]]) -> None:
        self.entries = entries

    def scan(self, _cursor: Any, pattern: str, count: int) -> Deferred[Any]:
        return succeed([b"0", [key.encode() for key in self.entries]])

    def mget(self, keys: list[str]) -> Deferred[Any]:
        return succeed([self.entries[key][0] for key in keys])

    def execute_command(self, _name: str, key: str) -> Deferred[Any]:
        return succeed(self.entries[key][1])


def store() -> tuple[FleetStore, Clock, ReservationLedger]:
    clock = Clock()
    made = FleetStore(clock, StateConfig("127.0.0.1"), proxy_id="me")  # type: ignore[arg-type]
    ledger = ReservationLedger()
    made.bind_ledger(ledger)
    return made, clock, ledger


def test_resync_applies_the_peers_cooldowns_affinity_and_counts_but_not_our_own() -> None:
    fleet, _clock, ledger = store()
    stalls = fleet.stall_tracker("ollama", 10.0, None)
    table = fleet.affinity_table("ollama", 10, 60.0)
    entry = {"e": "ollama", "m": "llama3", "d": DIGEST, "n": "n1"}
    keys = StoredKeys(
        {
            "nvpair:cool:ollama:n0": (json.dumps({"e": "ollama", "n": "n0", "r": "stall"}), 4000),
            f"nvpair:aff:ollama:0123:{DIGEST}": (json.dumps(entry), 60000),
            "nvpair:res:peer": ('{"n1":2}', 9000),
            "nvpair:res:me": ('{"n1":5}', 9000),
            "nvpair:junk": ("not json", -1),
        }
    )
    done: list[None] = []
    Deferred.fromCoroutine(fleet.resync(keys)).addCallback(done.append)
    assert done == [None]
    cooldown = stalls.cooldown("n0")
    assert cooldown is not None and cooldown.origin == "peer"
    digest = bytes.fromhex(DIGEST)
    assert table.lookup(AffinityKey("llama3", digest, (digest,))) == "n1"
    assert ledger.reservations("n1") == 2


def test_a_peer_batchs_bad_part_is_ignored_and_the_rest_applied() -> None:
    fleet, _clock, _ledger = store()
    fleet.affinity_table("ollama", 10, 60.0)
    bad = {"t": "aff", "e": "ollama", "n": "n1", "m": "llama3", "d": "not hex"}
    good = {"t": "prog", "e": "ollama", "n": "n0"}
    fleet.on_message(json.dumps({"o": "peer", "t": "batch", "m": [bad, good]}))
    fleet.on_message(b"{garbled")
    assert fleet.applied == 1
    assert fleet.peer_progress("ollama", "n0") is not None


def test_the_heartbeat_forgets_a_peer_not_heard_from_within_the_reservation_ttl() -> None:
    fleet, clock, ledger = store()
    fleet.on_message(json.dumps({"o": "peer", "t": "res", "c": {"n0": 3}}))
    assert ledger.reservations("n0") == 3
    clock.advance(RESERVATION_TTL - 0.5)
    fleet.on_beat()
    assert ledger.reservations("n0") == 3
    clock.advance(1.0)
    fleet.on_beat()
    assert ledger.reservations("n0") == 0


def test_own_counts_go_out_once_per_burst_and_again_on_every_refresh() -> None:
    clock, writes = Clock(), list[Command]()
    shared = SharedReservations(clock, Codec("me", "ns"), writes.append, lambda: True)  # type: ignore[arg-type]
    ledger = ReservationLedger()
    shared.bind(ledger)
    held = ledger.reserve("n0")
    ledger.move(held, "n1")
    clock.advance(RESERVATION_BATCH)
    assert len(writes) == 1
    (_set, pub) = writes[0]()
    assert pub[1]["c"] == {"n1": 1}
    clock.advance(RESERVATION_BATCH)
    shared.beat()
    assert len(writes) == 2


def test_a_burst_that_ends_where_it_began_publishes_nothing() -> None:
    clock, writes = Clock(), list[Command]()
    shared = SharedReservations(clock, Codec("me", "ns"), writes.append, lambda: True)  # type: ignore[arg-type]
    ledger = ReservationLedger()
    shared.bind(ledger)
    ledger.release(ledger.reserve("n0"))
    clock.advance(RESERVATION_BATCH)
    assert writes == []


def secret_store() -> FleetStore:
    config = StateConfig("127.0.0.1", secret=b"fleet secret")
    return FleetStore(Clock(), config, proxy_id="me")  # type: ignore[arg-type]


def test_resync_and_a_peers_message_give_a_session_its_home() -> None:
    """A session's home comes from the store (after a reconnection) or from a peer's message,
    sealed: the table finds it by the session's own digest sealed the same way."""
    fleet = secret_store()
    table = fleet.session_table("ollama", 10, 3600.0)
    assert isinstance(table, SharedSessionTable)
    mine, theirs = Session.of("alice", "m", "s1"), Session.of("alice", "m", "s2")
    sealed = [table._sealed(s).digest.hex() for s in (mine, theirs)]
    entry = {"e": "ollama", "k": "alice", "m": "m", "d": sealed[0], "n": "n1", "l": 4}
    keys = StoredKeys({f"nvpair:sess:ollama:{sealed[0]}": (json.dumps(entry), 60000)})
    Deferred.fromCoroutine(fleet.resync(keys))
    assert table.home(mine) == Home("n1", 4)
    message = {**entry, "o": "peer", "t": "sess", "d": sealed[1], "n": "n0", "l": 2}
    fleet.on_message(json.dumps(message))
    assert table.home(theirs) == Home("n0", 2)


@pytest.mark.parametrize(
    "change",
    [{"d": "not hex"}, {"k": None}, {"l": "4"}, {"l": True}, {"m": 7}, {"n": None}, {"e": "x"}],
)
def test_a_malformed_session_message_is_ignored(change: dict[str, Any]) -> None:
    fleet = secret_store()
    fleet.session_table("ollama", 10, 3600.0)
    message = {"o": "peer", "t": "sess", "e": "ollama", "k": "a", "m": "m", "d": DIGEST, "n": "n1"}
    fleet.on_message(json.dumps({**message, "l": 1, **change}))
    assert (fleet.applied, fleet._sharing.ignored) == (0, 1)


def test_without_a_secret_sessions_are_not_shared() -> None:
    """No secret, no session leaves the proxy: its table is its own, and a peer's is ignored."""
    fleet, _clock, _ledger = store()
    table = fleet.session_table("ollama", 10, 3600.0)
    assert type(table) is SessionTable
    message = {"o": "peer", "t": "sess", "e": "ollama", "k": "a", "m": "m", "d": DIGEST, "n": "n1"}
    fleet.on_message(json.dumps({**message, "l": 1}))
    assert (fleet.applied, fleet._sharing.ignored) == (0, 1)


def test_a_shared_session_goes_out_sealed_with_its_callers_key_and_model() -> None:
    clock, writes = Clock(), list[Command]()
    shared = SharedSessions(
        clock,  # type: ignore[arg-type]
        Codec("me", "ns"),
        writes.append,
        lambda: True,
        seal=lambda d: b"sealed" + d[:2],
    )
    table = shared.table("ollama", 10, 600.0)
    session = Session.of("alice", "m", "the name")
    table.record(session, "n1", 3)
    [(op, key, value, ttl), (_pub, message)] = writes[0]()
    sealed = (b"sealed" + session.digest[:2]).hex()
    assert (op, key, ttl) == ("set", f"ns:sess:ollama:{sealed}", 600_000)
    assert json.loads(value) == {
        "e": "ollama",
        "k": "alice",
        "m": "m",
        "d": sealed,
        "n": "n1",
        "l": 3,
    }
    assert "the name" not in value and "the name" not in json.dumps(message)


# --- the conversations each node's prompt cache was sent (docs/behaviour.md §5.3.1) ----------------


def test_a_noted_conversation_goes_out_sealed_with_its_node_model_and_tokens() -> None:
    clock, writes = Clock(), list[Command]()
    shared = SharedCaches(
        clock,  # type: ignore[arg-type]
        Codec("me", "ns"),
        writes.append,
        lambda: True,
        seal=lambda d: b"sealed" + d[:2],
    )
    book = CacheBook(clock)
    shared.bind("openai", book)
    book.note("n1", "qwen3", b"\x01\x02" * 16, 9000)
    [(op, message)] = writes[0]()
    assert op == "pub"
    fields = json.loads(message) if isinstance(message, str) else message
    assert {k: fields[k] for k in ("t", "e", "n", "m", "r", "h")} == {
        "t": "cache",
        "e": "openai",
        "n": "n1",
        "m": "qwen3",
        "r": (b"sealed\x01\x02").hex(),
        "h": 9000,
    }
    assert book.place("n1", "qwen3", b"\x01\x02" * 16) == Place(1, 9000, resident=True)


def test_a_peers_conversation_counts_in_a_nodes_cache_here() -> None:
    """A peer sent another conversation to ``n1`` since: this proxy's own is second there, and
    with ``n1`` keeping one it can no longer be warm."""
    fleet = secret_store()
    book = CacheBook(Clock(), lambda _node: 1)
    fleet.bind_books("openai", SpeedBook(Clock()), book)
    mine = b"\x07" * 32
    book.note("n1", "qwen3", mine, 5000)
    theirs = {"o": "peer", "t": "cache", "e": "openai", "n": "n1", "m": "qwen3", "r": DIGEST}
    fleet.on_message(json.dumps({**theirs, "h": 4000}))
    assert fleet._sharing.applied == 1
    assert book.place("n1", "qwen3", mine) == Place(2, 5000, resident=False)
    assert book.pushed_out("n1", "qwen3") == 4000


@pytest.mark.parametrize(
    "change", [{"r": "not hex"}, {"h": "9"}, {"h": True}, {"h": -1}, {"m": 7}, {"e": "ollama"}]
)
def test_a_malformed_cache_message_is_ignored(change: dict[str, Any]) -> None:
    fleet, _clock, _ledger = store()
    fleet.bind_books("openai", SpeedBook(Clock()), CacheBook(Clock()))
    message = {"o": "peer", "t": "cache", "e": "openai", "n": "n1", "m": "qwen3", "r": DIGEST}
    fleet.on_message(json.dumps({**message, "h": 1, **change}))
    assert (fleet._sharing.applied, fleet._sharing.ignored) == (0, 1)
