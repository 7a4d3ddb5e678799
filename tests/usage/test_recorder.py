"""Tests for nvpair_tw.usage._recorder, ._buffer and ._database over real SQLite files (tmp_path) on the
running reactor: batched writes on the database's thread, restarts, retention, degradation to
memory, and what the file holds (never a body)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock, deferLater
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from zope.interface import provider

from nvpair_tw.events import (
    EventBus,
    ProxyRequest,
    WorkloadCompleted,
    WorkloadInfo,
    WorkloadState,
)
from nvpair_tw.usage._buffer import UsageBuffer
from nvpair_tw.usage._database import SCHEMA_VERSION
from nvpair_tw.usage._minutes import UsageKey, parse_report
from nvpair_tw.usage._recorder import FLUSH_INTERVAL, PRUNE_INTERVAL, UsageRecorder
from nvpair_tw.usage._storage import Storage
from tests.helpers import proxy_request

pytestmark = pytest.mark.timeout(60)


def inference(**fields: Any) -> ProxyRequest:
    record: dict[str, Any] = {
        "model": "llama3",
        "key": "team-a",
        "node_id": "n1",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 5,
    }
    record.update(fields)
    return proxy_request(**record)


class Warnings:
    """Captures the usage log's warnings (or events of ``level``) while installed."""

    def __init__(self, level: str = "warn") -> None:
        self.events: list[LogEvent] = []

        @provider(ILogObserver)
        def observe(event: LogEvent) -> None:
            if (
                str(event.get("log_namespace")).startswith("nvpair_tw.usage.")
                and event["log_level"].name == level
            ):
                self.events.append(event)

        self._observer = observe

    def __enter__(self) -> Warnings:
        globalLogPublisher.addObserver(self._observer)
        return self

    def __exit__(self, *_: object) -> None:
        globalLogPublisher.removeObserver(self._observer)


async def totals(
    recorder: UsageRecorder, reactor: Any, by: list[str] | None = None
) -> list[dict[str, Any]]:
    report = parse_report("1h", None, by or [], reactor.seconds())
    answer = await recorder.report(report)
    return list(answer["rows"])


def stored(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT key, model, node, requests, errors, prompt_tokens, "
            "completion_tokens, unknown_tokens, cached_tokens, unknown_cached FROM usage "
            "ORDER BY key"
        ).fetchall()


VERSION_1 = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE usage (
    minute INTEGER NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    node TEXT NOT NULL,
    requests INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    unknown_tokens INTEGER NOT NULL,
    PRIMARY KEY (minute, key, model, node)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema_version', '1');
"""
"""A usage file as nvpair-tw wrote it before cached counts were kept (schema version 1)."""


@pytest_twisted.ensureDeferred
async def test_minutes_are_written_in_one_batch_and_survive_a_restart(
    reactor: Any, tmp_path: Path
) -> None:
    """A second recorder on the same file sees the first's minutes, and adds to them (upsert)."""
    path = tmp_path / "usage.sqlite3"
    first = UsageRecorder(reactor, EventBus(reactor), path=str(path))
    await first.start()
    assert first.state is Storage.DATABASE
    bus = EventBus(reactor)
    second_bus = bus
    first_bus = first._subscription._bus  # type: ignore[union-attr]
    for _ in range(3):
        first_bus.publish(inference())
    first_bus.publish(inference(status=502, prompt_tokens=None, completion_tokens=None))
    first_bus.publish(proxy_request(status=200, path="/api/tags"))  # not an inference
    await first.stop()
    assert stored(path) == [("team-a", "llama3", "n1", 4, 1, 9, 15, 1, 0, 4)]

    second = UsageRecorder(reactor, second_bus, path=str(path))
    await second.start()
    bus.publish(inference(key=None))
    [row] = await totals(second, reactor)
    assert (row["requests"], row["errors"], row["prompt_tokens"]) == (5, 1, 12)
    by_key = await totals(second, reactor, ["key"])
    assert [(r["key"], r["requests"]) for r in by_key] == [("anonymous", 1), ("team-a", 4)]
    await second.stop()
    assert len(stored(path)) == 2
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )


@pytest_twisted.ensureDeferred
async def test_a_file_of_the_first_schema_gains_the_cached_counts_and_keeps_its_minutes(
    reactor: Any, tmp_path: Path
) -> None:
    """A version 1 file is upgraded when opened (one transaction): its minutes stay, each
    request in them counted as having an unknown cached count (none was kept then), and new
    minutes add their cached counts."""
    path = tmp_path / "usage.sqlite3"
    minute = int(reactor.seconds() // 60)
    with sqlite3.connect(path) as db:
        db.executescript(VERSION_1)
        db.execute(
            "INSERT INTO usage VALUES (?, 'team-a', 'llama3', 'n1', 4, 1, 9, 15, 1)", (minute,)
        )
    recorder = UsageRecorder(reactor, EventBus(reactor), path=str(path))
    try:
        await recorder.start()
        assert recorder.state is Storage.DATABASE
        bus = recorder._subscription._bus  # type: ignore[union-attr]
        bus.publish(inference(node_id="n2", cached_tokens=2))
        [row] = await totals(recorder, reactor)
    finally:
        await recorder.stop()  # its thread would outlive a failed assertion, and pytest with it
    assert (row["requests"], row["cached_tokens"], row["unknown_cached"]) == (5, 2, 4)
    assert stored(path) == [
        ("team-a", "llama3", "n1", 4, 1, 9, 15, 1, 0, 4),
        ("team-a", "llama3", "n2", 1, 0, 3, 5, 0, 2, 0),
    ]
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION),) == ("2",)


@pytest_twisted.ensureDeferred
async def test_a_report_counts_unsaved_and_in_flight_minutes_once(
    reactor: Any, tmp_path: Path
) -> None:
    """Rows handed to the thread but not yet written, and rows not yet handed, are in the report."""
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(tmp_path / "u.sqlite3"))
    await recorder.start()
    bus.publish(inference())
    await recorder.flush()
    bus.publish(inference())
    writing = recorder.flush()  # in flight now
    bus.publish(inference())  # unsaved
    [row] = await totals(recorder, reactor)
    assert row["requests"] == 3
    await writing
    [row] = await totals(recorder, reactor)
    assert row["requests"] == 3
    await recorder.stop()


@pytest_twisted.ensureDeferred
async def test_retention_deletes_old_minutes_at_start(reactor: Any, tmp_path: Path) -> None:
    """Minutes older than the retention are gone once the recorder has started."""
    path = tmp_path / "u.sqlite3"
    first = UsageRecorder(reactor, EventBus(reactor), path=str(path))
    await first.start()
    now_minute = int(reactor.seconds() // 60)
    first.buffer.unsaved.clear()
    old = (now_minute - 200, "k", "m", "n", 1, 0, 0, 0, 0, 0, 1)
    new = (now_minute - 10, "k", "m", "n", 1, 0, 0, 0, 0, 0, 1)
    await first.storage.db.write([old, new])  # type: ignore[union-attr]
    await first.stop()
    second = UsageRecorder(reactor, EventBus(reactor), path=str(path), retention=3600)
    await second.start()
    await second.stop()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT minute FROM usage").fetchall() == [(now_minute - 10,)]


@pytest.mark.parametrize("how", ["corrupt", "unwritable", "newer"])
@pytest_twisted.ensureDeferred
async def test_an_unusable_database_is_one_warning_and_usage_stays_in_memory(
    reactor: Any, tmp_path: Path, how: str
) -> None:
    """Garbage in the file, a path under a regular file, a newer schema: one warning, no crash,
    and the counts are still reported (from memory)."""
    if how == "corrupt":
        path = tmp_path / "u.sqlite3"
        path.write_bytes(b"this is not a database\x00" * 500)
    elif how == "unwritable":
        (tmp_path / "plain-file").write_text("x")
        path = tmp_path / "plain-file" / "u.sqlite3"
    else:
        path = tmp_path / "u.sqlite3"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    before = path.read_bytes() if path.exists() else None
    bus = EventBus(reactor)
    with Warnings() as warnings:
        recorder = UsageRecorder(reactor, bus, path=str(path))
        bus.publish(inference())  # while opening
        await recorder.start()
        for _ in range(3):
            bus.publish(inference())
            await recorder.flush()
        [row] = await totals(recorder, reactor)
        await recorder.stop()
    assert recorder.state is Storage.MEMORY and recorder.warned
    assert row["requests"] == 4
    [warning] = warnings.events
    assert warning["path"] == str(path) and warning["hours"] == 24
    assert warning["error"] in {"DatabaseError", "OperationalError", "SchemaError"}
    assert warning["why"] and len(warning["why"]) <= 200
    if before is not None and how == "corrupt":
        assert path.read_bytes() == before  # never "repaired" over the operator's file


@pytest_twisted.ensureDeferred
async def test_a_write_that_fails_later_moves_its_minutes_to_memory(
    reactor: Any, tmp_path: Path
) -> None:
    """A database that breaks after opening (here: its table dropped under it) keeps the counts."""
    path = tmp_path / "u.sqlite3"
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(path))
    await recorder.start()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE usage")
    with Warnings() as warnings:
        bus.publish(inference())
        await recorder.flush()
        bus.publish(inference())
        await recorder.flush()
    assert recorder.state is Storage.MEMORY and len(warnings.events) == 1
    [row] = await totals(recorder, reactor)
    assert row["requests"] == 2
    await recorder.stop()


def test_without_a_database_or_fleet_no_timer_is_ever_armed() -> None:
    """Memory-only usage costs the request path one dict update and schedules nothing."""
    clock = Clock()
    bus = EventBus(clock)
    recorder = UsageRecorder(clock, bus, path=None)  # type: ignore[arg-type]
    bus.publish(inference())
    assert clock.getDelayedCalls() == []
    assert sum(c[0] for c in recorder.buffer.memory.values()) == 1
    clock.advance(2 * 86400)
    bus.publish(inference())  # a day later: the old minute is forgotten
    assert len(recorder.buffer.memory) == 1
    recorder.stop()


def test_the_flush_timer_is_armed_only_while_something_is_unsaved() -> None:
    """Before the database opens, records wait in memory and a flush timer is armed once."""
    clock = Clock()
    bus = EventBus(clock)
    recorder = UsageRecorder(clock, bus, path="/nonexistent/never-opened")  # type: ignore[arg-type]
    bus.publish(inference())
    bus.publish(inference())
    [timer] = clock.getDelayedCalls()
    assert timer.getTime() == FLUSH_INTERVAL
    clock.advance(FLUSH_INTERVAL)  # still opening: nothing to write to, kept
    assert clock.getDelayedCalls() == [] and recorder.buffer.unsaved


@pytest_twisted.ensureDeferred
async def test_the_reactor_is_never_blocked_by_a_large_batch(reactor: Any, tmp_path: Path) -> None:
    """50,000 distinct minutes written in one batch: the write takes place on another thread, and
    the reactor keeps turning while it waits (here on a lock the test holds on the file) and takes
    the result once the lock is let go."""
    bus = EventBus(reactor)
    path = tmp_path / "u.sqlite3"
    recorder = UsageRecorder(reactor, bus, path=str(path))
    await recorder.start()
    for i in range(50_000):
        bus.publish(inference(key=f"k{i % 500}", node_id=f"n{i // 500}"))
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    writing = recorder.flush()
    finished: list[None] = []
    writing.addCallback(finished.append)
    for _turn in range(5):
        await deferLater(reactor, 0, lambda: None)  # the reactor turns: nothing blocks it
    assert finished == [], "the write finished while another connection held the file"
    holder.execute("COMMIT")
    holder.close()
    await writing
    assert recorder.written == 50_000
    await recorder.stop()
    assert len(stored(path)) == 50_000


@pytest_twisted.ensureDeferred
async def test_stop_waits_for_the_open_and_writes_what_came_meanwhile(
    reactor: Any, tmp_path: Path
) -> None:
    """Stopped before the open finished: the records are still written."""
    path = tmp_path / "u.sqlite3"
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(path))
    started: Deferred[None] = recorder.start()
    bus.publish(inference())
    await recorder.stop()
    await started
    assert stored(path)[0][3] == 1


class FailingFleet:
    """A fleet store that says it is up and fails every read (a proxy bug or a lost reply)."""

    up = True

    def add_usage(self, rows: Any, ttl: float) -> None:
        pass

    def usage_rows(self, since: int, until: int) -> Deferred[list[Any]]:
        return fail(ConnectionError("the store went away mid-read"))


@pytest_twisted.ensureDeferred
async def test_a_report_that_cannot_read_the_fleet_says_partial_and_logs_once(
    reactor: Any,
) -> None:
    """The fleet's read fails: this proxy's own minutes, ``"partial": ["fleet"]``, and one warning
    naming the error's type however many reports fail the same way."""
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=None, fleet=FailingFleet())
    bus.publish(inference())
    report = parse_report("1h", None, [], reactor.seconds())
    with Warnings() as warnings:
        first = await recorder.report(report)
        second = await recorder.report(report)
    await recorder.stop()
    assert first == second
    assert first["scope"] == "local" and first["partial"] == ["fleet"]
    assert [row["requests"] for row in first["rows"]] == [1]
    [warning] = warnings.events
    assert warning["source"] == "fleet" and warning["error"] == "ConnectionError"
    assert warning["log_format"] == (
        "a usage report left out the {source} ({error}); its answer says partial"
    )


@pytest_twisted.ensureDeferred
async def test_a_report_that_cannot_read_the_fleet_but_reads_the_database_says_partial(
    reactor: Any, tmp_path: Path
) -> None:
    """The fleet's read fails and the database answers: the local minutes, database included,
    with ``"partial": ["fleet"]`` all the same."""
    bus = EventBus(reactor)
    path = str(tmp_path / "u.sqlite3")
    recorder = UsageRecorder(reactor, bus, path=path, fleet=FailingFleet())
    await recorder.start()
    bus.publish(inference())
    await recorder.flush()
    bus.publish(inference())
    with Warnings():
        answer = await recorder.report(parse_report("1h", None, [], reactor.seconds()))
    await recorder.stop()
    assert answer["scope"] == "local" and answer["partial"] == ["fleet"]
    assert [r["requests"] for r in answer["rows"]] == [2]


@pytest_twisted.ensureDeferred
async def test_a_report_that_cannot_read_the_database_says_partial(
    reactor: Any, tmp_path: Path
) -> None:
    """The database's query fails (its table dropped under it): the minutes outside it are
    reported, with ``"partial": ["database"]``; a report that read everything has no ``partial``."""
    path = tmp_path / "u.sqlite3"
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(path))
    await recorder.start()
    bus.publish(inference())
    whole = await recorder.report(parse_report("1h", None, [], reactor.seconds()))
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE usage")
    with Warnings() as warnings:
        answer = await recorder.report(parse_report("1h", None, [], reactor.seconds()))
    recorder.buffer.unsaved.clear()  # nothing to write into the dropped table
    await recorder.stop()  # before any assertion: a failed one must not leave its thread running
    assert "partial" not in whole and [r["requests"] for r in whole["rows"]] == [1]
    assert answer["scope"] == "local" and answer["partial"] == ["database"]
    assert [r["requests"] for r in answer["rows"]] == [1]
    [warning] = warnings.events
    assert warning["source"] == "database" and warning["error"] == "OperationalError"


class RecordingFleet:
    """A fleet store double: what it was handed, and the peers' rows it answers with."""

    def __init__(self, rows: list[Any] | None = None) -> None:
        self.up = True
        self.added: list[tuple[list[Any], float]] = []
        self.rows = rows or []
        self.asked: list[tuple[int, int]] = []

    def add_usage(self, rows: Any, ttl: float) -> None:
        self.added.append((list(rows), ttl))

    def usage_rows(self, since: int, until: int) -> Deferred[list[Any]]:
        self.asked.append((since, until))
        return succeed(list(self.rows))


def fired(deferred: Deferred[Any]) -> Any:
    got: list[Any] = []
    deferred.addBoth(got.append)
    [result] = got
    return result


def test_a_flush_hands_the_unshared_minutes_to_the_fleet_with_the_retention_as_ttl() -> None:
    clock = Clock()
    bus = EventBus(clock)
    fleet = RecordingFleet()
    recorder = UsageRecorder(clock, bus, path=None, fleet=fleet, retention=7200.0)  # type: ignore[arg-type]
    bus.publish(inference())
    bus.publish(inference())
    [timer] = clock.getDelayedCalls()
    assert timer.getTime() == FLUSH_INTERVAL
    clock.advance(FLUSH_INTERVAL)
    assert fleet.added == [([(0, "team-a", "llama3", "n1", 2, 0, 6, 10, 0, 0, 2)], 7200.0)]
    assert clock.getDelayedCalls() == [] and recorder.buffer.unshared == {}
    assert sum(c[0] for c in recorder.buffer.memory.values()) == 2  # kept here too
    fired(recorder.flush())
    assert len(fleet.added) == 1  # nothing new: nothing handed


def test_a_fleet_report_adds_the_peers_rows_to_the_minutes_not_yet_shared() -> None:
    clock = Clock()
    bus = EventBus(clock)
    peer = (0, "team-b", "llama3", "n2", 4, 1, 0, 0, 4)
    fleet = RecordingFleet([peer])
    recorder = UsageRecorder(clock, bus, path=None, fleet=fleet)  # type: ignore[arg-type]
    bus.publish(inference())
    report = parse_report("1h", None, ["key"], clock.seconds() + 60)
    answer = fired(recorder.report(report))
    assert answer["scope"] == "fleet" and "partial" not in answer
    assert fleet.asked == [(report.since, report.until)] and report.since != report.until
    assert [(r["key"], r["requests"], r["errors"]) for r in answer["rows"]] == [
        ("team-a", 1, 0),
        ("team-b", 4, 1),
    ]
    fleet.up = False
    local = fired(recorder.report(report))
    assert local["scope"] == "local" and [r["key"] for r in local["rows"]] == ["team-a"]
    fired(recorder.stop())


def test_a_fleet_that_refuses_the_rows_never_fails_the_flush() -> None:
    clock = Clock()
    bus = EventBus(clock)
    fleet = RecordingFleet()

    said_rows: list[str] = []

    def refuse(rows: Any, ttl: float) -> None:
        said_rows.append(repr(rows))
        raise ConnectionError(said_rows[0])  # what a client's error might hold: the rows

    fleet.add_usage = refuse  # type: ignore[method-assign]
    recorder = UsageRecorder(clock, bus, path=None, fleet=fleet)  # type: ignore[arg-type]
    bus.publish(inference())
    with Warnings() as said:
        assert fired(recorder.flush()) is None
    [event] = said.events  # a warning with the error's type and stack: never the rows
    assert (event["log_format"], event["error_type"]) == (
        "usage could not be shared with the fleet: {error_type}",
        "ConnectionError",
    )
    assert "in refuse" in event["stack"] and said_rows and said_rows[0] not in repr(event)
    assert recorder.buffer.unshared == {} and len(recorder.buffer.memory) == 1


@pytest_twisted.ensureDeferred
async def test_minutes_counted_while_opening_arm_the_flush_timer_once_open(
    reactor: Any, tmp_path: Path
) -> None:
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(tmp_path / "u.sqlite3"))
    started = recorder.start()
    bus.publish(inference())
    assert recorder._flush_timer is not None  # armed while opening, as ever
    recorder._flush_timer.cancel()
    recorder._flush_timer = None
    await started
    timer = recorder._flush_timer  # the open armed it again, for what waited
    await recorder.stop()
    assert timer is not None and timer.getTime() > reactor.seconds() - 1


@pytest_twisted.ensureDeferred
async def test_the_hourly_prune_is_armed_at_the_open_and_disarmed_by_stop(
    reactor: Any, tmp_path: Path
) -> None:
    recorder = UsageRecorder(reactor, EventBus(reactor), path=str(tmp_path / "u.sqlite3"))
    await recorder.start()
    timer = recorder.storage._prune_timer
    armed = timer is not None and timer.active()
    when = timer.getTime() - reactor.seconds() if timer is not None else None
    await recorder.stop()  # before any assertion: a failed one must not leave its thread running
    assert armed and when is not None and abs(when - PRUNE_INTERVAL) < 5
    assert timer is not None and not timer.active() and recorder.storage._prune_timer is None


@pytest_twisted.ensureDeferred
async def test_only_request_records_count_and_nothing_after_stop(
    reactor: Any, tmp_path: Path
) -> None:
    """Another event naming a model is not a request; a record published after ``stop`` is not
    counted, and ``stop`` closed the database."""
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(tmp_path / "u.sqlite3"))
    await recorder.start()
    info = WorkloadInfo(
        1, "run", "ollama", "llama3", WorkloadState.COMPLETED, "n1", 0, 0, 0, None, 1
    )
    bus.publish(WorkloadCompleted(info))
    bus.publish(inference())
    await recorder.stop()
    bus.publish(inference())
    await recorder.stop()  # a second stop is harmless
    assert recorder.storage.db is None
    assert recorder.buffer.unsaved == {} and recorder.buffer.memory == {}
    assert [r[3] for r in stored(tmp_path / "u.sqlite3")] == [1]


class _NoWire(ProxyRequest):
    """A record whose wire object cannot be made: a consumer that asks for it fails."""

    def _build(self) -> dict[str, Any]:
        raise AssertionError("the usage recorder asked for the wire object")


def test_the_recorder_reads_the_typed_record_never_its_wire_object() -> None:
    """The recorder counts a typed ``ProxyRequest`` from its attributes (``model``, ``key``,
    ``node_id``, counts) without making its wire object."""
    clock = Clock()
    bus = EventBus(clock)
    recorder = UsageRecorder(clock, bus, path=None)  # type: ignore[arg-type]
    record = _NoWire(
        "r-1", "ollama", "n1", "POST", "/api/chat", 200, 40, 10, None, (), False, 0,
        key="team-a", model="llama3", prompt_tokens=3, completion_tokens=5,
    )  # fmt: skip
    bus.publish(record)
    [subscription] = bus.subscriptions
    assert subscription.dropped is None
    [(bucket, counts)] = recorder.buffer.memory.items()
    assert (bucket.key, bucket.model, bucket.node) == ("team-a", "llama3", "n1")
    assert counts == [1, 0, 3, 5, 0, 0, 1]
    recorder.stop()


def test_the_recorder_listens_to_the_bus_as_usage_until_stopped() -> None:
    clock = Clock()
    bus = EventBus(clock)
    recorder = UsageRecorder(clock, bus, path=None)  # type: ignore[arg-type]
    assert [s.name for s in bus.subscriptions] == ["usage"]
    fired(recorder.stop())
    assert bus.subscriptions == ()


def test_memory_keeps_the_minutes_of_its_window_and_forgets_older_ones() -> None:
    """With an hour's retention, a minute counted at minute 1000 keeps minute 940 (the window's
    first) and forgets minute 939; a minute later, 940 goes too."""
    buffer = UsageBuffer(3600.0)
    for minute in (939, 940, 999):
        buffer.keep(UsageKey(minute, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    buffer.keep(UsageKey(1000, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    assert sorted(b.minute for b in buffer.memory) == [940, 999, 1000]
    buffer.keep(UsageKey(1001, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    assert sorted(b.minute for b in buffer.memory) == [999, 1000, 1001]


def test_a_batch_moved_to_memory_counts_no_row_as_written() -> None:
    buffer = UsageBuffer(3600.0)
    buffer.hold(UsageKey(1000, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    batch = buffer.send()
    buffer.keep_in_flight()
    assert buffer.written(batch) == 0
    assert buffer.memory == {UsageKey(1000, "k", "m", "n"): [1, 0, 0, 0, 0, 0, 1]}
    buffer.hold(UsageKey(1000, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    buffer.hold(UsageKey(1000, "k2", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    batch = buffer.send()
    assert buffer.written(batch) == 2 and buffer.in_flight == []
