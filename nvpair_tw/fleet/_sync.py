# -*- test-case-name: tests.fleet.test_sharing,tests.fleet.test_store -*-
"""Every kind of state a fleet shares (docs/behaviour.md §6.6), as one: the peers' messages applied
to it, and the store's keys read back into it when the store comes (back) up.

:class:`~nvpair_tw.fleet._store.FleetStore` owns the connections and tells this what they bring; a
wrong type, a missing or flushed key or a garbled message is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import define, field
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.fleet._session import Dialer, read_all
from nvpair_tw.fleet._sharing import (
    SharedAffinity,
    SharedCaches,
    SharedCooldowns,
    SharedCordons,
    SharedProgress,
    SharedReservations,
    SharedSessions,
    SharedSpeeds,
    SharedUsage,
    Write,
)
from nvpair_tw.fleet._wire import Codec, Kind, Message, sealer
from nvpair_tw.logs import LevelledLogger

__all__ = ["FleetSharing"]

log = LevelledLogger(namespace=__name__)


@define(eq=False)
class FleetSharing:
    """Every kind of state a fleet shares, and how what peers say reaches it."""

    _reactor: IProxyReactor
    _codec: Codec
    cooldowns: SharedCooldowns
    cordons: SharedCordons
    affinity: SharedAffinity
    sessions: SharedSessions
    reservations: SharedReservations
    progress: SharedProgress
    speeds: SharedSpeeds
    usage: SharedUsage
    caches: SharedCaches
    applied: int = field(default=0, init=False)
    """How many peers' messages were applied here."""
    ignored: int = field(default=0, init=False)
    """How many were not: not JSON, of a kind or for a facade this proxy does not know, or
    without what their kind needs."""

    @classmethod
    def made(
        cls,
        reactor: IProxyReactor,
        codec: Codec,
        write: Write,
        up: Callable[[], bool],
        secret: bytes | None,
    ) -> FleetSharing:
        """Each kind given the clock, the codec, the writer and whether the store is up now;
        affinity digests and session names sealed under ``secret`` (HMAC-SHA-256) when there is
        one (sessions are shared only then)."""
        parts = (reactor, codec, write, up)
        return cls(
            reactor,
            codec,
            SharedCooldowns(*parts),
            SharedCordons(*parts),
            SharedAffinity(*parts, seal=sealer(secret)),
            SharedSessions(*parts, seal=None if secret is None else sealer(secret)),
            SharedReservations(*parts),
            SharedProgress(*parts),
            SharedSpeeds(*parts),
            SharedUsage(*parts),
            SharedCaches(*parts, seal=sealer(secret)),
        )

    def on_message(self, raw: bytes | str) -> None:
        """A published change: apply it locally. A message that is not JSON, or not of a kind
        this proxy knows, is ignored (and counted); a failure applying one is a bug of the
        proxy's, logged with its traceback, and costs only that message."""
        try:
            messages = self._codec.decode(raw)
        except (ValueError, RecursionError):  # not JSON (a hand-written or foreign message)
            self.ignored += 1
            return
        for message in messages:
            try:
                if self._apply(message):
                    self.applied += 1
                else:
                    self.ignored += 1
            except Exception:
                log.bug(
                    "fleet store: a peer's {kind} message could not be applied",
                    Failure(),
                    kind=message.kind.value,
                )

    async def resync(self, dialer: Dialer, cmd: Any) -> None:
        """Read every shared key into local state (this proxy's own is written once up)."""
        values, ttls = await read_all(dialer, cmd, self._codec.prefix(Kind.COOL))
        now = self._reactor.seconds()
        for key, ttl in ttls.items():
            self.cooldowns.resync(values.get(key), ttl)
        cordons = self._codec.prefix(Kind.CORDON)
        self.cordons.resync({k: v for k, v in values.items() if k.startswith(cordons)})
        affinity = self._codec.prefix(Kind.AFFINITY)
        sessions = self._codec.prefix(Kind.SESSION)
        reservations = self._codec.prefix(Kind.RESERVATIONS)
        for key, value in values.items():
            if key.startswith(affinity):
                self.affinity.resync(value)
            elif key.startswith(sessions):
                self.sessions.resync(value)
            elif key.startswith(reservations):
                self.reservations.resync(key[len(reservations) :], value, now)
        self.reservations.settle()

    def reshare(self) -> None:
        """The store is up again: share the cooldowns and cordons this proxy saw meanwhile."""
        self.cooldowns.reshare()
        self.cordons.reshare()

    def _apply(self, message: Message) -> bool:
        """Apply one peer's message to the kind of state it changes; whether it was applied."""
        kind, fields = message.kind, message.fields
        if kind is Kind.RESERVATIONS:
            return self.reservations.apply(fields)
        engine, node = message.text("e"), message.text("n")
        if engine is None or node is None:
            return False
        if kind in (Kind.COOL, Kind.CLEAR):
            return self.cooldowns.apply(kind, engine, node, fields)
        if kind in (Kind.CORDON, Kind.UNCORDON):
            return self.cordons.apply(kind, engine, node, fields)
        if kind is Kind.AFFINITY:
            return self.affinity.apply(engine, node, fields)
        if kind is Kind.SESSION:
            return self.sessions.apply(engine, node, fields)
        if kind is Kind.SPEED:
            return self.speeds.apply(engine, node, fields)
        if kind is Kind.CACHE:
            return self.caches.apply(engine, node, fields)
        return kind is Kind.PROGRESS and self.progress.apply(engine, node)
