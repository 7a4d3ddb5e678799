"""Tests for nvpair_tw.fleet._sharing and the routing in nvpair_tw.fleet._store's session hooks: what a
peer published or left in the store reaches local state, on a ``task.Clock`` and a stand-in for
the store's command connection (tests/test_fleet.py covers the same over a real redis-server)."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from nvpair_tw.fleet._sharing import RESERVATION_BATCH, RESERVATION_TTL, SharedReservations
from nvpair_tw.fleet._store import FleetStore, StateConfig
from nvpair_tw.fleet._wire import Codec, Command
from nvpair_tw.selection._affinity import AffinityKey
from nvpair_tw.selection._reservations import ReservationLedger

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
