"""Tests for nvpair_tw.usage._storage: the table of the usage database's states, the one error
for a move the table does not allow, and the storage's life over a real SQLite file (tmp_path)
with its thread's answers run on a ``Clock``'s thread: the hourly prune, a second start, a
failure (said once, the database closed), close and queries."""

from __future__ import annotations

import gc
import queue
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import provider

from nvpair_tw.usage._buffer import UsageBuffer
from nvpair_tw.usage._database import UsageDatabase
from nvpair_tw.usage._minutes import MINUTE, Row, UsageKey, parse_report
from nvpair_tw.usage._storage import (
    MOVES,
    PRUNE_INTERVAL,
    IllegalMove,
    Move,
    Storage,
    UsageStorage,
)


def storage(path: str | None) -> UsageStorage:
    return UsageStorage(Clock(), path, UsageBuffer(3600.0), lambda: None)  # type: ignore[arg-type]


def test_a_recorder_without_a_database_starts_in_memory_and_one_with_a_path_opening() -> None:
    assert storage(None).state is Storage.MEMORY
    assert storage("/nonexistent/never-opened").state is Storage.OPENING


@pytest.mark.parametrize("state", list(Storage))
@pytest.mark.parametrize("move", list(Move))
def test_every_move_follows_the_table_or_is_the_one_illegal_move_error(
    state: Storage, move: Move
) -> None:
    """A move in the table gives its state and returns the one before; any other raises
    IllegalMove naming both, and leaves the state as it was."""
    held = storage(None)
    held.state = state
    if (state, move) in MOVES:
        assert held.move(move) is state
        assert held.state is MOVES[(state, move)]
    else:
        with pytest.raises(IllegalMove) as raised:
            held.move(move)
        assert (raised.value.state, raised.value.move) == (state, move)
        assert repr(move.value) in str(raised.value) and repr(state.value) in str(raised.value)
        assert held.state is state


def test_the_table_only_ever_gives_up_the_database_for_memory() -> None:
    """Once in memory, usage never goes back to a database (nothing is retried, §12.4)."""
    assert {after for (before, _), after in MOVES.items() if before is Storage.MEMORY} == {
        Storage.MEMORY
    }
    assert MOVES[(Storage.OPENING, Move.OPENED)] is Storage.DATABASE
    assert (Storage.OPENING, Move.CLOSED) not in MOVES
    assert (Storage.DATABASE, Move.OPENED) not in MOVES


class ThreadedClock(Clock):
    """A ``Clock`` for timers, and ``callFromThread`` for the database's thread: what the thread
    hands back waits in a queue until :meth:`settle` runs it on the test's own thread."""

    def __init__(self) -> None:
        super().__init__()
        self._from_threads: queue.SimpleQueue[tuple[Callable[..., Any], Any, Any]] = (
            queue.SimpleQueue()
        )
        self.databases: list[UsageDatabase] = []

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._from_threads.put((f, args, kwargs))

    def storage(
        self, path: Path, buffer: UsageBuffer, on_open: Callable[[], None] = lambda: None
    ) -> UsageStorage:
        """A storage of ``path`` on this clock; its thread is stopped at the test's end."""
        made = UsageStorage(self, str(path), buffer, on_open)  # type: ignore[arg-type]
        assert made.db is not None
        self.databases.append(made.db)
        return made

    def settle(self, deferred: Deferred[Any]) -> Any:
        """Run what the thread hands back until ``deferred`` has fired; its result."""
        got: list[Any] = []
        deferred.addBoth(got.append)
        while not got:
            f, args, kwargs = self._from_threads.get(timeout=30)
            f(*args, **kwargs)
        [result] = got
        if isinstance(result, Failure):
            result.raiseException()
        return result


@pytest.fixture
def clock() -> Iterator[ThreadedClock]:
    """A :class:`ThreadedClock`; the threads of its databases are stopped after the test (a
    failed one may leave them running)."""
    made = ThreadedClock()
    yield made
    for database in made.databases:
        if database._pool.started:
            database._pool.stop()


NOW = 10_000 * MINUTE
"""The clocks' time in these tests: minute 10,000 (so a retention of an hour reaches back)."""


def opened(clock: ThreadedClock, path: Path, buffer: UsageBuffer) -> UsageStorage:
    clock.advance(NOW)
    held = clock.storage(path, buffer)
    clock.settle(held.start())
    assert held.state is Storage.DATABASE
    return held


def closed(clock: ThreadedClock, held: UsageStorage) -> None:
    held.stop_pruning()
    clock.settle(held.close())


def minutes(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [m for (m,) in db.execute("SELECT minute FROM usage ORDER BY minute")]


def row(minute: int) -> Row:
    return (minute, "k", "m", "n", 1, 0, 0, 0, 0, 0, 1)


def test_the_hourly_prune_deletes_the_minutes_past_the_retention_and_is_armed_again(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    """An hour after the open, the minutes older than the retention (an hour here) go, the
    minute at the boundary stays, and the next prune is an hour later."""
    path = tmp_path / "u.sqlite3"
    held = opened(clock, path, UsageBuffer(3600.0))
    [timer] = clock.getDelayedCalls()
    assert timer.getTime() == NOW + PRUNE_INTERVAL
    now = int(NOW // MINUTE)
    assert held.db is not None
    clock.settle(held.db.write([row(now - 1), row(now), row(now + 1)]))
    clock.advance(PRUNE_INTERVAL - 1)
    assert minutes(path) == [now - 1, now, now + 1]
    clock.advance(1)
    assert clock.settle(held.write()) is None  # queued behind the prune
    assert minutes(path) == [now, now + 1]
    [timer] = clock.getDelayedCalls()
    assert timer.getTime() == NOW + 2 * PRUNE_INTERVAL
    assert held.state is Storage.DATABASE and not held.warned
    closed(clock, held)
    assert clock.getDelayedCalls() == []


def test_a_prune_due_after_the_close_does_nothing_and_is_not_armed_again(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    path = tmp_path / "u.sqlite3"
    held = opened(clock, path, UsageBuffer(3600.0))
    clock.settle(held.close())  # without stop_pruning: the timer is still armed
    assert held.state is Storage.MEMORY
    clock.advance(PRUNE_INTERVAL)
    assert clock.getDelayedCalls() == []
    held.stop_pruning()
    assert held.state is Storage.MEMORY and not held.warned


def test_a_prune_that_fails_gives_the_database_up_and_disarms_the_prune(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    path = tmp_path / "u.sqlite3"
    held = opened(clock, path, UsageBuffer(3600.0))
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE usage")
    clock.advance(PRUNE_INTERVAL)
    clock.settle(held.write())
    assert held.state is Storage.MEMORY and held.warned and held.db is None
    assert clock.getDelayedCalls() == []


def test_a_second_start_opens_nothing_again(clock: ThreadedClock, tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite3"
    clock.advance(NOW)
    opens: list[int] = []
    held = clock.storage(path, UsageBuffer(3600.0), lambda: opens.append(1))
    first = held.start()
    second = held.start()
    clock.settle(first)
    assert clock.settle(second) is None and clock.settle(held.start()) is None
    assert opens == [1] and held.state is Storage.DATABASE
    assert len(clock.getDelayedCalls()) == 1  # one prune timer
    closed(clock, held)


def test_start_and_when_open_without_a_database_fire_at_once() -> None:
    clock = ThreadedClock()
    held = UsageStorage(clock, None, UsageBuffer(3600.0), lambda: None)  # type: ignore[arg-type]
    assert fired(held.when_open()) and fired(held.start()) and fired(held.when_open())
    assert held.state is Storage.MEMORY and clock.getDelayedCalls() == []


def test_when_open_waits_for_the_open_and_each_waiter_gets_none(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    """Every waiter fires once the open is done, with ``None`` (not the open's own result)."""
    clock.advance(NOW)
    held = clock.storage(tmp_path / "u.sqlite3", UsageBuffer(3600.0))
    assert fired(held.when_open())  # never asked to open: at once
    started = held.start()
    assert held.query(parse_report("1h", None, [], NOW)) is None  # not open yet
    waiters = [held.when_open(), held.when_open()]
    assert not any(fired(w) for w in waiters)
    clock.settle(started)
    assert [fired_with(w) for w in waiters] == [[None], [None]]
    assert fired_with(held.when_open()) == [None]  # done: at once
    closed(clock, held)


def fired_with(deferred: Deferred[Any]) -> list[Any]:
    got: list[Any] = []
    deferred.addBoth(got.append)
    return got


def fired(deferred: Deferred[Any]) -> bool:
    return fired_with(deferred) == [None]


class Warnings:
    """Captures the storage log's warnings (or events of ``level``) while installed, and any
    unhandled error in a Deferred (``errors``)."""

    def __init__(self, level: str = "warn") -> None:
        self.events: list[LogEvent] = []
        self.errors: list[LogEvent] = []

        @provider(ILogObserver)
        def observe(event: LogEvent) -> None:
            if event.get("log_namespace") == "nvpair_tw.usage._storage" and (
                event["log_level"].name == level
            ):
                self.events.append(event)
            elif "Unhandled error in Deferred" in str(event.get("log_format")):
                self.errors.append(event)

        self._observer = observe

    def __enter__(self) -> Warnings:
        globalLogPublisher.addObserver(self._observer)
        return self

    def __exit__(self, *_: object) -> None:
        globalLogPublisher.removeObserver(self._observer)


def test_a_failure_is_said_once_and_the_database_is_closed_and_let_go(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    """The warning names the path, the error's type, its text cut at 200 characters and the
    memory window's hours; the database is closed (its thread stopped) and nothing uses it."""
    path = tmp_path / "u.sqlite3"
    held = opened(clock, path, UsageBuffer(7 * 3600.0))
    db = held.db
    assert db is not None
    closing: list[Deferred[None]] = []
    close = db.close

    def spied() -> Deferred[None]:
        closing.append(close())
        return closing[-1]

    db.close = spied  # type: ignore[method-assign]
    with Warnings() as warnings:
        held.failed(Failure(ValueError("x" * 300)))
        held.failed(Failure(KeyError("again")))
    assert held.state is Storage.MEMORY and held.warned and held.db is None
    [warning] = warnings.events
    assert (warning["path"], warning["error"], warning["hours"]) == (str(path), "ValueError", 7)
    assert warning["why"] == "x" * 200
    assert warning["log_format"] == (
        "usage database {path} cannot be used ({error}: {why}); usage is kept in memory "
        "only (the last {hours} h) and is not saved"
    )
    [closed_db] = closing
    clock.settle(closed_db)
    assert not db._pool.started
    assert clock.getDelayedCalls() == []  # the prune is disarmed
    assert held.query(parse_report("1h", None, [], NOW)) is None
    assert fired(held.close())


def test_a_write_keeps_unsaved_minutes_and_counts_the_rows_written(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    path = tmp_path / "u.sqlite3"
    buffer = UsageBuffer(3600.0)
    held = opened(clock, path, buffer)
    now = int(NOW // MINUTE)
    buffer.hold(UsageKey(now, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    buffer.hold(UsageKey(now, "k2", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    clock.settle(held.write())
    clock.settle(held.write())  # nothing unsaved: nothing written again
    assert held.written == 2 and buffer.in_flight == [] and buffer.unsaved == {}
    buffer.hold(UsageKey(now, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    clock.settle(held.write())
    assert held.written == 3
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT key, requests FROM usage ORDER BY key").fetchall() == [
            ("k", 2),
            ("k2", 1),
        ]
    closed(clock, held)


def test_batches_queued_behind_a_failed_write_go_to_memory_once(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    """The first batch fails (its table dropped): it and the batch queued behind it are counted
    in memory once each, neither is counted as written, and nothing waits for the thread."""
    path = tmp_path / "u.sqlite3"
    buffer = UsageBuffer(3600.0)
    held = opened(clock, path, buffer)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE usage")
    now = int(NOW // MINUTE)
    buffer.hold(UsageKey(now, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    held.write()
    buffer.hold(UsageKey(now, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    with Warnings() as warnings:
        clock.settle(held.write())
    assert held.state is Storage.MEMORY and len(warnings.events) == 1
    assert held.written == 0 and buffer.in_flight == [] and buffer.unsaved == {}
    assert buffer.memory == {UsageKey(now, "k", "m", "n"): [2, 0, 0, 0, 0, 0, 2]}
    buffer.hold(UsageKey(now, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    assert fired(held.write())  # given up: nothing is sent
    assert buffer.in_flight == []


def test_close_keeps_a_batch_in_flight_in_memory_and_stops_queries(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    path = tmp_path / "u.sqlite3"
    buffer = UsageBuffer(3600.0)
    held = opened(clock, path, buffer)
    report = parse_report("1h", None, [], NOW + MINUTE)
    asked = held.query(report)
    assert asked is not None and clock.settle(asked) == []
    now = int(NOW // MINUTE)
    buffer.hold(UsageKey(now, "k", "m", "n"), [1, 0, 0, 0, 0, 0, 1])
    writing = held.write()
    closing = held.close()
    assert held.state is Storage.MEMORY and held.db is None and buffer.in_flight == []
    assert buffer.memory == {UsageKey(now, "k", "m", "n"): [1, 0, 0, 0, 0, 0, 1]}
    assert held.query(report) is None
    clock.settle(writing)
    clock.settle(closing)
    assert held.written == 0 and minutes(path) == [now]
    held.stop_pruning()


def test_the_open_is_said_once_with_the_path(clock: ThreadedClock, tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite3"
    with Warnings("info") as said:
        held = opened(clock, path, UsageBuffer(3600.0))
    [event] = said.events
    assert (event["log_format"], event["path"]) == ("usage history in {path}", str(path))
    closed(clock, held)


def test_pruning_stopped_while_opening_arms_no_prune_at_the_open(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    """The recorder stops before the open is done: the open still prunes once, and arms nothing."""
    clock.advance(NOW)
    held = clock.storage(tmp_path / "u.sqlite3", UsageBuffer(3600.0))
    started = held.start()
    held.stop_pruning()
    clock.settle(started)
    assert held.state is Storage.DATABASE and clock.getDelayedCalls() == []
    clock.settle(held.close())


def failing_close(held: UsageStorage) -> None:
    """The database's close fails (its real thread is still stopped by the fixture)."""
    assert held.db is not None
    held.db.close = lambda: fail(sqlite3.OperationalError("disk gone"))  # type: ignore[method-assign]


def test_a_close_that_fails_is_swallowed(clock: ThreadedClock, tmp_path: Path) -> None:
    """Closing is the last thing done: its failure is neither the caller's nor left unhandled."""
    held = opened(clock, tmp_path / "u.sqlite3", UsageBuffer(3600.0))
    held.stop_pruning()
    failing_close(held)
    with Warnings() as said:
        assert fired(held.close())
        gc.collect()
    assert said.errors == [] and held.state is Storage.MEMORY


def test_a_failed_database_whose_close_fails_too_is_said_once(
    clock: ThreadedClock, tmp_path: Path
) -> None:
    held = opened(clock, tmp_path / "u.sqlite3", UsageBuffer(3600.0))
    failing_close(held)
    with Warnings() as said:
        held.failed(Failure(sqlite3.OperationalError("disk I/O error")))
        gc.collect()
    assert said.errors == [] and len(said.events) == 1 and held.db is None
