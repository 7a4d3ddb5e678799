# -*- test-case-name: tests.fleet.test_writer -*-
"""The fleet store's bounded, batched, fire-and-forget writer (docs/behaviour.md §6.6).

The request path never waits on the store: a write is queued (at most :data:`MAX_PENDING_WRITES`;
beyond, the oldest is dropped and counted) and the writes made within :data:`WRITE_BATCH` go out
as one script call and one published message. A store refusing a batch is said once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.fleet._config import StateConfig
from nvpair_tw.fleet._wire import WRITE_SCRIPT, Codec, Command, Op
from nvpair_tw.logs import LevelledLogger

__all__ = ["MAX_IN_FLIGHT_BATCHES", "MAX_PENDING_WRITES", "WRITE_BATCH", "BatchedWriter"]

log = LevelledLogger(namespace=__name__)
"""The fleet store's log lines keep one namespace, whichever of its modules emits them."""

MAX_PENDING_WRITES = 1024
MAX_IN_FLIGHT_BATCHES = 16
WRITE_BATCH = 0.005
"""Seconds: writes made within this window go to the store as one script call (one round trip),
and their notifications as one published message."""


class BatchedWriter:
    """Writes to the store over the command connection ``connection()`` gives (None while the
    store is away): ``dropped`` counts the writes lost to the bound, ``write_refused`` says the
    store refused a batch since it was last (re)connected."""

    def __init__(
        self,
        reactor: IProxyReactor,
        config: StateConfig,
        codec: Codec,
        connection: Callable[[], Any],
    ) -> None:
        self._reactor = reactor
        self._config = config
        self._codec = codec
        self._connection = connection
        self.dropped = 0
        self.write_refused = False
        self._in_flight = 0
        self._queue: deque[Command] = deque(maxlen=MAX_PENDING_WRITES)
        self._batch: IDelayedCall | None = None

    def write(self, command: Command) -> None:
        """Fire and forget: queue (bounded; the oldest is dropped when full) and send with the
        next batch, or when the store is back."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(command)
        if self._connection() is not None and self._batch is None:
            self._batch = self._reactor.callLater(WRITE_BATCH, self.flush)

    def connected(self) -> None:
        """The store is (back) up: a refusal would be news again; send what is queued."""
        self.write_refused = False
        self.flush()

    def disconnected(self) -> None:
        """The store is away: nothing is in flight any more, the next batch waits for it."""
        self._in_flight = 0
        self.stop()

    def stop(self) -> None:
        if self._batch is not None and self._batch.active():
            self._batch.cancel()
        self._batch = None

    def flush(self) -> None:
        """Send every queued write as one script call and one published message (a flush called
        directly, on reconnect or at shutdown, takes the pending batch with it: its timer goes)."""
        self.stop()
        conn = self._connection()
        if conn is None or not self._queue:
            return
        if self._in_flight >= MAX_IN_FLIGHT_BATCHES:
            self.dropped += len(self._queue)
            self._queue.clear()
            return
        keys, args = self._codec.script_args(self._drain())
        if not args:
            return
        try:
            sent: Deferred[Any] = conn.eval(WRITE_SCRIPT, keys, args)
        except Exception:  # the client failed to send it: the batch is dropped, and counted
            self.dropped += len(keys) or 1
            log.bug("fleet store: a batch could not be sent", Failure())
            return
        self._in_flight += 1
        sent.addBoth(self._written)

    def _drain(self) -> list[Op]:
        ops: list[Op] = []
        while self._queue:
            try:
                ops += self._queue.popleft()()
            except Exception:  # a write's own bug: logged, and it does not stop the others
                self.dropped += 1
                log.bug("fleet store: a write could not be made", Failure())
        return ops

    def _written(self, result: object) -> None:
        self._in_flight = max(0, self._in_flight - 1)
        error = result.value if isinstance(result, Failure) else result
        if not isinstance(error, BaseException):
            return
        if type(error).__name__ != "ResponseError" or self.write_refused:
            # A lost connection is the session's business (one warning there).
            log.debug("fleet store write failed: {error}", error=type(error).__name__)
            return
        # The store refused the batch itself (scripting disabled, out of memory, read-only
        # replica): say so once; the proxy keeps working on local state.
        self.write_refused = True
        log.warn(
            "fleet store {store} refused a write ({error}); nothing is shared until it accepts "
            "writes again",
            store=str(self._config),
            error=self._config.redact(str(error))[:200],
        )
