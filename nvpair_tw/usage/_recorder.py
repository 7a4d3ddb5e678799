# -*- test-case-name: tests.usage.test_recorder -*-
"""The usage recorder (docs/behaviour.md §12.4): every ``proxy/request`` record of an inference
counted into its minute, kept in memory and written in batches to the usage database off the
reactor thread, and (with ``--state``) added to the fleet store.

The request path only adds to a dict: the bus delivers the record synchronously, the recorder
counts it into its :class:`~nvpair_tw.usage._buffer.UsageBuffer` and returns. A timer (armed only
while something is unsaved) writes everything unsaved every :data:`FLUSH_INTERVAL` seconds as one
transaction on the database's own thread (:class:`~nvpair_tw.usage._storage.UsageStorage`);
``stop`` writes the rest. A report that cannot read the fleet store or the database says so: its
``partial`` names the sources left out, and each such failure is logged once with its type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.events import Event, EventBus, ProxyRequest, Subscription
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.usage._buffer import MEMORY_RETENTION, Group, UsageBuffer
from nvpair_tw.usage._minutes import Report, Row, counts_of, grouped, rollup
from nvpair_tw.usage._storage import PRUNE_INTERVAL, Storage, UsageStorage

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


class UsageSink(Protocol):
    """Where a fleet's usage is summed (:class:`~nvpair_tw.fleet.FleetStore`)."""

    @property
    def up(self) -> bool:
        """Whether the store is connected now."""

    def add_usage(self, rows: Sequence[Row], ttl: float) -> None:
        """Add these minutes to the fleet's sums, fire and forget; they expire after ``ttl``."""

    def usage_rows(self, since: int, until: int) -> Deferred[list[Row]]:
        """Every proxy's minutes from ``since`` to ``until``."""


def _answer(report: Report, groups: list[Group], scope: str, partial: list[str]) -> dict[str, Any]:
    answer: dict[str, Any] = {"rows": rollup(report, groups), "scope": scope}
    if partial:
        answer["partial"] = partial
    return answer


class UsageRecorder:
    """Counts requests into minutes; saves them to ``path`` (``None``: memory only).

    ``state`` is a :class:`~nvpair_tw.usage._storage.Storage`; ``warned`` says the database failed
    (and was said so, once).
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
        self._fleet = fleet
        self._flush_interval = flush_interval
        self.buffer = UsageBuffer(retention)
        self.storage = UsageStorage(reactor, path, self.buffer, self._arm)
        self._flush_timer: IDelayedCall | None = None
        self._unreadable: set[tuple[str, str]] = set()
        self._subscription: Subscription | None = bus.subscribe(
            self._observe, name="usage", kinds=(ProxyRequest,)
        )

    @property
    def path(self) -> str | None:
        return self.storage.path

    @property
    def retention(self) -> float:
        return self.buffer.retention

    @property
    def state(self) -> Storage:
        return self.storage.state

    @property
    def warned(self) -> bool:
        return self.storage.warned

    @property
    def written(self) -> int:
        """Rows written to the database so far (upserts: a minute written twice counts twice)."""
        return self.storage.written

    def _observe(self, event: Event) -> None:
        record = event.value
        if not isinstance(record, ProxyRequest):
            return
        counted = counts_of(event.time, record)
        if counted is None:
            return
        bucket, counts = counted
        buffer = self.buffer
        if self.storage.state is Storage.MEMORY:
            buffer.keep(bucket, counts)
        else:
            buffer.hold(bucket, counts)
        if self._fleet is not None:
            buffer.share(bucket, counts)
        if self._flush_timer is None:  # armed: nothing to do (`_arm` says whether to arm)
            self._arm()

    def _arm(self) -> None:
        """Arm the flush timer unless it is (once the database is open, or something is counted)."""
        if self._flush_timer is None and (self.buffer.unsaved or self.buffer.unshared):
            self._flush_timer = self._reactor.callLater(self._flush_interval, self.flush)

    def start(self) -> Deferred[None]:
        """Open the database (in its thread) and delete what is past the retention; fires when
        done, also when it failed (then usage is in memory)."""
        return self.storage.start()

    def flush(self) -> Deferred[None]:
        """Share everything unshared with the fleet and write everything unsaved; fires once
        written (or given up: then it is in memory)."""
        if self._flush_timer is not None and self._flush_timer.active():
            self._flush_timer.cancel()
        self._flush_timer = None
        if self.buffer.unshared and self._fleet is not None:
            rows = self.buffer.take_unshared()
            try:
                self._fleet.add_usage(rows, self.retention)
            except Exception:  # the fleet is an optimisation: a bug sharing never fails a flush
                log.bug("usage could not be shared with the fleet", Failure())
        return self.storage.write()

    def stop(self) -> Deferred[None]:
        """Stop counting, write the rest, close the database."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

        def finish(_: object) -> Deferred[None]:
            self.storage.stop_pruning()
            return self.flush()

        opened = self.storage.when_open()
        return opened.addCallback(finish).addCallback(lambda _: self.storage.close())

    def report(self, report: Report) -> Deferred[dict[str, Any]]:
        """``{"rows": [...], "scope": "fleet" | "local"}``: the fleet's minutes while the fleet
        store is up, else this proxy's own (database, in flight, unsaved, in memory). A source
        that failed is named in ``"partial"`` (``"fleet"``, ``"database"``)."""
        if self._fleet is not None and self._fleet.up:
            asked = self._fleet.usage_rows(report.since, report.until)
            return asked.addCallbacks(
                lambda rows: self._fleet_report(report, rows),
                lambda failure: self._local_report(report, [self._left_out("fleet", failure)]),
            )
        return self._local_report(report, [])

    def _fleet_report(self, report: Report, rows: list[Row]) -> dict[str, Any]:
        groups = [*grouped(report, rows), *self.buffer.unshared_groups(report)]
        return _answer(report, groups, "fleet", [])

    def _local_report(self, report: Report, partial: list[str]) -> Deferred[dict[str, Any]]:
        # Queued behind the writes so far: when it fires, whatever is still in flight was
        # written after the query ran, so nothing is counted twice.
        asked = self.storage.query(report)
        if asked is None:
            return succeed(self._local_rows(report, [], partial))
        return asked.addCallbacks(
            lambda found: self._local_rows(report, list(found), partial),
            lambda failure: self._local_rows(
                report, [], [*partial, self._left_out("database", failure)]
            ),
        )

    def _local_rows(
        self, report: Report, stored: list[Group], partial: list[str]
    ) -> dict[str, Any]:
        return _answer(report, [*stored, *self.buffer.groups(report)], "local", partial)

    def _left_out(self, source: str, failure: Failure) -> str:
        """A report leaves ``source`` out: logged once per source and error type; ``source``."""
        error = failure.type.__name__ if failure.type else "error"
        if (source, error) not in self._unreadable:
            self._unreadable.add((source, error))
            log.warn(
                "a usage report left out the {source} ({error}); its answer says partial",
                source=source,
                error=error,
            )
        return source
