# -*- test-case-name: tests.inbound.test_rates -*-
"""How much a named key may do: requests and tokens per minute, requests at once (§12.1).

:class:`RateLimiter` counts per key name in fixed one-minute windows of its clock (``floor(now /
60)``): a request is counted when it is admitted; its tokens (prompt + completion) when it ends,
and they are enforced on the requests that follow. ``max_concurrent`` counts the requests admitted
and not yet done. Over a limit, :meth:`RateLimiter.admit` gives a :class:`Refusal` (429
``rate-limited`` with ``Retry-After``: the seconds left in the window, 1 for concurrency).

With :class:`LimitCounters` (the fleet store, ``--state``) the counts are fleet-wide: every change
goes to the store without the request waiting on it, and the store's answer (the fleet's total)
is what the next decision sees, so a proxy learns its peers' counts from its own traffic and a
limit is passed by at most about one request per proxy. While the store is away, or when it
fails, each proxy counts alone; a request is never refused or delayed because the store failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Protocol

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nvpair_tw.core import RouteKind
from nvpair_tw.inbound._ingress import Rejection
from nvpair_tw.inbound._keys import Caller, KeyRules
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "CONCURRENCY_TTL",
    "NOT_COUNTED",
    "WINDOW",
    "Change",
    "LimitCounters",
    "Permit",
    "RateLimiter",
    "Refusal",
]

log = LevelledLogger(namespace=__name__)

WINDOW = 60.0
"""Seconds: the length of a counting window."""
CONCURRENCY_TTL = 900.0
"""Seconds: a fleet-wide concurrency counter not changed for this long is forgotten (a proxy that
died with requests in flight cannot hold a key's slots for longer)."""

Change = tuple[str, int, float]
"""One counter change: (counter name, amount to add — 0 reads, negative takes back, floored at 0
—, seconds the counter then lives)."""


class LimitCounters(Protocol):
    """Where counters are shared by a fleet (:meth:`nvpair_tw.fleet.FleetStore.limit_counters`)."""

    @property
    def up(self) -> bool:
        """Whether the store answers now; while it does not, nothing is sent."""

    def add(self, changes: Sequence[Change]) -> Deferred[list[int]]:
        """Apply ``changes`` at once; fires with each counter's fleet total, or fails."""


@frozen
class Refusal:
    """Over a limit: the seconds to wait (an integer, at least 1) and why."""

    retry_after: int
    message: str

    @property
    def rejection(self) -> Rejection:
        """The 429 ``rate-limited`` answer, with ``Retry-After``."""
        return Rejection(
            429, "rate-limited", self.message, ((b"Retry-After", b"%d" % self.retry_after),)
        )


class Tally(Enum):
    """What a counter counts; the value names it in the fleet store."""

    CONCURRENT = "conc"
    """Requests admitted and not done (spans no minute)."""
    REQUESTS = "rpm"
    """Requests admitted in a minute."""
    TOKENS = "tpm"
    """Tokens of the requests that ended in a minute."""


class _Stored(Enum):
    """What the fleet store did with a change sent to it."""

    COUNTED = "counted"
    MISSED = "missed"
    """It failed or was away: this proxy counted the change alone."""


@define
class _Tally:
    """One counter of one key: this proxy's own count, and the fleet's as last reported."""

    kind: Tally
    window: int | None
    """The minute counted (``floor(now / 60)``); ``None`` for :attr:`Tally.CONCURRENT`."""
    local: int = 0
    fleet: int | None = None
    pending: int = 0
    """This proxy's changes sent to the store and not yet answered."""

    def counter(self, namespace: str, name: str) -> str:
        """The counter's name in the fleet store."""
        if self.window is None:
            return f"{namespace}:{self.kind.value}:{name}"
        return f"{namespace}:{self.kind.value}:{name}:{self.window}"

    def fleet_count(self) -> int:
        """The fleet's count as far as known: the store's last total with this proxy's changes
        not yet answered, never below this proxy's own; its own when the store's is unknown."""
        if self.fleet is None:
            return self.local
        return max(self.local, self.fleet + self.pending)


@define(eq=False)
class Permit:
    """An admitted request: :meth:`done` when it ends, with its tokens if known."""

    _limiter: RateLimiter | None
    _caller: Caller | None
    _acquired: Deferred[_Stored] | None = None
    _done: bool = field(default=False, init=False)

    def done(self, tokens: int | None = None) -> None:
        """The request ended: count its ``tokens`` (None: unknown) and free its concurrency slot.
        Only the first call counts."""
        if self._done or self._limiter is None or self._caller is None:
            return
        self._done = True
        self._limiter._ended(self._caller, tokens, self._acquired)


NOT_COUNTED = Permit(None, None)
"""The permit of a request no limit counts (a key without limits, a route the limits do not
count): :meth:`Permit.done` does nothing."""


def _refusals(caller: Caller, counts: tuple[int, int, int], left: int) -> list[Refusal]:
    """Each limit of ``caller`` its counts (in flight, requests, tokens) reach; ``left``: the
    seconds to the next window."""
    rules, name = caller.rules, caller.name
    in_flight, requests, tokens = counts
    refusals = []
    if rules.max_concurrent is not None and in_flight >= rules.max_concurrent:
        message = f"key '{name}' has {rules.max_concurrent} requests in flight (max_concurrent)"
        refusals.append(Refusal(1, message))
    rpm = rules.requests_per_minute
    if rpm is not None and requests >= rpm:
        refusals.append(Refusal(left, f"key '{name}' reached {rpm} requests per minute"))
    tpm = rules.tokens_per_minute
    if tpm is not None and tokens >= tpm:
        refusals.append(Refusal(left, f"key '{name}' reached {tpm} tokens per minute"))
    return refusals


def _limited(rules: KeyRules, kind: RouteKind) -> bool:
    """Whether a request of route ``kind`` meets any of ``rules``' limits: inference every one,
    any other route the request limit alone."""
    if kind is RouteKind.INFERENCE:
        return rules.limited
    return rules.requests_per_minute is not None


def _longest(refusals: list[Refusal]) -> Refusal | None:
    return max(refusals, key=lambda r: r.retry_after) if refusals else None


def _say_once(said: set[str], error: BaseException) -> None:
    """Log a fault of the fleet store's counters once per error type (never a node's)."""
    kind = type(error).__name__
    if kind not in said:
        said.add(kind)
        log.warn(
            "limit counters: the fleet store failed ({error}); this proxy counts alone while it does",
            error=kind,
        )


@define
class RateLimiter:
    """The per-key limits of §12.1 on ``clock``, fleet-wide through ``counters`` when given."""

    clock: IReactorTime
    counters: LimitCounters | None = None
    namespace: str = "limit"
    _tallies: dict[tuple[str, Tally], _Tally] = field(factory=dict, init=False)
    unanswered: int = field(default=0, init=False)
    """Changes sent to the store and not answered yet."""
    _owed: dict[str, int] = field(factory=dict, init=False)
    """Per key: slots the store counted whose release it missed (given back with the next
    change)."""
    _said: set[str] = field(factory=set, init=False)
    """The types of the store's errors logged so far (each is logged once)."""

    def check(self, caller: Caller, kind: RouteKind = RouteKind.INFERENCE) -> Refusal | None:
        """Whether ``caller`` is over a limit a request of route ``kind`` meets, counting nothing
        (docs/behaviour.md §14.1: the limits that need no body are checked before the body is
        read; the request is counted only by :meth:`admit`, once it is admitted)."""
        if not _limited(caller.rules, kind):
            return None
        return self._over(caller, kind)

    def admit(self, caller: Caller, kind: RouteKind = RouteKind.INFERENCE) -> Permit | Refusal:
        """Admit one request of ``caller`` on a route of ``kind`` that goes to a node, or say why
        not (nothing is counted then). Inference holds a concurrency slot until its permit is
        done; any other route is counted once against the request limit (§12.1)."""
        if not _limited(caller.rules, kind):
            return NOT_COUNTED
        refusal = self._over(caller, kind)
        return refusal if refusal is not None else self._count(caller, kind)

    def _over(self, caller: Caller, kind: RouteKind) -> Refusal | None:
        """The refusal of the limit ``caller`` is over now (the longest wait), or None; beyond
        inference, only the request limit applies."""
        now = self.clock.seconds()
        window = int(now // WINDOW)
        shared = self._shared()
        concurrent = self._tally(caller.name, Tally.CONCURRENT, None)
        if not shared:
            concurrent.fleet = None  # stale once the store is away: learnt again when back
        tallies = (
            concurrent,
            self._tally(caller.name, Tally.REQUESTS, window),
            self._tally(caller.name, Tally.TOKENS, window),
        )
        in_flight, requests, tokens = (t.fleet_count() if shared else t.local for t in tallies)
        counts = (in_flight, requests, tokens) if kind is RouteKind.INFERENCE else (0, requests, 0)
        left = max(1, math.ceil((window + 1) * WINDOW - now))
        return _longest(_refusals(caller, counts, left))

    def _count(self, caller: Caller, kind: RouteKind) -> Permit:
        """Count one admitted request of ``caller`` (here, and in the fleet's store if shared);
        beyond inference against the request limit alone (no concurrency slot, no tokens)."""
        window = int(self.clock.seconds() // WINDOW)
        shared = self._shared()
        requests = self._tally(caller.name, Tally.REQUESTS, window)
        requests.local += 1
        if kind is not RouteKind.INFERENCE:
            if shared:
                self._send(caller.name, [(requests, 1, 2 * WINDOW)])
            return NOT_COUNTED
        concurrent = self._tally(caller.name, Tally.CONCURRENT, None)
        tokens = self._tally(caller.name, Tally.TOKENS, window)
        concurrent.local += 1
        if not shared:
            return Permit(self, caller, None)
        owed = self._owed.pop(caller.name, 0)
        changes = [
            (requests, 1, 2 * WINDOW),
            (concurrent, 1 - owed, CONCURRENCY_TTL),
            (tokens, 0, 2 * WINDOW),
        ]
        acquired = self._send(caller.name, changes)
        if owed:
            acquired.addCallback(self._settled, caller.name, owed)
        return Permit(self, caller, acquired)

    def in_flight(self, name: str) -> int:
        """This proxy's requests of key ``name`` admitted and not done."""
        tally = self._tallies.get((name, Tally.CONCURRENT))
        return tally.local if tally is not None else 0

    def _ended(
        self, caller: Caller, tokens: int | None, acquired: Deferred[_Stored] | None
    ) -> None:
        concurrent = self._tally(caller.name, Tally.CONCURRENT, None)
        concurrent.local = max(0, concurrent.local - 1)
        changes: list[tuple[_Tally, int, float]] = []
        if tokens is not None and tokens > 0:
            tally = self._tally(caller.name, Tally.TOKENS, int(self.clock.seconds() // WINDOW))
            tally.local += tokens
            changes.append((tally, tokens, 2 * WINDOW))
        if changes and self._shared():
            self._send(caller.name, changes)
        if acquired is not None:
            # Only a slot the store counted is given back there.
            acquired.addCallback(self._release, caller.name, concurrent)

    def _release(self, stored: _Stored, name: str, concurrent: _Tally) -> None:
        if stored is _Stored.MISSED:
            return
        owed = self._owed.pop(name, 0) + 1
        if not self._shared():
            self._owed[name] = owed
            return
        sent = self._send(name, [(concurrent, -owed, CONCURRENCY_TTL)])
        sent.addCallback(self._settled, name, owed)

    def _settled(self, stored: _Stored, name: str, owed: int) -> _Stored:
        """A change that carried ``owed`` releases: owed again when the store missed it."""
        if stored is _Stored.MISSED:
            self._owed[name] = self._owed.get(name, 0) + owed
        return stored

    def _shared(self) -> bool:
        try:
            return self.counters is not None and bool(self.counters.up)
        except Exception as error:  # a store's fault never costs a request: count alone
            _say_once(self._said, error)
            return False

    def _tally(self, name: str, kind: Tally, window: int | None) -> _Tally:
        tally = self._tallies.get((name, kind))
        if tally is None or tally.window != window:
            tally = self._tallies[(name, kind)] = _Tally(kind, window)
        return tally

    def _send(self, name: str, changes: list[tuple[_Tally, int, float]]) -> Deferred[_Stored]:
        """Send ``changes`` to the store; fires with what it did with them (never fails)."""
        assert self.counters is not None
        wire = [(t.counter(self.namespace, name), amount, ttl) for t, amount, ttl in changes]
        for tally, amount, _ttl in changes:
            tally.pending += amount
        self.unanswered += 1
        try:
            sent = self.counters.add(wire)
        except Exception as error:  # a closed connection: count locally
            _say_once(self._said, error)
            sent = Deferred()
            sent.errback(error)

        def answered(totals: list[int]) -> _Stored:
            self.unanswered -= 1
            for (tally, amount, _ttl), total in zip(changes, totals, strict=False):
                tally.pending -= amount
                if isinstance(total, int):
                    tally.fleet = total
            return _Stored.COUNTED

        def failed(failure: Failure) -> _Stored:
            self.unanswered -= 1
            for tally, amount, _ttl in changes:
                tally.pending -= amount
                if tally.kind is Tally.CONCURRENT:
                    tally.fleet = None  # unknown now: this proxy counts alone until next time
            log.debug("limit counters not shared: {error}", error=type(failure.value).__name__)
            return _Stored.MISSED

        return sent.addCallbacks(answered, failed)
