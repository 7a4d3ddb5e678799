# -*- test-case-name: tests.fleet.test_store,tests.fleet.test_sharing -*-
"""A fleet of proxies sharing what they learn through Redis or Valkey (docs/behaviour.md §6.6, ``--state``).

:class:`FleetStore` keeps one command connection and one pub/sub connection to the store (through
``txredisapi``'s protocols, dialled on the injected reactor) and shares, among every proxy that
names the same store:

- stall cooldowns (:class:`SharedStallTracker`): a key per cooling node with a TTL equal to the
  cooldown, published so peers cool the node too; a success anywhere ends it everywhere;
- affinity entries (:class:`SharedAffinityTable`): docs/behaviour.md §5.3 digests (HMAC-SHA-256 under
  ``--state-secret-file`` when given) → node id, with the idle TTL as the key's TTL;
- sessions' homes (:class:`SharedSessionTable`), only with ``--state-secret-file``: the sealed
  (key name, model, session name) → node and depth, with the session idle time as the TTL;
- reservation counts (through :class:`~nvpair_tw.selection._reservations.ReservationLedger`): each proxy
  publishes its own counts, the ledger adds the peers' to its own;
- the keys' rate-limit counters (:meth:`FleetStore.limit_counters`, docs/behaviour.md §12.1);
- the time each node last sent body bytes (:meth:`FleetStore.note_progress`, at most once per node
  per second), readable with :meth:`FleetStore.peer_progress`;
- the conversations each proxy sends to each node's prompt cache (:class:`SharedCaches`,
  docs/behaviour.md §5.3.1): published, their roots sealed as affinity digests are;
- usage sums per minute (:meth:`FleetStore.add_usage`, :meth:`FleetStore.usage_rows`;
  docs/behaviour.md §12.4), so a usage report covers the fleet.

The request path never waits on the store: decisions read local state that the subscriber keeps
current, and writes go out fire-and-forget, bounded (:data:`MAX_PENDING_WRITES` in flight, the same
number queued while the store is away; beyond, the oldest are dropped and counted). When the store
goes away the proxy logs one warning, keeps working on local state, reconnects with a backoff capped
at :data:`BACKOFF_CAP` seconds, logs one line when it is back and resynchronises (reads every shared
key, then writes its own state). A wrong type, a missing or flushed key or a garbled message is
ignored. The password is never logged: :class:`StateConfig` never shows it.

This module is the facade; the pieces each have a module of their own: where the store is
(:mod:`~nvpair_tw.fleet._config`), the keys and messages (:mod:`~nvpair_tw.fleet._wire`), the
connections' life (:mod:`~nvpair_tw.fleet._session`), the bounded batched writer
(:mod:`~nvpair_tw.fleet._writer`), each kind of shared state (:mod:`~nvpair_tw.fleet._sharing`) and
what peers say applied to them (:mod:`~nvpair_tw.fleet._sync`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail

from nvpair_tw.core import IProxyReactor
from nvpair_tw.fleet._config import StateConfig, parse_state_url, read_secret
from nvpair_tw.fleet._counters import SharedCounters
from nvpair_tw.fleet._session import BACKOFF_CAP, Session, next_backoff
from nvpair_tw.fleet._sharing import SharedAffinityTable, SharedStallTracker, UsageRow
from nvpair_tw.fleet._sync import FleetSharing
from nvpair_tw.fleet._wire import Codec
from nvpair_tw.fleet._writer import MAX_PENDING_WRITES, BatchedWriter
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.selection import (
    CacheBook,
    CooldownListener,
    CordonBook,
    Probe,
    ReservationLedger,
    SessionTable,
    SpeedBook,
)

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

log = LevelledLogger(namespace=__name__)


class FleetStore:
    """The connection to the fleet store and everything shared through it (one per process)."""

    def __init__(
        self, reactor: IProxyReactor, config: StateConfig, *, proxy_id: str | None = None
    ) -> None:
        self.config = config
        self.proxy_id = proxy_id or uuid.uuid4().hex
        codec = Codec(self.proxy_id, config.namespace)
        self._session = Session(reactor, config, channel=codec.channel, hooks=self)
        self._writer = BatchedWriter(reactor, config, codec, self._session.connection)
        self._sharing = FleetSharing.made(
            reactor, codec, self._writer.write, lambda: self.up, config.secret
        )
        self._counters = SharedCounters(codec, self._session.connection, self._session.dialer.timed)

    # --- what the runtime wires -----------------------------------------------------------------

    def stall_tracker(
        self,
        engine: str,
        period: float,
        on_change: CooldownListener | None,
        *,
        probe: Probe | None = None,
        probe_bound: float = 0.0,
    ) -> SharedStallTracker:
        """The stall tracker of ``engine``'s facade, sharing its cooldowns (and, with a ``probe``,
        the outcome of the expiry probes this proxy runs)."""
        return self._sharing.cooldowns.tracker(
            engine, period, on_change, probe=probe, probe_bound=probe_bound
        )

    def bind_cordons(self, engine: str, book: CordonBook) -> None:
        """Share the cordons of ``engine``'s facade with the fleet (docs/behaviour.md §13.1)."""
        self._sharing.cordons.bind(engine, book)

    def affinity_table(self, engine: str, max_entries: int, idle_ttl: float) -> SharedAffinityTable:
        """The affinity table of ``engine``'s facade, sharing its entries."""
        return self._sharing.affinity.table(engine, max_entries, idle_ttl)

    def session_table(self, engine: str, per_key: int, idle_ttl: float) -> SessionTable:
        """The session table of ``engine``'s facade, shared with a secret only (§5.3, §6.6)."""
        return self._sharing.sessions.table(engine, per_key, idle_ttl)

    def bind_ledger(self, ledger: ReservationLedger) -> None:
        """Share this process's reservation counts and add the peers' to ``ledger``."""
        self._sharing.reservations.bind(ledger)

    def bind_books(self, engine: str, speeds: SpeedBook, caches: CacheBook) -> None:
        """Share ``engine``'s learnt speeds (§15.1) and caches' conversations (§5.3.1)."""
        self._sharing.speeds.bind(engine, speeds)
        self._sharing.caches.bind(engine, caches)

    def limit_counters(self) -> SharedCounters:
        """The fleet-wide counters of the keys' rate limits (docs/behaviour.md §12.1)."""
        return self._counters

    def note_progress(self, engine: str, node_id: str) -> None:
        """Body bytes arrived from ``node_id`` now (docs/behaviour.md §6.4's "progress means alive"
        across a fleet): tell the fleet, at most once per node per second."""
        self._sharing.progress.note(engine, node_id)

    def peer_progress(self, engine: str, node_id: str) -> float | None:
        """When (local clock seconds) a peer last reported body bytes from ``node_id``, or None."""
        return self._sharing.progress.peer(engine, node_id)

    def add_usage(self, rows: Sequence[UsageRow], ttl: float) -> None:
        """Add this proxy's minutes to the fleet's usage sums, expiring ``ttl`` seconds after
        their hour (fire and forget: queued while the store is away, bounded like every write)."""
        self._sharing.usage.add(rows, ttl)

    def usage_rows(self, since: int, until: int) -> Deferred[list[UsageRow]]:
        """The fleet's usage minutes from ``since`` to ``until`` (minutes since the epoch); fails
        while the store is away or when it does not answer in time."""
        conn = self._session.connection()
        if conn is None:
            return fail(ConnectionError("the fleet store is away"))
        return Deferred.fromCoroutine(
            self._sharing.usage.rows(self._session.dialer, conn, since, until)
        )

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background; the proxy serves on local state meanwhile."""
        self._session.start()

    def stop(self) -> Deferred[None]:
        """Stop reconnecting, cancel timers, close the connections."""
        self._sharing.reservations.stop()
        self._writer.flush()  # the last usage minutes (and whatever else is queued) go out
        self._writer.stop()
        closed = self._session.stop()
        self._sharing.cooldowns.stop()
        return closed

    # --- the session's hooks --------------------------------------------------------------------

    def on_message(self, raw: bytes | str) -> None:
        """A published change: apply it locally (:meth:`FleetSharing.on_message`)."""
        self._sharing.on_message(raw)

    async def resync(self, cmd: Any) -> None:
        """Read every shared key into local state (this proxy's own is written once up)."""
        await self._sharing.resync(self._session.dialer, cmd)

    def on_up(self) -> None:
        """Up: share what this proxy saw while the store was away, send what is queued."""
        self._sharing.reshare()
        self._writer.connected()

    def on_beat(self) -> None:
        self._sharing.reservations.beat()

    def on_down(self, lost: bool) -> None:
        self._writer.disconnected()
        if lost:
            self._sharing.reservations.forget_peers()

    # --- what the admin listener and the metrics show -------------------------------------------

    @property
    def applied(self) -> int:
        """How many peers' messages were applied here."""
        return self._sharing.applied

    @property
    def up(self) -> bool:
        """Whether the store is connected (else the proxy works on local state)."""
        return self._session.up

    @property
    def since(self) -> float | None:
        """When the store last came up or went away (reactor seconds), None before either."""
        return self._session.since

    @property
    def lost_count(self) -> int:
        """How many times a connected store was lost."""
        return self._session.lost_count

    @property
    def dropped(self) -> int:
        """Writes dropped because the bounded queue was full."""
        return self._writer.dropped

    @property
    def write_refused(self) -> bool:
        """Whether the store refused a batch since it was last connected."""
        return self._writer.write_refused

    def status(self) -> dict[str, Any]:
        """The store's state for ``/readyz`` and the status page (never the password)."""
        return {
            "store": str(self.config),
            "state": "up" if self.up else "down",
            "since": None if self.since is None else int(self.since * 1000),
            "dropped_writes": self.dropped,
        }
