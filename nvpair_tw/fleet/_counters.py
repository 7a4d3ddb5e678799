# -*- test-case-name: tests.fleet.test_counters -*-
"""Fleet-wide rate-limit counters (docs/behaviour.md §12.1): the per-key counts of
:class:`~nvpair_tw.inbound.RateLimiter`, kept in the store so every proxy of a fleet counts together.

Each counter is one integer key, ``NAMESPACE:limit:KIND:NAME[:WINDOW]``: a minute window's
requests or tokens (living two windows), or a key's requests in flight (with a safety TTL, so a
proxy that died with requests in flight frees them in the end). One script call applies a
request's changes and returns the fleet's totals; a count taken back never goes below zero. The
request never waits on it: the limiter decides on what it knows and learns from the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail

from nvpair_tw.fleet._wire import Codec
from nvpair_tw.inbound import Change

__all__ = ["LIMIT_SCRIPT", "SharedCounters"]

# INCRBY on a key of another type fails the call, and the limiter then counts locally.
LIMIT_SCRIPT = """
local out = {}
for i = 1, #KEYS do
  local n = redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1])
  if n < 0 then
    redis.call('SET', KEYS[i], 0)
    n = 0
  end
  redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  out[i] = n
end
return out
"""


class SharedCounters:
    """The :class:`~nvpair_tw.inbound.LimitCounters` of one fleet store."""

    def __init__(
        self,
        codec: Codec,
        connection: Callable[[], Any],
        timed: Callable[[Deferred[Any], Any], Awaitable[Any]],
    ) -> None:
        self._codec = codec
        self._connection = connection
        self._timed = timed

    @property
    def up(self) -> bool:
        return self._connection() is not None

    def add(self, changes: Sequence[Change]) -> Deferred[list[int]]:
        conn = self._connection()
        if conn is None:
            return fail(ConnectionError("the fleet store is away"))
        keys = [self._codec.counter(name) for name, _amount, _ttl in changes]
        args: list[str] = []
        for _name, amount, ttl in changes:
            args += [str(int(amount)), str(max(1, int(ttl * 1000)))]

        async def call() -> list[int]:
            totals = await self._timed(conn.eval(LIMIT_SCRIPT, keys, args), conn)
            return [int(t) for t in totals]

        return Deferred.fromCoroutine(call())
