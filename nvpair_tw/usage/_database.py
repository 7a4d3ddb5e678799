# -*- test-case-name: tests.usage.test_recorder -*-
"""The usage database (docs/behaviour.md §12.4): one SQLite file, written and read on one thread of
its own, never on the reactor thread.

Every call returns a Deferred that fires on the reactor thread; the work runs, in call order, on a
one-thread pool (so SQLite never sees two writers and a report queued after a write sees it). Any
error (a corrupt file, a path that cannot be opened, a full disk) arrives as a failed Deferred:
the caller decides what that means.

The file holds ``meta`` (``schema_version``) and ``usage``: one row per (minute, key, model,
node) with the counts of :data:`~nvpair_tw.usage._minutes.COUNTS`, and nothing else. A file of
an older schema is brought to this one when opened, in the same transaction that reads its
version (:data:`MIGRATIONS`); a newer one is refused (:class:`SchemaError`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from nvpair_tw.usage._minutes import COUNTS, Report, Row

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SchemaError", "UsageDatabase"]

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    minute INTEGER NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    node TEXT NOT NULL,
    requests INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    unknown_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    unknown_cached INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, key, model, node)
) WITHOUT ROWID;
"""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE usage ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE usage ADD COLUMN unknown_cached INTEGER NOT NULL DEFAULT 0",
        # no cached count was kept then: every request of those minutes is unknown
        "UPDATE usage SET unknown_cached = requests",
    ),
}
"""From each older schema version to the next: the statements that bring a file up."""

_UPSERT = """
INSERT INTO usage (minute, key, model, node, requests, errors, prompt_tokens, completion_tokens,
                   unknown_tokens, cached_tokens, unknown_cached)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, key, model, node) DO UPDATE SET
    requests = requests + excluded.requests,
    errors = errors + excluded.errors,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    unknown_tokens = unknown_tokens + excluded.unknown_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    unknown_cached = unknown_cached + excluded.unknown_cached
"""

_COLUMN = {
    "key": "key",
    "model": "model",
    "node": "node",
    "minute": "minute",
    "hour": "minute - minute % 60",
    "day": "minute - minute % 1440",
}

T = TypeVar("T")


class SchemaError(Exception):
    """The file was written by a newer nvpair-tw (its ``schema_version`` is unknown here)."""


class UsageDatabase:
    """One SQLite file behind one thread; :meth:`open` first, :meth:`close` last."""

    def __init__(self, reactor: IReactorFromThreads, path: str) -> None:
        self._reactor = reactor
        self.path = path
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="nvpair-usage")
        self._db: sqlite3.Connection | None = None

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> Deferred[T]:
        def in_thread() -> T:
            if self._db is None:
                raise sqlite3.OperationalError("the usage database is not open")
            return work(self._db)

        return deferToThreadPool(self._reactor, self._pool, in_thread)

    def open(self) -> Deferred[int]:
        """Open (creating it if need be) and check the schema; fires with the rows it holds."""
        self._pool.start()

        def opening() -> int:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            try:
                version = _prepare(db)
            except BaseException:
                db.close()
                raise
            if version > SCHEMA_VERSION:
                db.close()
                raise SchemaError(
                    f"schema version {version}, this nvpair-tw knows {SCHEMA_VERSION}"
                )
            self._db = db
            (count,) = db.execute("SELECT count(*) FROM usage").fetchone()
            return int(count)

        return deferToThreadPool(self._reactor, self._pool, opening)

    def write(self, rows: Sequence[Row]) -> Deferred[None]:
        """Add ``rows`` to what the file holds (one transaction)."""

        def writing(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.executemany(_UPSERT, rows)

        return self._run(writing)

    def prune(self, before: int) -> Deferred[int]:
        """Delete every minute before ``before``; fires with how many rows went."""

        def pruning(db: sqlite3.Connection) -> int:
            with _transaction(db):
                return db.execute("DELETE FROM usage WHERE minute < ?", (before,)).rowcount

        return self._run(pruning)

    def query(self, report: Report) -> Deferred[list[tuple[tuple[Any, ...], tuple[int, ...]]]]:
        """The report's groups as (columns, counts), summed by SQLite."""
        columns = [_COLUMN[name] for name in report.by]
        select = ", ".join([*columns, *(f"sum({c})" for c in COUNTS)])
        sql = f"SELECT {select} FROM usage WHERE minute BETWEEN ? AND ?"
        if columns:
            sql += " GROUP BY " + ", ".join(str(i + 1) for i in range(len(columns)))
        width = len(columns)

        def querying(db: sqlite3.Connection) -> list[tuple[tuple[Any, ...], tuple[int, ...]]]:
            found = db.execute(sql, (report.since, report.until)).fetchall()
            return [
                (tuple(row[:width]), tuple(int(n or 0) for n in row[width:]))
                for row in found
                if row[width] is not None  # totals over no rows: sum() is NULL
            ]

        return self._run(querying)

    def close(self) -> Deferred[None]:
        """Close the file, then stop the thread (it is idle by then: nothing is left to wait for)."""
        if not self._pool.started:
            return succeed(None)  # never opened

        def closing() -> None:
            db, self._db = self._db, None
            if db is not None:
                db.close()

        closed = deferToThreadPool(self._reactor, self._pool, closing)
        closed.addBoth(self._stopped)
        return closed

    def _stopped(self, result: Any) -> Any:
        self._pool.stop()
        return result


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an error) on an autocommit connection."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _prepare(db: sqlite3.Connection) -> int:
    """WAL (a report never blocks the writer), the schema, its version, an older one brought up
    to this one (:data:`MIGRATIONS`); the version found, or reached."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    with _transaction(db):
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        found = db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        if found is None:
            db.execute(
                "INSERT INTO meta (name, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            return SCHEMA_VERSION
        try:
            version = int(found[0])
        except ValueError:
            raise SchemaError(f"schema version {found[0]!r} is not a number") from None
        return _migrated(db, version)


def _migrated(db: sqlite3.Connection, version: int) -> int:
    """The file of schema ``version`` brought up to :data:`SCHEMA_VERSION` (in the caller's
    transaction); the version it is at (a newer one is left as it is, for the caller to refuse)."""
    found = version
    while version in MIGRATIONS:
        for statement in MIGRATIONS[version]:
            db.execute(statement)
        version += 1
    if version != found:
        db.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(version),))
    return version
