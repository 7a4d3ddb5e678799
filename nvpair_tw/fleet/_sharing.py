# -*- test-case-name: tests.fleet.test_sharing -*-
"""What a fleet shares through its store (docs/behaviour.md §6.6), one class per kind of state.

Each kind writes through a ``write`` function (:meth:`~nvpair_tw.fleet._writer.BatchedWriter.write`),
applies a peer's published message (``apply``: whether it was applied) and, after a reconnection,
the keys read back from the store (``resync``). Anything malformed is ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import define, field, setters
from twisted.internet.interfaces import IDelayedCall

from nvpair_tw.core import IProxyReactor
from nvpair_tw.fleet._wire import Codec, Command, Kind, Op, json_object
from nvpair_tw.selection import (
    AffinityKey,
    AffinityTable,
    CacheBook,
    Cooldown,
    CooldownListener,
    Cordon,
    CordonBook,
    Home,
    Match,
    Probe,
    ReservationLedger,
    Sample,
    Session,
    SessionTable,
    SpeedBook,
    StallTracker,
)

__all__ = [
    "PROGRESS_EVERY",
    "RESERVATION_BATCH",
    "RESERVATION_TTL",
    "USAGE_METRICS",
    "SharedAffinity",
    "SharedAffinityTable",
    "SharedCaches",
    "SharedCooldowns",
    "SharedCordons",
    "SharedProgress",
    "SharedReservations",
    "SharedSessionTable",
    "SharedSessions",
    "SharedSpeeds",
    "SharedStallTracker",
    "SharedUsage",
]

RESERVATION_TTL = 10.0
"""A peer's reservation counts are forgotten when not refreshed for this long."""
RESERVATION_BATCH = 0.01
"""Seconds: reservation changes within this window go out as one publish."""
PROGRESS_EVERY = 1.0
USAGE_METRICS = ("r", "e", "p", "c", "u", "k", "n")
"""A usage row's counts as hash fields: requests, errors, prompt, completion, unknown counts,
cached prompt tokens and requests whose cached count is unknown (a peer of an older version
writes none of the last two: a report counts its requests as neither)."""

Write = Callable[[Command], None]


class _Sharing:
    """What every kind of shared state is given: the clock, the codec, the writer and whether the
    store is up now."""

    def __init__(
        self, reactor: IProxyReactor, codec: Codec, write: Write, up: Callable[[], bool]
    ) -> None:
        self._reactor = reactor
        self._codec = codec
        self._write = write
        self._up = up


class SharedCooldowns(_Sharing):
    """Stall cooldowns: a key per cooling node with a TTL equal to what is left of the cooldown,
    published so peers cool the node too; a success anywhere ends it everywhere."""

    def __init__(
        self, reactor: IProxyReactor, codec: Codec, write: Write, up: Callable[[], bool]
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self.trackers: dict[str, SharedStallTracker] = {}

    def tracker(
        self,
        engine: str,
        period: float,
        on_change: CooldownListener | None,
        *,
        probe: Probe | None = None,
        probe_bound: float = 0.0,
    ) -> SharedStallTracker:
        tracker = SharedStallTracker(
            self._reactor,
            period,
            on_change,
            store=self,
            engine=engine,
            probe=probe,
            probe_bound=probe_bound,
        )
        self.trackers[engine] = tracker
        return tracker

    def share_cooldown(self, engine: str, cooldown: Cooldown) -> None:
        """Store and publish a local stall's cooldown (TTL = what is left of it when sent).

        While the store is away nothing is queued: when it is back every local cooldown still
        running is shared again (:meth:`reshare`), with what is left of it then.
        """
        if not self._up():
            return
        key = self._codec.key(Kind.COOL, engine, cooldown.node_id)
        value = json.dumps({"e": engine, "n": cooldown.node_id, "r": cooldown.reason})

        def send() -> list[Op]:
            left = int((cooldown.until - self._reactor.seconds()) * 1000)
            if left <= 0:
                return []
            message = self._codec.message(
                Kind.COOL, e=engine, n=cooldown.node_id, r=cooldown.reason, ttl=left
            )
            return [("set", key, value, left), ("pub", message)]

        self._write(send)

    def share_clear(self, engine: str, node_id: str) -> None:
        """Delete and publish the end of a cooldown (a success on this proxy)."""
        key = self._codec.key(Kind.COOL, engine, node_id)
        message = self._codec.message(Kind.CLEAR, e=engine, n=node_id)

        def send() -> list[Op]:
            return [("del", key), ("pub", message)]

        self._write(send)

    def reshare(self) -> None:
        """The store is back: share the cooldowns this proxy saw while it was away."""
        for engine, stalls in self.trackers.items():
            for node in stalls.cooling():
                cooldown = stalls.cooldown(node)
                if cooldown is not None and cooldown.origin == "local":
                    self.share_cooldown(engine, cooldown)

    def apply(self, kind: Kind, engine: str, node: str, message: Mapping[str, Any]) -> bool:
        stalls = self.trackers.get(engine)
        if stalls is None:
            return False
        if kind is Kind.CLEAR:
            stalls.end(node, "peer-success")
            return True
        ttl = message.get("ttl")
        if not isinstance(ttl, int) or ttl <= 0:
            return False
        stalls.apply_peer(node, str(message.get("r") or "stall"), ttl / 1000)
        return True

    def resync(self, value: Any, ttl: Any) -> None:
        entry = json_object(value)
        if entry is None or not isinstance(ttl, int) or ttl <= 0:
            return
        engine, node = entry.get("e"), entry.get("n")
        stalls = self.trackers.get(engine) if isinstance(engine, str) else None
        if stalls is not None and isinstance(node, str) and node not in stalls.cooling():
            stalls.apply_peer(node, str(entry.get("r") or "stall"), ttl / 1000)

    def stop(self) -> None:
        for stalls in self.trackers.values():
            stalls.stop()


class SharedCordons(_Sharing):
    """Cordons set by a control channel (docs/behaviour.md §13.1): a key per cordoned node, with no
    TTL (a cordon lasts until it is lifted), and a published change, so every proxy of the fleet
    cordons the node (``origin="peer"``); an uncordon on any proxy lifts it everywhere. A nodes
    file's ``cordon = true`` is that file's, not shared."""

    def __init__(
        self, reactor: IProxyReactor, codec: Codec, write: Write, up: Callable[[], bool]
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self.books: dict[str, CordonBook] = {}
        self._applying = False

    def bind(self, engine: str, book: CordonBook) -> None:
        """Share ``book``'s changes and apply the peers' to it."""
        self.books[engine] = book
        book.subscribe(lambda node, cordon: self._changed(engine, node, cordon))

    def _changed(self, engine: str, node: str, cordon: Cordon | None) -> None:
        if self._applying:
            return  # a peer's change being applied here: not ours to share
        key = self._codec.key(Kind.CORDON, engine, node)
        if cordon is None:
            message = self._codec.message(Kind.UNCORDON, e=engine, n=node)
            self._write(lambda: [("del", key), ("pub", message)])
            return
        value = json.dumps({"e": engine, "n": node, "r": cordon.reason})
        message = self._codec.message(Kind.CORDON, e=engine, n=node, r=cordon.reason)
        self._write(lambda: [("keep", key, value), ("pub", message)])

    def apply(self, kind: Kind, engine: str, node: str, message: Mapping[str, Any]) -> bool:
        book = self.books.get(engine)
        if book is None:
            return False
        self._applying = True
        try:
            if kind is Kind.UNCORDON:
                return book.uncordon(node)
            book.cordon(node, str(message.get("r") or "cordoned by a peer"), origin="peer")
            return True
        finally:
            self._applying = False

    def resync(self, values: Mapping[str, Any]) -> None:
        """The store's cordons after a reconnection: cordon what it holds, lift the peers'
        cordons it no longer holds (lifted while this proxy was away)."""
        held: dict[tuple[str, str], str] = {}
        for value in values.values():
            entry = json_object(value)
            if entry is None:
                continue
            engine, node = entry.get("e"), entry.get("n")
            if isinstance(engine, str) and isinstance(node, str):
                held[(engine, node)] = str(entry.get("r") or "cordoned by a peer")
        for engine, book in self.books.items():
            for node in book.ids() - {n for e, n in held if e == engine}:
                cordon = book.of_id(node)
                if cordon is not None and cordon.origin == "peer":
                    self.apply(Kind.UNCORDON, engine, node, {})
        for (engine, node), reason in held.items():
            known = self.books.get(engine)
            if known is not None and node not in known.ids():
                self.apply(Kind.CORDON, engine, node, {"r": reason})

    def reshare(self) -> None:
        """The store is back: share this proxy's own cordons again (set while it was away)."""
        for engine, book in self.books.items():
            for node in book.ids():
                cordon = book.of_id(node)
                if cordon is not None and cordon.origin == "control":
                    self._changed(engine, node, cordon)


class SharedAffinity(_Sharing):
    """Affinity entries: sealed digest → node id, with the idle TTL as the key's TTL."""

    def __init__(
        self,
        reactor: IProxyReactor,
        codec: Codec,
        write: Write,
        up: Callable[[], bool],
        *,
        seal: Callable[[bytes], bytes],
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self._seal = seal
        self.tables: dict[str, SharedAffinityTable] = {}

    def table(self, engine: str, max_entries: int, idle_ttl: float) -> SharedAffinityTable:
        table = SharedAffinityTable(
            self._reactor,
            max_entries,
            idle_ttl,
            seal=self._seal,
            share=lambda model, digest, node: self.share(engine, model, digest, node),
        )
        self.tables[engine] = table
        return table

    def share(self, engine: str, model: str, digest: bytes, node_id: str) -> None:
        table = self.tables.get(engine)
        ttl = int((table.idle_ttl if table is not None else 300.0) * 1000)
        hexdigest = digest.hex()
        model_hash = hashlib.sha256(model.encode()).hexdigest()[:16]
        key = self._codec.key(Kind.AFFINITY, engine, model_hash, hexdigest)
        value = json.dumps({"e": engine, "m": model, "d": hexdigest, "n": node_id})
        message = self._codec.message(Kind.AFFINITY, e=engine, m=model, d=hexdigest, n=node_id)

        def send() -> list[Op]:
            return [("set", key, value, ttl), ("pub", message)]

        self._write(send)

    def apply(self, engine: str, node: str, message: Mapping[str, Any]) -> bool:
        table = self.tables.get(engine)
        model, digest = message.get("m"), message.get("d")
        if table is None or not isinstance(model, str) or not isinstance(digest, str):
            return False
        table.learn(model, bytes.fromhex(digest), node)
        return True

    def resync(self, value: Any) -> None:
        entry = json_object(value)
        if entry is None:
            return
        engine, model, digest, node = (entry.get(k) for k in ("e", "m", "d", "n"))
        table = self.tables.get(engine) if isinstance(engine, str) else None
        if table is None or not all(isinstance(v, str) for v in (model, digest, node)):
            return
        try:
            table.learn(str(model), bytes.fromhex(str(digest)), str(node))
        except ValueError:
            return


class SharedSessions(_Sharing):
    """Sessions' homes (docs/behaviour.md §5.3): sealed (key name, model, name) digest → node and
    depth, with the session idle time as the key's TTL. Only with a ``seal`` (the fleet's
    secret): a session name never leaves a proxy but as a keyed hash, and without one each
    proxy keeps its sessions to itself."""

    def __init__(
        self,
        reactor: IProxyReactor,
        codec: Codec,
        write: Write,
        up: Callable[[], bool],
        *,
        seal: Callable[[bytes], bytes] | None,
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self._seal = seal
        self.tables: dict[str, SharedSessionTable] = {}

    def table(self, engine: str, per_key: int, idle_ttl: float) -> SessionTable:
        if self._seal is None:
            return SessionTable(self._reactor, per_key, idle_ttl)
        table = SharedSessionTable(
            self._reactor,
            per_key,
            idle_ttl,
            seal=self._seal,
            share=lambda session, home: self.share(engine, session, home),
        )
        self.tables[engine] = table
        return table

    def share(self, engine: str, session: Session, home: Home) -> None:
        table = self.tables.get(engine)
        ttl = int((table.idle_ttl if table is not None else 3600.0) * 1000)
        digest = session.digest.hex()
        fields = {"e": engine, "k": session.key, "m": session.model, "d": digest}
        key = self._codec.key(Kind.SESSION, engine, digest)
        value = json.dumps({**fields, "n": home.node, "l": home.depth})
        message = self._codec.message(Kind.SESSION, **fields, n=home.node, l=home.depth)
        self._write(lambda: [("set", key, value, ttl), ("pub", message)])

    def apply(self, engine: str, node: str, message: Mapping[str, Any]) -> bool:
        table = self.tables.get(engine)
        found = _sealed_session(message)
        depth = message.get("l")
        if table is None or found is None or isinstance(depth, bool) or not isinstance(depth, int):
            return False
        table.learn(found, node, max(depth, 0))
        return True

    def resync(self, value: Any) -> None:
        entry = json_object(value)
        engine, node = (entry.get("e"), entry.get("n")) if entry is not None else (None, None)
        if entry is not None and isinstance(engine, str) and isinstance(node, str):
            self.apply(engine, node, entry)


def _sealed_session(message: Mapping[str, Any]) -> Session | None:
    """The sealed session a peer's message names, or None."""
    key, model, digest = (message.get(k) for k in ("k", "m", "d"))
    if not (isinstance(key, str) and isinstance(model, str) and isinstance(digest, str)):
        return None
    try:
        return Session(key, model, bytes.fromhex(digest))
    except ValueError:
        return None


class SharedReservations(_Sharing):
    """Reservation counts: each proxy publishes its own (a key refreshed by the heartbeat, with
    :data:`RESERVATION_TTL`), and the ledger adds the peers' to its own."""

    def __init__(
        self, reactor: IProxyReactor, codec: Codec, write: Write, up: Callable[[], bool]
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self._ledger: ReservationLedger | None = None
        self._timer: IDelayedCall | None = None
        self._published: dict[str, int] = {}
        self._peers: dict[str, tuple[dict[str, int], float]] = {}

    def bind(self, ledger: ReservationLedger) -> None:
        self._ledger = ledger
        ledger.on_change = self._changed

    def _changed(self) -> None:
        # Coalesce a burst (a move is a release and a reserve; a short request reserves and
        # releases) into one publish, off the request path and well inside the 100 ms bound.
        if self._timer is None:
            self._timer = self._reactor.callLater(RESERVATION_BATCH, self._send_changed)

    def _send_changed(self) -> None:
        """A burst's end: publish this proxy's counts when they changed since the last publish."""
        self.stop()
        counts = self._counts()
        if counts != self._published:
            self._send(counts)

    def refresh(self) -> None:
        """Publish this proxy's counts, changed or not (the heartbeat: it keeps the stored key and
        the peers' view alive)."""
        self.stop()
        self._send(self._counts())

    def _counts(self) -> dict[str, int]:
        return self._ledger.local_counts() if self._ledger is not None else {}

    def _send(self, counts: dict[str, int]) -> None:
        self._published = counts
        key = self._codec.key(Kind.RESERVATIONS, self._codec.proxy_id)
        value = json.dumps(counts, separators=(",", ":"))
        message = self._codec.message(Kind.RESERVATIONS, c=counts)
        if not self._up():
            return  # resent whole on reconnect: a queued count would only be stale

        def send() -> list[Op]:
            return [("set", key, value, int(RESERVATION_TTL * 1000)), ("pub", message)]

        self._write(send)

    def beat(self) -> None:
        """The heartbeat: forget peers not heard from for a while, refresh our own counts."""
        now = self._reactor.seconds()
        for proxy, (_counts, heard) in list(self._peers.items()):
            if now - heard > RESERVATION_TTL:
                del self._peers[proxy]
                self.settle()
        if self._ledger is not None and self._ledger.local_counts():
            self.refresh()

    def apply(self, message: Mapping[str, Any]) -> bool:
        counts, origin = message.get("c"), message.get("o")
        if not isinstance(origin, str) or not isinstance(counts, dict):
            return False
        clean = {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
        self._peers[origin] = (clean, self._reactor.seconds())
        self.settle()
        return True

    def resync(self, proxy: str, value: Any, now: float) -> None:
        counts = json_object(value)
        if proxy != self._codec.proxy_id and counts is not None:
            clean = {str(n): c for n, c in counts.items() if isinstance(c, int)}
            self._peers[proxy] = (clean, now)

    def forget_peers(self) -> None:
        self._peers.clear()
        self.settle()

    def settle(self) -> None:
        """Give the ledger the sum of the peers' counts."""
        if self._ledger is None:
            return
        total: dict[str, int] = {}
        for counts, _heard in self._peers.values():
            for node, n in counts.items():
                total[node] = total.get(node, 0) + n
        self._ledger.set_peers(total)

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


class SharedProgress(_Sharing):
    """When each node last sent body bytes: told at most once per node per :data:`PROGRESS_EVERY`
    seconds, and when a peer last saw some (local clock)."""

    def __init__(
        self, reactor: IProxyReactor, codec: Codec, write: Write, up: Callable[[], bool]
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self._sent: dict[tuple[str, str], float] = {}
        self._heard: dict[tuple[str, str], float] = {}

    def note(self, engine: str, node_id: str) -> None:
        now = self._reactor.seconds()
        last = self._sent.get((engine, node_id))
        if last is not None and now - last < PROGRESS_EVERY:
            return
        self._sent[(engine, node_id)] = now
        message = self._codec.message(Kind.PROGRESS, e=engine, n=node_id)
        self._write(lambda: [("pub", message)])

    def peer(self, engine: str, node_id: str) -> float | None:
        return self._heard.get((engine, node_id))

    def apply(self, engine: str, node: str) -> bool:
        self._heard[(engine, node)] = self._reactor.seconds()
        return True


_SAMPLE_FIELDS = (
    ("d", "decode_rate"),
    ("p", "prefill_rate"),
    ("l", "load_seconds"),
    ("c", "completion_tokens"),
    ("k", "concurrency"),
    ("b", "bytes_per_token"),
)


class SharedSpeeds(_Sharing):
    """The samples each proxy learns of a node's speed (docs/behaviour.md §15.1): published as
    they are learnt and folded in by every peer, so each proxy's estimate is made from the whole
    fleet's samples (samples, not estimates, are merged)."""

    def __init__(
        self, reactor: IProxyReactor, codec: Codec, write: Write, up: Callable[[], bool]
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self._books: dict[str, SpeedBook] = {}

    def bind(self, engine: str, book: SpeedBook) -> None:
        self._books[engine] = book
        book.subscribe(lambda node, model, sample: self._share(engine, node, model, sample))

    def _share(self, engine: str, node: str, model: str, sample: Sample) -> None:
        figures = {
            short: getattr(sample, name)
            for short, name in _SAMPLE_FIELDS
            if getattr(sample, name) is not None
        }
        message = self._codec.message(Kind.SPEED, e=engine, n=node, m=model, s=figures)
        self._write(lambda: [("pub", message)])

    def apply(self, engine: str, node: str, message: Mapping[str, Any]) -> bool:
        book, model, figures = self._books.get(engine), message.get("m"), message.get("s")
        if book is None or not isinstance(model, str) or not isinstance(figures, dict):
            return False
        values: dict[str, float] = {}
        for short, name in _SAMPLE_FIELDS:
            value = figures.get(short)
            if isinstance(value, bool) or not isinstance(value, int | float | None):
                return False
            if value is not None:
                if not math.isfinite(value):  # JSON's Infinity and NaN: no figure
                    return False
                values[name] = float(value)
        tokens = values.get("completion_tokens")
        sample = Sample(
            values.get("decode_rate"),
            values.get("prefill_rate"),
            values.get("load_seconds"),
            None if tokens is None else int(tokens),
            values.get("concurrency", 1.0),
            values.get("bytes_per_token"),
        )
        book.fold(node, model, sample)
        return True


class SharedCaches(_Sharing):
    """Which conversations each node's prompt cache was sent last (docs/behaviour.md §5.3.1,
    §6.6): each proxy publishes every conversation it notes — the node, the model, its root
    sealed as affinity digests are (HMAC-SHA-256 under the fleet secret, else the digest itself)
    and the tokens the engine holds for it — and folds in its peers', so every proxy counts the
    whole fleet's conversations on a node. Published, not stored; a capacity each proxy corrects
    from the answers it relays is not shared."""

    def __init__(
        self,
        reactor: IProxyReactor,
        codec: Codec,
        write: Write,
        up: Callable[[], bool],
        *,
        seal: Callable[[bytes], bytes],
    ) -> None:
        super().__init__(reactor, codec, write, up)
        self._seal = seal
        self._books: dict[str, CacheBook] = {}

    def bind(self, engine: str, book: CacheBook) -> None:
        self._books[engine] = book
        book.shared(self._seal, lambda *noted: self._share(engine, *noted))

    def _share(self, engine: str, node: str, model: str, root: bytes, tokens: int | None) -> None:
        held = {} if tokens is None else {"h": tokens}
        message = self._codec.message(Kind.CACHE, e=engine, n=node, m=model, r=root.hex(), **held)
        self._write(lambda: [("pub", message)])

    def apply(self, engine: str, node: str, message: Mapping[str, Any]) -> bool:
        book, model, root = self._books.get(engine), message.get("m"), message.get("r")
        tokens = message.get("h")
        if book is None or not isinstance(model, str) or not isinstance(root, str):
            return False
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0
        ):
            return False
        try:
            sealed = bytes.fromhex(root)
        except ValueError:
            return False
        book.fold(node, model, sealed, tokens)
        return True


class SharedStallTracker(StallTracker):
    """A facade's cooldowns, shared with the fleet: a local stall is stored and published, a
    peer's is applied with ``origin="peer"``, and a success here ends the cooldown everywhere.
    The expiry probe runs on the proxy that saw the stall; its renewal is shared like a stall and
    its answer like a success, so the peers holding the cooldown follow it."""

    def __init__(
        self,
        clock: IProxyReactor,
        period: float,
        on_change: CooldownListener | None,
        *,
        store: SharedCooldowns,
        engine: str,
        probe: Probe | None = None,
        probe_bound: float = 0.0,
    ) -> None:
        super().__init__(clock, period, on_change, probe=probe, probe_bound=probe_bound)
        self._store = store
        self._engine = engine

    def cool(self, node_id: str, reason: str) -> None:
        cooldown = self.install(node_id, reason, self.period)
        self._store.share_cooldown(self._engine, cooldown)

    def clear(self, node_id: str) -> None:
        # Only a node that is cooling (here, so in the fleet) costs a write.
        if self.end(node_id, "success"):
            self._store.share_clear(self._engine, node_id)

    def renewed(self, cooldown: Cooldown) -> None:
        self._store.share_cooldown(self._engine, cooldown)

    def answered(self, node_id: str) -> None:
        if self.end(node_id, "expired"):
            self._store.share_clear(self._engine, node_id)

    def apply_peer(self, node_id: str, reason: str, period: float) -> None:
        """Another proxy saw ``node_id`` stall: cool it here for what is left of its cooldown."""
        self.install(node_id, reason, period, origin="peer")


@define(on_setattr=setters.NO_OP)
class SharedAffinityTable(AffinityTable):
    """A facade's affinity table whose entries the fleet shares.

    Entries are keyed by *sealed* digests (HMAC-SHA-256 under the fleet secret, or the docs/behaviour.md §5.3
    digest itself without one), so a peer's entry and a local lookup meet in the same table.
    """

    _seal: Callable[[bytes], bytes] = field(kw_only=True, default=lambda d: d)
    _share: Callable[[str, bytes, str], None] | None = field(kw_only=True, default=None)

    def _sealed(self, key: AffinityKey) -> AffinityKey:
        seal = self._seal
        return AffinityKey(key.model, seal(key.key), tuple(seal(d) for d in key.lookups))

    def match(self, key: AffinityKey) -> Match | None:
        return super().match(self._sealed(key))

    def holds(self, key: AffinityKey) -> bool:
        return super().holds(self._sealed(key))

    def record(self, key: AffinityKey, node_id: str) -> None:
        sealed = self._sealed(key)
        super().record(sealed, node_id)
        if self._share is not None:
            self._share(sealed.model, sealed.key, node_id)

    def learn(self, model: str, sealed_digest: bytes, node_id: str) -> None:
        """A peer's entry (already sealed): remember it here without sharing it again."""
        super().record(AffinityKey(model, sealed_digest, (sealed_digest,)), node_id)


@define(on_setattr=setters.NO_OP)
class SharedSessionTable(SessionTable):
    """A facade's session table whose homes the fleet shares, keyed by *sealed* session
    digests (HMAC-SHA-256 under the fleet secret), so a peer's home and a local lookup meet."""

    _seal: Callable[[bytes], bytes] = field(kw_only=True)
    _share: Callable[[Session, Home], None] | None = field(kw_only=True, default=None)

    def _sealed(self, session: Session) -> Session:
        return Session(session.key, session.model, self._seal(session.digest))

    def home(self, session: Session) -> Home | None:
        return super().home(self._sealed(session))

    def record(self, session: Session, node_id: str, depth: int) -> None:
        sealed = self._sealed(session)
        super().record(sealed, node_id, depth)
        if self._share is not None:
            self._share(sealed, Home(node_id, depth))

    def learn(self, sealed: Session, node_id: str, depth: int) -> None:
        """A peer's home (its session already sealed): kept here without sharing it again."""
        super().record(sealed, node_id, depth)


UsageRow = tuple[int, str, str, str, int, int, int, int, int, int, int]
"""``(minute, key, model, node, requests, errors, prompt, completion, unknown, cached,
unknown_cached)``, as :mod:`nvpair_tw.usage` counts them."""


class SharedUsage(_Sharing):
    """Usage sums of the whole fleet (docs/behaviour.md §12.4): one hash per UTC hour
    (``NS:usage:HOUR``, the hour as minutes since the epoch), a field per (minute, key, model,
    node, count) holding the fleet's sum, added with ``HINCRBY`` and expiring after the retention.
    Nothing is published: a report reads the hashes."""

    def add(self, rows: Sequence[UsageRow], ttl: float) -> None:
        """Add these minutes to the fleet's sums (fire and forget, through the batched writer)."""
        if not rows:
            return
        rows = list(rows)

        def ops() -> list[Op]:
            made: list[Op] = []
            for minute, key, model, node, *counts in rows:
                hour = self._codec.key(Kind.USAGE, str(minute - minute % 60))
                # The hash lives for the retention after its last minute.
                ttl_ms = int((ttl + (minute - minute % 60 + 60) * 60 - self._wall()) * 1000)
                for metric, n in zip(USAGE_METRICS, counts, strict=True):
                    if n:
                        name = json.dumps([minute, key, model, node, metric])
                        made.append(("hincr", hour, name, n, max(ttl_ms, 1000)))
            return made

        self._write(ops)

    def _wall(self) -> float:
        return self._reactor.seconds()

    async def rows(self, dialer: Any, cmd: Any, since: int, until: int) -> list[UsageRow]:
        """Every minute from ``since`` to ``until`` the fleet summed; malformed fields ignored."""
        hours = range(since - since % 60, until + 1, 60)
        asked = [dialer.timed(cmd.hgetall(self._codec.key(Kind.USAGE, str(h))), cmd) for h in hours]
        found: dict[tuple[int, str, str, str], list[int]] = {}
        for pending in asked:
            try:
                stored = await pending
            except Exception as error:  # a wrong type: that hour is skipped
                if type(error).__name__ != "ResponseError":
                    raise
                continue
            for name, value in (stored or {}).items():
                parsed = _usage_field(name, value)
                if parsed is None:
                    continue
                (bucket, metric), n = parsed
                if since <= bucket[0] <= until:
                    found.setdefault(bucket, [0] * len(USAGE_METRICS))[metric] += n
        return [(*bucket, *counts) for bucket, counts in found.items()]  # type: ignore[misc]


def _usage_field(
    field: Any, value: Any
) -> tuple[tuple[tuple[int, str, str, str], int], int] | None:
    """One hash field as ((minute, key, model, node), metric index) and its count, or None."""
    try:
        minute, key, model, node, metric = json.loads(field)
        n = int(value)
    except (ValueError, TypeError):
        return None
    if not (
        isinstance(minute, int)
        and all(isinstance(v, str) for v in (key, model, node))
        and metric in USAGE_METRICS
    ):
        return None
    return ((minute, key, model, node), USAGE_METRICS.index(metric)), n
