"""Tests for nvpair_tw.usage._recorder and ._database over real SQLite files (tmp_path) on the
running reactor: batched writes on the database's thread, restarts, retention, degradation to
memory, and what the file holds (never a body)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from zope.interface import provider

from nvpair_tw.events import PROXY_REQUEST, EventBus
from nvpair_tw.usage._database import SCHEMA_VERSION
from nvpair_tw.usage._minutes import parse_report
from nvpair_tw.usage._recorder import FLUSH_INTERVAL, UsageRecorder

pytestmark = pytest.mark.timeout(60)


def inference(**fields: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": "llama3",
        "key": "team-a",
        "node_id": "n1",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 5,
    }
    payload.update(fields)
    return payload


class Warnings:
    """Captures the usage log's warnings while installed."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []

        @provider(ILogObserver)
        def observe(event: LogEvent) -> None:
            if (
                event.get("log_namespace") == "nvpair_tw.usage._recorder"
                and event["log_level"].name == "warn"
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
            "completion_tokens, unknown_tokens FROM usage ORDER BY key"
        ).fetchall()


@pytest_twisted.ensureDeferred
async def test_minutes_are_written_in_one_batch_and_survive_a_restart(
    reactor: Any, tmp_path: Path
) -> None:
    """A second recorder on the same file sees the first's minutes, and adds to them (upsert)."""
    path = tmp_path / "usage.sqlite3"
    first = UsageRecorder(reactor, EventBus(reactor), path=str(path))
    await first.start()
    assert first.state == "database"
    bus = EventBus(reactor)
    second_bus = bus
    first_bus = first._subscription._bus  # type: ignore[union-attr]
    for _ in range(3):
        first_bus.publish(PROXY_REQUEST, inference())
    first_bus.publish(
        PROXY_REQUEST, inference(status=502, prompt_tokens=None, completion_tokens=None)
    )
    first_bus.publish(PROXY_REQUEST, {"status": 200, "path": "/api/tags"})  # not an inference
    await first.stop()
    assert stored(path) == [("team-a", "llama3", "n1", 4, 1, 9, 15, 1)]

    second = UsageRecorder(reactor, second_bus, path=str(path))
    await second.start()
    bus.publish(PROXY_REQUEST, inference(key=None))
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
async def test_a_report_counts_unsaved_and_in_flight_minutes_once(
    reactor: Any, tmp_path: Path
) -> None:
    """Rows handed to the thread but not yet written, and rows not yet handed, are in the report."""
    bus = EventBus(reactor)
    recorder = UsageRecorder(reactor, bus, path=str(tmp_path / "u.sqlite3"))
    await recorder.start()
    bus.publish(PROXY_REQUEST, inference())
    await recorder.flush()
    bus.publish(PROXY_REQUEST, inference())
    writing = recorder.flush()  # in flight now
    bus.publish(PROXY_REQUEST, inference())  # unsaved
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
    first._unsaved.clear()
    old = (now_minute - 200, "k", "m", "n", 1, 0, 0, 0, 0)
    new = (now_minute - 10, "k", "m", "n", 1, 0, 0, 0, 0)
    await first._db.write([old, new])  # type: ignore[union-attr]
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
        bus.publish(PROXY_REQUEST, inference())  # while opening
        await recorder.start()
        for _ in range(3):
            bus.publish(PROXY_REQUEST, inference())
            await recorder.flush()
        [row] = await totals(recorder, reactor)
        await recorder.stop()
    assert recorder.state == "memory" and recorder.warned
    assert row["requests"] == 4
    assert len(warnings.events) == 1
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
        bus.publish(PROXY_REQUEST, inference())
        await recorder.flush()
        bus.publish(PROXY_REQUEST, inference())
        await recorder.flush()
    assert recorder.state == "memory" and len(warnings.events) == 1
    [row] = await totals(recorder, reactor)
    assert row["requests"] == 2
    await recorder.stop()


def test_without_a_database_or_fleet_no_timer_is_ever_armed() -> None:
    """Memory-only usage costs the request path one dict update and schedules nothing."""
    clock = Clock()
    bus = EventBus(clock)
    recorder = UsageRecorder(clock, bus, path=None)  # type: ignore[arg-type]
    bus.publish(PROXY_REQUEST, inference())
    assert clock.getDelayedCalls() == []
    assert sum(c[0] for c in recorder._memory.values()) == 1
    clock.advance(2 * 86400)
    bus.publish(PROXY_REQUEST, inference())  # a day later: the old minute is forgotten
    assert len(recorder._memory) == 1
    recorder.stop()


def test_the_flush_timer_is_armed_only_while_something_is_unsaved() -> None:
    """Before the database opens, records wait in memory and a flush timer is armed once."""
    clock = Clock()
    bus = EventBus(clock)
    recorder = UsageRecorder(clock, bus, path="/nonexistent/never-opened")  # type: ignore[arg-type]
    bus.publish(PROXY_REQUEST, inference())
    bus.publish(PROXY_REQUEST, inference())
    [timer] = clock.getDelayedCalls()
    assert timer.getTime() == FLUSH_INTERVAL
    clock.advance(FLUSH_INTERVAL)  # still opening: nothing to write to, kept
    assert clock.getDelayedCalls() == [] and recorder._unsaved


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
        bus.publish(PROXY_REQUEST, inference(key=f"k{i % 500}", node_id=f"n{i // 500}"))
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
    bus.publish(PROXY_REQUEST, inference())
    await recorder.stop()
    await started
    assert stored(path)[0][3] == 1
