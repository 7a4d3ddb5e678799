# -*- test-case-name: tests.test_fleet -*-
"""A fleet of proxies sharing what they learn through Redis or Valkey (SPEC §6.6, ``--state``).

:class:`FleetStore` keeps one command connection and one pub/sub connection to the store (through
``txredisapi``'s protocols, dialled on the injected reactor) and shares, among every proxy that
names the same store:

- stall cooldowns (:class:`SharedStallTracker`): a key per cooling node with a TTL equal to the
  cooldown, published so peers cool the node too; a success anywhere ends it everywhere;
- affinity entries (:class:`SharedAffinityTable`): SPEC §5.3 digests (HMAC-SHA-256 under
  ``--state-secret-file`` when given) → node id, with the idle TTL as the key's TTL;
- reservation counts (through :class:`~nvpair_tw.reservations.ReservationLedger`): each proxy
  publishes its own counts, the ledger adds the peers' to its own;
- the time each node last sent body bytes (:meth:`FleetStore.note_progress`, at most once per node
  per second), readable with :meth:`FleetStore.peer_progress`.

The request path never waits on the store: decisions read local state that the subscriber keeps
current, and writes go out fire-and-forget, bounded (:data:`MAX_PENDING_WRITES` in flight, the same
number queued while the store is away; beyond, the oldest are dropped and counted). When the store
goes away the proxy logs one warning, keeps working on local state, reconnects with a backoff capped
at :data:`BACKOFF_CAP` seconds, logs one line when it is back and resynchronises (reads every shared
key, then writes its own state). A wrong type, a missing or flushed key or a garbled message is
ignored. The password is never logged: :class:`StateConfig` never shows it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from attrs import define, field, frozen, setters
from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from nvpair_tw.affinity import AffinityKey, AffinityTable
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.reactor import IProxyReactor, abort
from nvpair_tw.reservations import ReservationLedger
from nvpair_tw.stalls import Cooldown, CooldownListener, StallTracker

__all__ = [
    "BACKOFF_CAP",
    "MAX_PENDING_WRITES",
    "FleetStore",
    "SharedAffinityTable",
    "SharedStallTracker",
    "StateConfig",
    "next_backoff",
    "parse_state_url",
    "read_secret",
]

log = LevelledLogger()

BACKOFF_FIRST = 0.1
BACKOFF_CAP = 2.0
"""Seconds: reconnect delays double from :data:`BACKOFF_FIRST` up to this."""
CONNECT_TIMEOUT = 2.0
COMMAND_TIMEOUT = 2.0
HEARTBEAT = 1.0
"""Seconds between liveness pings (and reservation refreshes)."""
RESERVATION_TTL = 10.0
"""A peer's reservation counts are forgotten when not refreshed for this long."""
RESERVATION_BATCH = 0.01
"""Seconds: reservation changes within this window go out as one publish."""
PROGRESS_EVERY = 1.0
MAX_PENDING_WRITES = 1024
SCAN_COUNT = 500

WRITE_BATCH = 0.005
"""Seconds: writes made within this window go to the store as one script call (one round trip),
and their notifications as one published message."""

Op = tuple[Any, ...]
"""One store operation: ``("set", key, value, ttl_ms)``, ``("del", key)`` or ``("pub", message)``."""
Command = Callable[[], Sequence[Op]]
"""Makes a write's operations when it is sent (so a TTL is what is left *then*)."""

# One round trip for a whole batch; SET and DEL replace any type, so a key a person corrupted by
# hand cannot make the batch fail.
WRITE_SCRIPT = """
local k, i = 1, 1
while i <= #ARGV do
  local op = ARGV[i]
  if op == 's' then
    redis.call('SET', KEYS[k], ARGV[i + 1], 'PX', ARGV[i + 2]); k = k + 1; i = i + 3
  elseif op == 'd' then
    redis.call('DEL', KEYS[k]); k = k + 1; i = i + 1
  else
    redis.call('PUBLISH', ARGV[i + 1], ARGV[i + 2]); i = i + 3
  end
end
return 1
"""
MAX_IN_FLIGHT_BATCHES = 16


@frozen
class StateConfig:
    """Where the fleet store is and how to talk to it; ``repr`` and ``str`` never show secrets."""

    host: str
    port: int = 6379
    db: int = 0
    password: str | None = field(default=None, repr=False)
    secret: bytes | None = field(default=None, repr=False)
    namespace: str = "nvpair"

    def __str__(self) -> str:
        auth = ":***@" if self.password else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{auth}{host}:{self.port}/{self.db}"


def parse_state_url(
    url: str, *, password: str | None = None, secret: bytes | None = None
) -> StateConfig:
    """``redis://[:PASSWORD@]HOST[:PORT][/DB]`` as a :class:`StateConfig`.

    ``password`` (from ``--state-password-file``) wins over one in the URL. A ValueError's message
    never contains the password.
    """
    try:
        parts = urlsplit(url)
        port = parts.port or 6379
        host = parts.hostname
    except ValueError:
        raise ValueError("--state must look like redis://HOST:PORT/DB") from None
    if parts.scheme != "redis" or not host:
        raise ValueError("--state must look like redis://HOST:PORT/DB")
    path = parts.path.strip("/") or "0"
    if not path.isdigit():
        raise ValueError("--state: the database must be a number, as in redis://HOST:PORT/0")
    given = unquote(parts.password) if parts.password else None
    return StateConfig(
        host=host,
        port=port,
        db=int(path),
        password=password if password is not None else given,
        secret=secret,
    )


def next_backoff(delay: float) -> float:
    """The reconnect delay after ``delay``: doubled, capped at :data:`BACKOFF_CAP`."""
    return min(BACKOFF_CAP, delay * 2)


def read_secret(path: str) -> bytes:
    """A secret or password file's content without its trailing newline (never logged)."""
    with open(path, "rb") as handle:
        content = handle.read().rstrip(b"\r\n")
    if not content:
        raise ValueError(f"{path} is empty")
    return content


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


def _seal(secret: bytes | None) -> Callable[[bytes], bytes]:
    if secret is None:
        return lambda digest: digest
    return lambda digest: hmac.new(secret, digest, hashlib.sha256).digest()


class FleetStore:
    """The connection to the fleet store and everything shared through it (one per process)."""

    def __init__(
        self, reactor: IProxyReactor, config: StateConfig, *, proxy_id: str | None = None
    ) -> None:
        self._reactor = reactor
        self.config = config
        self.proxy_id = proxy_id or uuid.uuid4().hex
        self._ns = config.namespace
        self._channel = f"{self._ns}:events"
        self._seal = _seal(config.secret)
        self.up = False
        self.since: float | None = None
        self.lost_count = 0
        self.dropped = 0
        self.applied = 0
        self.write_refused = False
        self._cmd: Any = None
        self._sub: Any = None
        self._running = False
        self._session: Deferred[None] | None = None
        self._retry: IDelayedCall | None = None
        self._beat: IDelayedCall | None = None
        self._publish_reservations: IDelayedCall | None = None
        self._published_counts: dict[str, int] = {}
        self._delay = BACKOFF_FIRST
        self._in_flight = 0
        self._queue: deque[Command] = deque(maxlen=MAX_PENDING_WRITES)
        self._batch: IDelayedCall | None = None
        self._stalls: dict[str, SharedStallTracker] = {}
        self._tables: dict[str, SharedAffinityTable] = {}
        self._ledger: ReservationLedger | None = None
        self._peer_counts: dict[str, tuple[dict[str, int], float]] = {}
        self._progress_sent: dict[tuple[str, str], float] = {}
        self._peer_progress: dict[tuple[str, str], float] = {}

    # --- what the runtime wires -----------------------------------------------------------------

    def stall_tracker(
        self, engine: str, period: float, on_change: CooldownListener | None
    ) -> SharedStallTracker:
        """The stall tracker of ``engine``'s facade, sharing its cooldowns."""
        tracker = SharedStallTracker(self._reactor, period, on_change, store=self, engine=engine)
        self._stalls[engine] = tracker
        return tracker

    def affinity_table(self, engine: str, max_entries: int, idle_ttl: float) -> SharedAffinityTable:
        """The affinity table of ``engine``'s facade, sharing its entries."""
        table = SharedAffinityTable(
            self._reactor,
            max_entries,
            idle_ttl,
            seal=self._seal,
            share=lambda model, digest, node: self._share_affinity(engine, model, digest, node),
        )
        self._tables[engine] = table
        return table

    def bind_ledger(self, ledger: ReservationLedger) -> None:
        """Share this process's reservation counts and add the peers' to ``ledger``."""
        self._ledger = ledger
        ledger.on_change = self._reservations_changed

    def note_progress(self, engine: str, node_id: str) -> None:
        """Body bytes arrived from ``node_id`` now: tell the fleet (at most once per node per second).

        The hook for SPEC §6.4's "progress means alive" across a fleet: call it where an attempt
        receives body bytes; :meth:`peer_progress` answers when a peer last saw some.
        """
        now = self._reactor.seconds()
        last = self._progress_sent.get((engine, node_id))
        if last is not None and now - last < PROGRESS_EVERY:
            return
        self._progress_sent[(engine, node_id)] = now
        message = self._message("prog", e=engine, n=node_id)
        self._write(lambda: [("pub", message)])

    def peer_progress(self, engine: str, node_id: str) -> float | None:
        """When (local clock seconds) a peer last reported body bytes from ``node_id``, or None."""
        return self._peer_progress.get((engine, node_id))

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background; the proxy serves on local state meanwhile."""
        if self._running:
            return
        self._running = True
        self._connect_soon(0)

    def stop(self) -> Deferred[None]:
        """Stop reconnecting, cancel timers, close the connections."""
        self._running = False
        for timer in (self._retry, self._beat, self._publish_reservations, self._batch):
            if timer is not None and timer.active():
                timer.cancel()
        self._retry = self._beat = self._publish_reservations = self._batch = None
        waits: list[Deferred[Any]] = []
        for conn in (self._cmd, self._sub):
            if conn is not None and conn.transport is not None:
                waits.append(conn.whenDisconnected())
                conn.transport.loseConnection()
        self._cmd = self._sub = None
        if self._session is not None:
            self._session.cancel()
        for stalls in self._stalls.values():
            stalls.stop()
        done: Deferred[Any] = DeferredList(waits, consumeErrors=True)
        return done.addCallback(lambda _: None)

    def _connect_soon(self, delay: float) -> None:
        if self._running:
            self._retry = self._reactor.callLater(delay, self._connect)

    def _connect(self) -> None:
        self._retry = None
        self._session = Deferred.fromCoroutine(self._run())
        self._session.addErrback(self._session_failed)

    def _session_failed(self, failure: Failure) -> None:
        self._session = None
        reason = "stopped" if failure.check(CancelledError) else self._redact(failure)
        self._lost(reason)

    def _redact(self, failure: Failure) -> str:
        """A failure as one line that cannot carry the password."""
        kind = failure.type.__name__ if failure.type is not None else "error"
        text = f"{kind}: {failure.getErrorMessage()}"
        if self.config.password:
            text = text.replace(self.config.password, "***")
        return text

    async def _run(self) -> None:
        command, subscriber = _protocols()
        cmd = await self._dial(command())
        self._cmd = cmd
        sub = await self._dial(subscriber())
        self._sub = sub
        sub.on_message = self._received
        ended: Deferred[Any] = DeferredList(
            [cmd.whenDisconnected(), sub.whenDisconnected()],
            fireOnOneCallback=True,
            consumeErrors=True,
        )
        await self._timed(sub.subscribe(self._channel), sub)
        await self._resync(cmd)
        self._became_up()
        await ended
        self._session = None
        self._lost()

    async def _dial(self, protocol: Any) -> Any:
        protocol.factory = _Quiet()
        endpoint = HostnameEndpoint(
            self._reactor, self.config.host, self.config.port, timeout=CONNECT_TIMEOUT
        )
        connected = await connectProtocol(endpoint, protocol)
        if self.config.password is not None:
            try:
                await self._timed(connected.auth(self.config.password), connected)
            except Exception:
                # Never the exception itself: some servers echo what they were sent.
                abort(connected.transport)
                raise ConnectionError("the fleet store refused the password") from None
        if self.config.db:
            await self._timed(connected.select(self.config.db), connected)
        return connected

    async def _timed(self, pending: Deferred[Any], conn: Any) -> Any:
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

    def _became_up(self) -> None:
        self.up = True
        self.write_refused = False
        self.since = self._reactor.seconds()
        self._delay = BACKOFF_FIRST
        if self.lost_count:
            log.info("fleet store {store} is back; state resynchronised", store=str(self.config))
        else:
            log.info("fleet store {store} connected", store=str(self.config))
        # Then this proxy's own state: the cooldowns it saw while the store was away.
        for engine, stalls in self._stalls.items():
            for node in stalls.cooling():
                cooldown = stalls.cooldown(node)
                if cooldown is not None and cooldown.origin == "local":
                    self.share_cooldown(engine, cooldown)
        self._flush()
        self._heartbeat()

    def _lost(self, reason: str = "connection closed") -> None:
        was_up = self.up
        self.up = False
        for conn in (self._cmd, self._sub):
            if conn is not None and conn.transport is not None:
                abort(conn.transport)
        self._cmd = self._sub = None
        self._in_flight = 0
        for timer in (self._beat, self._batch):
            if timer is not None and timer.active():
                timer.cancel()
        self._beat = self._batch = None
        if not self._running:
            return
        if was_up:
            self.lost_count += 1
            self.since = self._reactor.seconds()
            log.warn(
                "fleet store {store} lost; working on local state until it is back",
                store=str(self.config),
            )
            self._peer_counts.clear()
            self._apply_peer_counts()
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
        cmd = self._cmd
        if cmd is None or not self._running:
            return
        now = self._reactor.seconds()
        for proxy, (_counts, heard) in list(self._peer_counts.items()):
            if now - heard > RESERVATION_TTL:
                del self._peer_counts[proxy]
                self._apply_peer_counts()
        pinged = Deferred.fromCoroutine(self._timed(cmd.ping(), cmd))
        pinged.addErrback(lambda _f: abort(cmd.transport) if cmd.transport else None)
        if self._ledger is not None and self._ledger.local_counts():
            self._send_reservations()
        self._beat = self._reactor.callLater(HEARTBEAT, self._heartbeat)

    # --- writes ---------------------------------------------------------------------------------

    def _write(self, command: Command) -> None:
        """Fire and forget: queue (bounded; the oldest is dropped when full) and send with the
        next batch, or when the store is back."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(command)
        if self.up and self._batch is None:
            self._batch = self._reactor.callLater(WRITE_BATCH, self._flush)

    def _flush(self) -> None:
        """Send every queued write as one script call and one published message."""
        self._batch = None
        conn = self._cmd
        if conn is None or not self.up or not self._queue:
            return
        if self._in_flight >= MAX_IN_FLIGHT_BATCHES:
            self.dropped += len(self._queue)
            self._queue.clear()
            return
        keys: list[str] = []
        args: list[Any] = []
        messages: list[dict[str, Any]] = []
        while self._queue:
            try:
                ops = self._queue.popleft()()
            except Exception as error:  # a write's own bug must not stop the others
                log.debug("fleet store write skipped: {error}", error=type(error).__name__)
                continue
            for op in ops:
                if op[0] == "set":
                    keys.append(op[1])
                    args += ["s", op[2], max(1, int(op[3]))]
                elif op[0] == "del":
                    keys.append(op[1])
                    args.append("d")
                else:
                    messages.append(op[1])
        if messages:
            batch = (
                messages[0]
                if len(messages) == 1
                else {"o": self.proxy_id, "t": "batch", "m": messages}
            )
            args += ["p", self._channel, json.dumps(batch, separators=(",", ":"))]
        if not args:
            return
        try:
            sent: Deferred[Any] = conn.eval(WRITE_SCRIPT, keys, args)
        except Exception as error:  # a closed transport: the store is away, the batch is dropped
            log.debug("fleet store write failed: {error}", error=type(error).__name__)
            return
        self._in_flight += 1
        sent.addBoth(self._written)

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
        text = str(error)
        if self.config.password:
            text = text.replace(self.config.password, "***")
        log.warn(
            "fleet store {store} refused a write ({error}); nothing is shared until it accepts "
            "writes again",
            store=str(self.config),
            error=text[:200],
        )

    def _message(self, kind: str, **fields: object) -> dict[str, Any]:
        return {"o": self.proxy_id, "t": kind, **fields}

    def _key(self, *parts: str) -> str:
        return ":".join((self._ns, *parts))

    def share_cooldown(self, engine: str, cooldown: Cooldown) -> None:
        """Store and publish a local stall's cooldown (TTL = what is left of it when sent).

        While the store is away nothing is queued: when it is back every local cooldown still
        running is shared again (:meth:`_became_up`), with what is left of it then.
        """
        if not self.up:
            return
        key = self._key("cool", engine, cooldown.node_id)
        value = json.dumps({"e": engine, "n": cooldown.node_id, "r": cooldown.reason})

        def send() -> list[Op]:
            left = int((cooldown.until - self._reactor.seconds()) * 1000)
            if left <= 0:
                return []
            message = self._message(
                "cool", e=engine, n=cooldown.node_id, r=cooldown.reason, ttl=left
            )
            return [("set", key, value, left), ("pub", message)]

        self._write(send)

    def share_clear(self, engine: str, node_id: str) -> None:
        """Delete and publish the end of a cooldown (a success on this proxy)."""
        key = self._key("cool", engine, node_id)
        message = self._message("clear", e=engine, n=node_id)

        def send() -> list[Op]:
            return [("del", key), ("pub", message)]

        self._write(send)

    def _share_affinity(self, engine: str, model: str, digest: bytes, node_id: str) -> None:
        table = self._tables.get(engine)
        ttl = int((table.idle_ttl if table is not None else 300.0) * 1000)
        hexdigest = digest.hex()
        key = self._key("aff", engine, hashlib.sha256(model.encode()).hexdigest()[:16], hexdigest)
        value = json.dumps({"e": engine, "m": model, "d": hexdigest, "n": node_id})
        message = self._message("aff", e=engine, m=model, d=hexdigest, n=node_id)

        def send() -> list[Op]:
            return [("set", key, value, ttl), ("pub", message)]

        self._write(send)

    def _reservations_changed(self) -> None:
        # Coalesce a burst (a move is a release and a reserve; a short request reserves and
        # releases) into one publish, off the request path and well inside the 100 ms bound.
        if self._publish_reservations is None:
            self._publish_reservations = self._reactor.callLater(
                RESERVATION_BATCH, self._send_reservations, False
            )

    def _send_reservations(self, refresh: bool = True) -> None:
        """Publish this proxy's counts: when they changed since the last publish, or always on a
        ``refresh`` (the heartbeat, which keeps the stored key and the peers' view alive)."""
        if self._publish_reservations is not None and self._publish_reservations.active():
            self._publish_reservations.cancel()
        self._publish_reservations = None
        counts = self._ledger.local_counts() if self._ledger is not None else {}
        if not refresh and counts == self._published_counts:
            return
        self._published_counts = counts
        key = self._key("res", self.proxy_id)
        value = json.dumps(counts, separators=(",", ":"))
        message = self._message("res", c=counts)
        if not self.up:
            return  # resent whole on reconnect: a queued count would only be stale

        def send() -> list[Op]:
            return [("set", key, value, int(RESERVATION_TTL * 1000)), ("pub", message)]

        self._write(send)

    # --- reads ----------------------------------------------------------------------------------

    def _received(self, raw: bytes | str) -> None:
        """A published change: apply it locally. Anything malformed is ignored."""
        try:
            message = json.loads(raw)
            if not isinstance(message, dict) or message.get("o") == self.proxy_id:
                return
            if message.get("t") == "batch" and isinstance(message.get("m"), list):
                for inner in message["m"]:
                    if isinstance(inner, dict):
                        self._received(json.dumps({**inner, "o": message.get("o")}))
                return
            self._apply(message)
        except Exception as error:  # a hand-written or foreign message must never hurt the proxy
            log.debug("fleet store: ignored a message ({error})", error=type(error).__name__)

    def _apply(self, message: Mapping[str, Any]) -> None:
        kind = message.get("t")
        engine, node = message.get("e"), message.get("n")
        if kind == "res":
            counts = message.get("c")
            origin = message.get("o")
            if isinstance(origin, str) and isinstance(counts, dict):
                clean = {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
                self._peer_counts[origin] = (clean, self._reactor.seconds())
                self._apply_peer_counts()
                self.applied += 1
            return
        if not isinstance(engine, str) or not isinstance(node, str):
            return
        if kind == "cool":
            stalls = self._stalls.get(engine)
            ttl = message.get("ttl")
            reason = message.get("r")
            if stalls is not None and isinstance(ttl, int) and ttl > 0:
                stalls.apply_peer(node, str(reason or "stall"), ttl / 1000)
                self.applied += 1
        elif kind == "clear":
            stalls = self._stalls.get(engine)
            if stalls is not None:
                stalls.end(node, "peer-success")
                self.applied += 1
        elif kind == "aff":
            table = self._tables.get(engine)
            model, digest = message.get("m"), message.get("d")
            if table is not None and isinstance(model, str) and isinstance(digest, str):
                table.learn(model, bytes.fromhex(digest), node)
                self.applied += 1
        elif kind == "prog":
            self._peer_progress[(engine, node)] = self._reactor.seconds()
            self.applied += 1

    def _apply_peer_counts(self) -> None:
        if self._ledger is None:
            return
        total: dict[str, int] = {}
        for counts, _heard in self._peer_counts.values():
            for node, n in counts.items():
                total[node] = total.get(node, 0) + n
        self._ledger.set_peers(total)

    async def _resync(self, cmd: Any) -> None:
        """Read every shared key into local state, then write this proxy's own state."""
        cursor: Any = 0
        keys: list[str] = []
        while True:
            reply = await self._timed(
                cmd.scan(cursor, pattern=f"{self._ns}:*", count=SCAN_COUNT), cmd
            )
            cursor, batch = reply
            keys.extend(_text(k) for k in batch)
            if int(cursor) == 0:
                break
        cools = [k for k in keys if k.startswith(self._key("cool", ""))]
        values = await self._timed(cmd.mget(keys), cmd) if keys else []
        ttls = [await self._timed(cmd.execute_command("PTTL", k), cmd) for k in cools]
        now = self._reactor.seconds()
        by_key = dict(zip(keys, values, strict=False))
        for key, ttl in zip(cools, ttls, strict=False):
            self._resync_cooldown(by_key.get(key), ttl)
        for key, value in by_key.items():
            if key.startswith(self._key("aff", "")):
                self._resync_affinity(value)
            elif key.startswith(self._key("res", "")):
                proxy = key[len(self._key("res", "")) :]
                counts = _json_object(value)
                if proxy != self.proxy_id and counts is not None:
                    clean = {str(n): c for n, c in counts.items() if isinstance(c, int)}
                    self._peer_counts[proxy] = (clean, now)
        self._apply_peer_counts()

    def _resync_cooldown(self, value: Any, ttl: Any) -> None:
        entry = _json_object(value)
        if entry is None or not isinstance(ttl, int) or ttl <= 0:
            return
        engine, node = entry.get("e"), entry.get("n")
        stalls = self._stalls.get(engine) if isinstance(engine, str) else None
        if stalls is not None and isinstance(node, str) and node not in stalls.cooling():
            stalls.apply_peer(node, str(entry.get("r") or "stall"), ttl / 1000)

    def _resync_affinity(self, value: Any) -> None:
        entry = _json_object(value)
        if entry is None:
            return
        engine, model, digest, node = (entry.get(k) for k in ("e", "m", "d", "n"))
        table = self._tables.get(engine) if isinstance(engine, str) else None
        if table is None or not all(isinstance(v, str) for v in (model, digest, node)):
            return
        try:
            table.learn(str(model), bytes.fromhex(str(digest)), str(node))
        except ValueError:
            return

    # --- what the admin listener shows ----------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The store's state for ``/readyz`` and the status page (never the password)."""
        return {
            "store": str(self.config),
            "state": "up" if self.up else "down",
            "since": None if self.since is None else int(self.since * 1000),
            "dropped_writes": self.dropped,
        }


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _json_object(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, str | bytes):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


class SharedStallTracker(StallTracker):
    """A facade's cooldowns, shared with the fleet: a local stall is stored and published, a
    peer's is applied with ``origin="peer"``, and a success here ends the cooldown everywhere."""

    def __init__(
        self,
        clock: IProxyReactor,
        period: float,
        on_change: CooldownListener | None,
        *,
        store: FleetStore,
        engine: str,
    ) -> None:
        super().__init__(clock, period, on_change)
        self._store = store
        self._engine = engine

    def cool(self, node_id: str, reason: str) -> None:
        cooldown = self.install(node_id, reason, self.period)
        self._store.share_cooldown(self._engine, cooldown)

    def clear(self, node_id: str) -> None:
        # Only a node that is cooling (here, so in the fleet) costs a write.
        if self.end(node_id, "success"):
            self._store.share_clear(self._engine, node_id)

    def apply_peer(self, node_id: str, reason: str, period: float) -> None:
        """Another proxy saw ``node_id`` stall: cool it here for what is left of its cooldown."""
        self.install(node_id, reason, period, origin="peer")


@define(on_setattr=setters.NO_OP)
class SharedAffinityTable(AffinityTable):
    """A facade's affinity table whose entries the fleet shares.

    Entries are keyed by *sealed* digests (HMAC-SHA-256 under the fleet secret, or the SPEC §5.3
    digest itself without one), so a peer's entry and a local lookup meet in the same table.
    """

    _seal: Callable[[bytes], bytes] = field(kw_only=True, default=lambda d: d)
    _share: Callable[[str, bytes, str], None] | None = field(kw_only=True, default=None)

    def _sealed(self, key: AffinityKey) -> AffinityKey:
        seal = self._seal
        return AffinityKey(key.model, seal(key.key), tuple(seal(d) for d in key.lookups))

    def lookup(self, key: AffinityKey) -> str | None:
        return super().lookup(self._sealed(key))

    def record(self, key: AffinityKey, node_id: str) -> None:
        sealed = self._sealed(key)
        super().record(sealed, node_id)
        if self._share is not None:
            self._share(sealed.model, sealed.key, node_id)

    def learn(self, model: str, sealed_digest: bytes, node_id: str) -> None:
        """A peer's entry (already sealed): remember it here without sharing it again."""
        super().record(AffinityKey(model, sealed_digest, (sealed_digest,)), node_id)
