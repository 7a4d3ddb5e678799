# -*- test-case-name: tests.corridor.test_state -*-
"""The state a facade keeps, and the state every facade of one process shares.

:class:`FacadeState` holds one engine's per-facade state (the pin, stall cooldowns, the affinity table,
the node directory and inventory, the admission slots and queue, the progress record) and answers
the two questions the corridor asks of it: which nodes
may serve a model (docs/behaviour.md §4.2) and in what order (§5). :class:`Shared` is what every
facade of a process shares: the clock, the upstream clients, the reservation ledger, the workloads
and the event bus.
"""

from __future__ import annotations

from typing import Protocol

from attrs import Factory, define, field
from treq.client import HTTPClient
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory

from nvpair_tw.core import EngineProfile, Settings
from nvpair_tw.corridor._aggregate import FirstSeen
from nvpair_tw.corridor._collector import QuietCollector
from nvpair_tw.corridor._revocation import Holdings
from nvpair_tw.corridor._tunnel import TunnelBook
from nvpair_tw.corridor._workloads import WorkloadRegistry
from nvpair_tw.events import EventBus
from nvpair_tw.inbound import CorsPolicy, IngressPolicy, RateLimiter
from nvpair_tw.nodes import Node, NodeDirectory, SelfGuard
from nvpair_tw.selection import (
    Admission,
    AffinityTable,
    CacheBook,
    CordonBook,
    FlightBook,
    InventoryBook,
    IStallTracker,
    ProgressBook,
    ReservationLedger,
    RouteGaps,
    SessionTable,
    SpeedBook,
    order_candidates,
)
from nvpair_tw.upstream import UpstreamClient

__all__ = ["FacadeState", "RequestTracer", "Shared"]


class RequestTracer(Protocol):
    """The corridor's tracing hook (docs/behaviour.md §12.5): told of every request as it starts."""

    def begin(self, request_id: str, name: str, started: float, headers: Headers) -> None:
        """The request ``request_id`` (``METHOD path``) began at clock seconds ``started``;
        ``headers`` are the client's, which the tracer may rewrite (``traceparent``,
        ``tracestate``) before anything is forwarded."""


@define
class Shared:
    """What every facade of one process shares: clock, clients, ledger, workloads, events."""

    clock: IReactorTime
    client: UpstreamClient
    http: HTTPClient
    ledger: ReservationLedger
    workloads: WorkloadRegistry
    bus: EventBus
    settings: Settings
    ingress: IngressPolicy | None = None
    cors: CorsPolicy | None = None
    """Browser origins allowed to call the facades (§13.4); ``None``: CORS is off."""
    draining: bool = False
    endpoints: IAgentEndpointFactory | None = None
    """How nodes are dialled outside the agent (WebSocket tunnels, §2.1)."""
    tunnels: TunnelBook = Factory(
        lambda self: TunnelBook(self.settings.max_tunnels), takes_self=True
    )
    """The open WebSocket tunnels and their cap."""
    tracer: RequestTracer | None = None
    """Traces (``--otlp-endpoint``, §12.5); ``None``: tracing is off and costs nothing."""
    limiter: RateLimiter = Factory(lambda self: RateLimiter(self.clock), takes_self=True)
    """The named keys' rate and concurrency limits (§12.1); fleet-wide with ``--state``."""
    self_guard: SelfGuard | None = None
    """This process's own listening addresses: a node that is this process is never a candidate
    (§14.3); ``None``: no such check (tests that build no runtime)."""
    collector: QuietCollector = Factory(QuietCollector)
    """Keeps the cyclic collector off large bodies' objects (§14.1)."""
    holdings: Holdings = Factory(lambda self: Holdings(self.tunnels), takes_self=True)
    """What each named key holds (queued requests, tunnels), ended when the key is revoked
    (§14.2)."""


@define
class FacadeState:
    """The state of one engine's facade."""

    profile: EngineProfile
    shared: Shared
    directory: NodeDirectory
    inventory: InventoryBook
    stalls: IStallTracker
    affinity: AffinityTable
    admission: Admission
    pin: str | None = None
    first_body_gate: bool = True
    progress: ProgressBook = Factory(lambda self: ProgressBook(self.shared.clock), takes_self=True)
    """When each node last delivered inference body bytes, and its busy waits (§6.4)."""
    cordons: CordonBook = Factory(lambda self: CordonBook(self.shared.clock), takes_self=True)
    """The nodes an operator took out of service for new work (§13.1)."""
    first_seen: FirstSeen = Factory(FirstSeen)
    """When the facade's model lists first showed each model (``modified_at``, §17.6)."""
    speeds: SpeedBook = Factory(
        lambda self: SpeedBook(self.shared.clock, self._speed_seed), takes_self=True
    )
    """What each node has shown it can do, per model (§15.1)."""
    flights: FlightBook = Factory(
        lambda self: FlightBook(self.shared.clock, self.progress), takes_self=True
    )
    """The attempts in flight on each node and their predicted ends (§15.2)."""
    gaps: RouteGaps = Factory(
        lambda self: RouteGaps(self.profile.name, self.inventory.reach), takes_self=True
    )
    """The routes each node was found to lack, until its next restart is seen (§17.3)."""
    sessions: SessionTable = Factory(lambda self: self._session_table(), takes_self=True)
    """Where each caller's named sessions were last served (§5.3)."""
    caches: CacheBook = Factory(lambda self: self._cache_book(), takes_self=True)
    """The conversations each node's prompt cache can still hold, and how many (§5.3.1)."""
    responses: AffinityTable = Factory(lambda self: self._response_table(), takes_self=True)
    """Which node holds each stored ``/v1/responses`` answer, and whose it is (§2.1): kept as long
    as a session (``--session-ttl``), since a conversation continued from a stored response comes
    back after the agent's pauses like a session does."""
    engine: str = field(init=False)
    """The facade's engine (its profile's name): read by every record and event, so kept."""

    def _cache_book(self) -> CacheBook:
        def configured(node_id: str) -> int | None:
            node = self.directory.get(node_id)
            return None if node is None else node.cache_conversations

        clock, ttl = self.shared.clock, self.shared.settings.affinity_ttl
        return CacheBook(clock, configured, self.inventory.reported_slots, ttl)

    def _response_table(self) -> AffinityTable:
        settings = self.shared.settings
        return AffinityTable(self.shared.clock, settings.affinity_max_entries, settings.session_ttl)

    def _session_table(self) -> SessionTable:
        settings = self.shared.settings
        return SessionTable(self.shared.clock, settings.affinity_max_entries, settings.session_ttl)

    def _speed_seed(self, node_id: str) -> float | None:
        node = self.directory.get(node_id)
        return None if node is None else node.speed

    @engine.default
    def _engine(self) -> str:
        return self.profile.name

    def serving(self) -> list[Node]:
        """The nodes that take new work: every node but the cordoned ones (§13.1) and any that
        is this process itself (§14.3)."""
        guard = self.shared.self_guard
        return [
            n
            for n in self.directory.nodes()
            if not self.cordons.cordoned(n) and (guard is None or not guard.excludes(n.url))
        ]

    def eligible(self, model: str | None) -> list[Node]:
        """Nodes allowed for a request: the serving owners of the model (docs/behaviour.md §4.2),
        or every serving node."""
        nodes = self.serving()
        if not model:
            return nodes
        return [n for n in nodes if self.inventory.advertises(n.id, model)]

    def cordoned_owners(self, model: str | None) -> list[Node]:
        """The cordoned nodes that would be eligible if they were not cordoned."""
        nodes = [n for n in self.directory.nodes() if self.cordons.cordoned(n)]
        if not model:
            return nodes
        return [n for n in nodes if self.inventory.advertises(n.id, model)]

    def order(
        self,
        nodes: list[Node],
        *,
        head_selection: bool,
        affinity_hint: str | None = None,
        model: str | None = None,
    ) -> tuple[list[Node], bool]:
        """Candidate order for ``nodes`` (§5): (ordered nodes, whether the warm node was promoted).

        With head selection and a ``model``, the nodes where the model is known resident (§6.4)
        win ties on load.
        """
        by_id = {n.id: n for n in nodes}
        resident = (
            {n.id for n in nodes if self.inventory.resident(n.id, model)}
            if head_selection and model
            else set()
        )
        ordering = order_candidates(
            [n.id for n in nodes],
            pin=self.pin or None,
            snapshot=self.shared.ledger.in_force,
            ledger_view=self.shared.ledger,
            affinity_hint=affinity_hint,
            head_selection=head_selection,
            cooling=self.stalls.cooling(),
            resident=resident,
        )
        return [by_id[i] for i in ordering.nodes], ordering.affinity
