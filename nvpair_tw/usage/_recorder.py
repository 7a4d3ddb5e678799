# -*- test-case-name: tests.usage.test_recorder -*-
"""The usage recorder (docs/behaviour.md §12.4): every ``proxy/request`` record of an inference
counted into its minute, kept in memory and written in batches to the usage database off the
reactor thread, and (with ``--state``) added to the fleet store.

The request path only adds to a dict: the bus delivers the record synchronously, the recorder
counts it and returns. A timer (armed only while something is unsaved) writes everything unsaved
every :data:`FLUSH_INTERVAL` seconds as one transaction on the database's own thread; ``stop``
writes the rest. A database that cannot be opened, read or written (a corrupt file, a path that
cannot be created, a full disk) is said once; from then on usage is kept in memory only (the last
:data:`MEMORY_RETENTION` seconds) and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorFromThreads
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.events import PROXY_REQUEST, Event, EventBus, Subscription
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.usage._database import UsageDatabase
from nvpair_tw.usage._minutes import (
    COUNTS,
    MINUTE,
    Counts,
    Report,
    Row,
    UsageKey,
    add,
    counts_of,
    grouped,
    rollup,
)

__all__ = [
    "DEFAULT_RETENTION",
    "FLUSH_INTERVAL",
    "MEMORY_RETENTION",
    "PRUNE_INTERVAL",
    "UsageRecorder",
    "UsageSink",
]

log = LevelledLogger(namespace=__name__)

DEFAULT_RETENTION = 90 * 86400.0
FLUSH_INTERVAL = 5.0
"""Seconds between batched writes (while something is unsaved)."""
PRUNE_INTERVAL = 3600.0
"""Seconds between deletions of the minutes older than the retention (and once at start)."""
MEMORY_RETENTION = 86400.0
"""Seconds of usage kept in memory when there is no database (``none``, or it failed)."""


class UsageSink(Protocol):
    """Where a fleet's usage is summed (:class:`~nvpair_tw.fleet.FleetStore`)."""

    @property
    def up(self) -> bool:
        """Whether the store is connected now."""

    def add_usage(self, rows: Sequence[Row], ttl: float) -> None:
        """Add these minutes to the fleet's sums, fire and forget; they expire after ``ttl``."""

    def usage_rows(self, since: int, until: int) -> Deferred[list[Row]]:
        """Every proxy's minutes from ``since`` to ``until``."""


def _rows(buckets: dict[UsageKey, Counts]) -> list[Row]:
    return [(k.minute, k.key, k.model, k.node, *c) for k, c in buckets.items()]  # type: ignore[misc]


def _merge(into: dict[UsageKey, Counts], rows: Iterable[Row]) -> None:
    for row in rows:
        add(into.setdefault(UsageKey(*row[:4]), [0] * len(COUNTS)), row[4:])


class UsageRecorder:
    """Counts requests into minutes; saves them to ``path`` (``None``: memory only).

    ``state`` is ``"memory"``, ``"opening"`` (until :meth:`start`'s open is done) or
    ``"database"``; ``warned`` says the database failed (and was said so, once).
    """

    def __init__(
        self,
        reactor: IProxyReactor,
        bus: EventBus,
        *,
        path: str | None,
        retention: float = DEFAULT_RETENTION,
        fleet: UsageSink | None = None,
        flush_interval: float = FLUSH_INTERVAL,
    ) -> None:
        self._reactor = reactor
        self.path = path
        self.retention = retention
        self._fleet = fleet
        self._flush_interval = flush_interval
        self.state = "memory" if path is None else "opening"
        self.warned = False
        self.written = 0
        """Rows written to the database so far (upserts: a minute written twice counts twice)."""
        self._db = None if path is None else UsageDatabase(cast(IReactorFromThreads, reactor), path)
        self._memory: dict[UsageKey, Counts] = {}
        self._unsaved: dict[UsageKey, Counts] = {}
        self._unshared: dict[UsageKey, Counts] = {}
        self._in_flight: list[list[Row]] = []
        self._flush_timer: IDelayedCall | None = None
        self._prune_timer: IDelayedCall | None = None
        self._memory_pruned = 0
        self._opened: Deferred[None] | None = None
        self._open_settled = False
        self._waiters: list[Deferred[None]] = []
        self._writing: Deferred[None] = succeed(None)
        self._stopped = False
        self._subscription: Subscription | None = bus.subscribe(self._observe, name="usage")

    # --- counting (the request path) -----------------------------------------------------------

    def _observe(self, event: Event) -> None:
        if event.name != PROXY_REQUEST or self._stopped:
            return
        counted = counts_of(event.time, event.payload)
        if counted is None:
            return
        bucket, counts = counted
        if self.state == "memory":
            add(self._memory.setdefault(bucket, [0] * len(COUNTS)), counts)
            self._prune_memory(bucket.minute)
        else:
            add(self._unsaved.setdefault(bucket, [0] * len(COUNTS)), counts)
        if self._fleet is not None:
            add(self._unshared.setdefault(bucket, [0] * len(COUNTS)), counts)
        if (self._unsaved or self._unshared) and self._flush_timer is None:
            self._flush_timer = self._reactor.callLater(self._flush_interval, self.flush)

    def _prune_memory(self, minute: int) -> None:
        """Forget memory minutes past the memory window (at most once a minute)."""
        if minute <= self._memory_pruned:
            return
        self._memory_pruned = minute
        keep = minute - int(min(self.retention, MEMORY_RETENTION) // MINUTE)
        for bucket in [b for b in self._memory if b.minute < keep]:
            del self._memory[bucket]

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> Deferred[None]:
        """Open the database (in its thread) and delete what is past the retention; fires when
        done, also when it failed (then usage is in memory)."""
        if self._db is None or self._opened is not None:
            return succeed(None)
        db = self._db
        opening = db.open()
        opened: Deferred[None] = opening.addCallback(lambda _count: self._prune_db())
        self._opened = opened.addCallbacks(self._open_done, self._failed)
        self._opened.addBoth(self._settled)
        return self._when_open()

    def _settled(self, result: object) -> object:
        self._open_settled = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)
        return result

    def _when_open(self) -> Deferred[None]:
        """A Deferred of its own that fires once the open is done (at once if it is, or was never
        asked for): the open's own chain is left to whoever started it."""
        if self._opened is None or self._open_settled:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def _open_done(self, _result: object) -> None:
        if self.state != "opening":
            return
        self.state = "database"
        log.info("usage history in {path}", path=self.path)
        self._schedule_prune()
        if self._unsaved and self._flush_timer is None:
            self._flush_timer = self._reactor.callLater(self._flush_interval, self.flush)

    def _schedule_prune(self) -> None:
        if not self._stopped:
            self._prune_timer = self._reactor.callLater(PRUNE_INTERVAL, self._prune_hourly)

    def _prune_hourly(self) -> None:
        self._prune_timer = None
        if self.state == "database":
            self._writing = self._writing.addCallback(lambda _: self._prune_db()).addErrback(
                self._failed
            )
            self._schedule_prune()

    def _prune_db(self) -> Deferred[None]:
        assert self._db is not None
        before = int((self._reactor.seconds() - self.retention) // MINUTE)
        return self._db.prune(before).addCallback(lambda _n: None)

    def flush(self) -> Deferred[None]:
        """Share everything unshared with the fleet and write everything unsaved; fires once
        written (or given up: then it is in memory)."""
        if self._flush_timer is not None and self._flush_timer.active():
            self._flush_timer.cancel()
        self._flush_timer = None
        if self._unshared and self._fleet is not None:
            rows, self._unshared = _rows(self._unshared), {}
            try:
                self._fleet.add_usage(rows, self.retention)
            except Exception as error:  # the fleet is an optimisation: never fail a flush for it
                log.debug("usage not shared: {error}", error=type(error).__name__)
        if self.state != "database" or not self._unsaved:
            return self._writing
        assert self._db is not None
        batch, self._unsaved = _rows(self._unsaved), {}
        self._in_flight.append(batch)
        db = self._db

        def write(_: object) -> Deferred[None]:
            if self.state != "database":
                return succeed(None)  # failed meanwhile: _failed moved the batch to memory
            return db.write(batch)

        def written(_: object) -> None:
            if batch in self._in_flight:
                self._in_flight.remove(batch)
                self.written += len(batch)

        self._writing = self._writing.addCallback(write).addCallbacks(written, self._failed)
        return self._writing

    def _failed(self, failure: Failure) -> None:
        """The database failed (at open, a write or a prune): say it once, keep usage in memory."""
        if self.state == "memory":
            return
        self.state = "memory"
        for batch in self._in_flight:
            _merge(self._memory, batch)
        self._in_flight = []
        _merge(self._memory, _rows(self._unsaved))
        self._unsaved = {}
        if self._prune_timer is not None and self._prune_timer.active():
            self._prune_timer.cancel()
        self._prune_timer = None
        if not self.warned:
            self.warned = True
            log.warn(
                "usage database {path} cannot be used ({error}: {why}); usage is kept in memory "
                "only (the last {hours} h) and is not saved",
                path=self.path,
                error=failure.type.__name__ if failure.type else "error",
                why=str(failure.value)[:200],
                hours=int(min(self.retention, MEMORY_RETENTION) // 3600),
            )
        if self._db is not None:
            self._db.close().addErrback(lambda _f: None)
            self._db = None

    def stop(self) -> Deferred[None]:
        """Stop counting, write the rest, close the database."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        opened = self._when_open()

        def finish(_: object) -> Deferred[None]:
            self._stopped = True
            if self._prune_timer is not None and self._prune_timer.active():
                self._prune_timer.cancel()
            self._prune_timer = None
            return self.flush()

        def close(_: object) -> Deferred[None]:
            if self._db is None:
                return succeed(None)
            db, self._db = self._db, None
            if self.state == "database":
                self.state = "memory"
                _merge(self._memory, [r for batch in self._in_flight for r in batch])
            return db.close().addErrback(lambda _f: None)

        return opened.addCallback(finish).addCallback(close)

    # --- reports --------------------------------------------------------------------------------

    def report(self, report: Report) -> Deferred[dict[str, Any]]:
        """``{"rows": [...], "scope": "fleet" | "local"}``: the fleet's minutes while the fleet
        store is up, else this proxy's own (database, in flight, unsaved, in memory)."""
        if self._fleet is not None and self._fleet.up:
            fleet = self._fleet
            asked = fleet.usage_rows(report.since, report.until)
            return asked.addCallbacks(
                lambda rows: self._fleet_report(report, rows),
                lambda failure: self._local_report(report),
            )
        return self._local_report(report)

    def _fleet_report(self, report: Report, rows: list[Row]) -> dict[str, Any]:
        groups = [*grouped(report, rows), *grouped(report, _rows(self._unshared))]
        return {"rows": rollup(report, groups), "scope": "fleet"}

    def _local_report(self, report: Report) -> Deferred[dict[str, Any]]:
        if self.state == "database" and self._db is not None:
            # Queued behind the writes so far: when it fires, whatever is still in flight was
            # written after the query ran, so nothing is counted twice.
            asked = self._db.query(report)
            return asked.addCallbacks(
                lambda found: self._local_rows(report, found),
                lambda failure: self._local_rows(report, []),
            )
        return succeed(self._local_rows(report, []))

    def _local_rows(
        self, report: Report, stored: list[tuple[tuple[Any, ...], tuple[int, ...]]]
    ) -> dict[str, Any]:
        groups = [
            *stored,
            *grouped(report, [r for batch in self._in_flight for r in batch]),
            *grouped(report, _rows(self._unsaved)),
            *grouped(report, _rows(self._memory)),
        ]
        return {"rows": rollup(report, groups), "scope": "local"}
