# -*- test-case-name: tests.runtime.test_process -*-
"""Assembles one process: the shared pool and clients, the ledger, workloads, events, and a facade per engine.

Nothing here touches the global reactor: ``tap.makeService`` passes it in, tests pass the one they run on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from attrs import Factory, define, field
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, gatherResults
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IAgent

from nvpair_tw.core import ENGINES, IProxyReactor, Settings
from nvpair_tw.corridor import FacadeResource, FacadeState, Shared, WorkloadRegistry
from nvpair_tw.events import (
    EventBus,
    NodeCooldown,
    NodeCooldownEnded,
    NodeCordon,
    NodeUncordon,
    log_events,
)
from nvpair_tw.fleet import FleetStore, StateConfig
from nvpair_tw.inbound import (
    CorsPolicy,
    IngressConfig,
    IngressPolicy,
    LimitedSite,
    RateLimiter,
    parse_ingress,
)
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node, NodeDirectory, NodeTrustPolicy, SelfGuard
from nvpair_tw.selection import (
    PROBE_BOUND,
    Admission,
    AffinityTable,
    Cooldown,
    CooldownListener,
    Cordon,
    CordonBook,
    CordonListener,
    InventoryBook,
    IStallTracker,
    ReservationLedger,
    StallTracker,
    expiry_probe,
    slot_limit,
)
from nvpair_tw.upstream import (
    NodeAgent,
    NodeEndpointFactory,
    UpstreamClient,
    make_http_client,
    make_pool,
)
from nvpair_tw.usage import DEFAULT_RETENTION, UsageRecorder

if TYPE_CHECKING:
    from nvpair_tw.traces import RequestTracing

__all__ = ["Runtime", "StallTrackerFactory", "build_runtime", "upstream_agent"]

log = LevelledLogger(namespace=__name__)

REMOTE_SHARE_DIVISOR = 4
"""With keys, 1/4 of each facade's ``--max-connections`` is kept for remote callers: loopback
and unix-socket peers together hold at most the other three quarters (docs/behaviour.md §14.4)."""
RESPONSES_TABLE = "/responses"
"""Appended to an engine's name, the fleet's name for its response table (docs/behaviour.md
§2.1): its entries travel as affinity entries of that name, kept for the session time."""
SELF_CHECK_INTERVAL = 10.0
"""Seconds between two resolutions of the node names that could be this process (§14.3)."""

StallTrackerFactory = Callable[[str, CooldownListener], IStallTracker]


@define
class Runtime:
    """Everything one proxy process runs, with start and stop."""

    reactor: IProxyReactor
    settings: Settings
    shared: Shared
    facades: dict[str, FacadeState]
    pool: HTTPConnectionPool
    sites: dict[str, LimitedSite] = field(factory=dict)
    fleet: FleetStore | None = None
    native: NodeAgent | None = None
    """The upstream client when ``--upstream-client native`` (``pool`` then holds nothing)."""
    tracing: RequestTracing | None = None
    """The request spans when ``--otlp-endpoint`` is given (docs/behaviour.md §12.5)."""
    usage: UsageRecorder | None = None
    """The usage history (docs/behaviour.md §12.4)."""
    self_guard: SelfGuard = field(
        default=Factory(lambda runtime: SelfGuard(runtime.reactor), takes_self=True), kw_only=True
    )
    """This process's listening addresses, for the self-loop check (docs/behaviour.md §14.3)."""
    facade_urls: dict[str, str] = field(factory=dict, kw_only=True)
    """Where clients reach each facade (by engine), once it listens: its
    :func:`~nvpair_tw.runtime._endpoints.client_url` (the status page shows it)."""

    def __attrs_post_init__(self) -> None:
        self.shared.self_guard = self.self_guard

    def start(self) -> None:
        """Load node files, start watching and polling (and connecting to the fleet store)."""
        if self.fleet is not None:
            self.fleet.start()
        if self.usage is not None:
            self.usage.start().addErrback(
                lambda failure: log.failure("usage history did not start", failure)
            )
        for facade in self.facades.values():
            facade.directory.start()
            facade.inventory.start()
        if self.shared.ingress is not None:
            self.shared.ingress.start()
        self.self_guard.watch(self._node_urls, self.reactor, SELF_CHECK_INTERVAL)

    def _node_urls(self) -> list[str]:
        """Every node URL of every facade (for the self check, §14.3)."""
        return [n.url for facade in self.facades.values() for n in facade.directory.nodes()]

    def stop(self) -> Deferred[None]:
        """Stop timers and polls; close open tunnels and idle upstream connections."""
        self.self_guard.stop()
        self.shared.tunnels.close_all()
        for facade in self.facades.values():
            facade.inventory.stop()
            facade.directory.stop()
            stop = getattr(facade.stalls, "stop", None)
            if stop is not None:
                stop()
        if self.shared.ingress is not None:
            self.shared.ingress.stop()
        closed = self.close_idle()
        if self.usage is not None:
            # The last minutes are written (and handed to the fleet store) before it closes.
            saved = self.usage.stop().addErrback(
                lambda failure: log.failure("usage history did not stop cleanly", failure)
            )
            closed = gatherResults([closed, saved]).addCallback(lambda _: None)
        if self.fleet is not None:
            fleet = self.fleet
            closed.addCallback(lambda _: fleet.stop())
        if self.tracing is not None:
            tracing, reactor = self.tracing, self.reactor
            closed.addCallback(lambda _: tracing.shutdown(reactor))
        return closed

    def close_idle(self) -> Deferred[None]:
        """Close the idle upstream connections (of whichever client the process uses)."""
        closing: list[Deferred[None]] = [self.pool.closeCachedConnections()]
        if self.native is not None:
            closing.append(self.native.close())
        return gatherResults(closing).addCallback(lambda _: None)

    def _remote_share(self) -> int:
        """The connections of a facade loopback may not take (docs/behaviour.md §14.4): a
        quarter of ``--max-connections`` when keys let remote callers in, else none."""
        ingress = self.shared.ingress
        if ingress is None or not ingress.keys_configured:
            return 0
        return self.settings.max_connections // REMOTE_SHARE_DIVISOR

    def site_for(self, engine: str) -> LimitedSite:
        """The limited Site of one facade (built once)."""
        if engine not in self.sites:
            settings = self.settings
            self.sites[engine] = FacadeResource(self.facades[engine]).site(
                clock=self.reactor,
                max_body_size=settings.max_body_size,
                max_connections=settings.max_connections,
                max_connections_per_source=settings.max_connections_per_source,
                remote_share=self._remote_share(),
            )
        return self.sites[engine]


def build_runtime(
    reactor: IProxyReactor,
    settings: Settings,
    engines: Sequence[str],
    *,
    nodes: Mapping[str, Sequence[Node]] | None = None,
    nodes_file: str | None = None,
    ingress: IngressConfig | None = None,
    environ: Mapping[str, str] | None = None,
    keys_file: str | None = None,
    allow_hosts: Sequence[str] = (),
    stall_tracker: StallTrackerFactory | None = None,
    client: UpstreamClient | None = None,
    http: HTTPClient | None = None,
    state: StateConfig | None = None,
    usage_db: str | None = None,
    usage_retention: float = DEFAULT_RETENTION,
) -> Runtime:
    """Build every facade of one process around one pool, one ledger, one workload registry, one bus.

    ``ingress`` is the parsed gate configuration (loopback only when absent); ``environ`` is a
    shorthand for tests, parsed with :func:`~nvpair_tw.inbound._ingress.parse_ingress` (not both),
    with ``keys_file`` (``--keys``, §12.1) and ``allow_hosts`` (``--allow-host``, §14.2) if given.
    ``client`` (attempts) and ``http`` (a treq client for model lists and inventory polls) default
    to clients over the process's pool; ``nvpair_tw.testing.MemoryCluster`` injects in-memory ones.
    ``state`` (``--state``) shares cooldowns, affinity and reservations with a fleet (docs/behaviour.md §6.6).
    ``usage_db`` is the usage database (``None``: usage in memory only) and ``usage_retention``
    how long its minutes are kept (docs/behaviour.md §12.4).
    """
    ingress = _ingress_config(ingress, environ, keys_file, allow_hosts)
    pool = make_pool(reactor)
    facades: dict[str, FacadeState] = {}
    # One endpoint factory for inference and control-plane reads alike: the same per-node TLS trust
    # (read from every facade's nodes when a connection starts) and the same IP-literal dialling.
    trust = NodeTrustPolicy(lambda: [n for f in facades.values() for n in f.directory.nodes()])
    endpoints = NodeEndpointFactory(reactor, settings.connect_timeout, tls=trust)
    agent = upstream_agent(settings.upstream_client, reactor, endpoints, pool)
    client = client if client is not None else UpstreamClient.from_agent(agent, reactor)
    http = http if http is not None else make_http_client(agent)
    shared = _shared(reactor, settings, client, http, ingress)
    shared.endpoints = endpoints
    fleet = _fleet(reactor, state, shared)
    for engine in engines:
        flag_nodes = list((nodes or {}).get(engine, ()))
        facades[engine] = _facade(
            engine, shared, reactor, flag_nodes, nodes_file, stall_tracker, fleet
        )
    return Runtime(
        reactor,
        settings,
        shared,
        facades,
        pool,
        fleet=fleet,
        native=agent if isinstance(agent, NodeAgent) else None,
        tracing=_tracing(reactor, settings, shared),
        usage=UsageRecorder(
            reactor, shared.bus, path=usage_db, retention=usage_retention, fleet=fleet
        ),
    )


def _ingress_config(
    ingress: IngressConfig | None,
    environ: Mapping[str, str] | None,
    keys_file: str | None,
    allow_hosts: Sequence[str],
) -> IngressConfig | None:
    """The gate's configuration: ``ingress`` as given, or ``environ`` (a test shorthand) parsed
    with ``keys_file`` and ``allow_hosts``; ``TypeError`` for a mix of the two."""
    if environ is not None:
        if ingress is not None:
            raise TypeError("give build_runtime ingress or environ, not both")
        return parse_ingress(environ, keys_file=keys_file, allow_hosts=allow_hosts)
    if keys_file is not None or allow_hosts:
        raise TypeError("build_runtime's keys_file and allow_hosts go with environ")
    return ingress


def _fleet(reactor: IProxyReactor, state: StateConfig | None, shared: Shared) -> FleetStore | None:
    """The fleet store of ``--state`` (docs/behaviour.md §6.6), bound to the ledger, and the
    keys' limits counted fleet-wide through it (§12.1); ``None`` without ``--state``."""
    if state is None:
        return None
    fleet = FleetStore(reactor, state)
    fleet.bind_ledger(shared.ledger)
    shared.limiter = RateLimiter(reactor, fleet.limit_counters())
    return fleet


def _tracing(reactor: IProxyReactor, settings: Settings, shared: Shared) -> RequestTracing | None:
    """The request spans of ``--otlp-endpoint`` (docs/behaviour.md §12.5), imported only then."""
    if not settings.otlp_endpoint:
        return None
    from nvpair_tw.traces import otlp_tracing

    tracing = otlp_tracing(reactor, shared.bus, settings.otlp_endpoint)
    shared.tracer = tracing
    return tracing


def upstream_agent(
    kind: str, reactor: IProxyReactor, endpoints: NodeEndpointFactory, pool: HTTPConnectionPool
) -> IAgent:
    """The agent of the upstream hop (inference and control-plane reads): ``native`` is
    :class:`~nvpair_tw.upstream._agent.NodeAgent` (``pool`` unused), ``twisted`` is Twisted's ``Agent``
    over ``pool`` (docs/architecture.md, "The upstream hop")."""
    if kind == "native":  # the same keep-alive policy as the pool's (upstream.make_pool)
        return NodeAgent(
            reactor,
            endpoints,
            max_idle_per_host=pool.maxPersistentPerHost,
            idle_seconds=pool.cachedConnectionTimeout,
        )
    if kind == "twisted":
        agent: IAgent = Agent.usingEndpointFactory(reactor, endpoints, pool=pool)
        return agent
    raise ValueError(f"unknown upstream client {kind!r}")


def _shared(
    reactor: IProxyReactor,
    settings: Settings,
    client: UpstreamClient,
    http: HTTPClient,
    ingress: IngressConfig | None,
) -> Shared:
    """What every facade of the process shares; the bus logs every event."""
    bus = EventBus(reactor)
    log_events(bus, LevelledLogger(namespace="nvpair_tw.events"))
    shared = Shared(
        clock=reactor,
        client=client,
        http=http,
        ledger=ReservationLedger(),
        workloads=WorkloadRegistry(reactor, bus),
        bus=bus,
        settings=settings,
        ingress=IngressPolicy.from_config(
            ingress if ingress is not None else IngressConfig(),
            reactor,
            cors_origins=settings.cors_origins,
        ),
        cors=CorsPolicy.of(settings.cors_origins),
    )
    # A key removed or re-scoped loses its queued requests and tunnels (§14.2).
    assert shared.ingress is not None
    shared.ingress.watch_changes(shared.holdings.revoke)
    return shared


def _facade(
    engine: str,
    shared: Shared,
    reactor: IProxyReactor,
    flag_nodes: list[Node],
    nodes_file: str | None,
    stall_tracker: StallTrackerFactory | None,
    fleet: FleetStore | None,
) -> FacadeState:
    """One engine's facade: its nodes, inventory, admission, stall tracker, affinity and session
    tables."""
    settings = shared.settings
    profile = ENGINES[engine]
    directory = NodeDirectory(profile, reactor, flag_nodes=flag_nodes, nodes_file=nodes_file)
    inventory = InventoryBook(
        profile,
        directory,
        shared.http,
        reactor,
        interval=settings.inventory_interval,
        timeout=settings.inventory_timeout,
    )
    cordons = CordonBook(reactor, _cordon_announcer(shared.bus, engine))
    admission = Admission(
        reactor,
        slot_limit(directory.get, settings.default_slots, inventory.reported_slots),
        settings.queue_size,
        settings.queue_timeout,
        accepts=lambda node_id: not cordons.blocks(directory.get(node_id)),
        reserved=lambda node_id: getattr(directory.get(node_id), "slots_reserved", 0),
        batch_max_wait=settings.batch_max_wait,
    )
    directory.subscribe(admission.wake)  # raised slots or a new node: bind who waits
    cordons.subscribe(lambda _node, cordon: None if cordon else admission.wake())
    facade = FacadeState(
        profile=profile,
        shared=shared,
        directory=directory,
        inventory=inventory,
        stalls=_stall_tracker(engine, shared, reactor, stall_tracker, fleet, directory),
        affinity=(
            fleet.affinity_table(engine, settings.affinity_max_entries, settings.affinity_ttl)
            if fleet is not None
            else AffinityTable(reactor, settings.affinity_max_entries, settings.affinity_ttl)
        ),
        admission=admission,
        cordons=cordons,
    )
    if fleet is not None:
        n, ttl = settings.affinity_max_entries, settings.session_ttl
        facade.sessions = fleet.session_table(engine, n, ttl)
        facade.responses = fleet.affinity_table(engine + RESPONSES_TABLE, n, ttl)
        _share_progress(facade, fleet, engine)
        fleet.bind_cordons(engine, cordons)
        fleet.bind_books(engine, facade.speeds, facade.caches)
    return facade


def _cordon_announcer(bus: EventBus, engine: str) -> CordonListener:
    """``node/cordon`` and ``node/uncordon`` on the bus (control clients, logs, the status page)."""

    def announce(node_id: str, cordon: Cordon | None) -> None:
        if cordon is None:
            bus.publish(NodeUncordon(engine, node_id))
        else:
            since = None if cordon.since is None else int(cordon.since * 1000)
            bus.publish(NodeCordon(engine, node_id, cordon.reason, since, cordon.origin))

    return announce


def _stall_tracker(
    engine: str,
    shared: Shared,
    reactor: IProxyReactor,
    factory: StallTrackerFactory | None,
    fleet: FleetStore | None,
    directory: NodeDirectory,
) -> IStallTracker:
    """A given factory's tracker, else the fleet's shared one, else a local one; the last two ask
    a node at its cooldown's expiry whether it answers before letting it go (§6.3)."""
    announce = _cooldown_announcer(shared.bus, engine)
    if factory is not None:
        return factory(engine, announce)
    settings = shared.settings
    bound = min(settings.response_header_timeout, PROBE_BOUND)
    probe = expiry_probe(ENGINES[engine], directory, shared.http, reactor, bound)
    if fleet is not None:
        return fleet.stall_tracker(
            engine, settings.cooldown, announce, probe=probe, probe_bound=bound
        )
    return StallTracker(reactor, settings.cooldown, announce, probe=probe, probe_bound=bound)


def _share_progress(facade: FacadeState, fleet: FleetStore, engine: str) -> None:
    """A peer's body bytes from a node count as progress here, and ours are told to the fleet."""
    facade.progress.shared(
        lambda node_id: fleet.note_progress(engine, node_id),
        lambda node_id: fleet.peer_progress(engine, node_id),
    )


def _cooldown_announcer(bus: EventBus, engine: str) -> CooldownListener:
    def announce(node_id: str, cooldown: Cooldown | None, reason: str) -> None:
        if cooldown is not None:
            bus.publish(
                NodeCooldown(
                    engine,
                    node_id,
                    reason,
                    int(cooldown.until * 1000),
                    # still no answer at the previous expiry (docs/behaviour.md §6.3)
                    renewed=cooldown.renewed,
                    # a peer of the fleet stalled (docs/behaviour.md §6.6)
                    origin=None if cooldown.origin == "local" else cooldown.origin,
                )
            )
        else:
            bus.publish(NodeCooldownEnded(engine, node_id, reason))

    return announce
