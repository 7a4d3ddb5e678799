"""Fleet-wide key limits through a real redis-server (docs/behaviour.md §12.1, ``--state``).

Two :class:`~nvpair_tw.fleet.FleetStore` connections stand for two proxies; each has its own
:class:`~nvpair_tw.inbound.RateLimiter`, whose windows run on a shared ``Clock`` (the windows are
the clock's, the store's round trips the real reactor's). Waits poll with a bounded deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from nvpair_tw.fleet import FleetStore
from nvpair_tw.inbound import Caller, KeyRules, Permit, RateLimiter, Refusal
from tests.fleet.test_store import RedisServer, redis, restart
from tests.helpers import eventually

__all__ = ["redis"]  # the fixture, imported for these tests

pytestmark = pytest.mark.timeout(60)


class Proxy:
    def __init__(self, reactor: Any, server: RedisServer, name: str, clock: Clock) -> None:
        self.store = FleetStore(reactor, server.config(), proxy_id=name)
        self.limiter = RateLimiter(clock, self.store.limit_counters())

    def admit(self, who: Caller) -> Permit | Refusal:
        return self.limiter.admit(who)


@pytest_twisted.async_yield_fixture()
async def pair(reactor: Any, redis: RedisServer) -> AsyncIterator[tuple[Proxy, Proxy]]:
    clock = Clock()
    clock.advance(6000)  # window 100
    a, b = Proxy(reactor, redis, "a", clock), Proxy(reactor, redis, "b", clock)
    for proxy in (a, b):
        proxy.store.start()
    await eventually(reactor, lambda: a.store.up and b.store.up, 10.0, "both stores up")
    yield a, b
    for proxy in (a, b):
        await proxy.store.stop()


async def settled(reactor: Any, *proxies: Proxy) -> None:
    await eventually(
        reactor, lambda: all(p.limiter.unanswered == 0 for p in proxies), 5.0, "answers"
    )


def permitted(got: Permit | Refusal) -> Permit:
    assert isinstance(got, Permit), got
    return got


@pytest_twisted.ensureDeferred
async def test_two_proxies_count_requests_together(
    reactor: Any, redis: RedisServer, pair: tuple[Proxy, Proxy]
) -> None:
    a, b = pair
    alice = Caller("alice", KeyRules(requests_per_minute=5))
    for _ in range(3):
        permitted(a.admit(alice))
    await settled(reactor, a)
    for _ in range(2):
        permitted(b.admit(alice))  # b learns the fleet's 5 from these answers
    await settled(reactor, b)
    refused = b.admit(alice)
    assert isinstance(refused, Refusal) and refused.retry_after == 60
    assert redis.cli("GET", "nvpair:limit:rpm:alice:100").strip() == "5"
    # a last heard 3: it passes one more, learns the fleet's total, and refuses after.
    permitted(a.admit(alice))
    await settled(reactor, a)
    assert isinstance(a.admit(alice), Refusal)
    assert redis.cli("GET", "nvpair:limit:rpm:alice:100").strip() == "6"
    ttl = int(redis.cli("PTTL", "nvpair:limit:rpm:alice:100"))
    assert 0 < ttl <= 120_000


@pytest_twisted.ensureDeferred
async def test_concurrency_and_tokens_are_fleet_wide_and_released(
    reactor: Any, redis: RedisServer, pair: tuple[Proxy, Proxy]
) -> None:
    a, b = pair
    alice = Caller("alice", KeyRules(max_concurrent=2, tokens_per_minute=1000))
    held = permitted(a.admit(alice))
    await settled(reactor, a)
    other = permitted(b.admit(alice))
    await settled(reactor, b)
    assert isinstance(b.admit(alice), Refusal)  # one here, one on a
    assert redis.cli("GET", "nvpair:limit:conc:alice").strip() == "2"
    assert int(redis.cli("PTTL", "nvpair:limit:conc:alice")) > 0  # the safety TTL
    held.done(700)
    await settled(reactor, a)  # a's tokens reach the store first: b's answer then holds both
    other.done(400)
    await settled(reactor, b)
    assert redis.cli("GET", "nvpair:limit:conc:alice").strip() == "0"
    assert redis.cli("GET", "nvpair:limit:tpm:alice:100").strip() == "1100"
    # b knows the fleet's tokens from its own end; a learns them with its next admit.
    assert isinstance(b.admit(alice), Refusal)
    permitted(a.admit(alice)).done(None)
    await settled(reactor, a)
    assert isinstance(a.admit(alice), Refusal)


@pytest_twisted.ensureDeferred
async def test_a_counter_lost_in_the_store_never_goes_below_zero(
    reactor: Any, redis: RedisServer, pair: tuple[Proxy, Proxy]
) -> None:
    a, b = pair
    alice = Caller("alice", KeyRules(max_concurrent=1))
    held = permitted(a.admit(alice))
    await settled(reactor, a)
    redis.cli("DEL", "nvpair:limit:conc:alice")  # expired or flushed while in flight
    held.done(None)
    await settled(reactor, a)
    assert redis.cli("GET", "nvpair:limit:conc:alice").strip() == "0"
    permitted(b.admit(alice)).done(None)


@pytest_twisted.ensureDeferred
async def test_with_the_store_down_each_proxy_counts_alone_and_never_fails(
    reactor: Any, redis: RedisServer, pair: tuple[Proxy, Proxy]
) -> None:
    a, b = pair
    alice = Caller("alice", KeyRules(requests_per_minute=3, max_concurrent=5))
    permitted(a.admit(alice)).done(None)
    await settled(reactor, a)
    redis.kill()
    await eventually(reactor, lambda: not a.store.up and not b.store.up, 10.0, "stores down")
    # a counts its own (1 before, 2 now); b alone admits 3 of its own.
    permitted(a.admit(alice)).done(None)
    permitted(a.admit(alice)).done(None)
    assert isinstance(a.admit(alice), Refusal)
    for _ in range(3):
        permitted(b.admit(alice)).done(None)
    assert isinstance(b.admit(alice), Refusal)
    assert a.limiter.unanswered == b.limiter.unanswered == 0  # nothing was sent
    await restart(reactor, redis)
    await eventually(reactor, lambda: a.store.up and b.store.up, 10.0, "stores back")
    other = Caller("bob", KeyRules(requests_per_minute=2))
    permitted(a.admit(other))
    await settled(reactor, a)
    permitted(b.admit(other))
    await settled(reactor, b)
    assert isinstance(b.admit(other), Refusal)  # shared again


@pytest_twisted.ensureDeferred
async def test_a_key_of_another_type_in_the_store_costs_only_the_sharing(
    reactor: Any, redis: RedisServer, pair: tuple[Proxy, Proxy]
) -> None:
    a, _b = pair
    redis.cli("HSET", "nvpair:limit:rpm:alice:100", "f", "v")
    alice = Caller("alice", KeyRules(requests_per_minute=2))
    permitted(a.admit(alice))
    await settled(reactor, a)
    permitted(a.admit(alice))
    await settled(reactor, a)
    assert isinstance(a.admit(alice), Refusal)
    assert a.store.up
