"""The per-key limits of docs/behaviour.md §12.1 on an injected clock: one-minute windows,
``Retry-After``, tokens counted at the end and enforced after, concurrency; and the fleet-wide
bookkeeping against a store double whose answers the test releases by hand (the real store:
tests/fleet/test_counters.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from zope.interface import provider

from nvpair_tw.core import RouteKind
from nvpair_tw.inbound import (
    LOCAL,
    NOT_COUNTED,
    Caller,
    Change,
    KeyRules,
    Permit,
    RateLimiter,
    Refusal,
)
from nvpair_tw.inbound._rates import Tally

pytestmark = pytest.mark.timeout(30)


def caller(name: str = "alice", **limits: int) -> Caller:
    return Caller(name, KeyRules(**limits))  # type: ignore[arg-type]


def permit(limiter: RateLimiter, who: Caller) -> Permit:
    got = limiter.admit(who)
    assert isinstance(got, Permit), got
    return got


def refusal(limiter: RateLimiter, who: Caller) -> Refusal:
    got = limiter.admit(who)
    assert isinstance(got, Refusal), got
    return got


def test_unlimited_callers_are_never_refused() -> None:
    limiter = RateLimiter(Clock())
    for _ in range(1000):
        permit(limiter, LOCAL).done(10_000)
        permit(limiter, Caller("scoped", KeyRules(models=("a*",)))).done(None)


def test_requests_per_minute_counts_at_admit_in_fixed_minute_windows() -> None:
    clock = Clock()
    clock.advance(600 + 15)  # 15 s into a window
    limiter = RateLimiter(clock)
    alice = caller(requests_per_minute=3)
    permits = [permit(limiter, alice) for _ in range(3)]
    refused = refusal(limiter, alice)
    assert refused.retry_after == 45
    assert "alice" in refused.message and "3 requests per minute" in refused.message
    for p in permits:
        p.done(None)  # ending does not give a request back
    clock.advance(44.5)
    assert refusal(limiter, alice).retry_after == 1  # 0.5 s left: at least 1
    clock.advance(0.5)  # the next window
    permit(limiter, alice)
    # Keys count apart.
    assert isinstance(limiter.admit(caller("bob", requests_per_minute=3)), Permit)


def test_a_refused_request_is_not_counted() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    alice = caller(requests_per_minute=1)
    permit(limiter, alice)
    for _ in range(5):
        refusal(limiter, alice)
    clock.advance(60)
    permit(limiter, alice)
    refusal(limiter, alice)


def test_tokens_count_when_a_request_ends_and_limit_the_next_ones() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    alice = caller(tokens_per_minute=1000)
    first, second = permit(limiter, alice), permit(limiter, alice)
    first.done(900)
    third = permit(limiter, alice)  # 900 < 1000: still admitted
    second.done(200)  # the request in flight may pass the limit...
    refused = refusal(limiter, alice)  # ...and the next ones wait for the window
    assert "1000 tokens per minute" in refused.message and refused.retry_after == 60
    third.done(None)  # unknown tokens count as nothing
    clock.advance(60)
    permit(limiter, alice).done(0)


def test_done_counts_once() -> None:
    limiter = RateLimiter(Clock())
    alice = caller(tokens_per_minute=100, max_concurrent=1)
    p = permit(limiter, alice)
    p.done(60)
    p.done(60)
    assert limiter.in_flight("alice") == 0
    permit(limiter, alice)  # 60 < 100


def test_max_concurrent_is_released_on_done_and_retries_after_one_second() -> None:
    limiter = RateLimiter(Clock())
    alice = caller(max_concurrent=2)
    a, b = permit(limiter, alice), permit(limiter, alice)
    assert limiter.in_flight("alice") == 2
    refused = refusal(limiter, alice)
    assert refused.retry_after == 1 and "max_concurrent" in refused.message
    a.done(None)
    c = permit(limiter, alice)
    b.done(None)
    c.done(None)
    assert limiter.in_flight("alice") == 0


def test_the_longest_wait_is_told_when_several_limits_are_reached() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    alice = caller(max_concurrent=1, requests_per_minute=1)
    permit(limiter, alice)
    clock.advance(20)
    refused = refusal(limiter, alice)
    assert refused.retry_after == 40 and "requests per minute" in refused.message


def test_the_refusal_is_a_429_rate_limited_with_retry_after() -> None:
    rejection = Refusal(17, "key 'alice' reached 3 requests per minute").rejection
    assert (rejection.status, rejection.code) == (429, "rate-limited")
    assert rejection.headers == ((b"Retry-After", b"17"),)
    assert rejection.message == "key 'alice' reached 3 requests per minute"


def test_new_limits_apply_to_the_counts_so_far() -> None:
    """A reload that lowers a key's limit applies at once (the counts are per name)."""
    limiter = RateLimiter(Clock())
    for _ in range(3):
        permit(limiter, caller(requests_per_minute=10))
    refusal(limiter, caller(requests_per_minute=3))
    permit(limiter, caller(requests_per_minute=4))


# --- fleet-wide bookkeeping against a double ----------------------------------------------------


class Counters:
    """A store double: totals kept here, each answer released by the test."""

    def __init__(self) -> None:
        self.up = True
        self.totals: dict[str, int] = {}
        self.waiting: list[tuple[Sequence[Change], Deferred[list[int]]]] = []
        self.broken = False

    def add(self, changes: Sequence[Change]) -> Deferred[list[int]]:
        if self.broken:
            raise ConnectionError("closed")
        d: Deferred[list[int]] = Deferred()
        self.waiting.append((changes, d))
        return d

    def answer_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for changes, d in waiting:
            out = []
            for name, amount, ttl in changes:
                assert ttl > 0
                self.totals[name] = max(0, self.totals.get(name, 0) + amount)
                out.append(self.totals[name])
            d.callback(out)

    def fail_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for _changes, d in waiting:
            d.errback(ConnectionError("lost"))


def test_the_fleets_total_from_the_store_counts_with_this_proxys_own() -> None:
    clock = Clock()
    store = Counters()
    limiter = RateLimiter(clock, store)
    alice = caller(requests_per_minute=5)
    permit(limiter, alice)
    store.answer_all()
    store.totals["limit:rpm:alice:0"] += 3  # three from peers
    permit(limiter, alice)  # this proxy does not know yet: 2 of 5 here
    store.answer_all()  # the answer says 5
    refused = refusal(limiter, alice)
    assert refused.retry_after == 60
    assert set(store.totals) == {"limit:rpm:alice:0", "limit:conc:alice", "limit:tpm:alice:0"}


def test_unanswered_increments_count_too() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(requests_per_minute=2)
    permit(limiter, alice)
    store.answer_all()
    permit(limiter, alice)  # sent, not answered
    refusal(limiter, alice)


def test_unanswered_increments_add_to_the_fleets_last_total() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(requests_per_minute=4)
    store.totals["limit:rpm:alice:0"] = 2  # peers' requests
    permit(limiter, alice)
    store.answer_all()  # the fleet: 3
    permit(limiter, alice)  # sent, not answered: 4 in all, though only 2 here
    refusal(limiter, alice)


def test_tokens_reach_the_store_and_a_peers_tokens_come_back_with_the_next_admit() -> None:
    clock = Clock()
    store = Counters()
    limiter = RateLimiter(clock, store)
    alice = caller(tokens_per_minute=1000)
    permit(limiter, alice).done(300)
    store.answer_all()
    assert store.totals["limit:tpm:alice:0"] == 300
    store.totals["limit:tpm:alice:0"] += 800  # a peer's requests ended
    permit(limiter, alice)  # admitted on what it knew; the answer tells it the fleet's 1100
    store.answer_all()
    refusal(limiter, alice)


def test_fleet_concurrency_is_released_only_when_the_store_counted_it() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=3)
    counted = permit(limiter, alice)
    store.answer_all()
    lost = permit(limiter, alice)
    store.fail_all()  # this acquire never reached the store
    pending = permit(limiter, alice)
    assert store.totals["limit:conc:alice"] == 1
    counted.done(None)
    lost.done(None)
    pending.done(None)  # released once its acquire is answered
    store.answer_all()
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 0
    assert limiter.in_flight("alice") == 0


def test_the_release_of_an_acquire_the_store_missed_is_not_sent() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=3)
    held = permit(limiter, alice)
    store.answer_all()
    lost = permit(limiter, alice)
    store.fail_all()
    lost.done(None)
    assert store.waiting == []  # the store never counted it: nothing to give back
    held.done(None)
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 0


def test_a_peers_requests_in_flight_count_against_max_concurrent() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=2)
    store.totals["limit:conc:alice"] = 1
    p = permit(limiter, alice)
    store.answer_all()  # 2 in the fleet
    refusal(limiter, alice)
    p.done(None)
    store.answer_all()
    permit(limiter, alice)


def test_a_store_that_goes_away_leaves_local_counting() -> None:
    """Down: nothing is sent, the fleet's last total is set aside, this proxy counts alone."""
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=2)
    store.totals["limit:conc:alice"] = 5  # peers hold slots
    p = permit(limiter, alice)
    store.answer_all()
    refusal(limiter, alice)
    store.up = False
    q = permit(limiter, alice)  # counts alone: 2 of 2 here now
    refusal(limiter, alice)
    assert store.waiting == []
    q.done(None)
    p.done(None)  # its slot in the store is owed, not lost
    store.broken = True  # back, but a closed connection raises: never a refusal
    store.up = True
    r, s = permit(limiter, alice), permit(limiter, alice)
    refusal(limiter, alice)
    r.done(None)
    s.done(None)


def test_a_release_the_store_missed_is_given_back_with_the_next_change() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=10)
    held = [permit(limiter, alice) for _ in range(3)]
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 3
    store.up = False
    for p in held:
        p.done(None)
    store.up = True
    p = permit(limiter, alice)
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 1  # +1, and the three owed
    p.done(None)
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 0


def test_releases_a_change_carried_are_owed_again_when_the_store_misses_it() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=10)
    held = [permit(limiter, alice) for _ in range(3)]
    store.answer_all()
    store.up = False
    for p in held:
        p.done(None)  # owed: the store is away
    store.up = True
    lost = permit(limiter, alice)  # carries the three releases
    store.fail_all()  # missed: still owed, and this acquire never counted
    p = permit(limiter, alice)
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 1  # 3, +1, and the three owed
    lost.done(None)
    p.done(None)
    store.answer_all()
    assert store.totals["limit:conc:alice"] == 0


def test_with_the_store_away_the_fleets_last_minute_total_is_set_aside() -> None:
    """Down, the last total the store gave for the minute no longer counts: this proxy's own
    requests do."""
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(requests_per_minute=3)
    store.totals["limit:rpm:alice:0"] = 5  # peers' requests
    permit(limiter, alice)
    store.answer_all()  # the fleet: 6
    refusal(limiter, alice)
    store.up = False
    permit(limiter, alice)  # 2 of 3 here


def test_a_failing_store_never_refuses_or_raises() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(max_concurrent=1, requests_per_minute=100, tokens_per_minute=10**6)
    for _ in range(20):
        p = permit(limiter, alice)
        store.fail_all()
        p.done(5)
        store.fail_all()
    store.broken = True
    for _ in range(20):
        permit(limiter, alice).done(5)


class BrokenUp:
    """A store whose ``up`` itself raises (a bug in it, not a node's fault)."""

    @property
    def up(self) -> bool:
        raise AttributeError("no connection object")

    def add(self, changes: Sequence[Change]) -> Deferred[list[int]]:
        raise AssertionError("never reached: the store is not up")


def test_a_store_whose_state_cannot_be_read_is_logged_once_with_its_type() -> None:
    """Counting goes on alone; the fault is one warning naming its type, however many requests
    meet it, and it names no node."""
    said: list[LogEvent] = []

    @provider(ILogObserver)
    def observe(event: LogEvent) -> None:
        if event.get("log_namespace") == "nvpair_tw.inbound._rates":
            said.append(event)

    limiter = RateLimiter(Clock(), BrokenUp())
    alice = caller(requests_per_minute=100)
    globalLogPublisher.addObserver(observe)
    try:
        for _ in range(5):
            permit(limiter, alice).done(5)
    finally:
        globalLogPublisher.removeObserver(observe)
    assert limiter.unanswered == 0
    [warning] = said
    assert warning["error"] == "AttributeError" and warning["log_level"].name == "warn"
    assert "node" not in warning["log_format"]


def test_the_tallies_name_their_counters_by_kind_and_only_minutes_carry_a_window() -> None:
    assert [t.value for t in Tally] == ["conc", "rpm", "tpm"]
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    permit(limiter, caller(max_concurrent=3, tokens_per_minute=10)).done(4)
    store.answer_all()
    assert set(store.totals) == {"limit:rpm:alice:0", "limit:conc:alice", "limit:tpm:alice:0"}


# --- beyond inference: every request that reaches a node (docs/behaviour.md §12.1) -----------

OTHER_ROUTES = (RouteKind.MODEL_ROUTED, RouteKind.MODEL_LIST, RouteKind.PASS_THROUGH)


@pytest.mark.parametrize("kind", OTHER_ROUTES)
def test_any_other_route_counts_once_against_the_request_limit(kind: RouteKind) -> None:
    limiter = RateLimiter(Clock())
    alice = caller(requests_per_minute=3, max_concurrent=1, tokens_per_minute=10)
    held = permit(limiter, alice)  # an inference in flight: max_concurrent reached
    assert limiter.check(alice) is not None
    assert limiter.check(alice, kind) is None  # concurrency is inference's
    assert limiter.admit(alice, kind) is NOT_COUNTED  # the second request of the minute
    assert limiter.in_flight("alice") == 1
    held.done(50)  # over the token limit: inference is refused, the other routes are not
    assert limiter.check(alice) is not None
    assert limiter.admit(alice, kind) is NOT_COUNTED  # the third
    refused = limiter.admit(alice, kind)
    assert isinstance(refused, Refusal) and "3 requests per minute" in refused.message
    assert limiter.check(alice, kind) is not None
    assert limiter.in_flight("alice") == 0


def test_other_routes_without_a_request_limit_are_not_counted() -> None:
    limiter = RateLimiter(Clock())
    bob = caller("bob", max_concurrent=1, tokens_per_minute=1)
    for kind in OTHER_ROUTES:
        assert limiter.check(bob, kind) is None
        assert limiter.admit(bob, kind) is NOT_COUNTED
    permit(limiter, bob)
    assert limiter.in_flight("bob") == 1


def test_another_routes_request_reaches_the_store_as_a_request_alone() -> None:
    store = Counters()
    limiter = RateLimiter(Clock(), store)
    alice = caller(requests_per_minute=5, max_concurrent=3)
    assert limiter.admit(alice, RouteKind.MODEL_LIST) is NOT_COUNTED
    [(changes, _)] = store.waiting
    assert changes == [("limit:rpm:alice:0", 1, 120.0)]
    store.answer_all()
    store.totals["limit:rpm:alice:0"] += 4  # peers
    limiter.admit(alice, RouteKind.MODEL_ROUTED)
    store.answer_all()
    assert isinstance(limiter.admit(alice, RouteKind.PASS_THROUGH), Refusal)
