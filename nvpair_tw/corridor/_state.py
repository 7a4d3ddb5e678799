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

from attrs import Factory, define, frozen
from treq.client import HTTPClient
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory

from nvpair_tw.core import EngineProfile, Settings
from nvpair_tw.corridor._aggregate import FirstSeen
from nvpair_tw.corridor._collector import QuietCollector
from nvpair_tw.corridor._revocation import Holdings
from nvpair_tw.corridor._tunnel import TunnelBook
from nvpair_tw.corridor._workloads import RequestRecord, WorkloadRegistry
from nvpair_tw.events import EventBus
from nvpair_tw.inbound import CorsPolicy, IngressPolicy, RateLimiter
from nvpair_tw.nodes import Node, NodeDirectory, SelfGuard
from nvpair_tw.selection import (
    Admission,
    AffinityTable,
    Answer,
    CordonBook,
    FlightBook,
    InventoryBook,
    IStallTracker,
    Landing,
    Load,
    Patience,
    ProgressBook,
    RequestSize,
    ReservationLedger,
    SpeedBook,
    Start,
    Trip,
    fit,
    order_candidates,
    patience,
    predict_all,
    sample_of,
    slot_wait,
)
from nvpair_tw.upstream import UpstreamClient

__all__ = ["FacadeState", "Ranked", "RequestTracer", "Shared"]


class RequestTracer(Protocol):
    """The corridor's tracing hook (docs/behaviour.md §12.5): told of every request as it starts."""

    def begin(self, record: RequestRecord, headers: Headers) -> None:
        """``record`` has just begun; ``headers`` are the client's, which the tracer may rewrite
        (``traceparent``, ``tracestate``) before anything is forwarded."""


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


@frozen
class Ranked:
    """Candidates in order of their predicted time to the last token (docs/behaviour.md §15.2),
    whether the warm node heads them, and each node's prediction in seconds."""

    nodes: list[Node]
    affinity: bool
    predicted: dict[str, float]
    context_fit: bool = True
    """False when no candidate's known context holds the request: the largest is used (§15.3)."""
    patience: Patience | None = None
    """How long a queued request waits for its best node while a worse one frees (§15.2)."""


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
    flights: FlightBook = Factory(lambda self: FlightBook(self.shared.clock), takes_self=True)
    """The attempts in flight on each node and their predicted ends (§15.2)."""

    def _speed_seed(self, node_id: str) -> float | None:
        node = self.directory.get(node_id)
        return None if node is None else node.speed

    @property
    def engine(self) -> str:
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

    def rank(
        self, nodes: list[Node], model: str, size: RequestSize, affinity_hint: str | None
    ) -> Ranked:
        """The order of an inference request for ``model`` (§15.2): only the nodes it fits
        (§15.3), an eligible pin first, then the least predicted time to the last token, cooling
        nodes last."""
        ledger = self.shared.ledger
        loads: dict[str, Load] = {}

        def load(node_id: str) -> Load:
            # The fleet's reservations (§6.6) count too: a peer's requests share the node. Read
            # once per node and request (the prediction and the patience both ask).
            known = loads.get(node_id)
            if known is not None:
                return known
            here = max(self.flights.in_flight(node_id), self.admission.slots_in_use(node_id))
            busy = max(here, ledger.reservations(node_id))
            known = loads[node_id] = Load(
                busy + ledger.pending(node_id),
                self.admission.slots(node_id),
                self.flights.remaining(node_id) + self.admission.queued_for(node_id),
                self.inventory.resident(node_id, model),
            )
            return known

        ids = [n.id for n in nodes]
        # A request that sets its own num_ctx is served with it wherever it goes (§15.3).
        known = (
            (lambda n: None)
            if size.num_ctx
            else (lambda n: self.inventory.context_length(n, model))
        )
        fitted = fit(ids, size.needed, known)
        ids = fitted.nodes
        predicted = predict_all(ids, model, size, self.speeds, load, affinity_hint)
        ordering = order_candidates(
            ids,
            pin=self.pin or None,
            snapshot=ledger.in_force,
            ledger_view=ledger,
            affinity_hint=affinity_hint,
            head_selection=True,
            cooling=self.stalls.cooling(),
            predicted=predicted,
        )
        by_id = {n.id: n for n in nodes}
        nodes = [by_id[i] for i in ordering.nodes]
        waiting = None
        if len(ids) > 1:  # with one candidate there is no better node to wait for
            waits = {n: slot_wait(load(n)) for n in ids}
            waiting = patience(list(ordering.nodes), predicted, waits, self.shared.clock.seconds())
        return Ranked(nodes, ordering.affinity, predicted, fitted.fits, waiting)

    def trip(
        self,
        model: str | None,
        predicted: dict[str, float],
        warm: str | None,
        waiting: Patience | None = None,
    ) -> Trip:
        """The flights of one request (§15.2): how each attempt starts is read at its dispatch;
        each counts as work ahead its prediction from dispatch (``waiting``'s, when it has one)."""

        def start(node_id: str) -> Start:
            if node_id == warm:
                return Start.CACHED
            if model and self.inventory.resident(node_id, model) is False:
                return Start.LOADED
            return Start.PLAIN

        # A request naming no model is not counted as work on a node (a fresh book keeps it).
        book = self.flights if model else FlightBook(self.shared.clock)
        return Trip(book, predicted, start, None if waiting is None else waiting.service)

    def learn(self, landing: Landing, model: str, answer: Answer) -> None:
        """Fold one complete answer into the serving node's rates (§15.1)."""
        node_id = landing.node_id
        prefill = self.speeds.rates(node_id, model).prefill
        sample = sample_of(answer, landing.start, landing.concurrency, prefill)
        self.speeds.learn(node_id, model, sample)
