# -*- test-case-name: tests.fleet.test_store -*-
"""The life of the connections to the fleet store (docs/behaviour.md §6.6): connect, authenticate, select the
database, subscribe, ping, and reconnect with a capped backoff when the store goes away.

One command connection and one pub/sub connection, through ``txredisapi``'s protocols dialled on
the injected reactor. The store going away is one warning; coming back is one line. What is shared
over the session is its owner's business, told through the hooks of :class:`Session`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor, abort
from nvpair_tw.fleet._config import StateConfig
from nvpair_tw.fleet._wire import text
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "BACKOFF_CAP",
    "BACKOFF_FIRST",
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "HEARTBEAT",
    "SCAN_COUNT",
    "Dialer",
    "Session",
    "SessionHooks",
    "next_backoff",
    "read_all",
]

log = LevelledLogger(namespace=__name__)
"""The fleet store's log lines keep one namespace, whichever of its modules emits them."""

BACKOFF_FIRST = 0.1
BACKOFF_CAP = 2.0
"""Seconds: reconnect delays double from :data:`BACKOFF_FIRST` up to this."""
CONNECT_TIMEOUT = 2.0
COMMAND_TIMEOUT = 2.0
HEARTBEAT = 1.0
"""Seconds between liveness pings (and reservation refreshes)."""
SCAN_COUNT = 500


def next_backoff(delay: float) -> float:
    """The reconnect delay after ``delay``: doubled, capped at :data:`BACKOFF_CAP`."""
    return min(BACKOFF_CAP, delay * 2)


@functools.cache
def _protocols() -> tuple[type[Any], type[Any]]:
    """txredisapi's command protocol and a subscriber that hands messages on.

    Imported on first use, not with this module: txredisapi imports the global reactor, which
    must not be installed by merely parsing options (``twistd --reactor`` chooses it later).
    """
    import txredisapi  # type: ignore[import-untyped]

    class Subscriber(txredisapi.SubscriberProtocol):  # type: ignore[misc]
        on_message: Callable[[bytes | str], None] = staticmethod(lambda _m: None)  # type: ignore[assignment]

        def messageReceived(self, pattern: Any, channel: Any, message: Any) -> None:
            self.on_message(message)

    return txredisapi.RedisProtocol, Subscriber


class _Quiet(Factory):
    """What txredisapi's protocol asks of its factory (we authenticate ourselves)."""

    isLazy = False

    def stopTrying(self) -> None:
        pass

    def connectionError(self, _message: str) -> None:
        pass


def _close(conns: tuple[Any, ...], how: Callable[[Any], object]) -> None:
    for conn in conns:
        if conn is not None and conn.transport is not None:
            how(conn)


def _cancel(*timers: IDelayedCall | None) -> None:
    for timer in timers:
        if timer is not None and timer.active():
            timer.cancel()


class SessionHooks(Protocol):
    """What a :class:`Session` tells its owner."""

    def on_message(self, raw: bytes | str) -> None:
        """A message published on the store's channel."""

    def resync(self, cmd: Any) -> Awaitable[None]:
        """Subscribed: read the store (through ``cmd``) before the session counts as up."""

    def on_up(self) -> None:
        """Connected, subscribed and resynchronised."""

    def on_beat(self) -> None:
        """Every :data:`HEARTBEAT` while up."""

    def on_down(self, lost: bool) -> None:
        """The connections were dropped; ``lost``: a running session that was up."""


class Dialer:
    """Opens one authenticated connection to the store and awaits its commands, each bounded."""

    def __init__(self, reactor: IProxyReactor, config: StateConfig) -> None:
        self._reactor = reactor
        self.config = config

    async def dial(self, protocol: Any) -> Any:
        protocol.factory = _Quiet()
        endpoint = HostnameEndpoint(
            self._reactor, self.config.host, self.config.port, timeout=CONNECT_TIMEOUT
        )
        connected = await connectProtocol(endpoint, protocol)
        if self.config.password is not None:
            try:
                await self.timed(connected.auth(self.config.password), connected)
            except Exception:
                # Never the exception itself: some servers echo what they were sent.
                abort(connected.transport)
                raise ConnectionError("the fleet store refused the password") from None
        if self.config.db:
            await self.timed(connected.select(self.config.db), connected)
        return connected

    async def timed(self, pending: Deferred[Any], conn: Any) -> Any:
        """Await a command; past COMMAND_TIMEOUT the connection is dropped (txredisapi's replies
        are matched by order, so one command cannot be abandoned on its own)."""
        timer = self._reactor.callLater(COMMAND_TIMEOUT, abort, conn.transport)
        try:
            result = await pending
        finally:
            if timer.active():
                timer.cancel()
        if isinstance(result, Exception):
            raise result
        return result


class Session:
    """The connections to the store, kept up in the background while it runs (told to ``hooks``)."""

    def __init__(
        self,
        reactor: IProxyReactor,
        config: StateConfig,
        *,
        channel: str,
        hooks: SessionHooks,
    ) -> None:
        self._reactor = reactor
        self.config = config
        self.dialer = Dialer(reactor, config)
        self._channel = channel
        self._hooks = hooks
        self.up = False
        self.since: float | None = None
        self.lost_count = 0
        self.cmd: Any = None
        self._sub: Any = None
        self._running = False
        self._task: Deferred[None] | None = None
        self._retry: IDelayedCall | None = None
        self._beat: IDelayedCall | None = None
        self._delay = BACKOFF_FIRST

    def connection(self) -> Any:
        """The command connection while the session is up, else None."""
        return self.cmd if self.up else None

    def start(self) -> None:
        """Connect in the background; nothing waits on it."""
        if self._running:
            return
        self._running = True
        self._connect_soon(0)

    def stop(self) -> Deferred[None]:
        """Stop reconnecting, cancel timers, close the connections."""
        self._running = False
        _cancel(self._retry, self._beat)
        self._retry = self._beat = None
        waits: list[Deferred[Any]] = []

        def close(conn: Any) -> None:
            waits.append(conn.whenDisconnected())
            conn.transport.loseConnection()

        _close((self.cmd, self._sub), close)
        self.cmd = self._sub = None
        if self._task is not None:
            self._task.cancel()
        done: Deferred[Any] = DeferredList(waits, consumeErrors=True)
        return done.addCallback(lambda _: None)

    def _connect_soon(self, delay: float) -> None:
        if self._running:
            self._retry = self._reactor.callLater(delay, self._connect)

    def _connect(self) -> None:
        self._retry = None
        self._task = Deferred.fromCoroutine(self._run())
        self._task.addErrback(self._failed)

    def _failed(self, failure: Failure) -> None:
        self._task = None
        reason = "stopped" if failure.check(CancelledError) else self._redact(failure)
        self._lost(reason)

    def _redact(self, failure: Failure) -> str:
        """A failure as one line that cannot carry the password."""
        kind = failure.type.__name__ if failure.type is not None else "error"
        return self.config.redact(f"{kind}: {failure.getErrorMessage()}")

    async def _run(self) -> None:
        command, subscriber = _protocols()
        cmd = await self.dialer.dial(command())
        self.cmd = cmd
        sub = await self.dialer.dial(subscriber())
        self._sub = sub
        sub.on_message = self._hooks.on_message
        ended: Deferred[Any] = DeferredList(
            [cmd.whenDisconnected(), sub.whenDisconnected()],
            fireOnOneCallback=True,
            consumeErrors=True,
        )
        await self.dialer.timed(sub.subscribe(self._channel), sub)
        await self._hooks.resync(cmd)
        self._became_up()
        await ended
        self._task = None
        self._lost()

    def _became_up(self) -> None:
        self.up = True
        self.since = self._reactor.seconds()
        self._delay = BACKOFF_FIRST
        if self.lost_count:
            log.info("fleet store {store} is back; state resynchronised", store=str(self.config))
        else:
            log.info("fleet store {store} connected", store=str(self.config))
        self._hooks.on_up()
        self._heartbeat()

    def _lost(self, reason: str = "connection closed") -> None:
        was_up = self.up
        self.up = False
        _close((self.cmd, self._sub), lambda c: abort(c.transport))
        self.cmd = self._sub = None
        _cancel(self._beat)
        self._beat = None
        self._hooks.on_down(was_up and self._running)
        if not self._running:
            return
        if was_up:
            self.lost_count += 1
            self.since = self._reactor.seconds()
            log.warn(
                "fleet store {store} lost; working on local state until it is back",
                store=str(self.config),
            )
        elif self.since is None:
            # Never reached yet: say so once, then retry quietly.
            self.since = self._reactor.seconds()
            log.warn(
                "fleet store {store} unreachable ({reason}); working on local state, retrying",
                store=str(self.config),
                reason=reason,
            )
        delay, self._delay = self._delay, next_backoff(self._delay)
        self._connect_soon(delay)

    def _heartbeat(self) -> None:
        self._beat = None
        cmd = self.cmd
        if cmd is None or not self._running:
            return
        pinged = Deferred.fromCoroutine(self.dialer.timed(cmd.ping(), cmd))
        pinged.addErrback(lambda _f: abort(cmd.transport) if cmd.transport else None)
        self._hooks.on_beat()
        self._beat = self._reactor.callLater(HEARTBEAT, self._heartbeat)


async def read_all(
    dialer: Dialer, cmd: Any, ttl_prefix: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every key of the store's namespace with its value, and the TTL (ms) of those starting with
    ``ttl_prefix`` (each command under :meth:`Dialer.timed`)."""
    cursor: Any = 0
    keys: list[str] = []
    while True:
        reply = await dialer.timed(
            cmd.scan(cursor, pattern=f"{dialer.config.namespace}:*", count=SCAN_COUNT), cmd
        )
        cursor, batch = reply
        keys.extend(text(k) for k in batch)
        if int(cursor) == 0:
            break
    timed = [k for k in keys if k.startswith(ttl_prefix)]
    values = await dialer.timed(cmd.mget(keys), cmd) if keys else []
    ttls = [await dialer.timed(cmd.execute_command("PTTL", k), cmd) for k in timed]
    return dict(zip(keys, values, strict=False)), dict(zip(timed, ttls, strict=False))
