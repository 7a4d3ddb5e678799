# -*- test-case-name: tests.usage.test_storage -*-
"""The usage database's life (docs/behaviour.md §12.4): opening, in use, or given up for memory.

:class:`Storage` is where usage goes now; :data:`MOVES` is the table of what may move it, and
any other move is :class:`IllegalMove` (a bug in the recorder, never the database's fault). A
database that cannot be opened, read or written is said once, with the error's type; from then on
usage is kept in memory only and nothing is retried against the file. Every write, prune and close
runs on the database's own thread, queued one after the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorFromThreads
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.usage._buffer import UsageBuffer
from nvpair_tw.usage._database import UsageDatabase
from nvpair_tw.usage._minutes import MINUTE, Report

__all__ = ["MOVES", "PRUNE_INTERVAL", "IllegalMove", "Move", "Storage", "UsageStorage"]

log = LevelledLogger(namespace=__name__)

PRUNE_INTERVAL = 3600.0
"""Seconds between deletions of the minutes older than the retention (and once at start)."""

Stored = list[tuple[tuple[Any, ...], tuple[int, ...]]]


class Storage(Enum):
    """Where counted usage goes."""

    MEMORY = "memory"
    """Memory only: no database (``--usage-db none``), it failed, or it is closed."""
    OPENING = "opening"
    """Held until the database's open (and first prune) is done."""
    DATABASE = "database"
    """Written to the database in batches."""


class Move(Enum):
    """What happens to the database."""

    OPENED = "opened"
    FAILED = "failed"
    CLOSED = "closed"


MOVES: Mapping[tuple[Storage, Move], Storage] = {
    (Storage.OPENING, Move.OPENED): Storage.DATABASE,
    (Storage.OPENING, Move.FAILED): Storage.MEMORY,
    (Storage.DATABASE, Move.FAILED): Storage.MEMORY,
    (Storage.DATABASE, Move.CLOSED): Storage.MEMORY,
    (Storage.MEMORY, Move.FAILED): Storage.MEMORY,  # a late failure: already given up
}
"""(state, move) → the next state; a pair not here is :class:`IllegalMove`."""


class IllegalMove(RuntimeError):
    """A move :data:`MOVES` does not allow from the current state."""

    def __init__(self, state: Storage, move: Move) -> None:
        super().__init__(f"usage storage cannot handle {move.value!r} while {state.value!r}")
        self.state = state
        self.move = move


class UsageStorage:
    """The database at ``path`` (``None``: memory only) behind ``buffer``; ``on_open`` runs once
    it is open. ``warned`` says it failed (and was said so, once); ``written`` counts the rows
    written so far (upserts: a minute written twice counts twice)."""

    def __init__(
        self,
        reactor: IProxyReactor,
        path: str | None,
        buffer: UsageBuffer,
        on_open: Callable[[], None],
    ) -> None:
        self._reactor = reactor
        self.path = path
        self._buffer = buffer
        self._on_open = on_open
        self.state = Storage.MEMORY if path is None else Storage.OPENING
        self.warned = False
        self.written = 0
        self.db = None if path is None else UsageDatabase(cast(IReactorFromThreads, reactor), path)
        self._prune_timer: IDelayedCall | None = None
        self._opened: Deferred[None] | None = None
        self._open_settled = False
        self._waiters: list[Deferred[None]] = []
        self._writing: Deferred[None] = succeed(None)
        self._pruning = True

    def move(self, move: Move) -> Storage:
        """Take ``move`` (:data:`MOVES`); the state before it."""
        before = self.state
        after = MOVES.get((before, move))
        if after is None:
            raise IllegalMove(before, move)
        self.state = after
        return before

    def start(self) -> Deferred[None]:
        """Open the database (in its thread) and delete what is past the retention; fires when
        done, also when it failed (then usage is in memory)."""
        if self.db is None or self._opened is not None:
            return succeed(None)
        opened: Deferred[None] = self.db.open().addCallback(lambda _count: self._prune_db())
        self._opened = opened.addCallbacks(self._open_done, self.failed)
        self._opened.addBoth(self._settled)
        return self.when_open()

    def _settled(self, result: object) -> object:
        self._open_settled = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)
        return result

    def when_open(self) -> Deferred[None]:
        """A Deferred of its own that fires once the open is done (at once if it is, or was never
        asked for): the open's own chain is left to whoever started it."""
        if self._opened is None or self._open_settled:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def _open_done(self, _result: object) -> None:
        self.move(Move.OPENED)
        log.info("usage history in {path}", path=self.path)
        self._schedule_prune()
        self._on_open()

    def _schedule_prune(self) -> None:
        if self._pruning:
            self._prune_timer = self._reactor.callLater(PRUNE_INTERVAL, self._prune_hourly)

    def _prune_hourly(self) -> None:
        self._prune_timer = None
        if self.state is Storage.DATABASE:
            self._writing = self._writing.addCallback(lambda _: self._prune_db()).addErrback(
                self.failed
            )
            self._schedule_prune()

    def _prune_db(self) -> Deferred[None]:
        assert self.db is not None
        before = int((self._reactor.seconds() - self._buffer.retention) // MINUTE)
        return self.db.prune(before).addCallback(lambda _n: None)

    def write(self) -> Deferred[None]:
        """Write everything unsaved (when the database is in use); fires once written (or given
        up: then it is in memory)."""
        if self.state is not Storage.DATABASE or not self._buffer.unsaved:
            return self._writing
        assert self.db is not None
        batch = self._buffer.send()
        db = self.db

        def write(_: object) -> Deferred[None]:
            if self.state is not Storage.DATABASE:
                return succeed(None)  # failed meanwhile: the batch was moved to memory
            return db.write(batch)

        def written(_: object) -> None:
            self.written += self._buffer.written(batch)

        self._writing = self._writing.addCallback(write).addCallbacks(written, self.failed)
        return self._writing

    def failed(self, failure: Failure) -> None:
        """The database failed (at open, a write or a prune): say it once, keep usage in memory."""
        if self.move(Move.FAILED) is Storage.MEMORY:
            return
        self._buffer.keep_everything()
        self._stop_timer()
        if not self.warned:
            self.warned = True
            log.warn(
                "usage database {path} cannot be used ({error}: {why}); usage is kept in memory "
                "only (the last {hours} h) and is not saved",
                path=self.path,
                error=failure.type.__name__ if failure.type else "error",
                why=str(failure.value)[:200],
                hours=self._buffer.memory_hours,
            )
        if self.db is not None:
            self.db.close().addErrback(lambda _f: None)
            self.db = None

    def _stop_timer(self) -> None:
        if self._prune_timer is not None and self._prune_timer.active():
            self._prune_timer.cancel()
        self._prune_timer = None

    def stop_pruning(self) -> None:
        """No more hourly prunes (the recorder is stopping)."""
        self._pruning = False
        self._stop_timer()

    def close(self) -> Deferred[None]:
        """Close the database (what is still in flight is kept in memory)."""
        if self.db is None:
            return succeed(None)
        db, self.db = self.db, None
        if self.state is Storage.DATABASE:
            self.move(Move.CLOSED)
            self._buffer.keep_in_flight()
        return db.close().addErrback(lambda _f: None)

    def query(self, report: Report) -> Deferred[Stored] | None:
        """The database's minutes for ``report`` (queued behind the writes so far), or ``None``
        while it is not in use."""
        if self.state is not Storage.DATABASE or self.db is None:
            return None
        return self.db.query(report)
