# -*- test-case-name: tests.ops.test_metrics -*-
"""Prometheus metrics of one proxy process (docs/behaviour.md §10).

Counters and histograms are fed by a bus subscriber, so they count exactly what the events say
(``proxy/request``, ``workload:*``, ``node/cooldown``). Gauges (in-flight workloads, inventory age,
residency, cooldowns, slots in use, queue depth, reservations) and the per-node busy-wait counter
(live, so a long wait shows while it lasts) are read from the runtime at scrape time by a custom
collector. Every ``ProxyMetrics`` has its own ``CollectorRegistry``: the global default registry is
never touched, so several runtimes (tests, several processes' worth of facades) never collide.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import (
    NODE_COOLDOWN,
    NODE_COOLDOWN_ENDED,
    PROXY_REQUEST,
    WORKLOAD_COMPLETED,
    WORKLOAD_ERRORED,
    Event,
    Subscription,
)
from nvpair_tw.ops._queues import queue_metrics
from nvpair_tw.runtime import Runtime
from nvpair_tw.selection import CHAT_PATHS, COMPLETION_PATHS

__all__ = ["STALL_OUTCOMES", "ProxyMetrics", "RuntimeCollector"]

STALL_OUTCOMES = frozenset({"stall", "first-body-timeout"})
"""Attempt outcomes that are stalls (docs/behaviour.md §6.1): both cool the node."""

AFFINITY_PATHS = CHAT_PATHS | COMPLETION_PATHS

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFB_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
RATE_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2, 4, 8)
OTHER = "other"
"""The label of a model no node or catalogue knows."""


def _text(value: Any, default: str = "none") -> str:
    return default if value is None else str(value)


NodeValue = Callable[[FacadeState, str, float], float | None]
"""One per-node gauge's value: (facade, node id, now) -> value, or None for no sample."""


def _age(facade: FacadeState, node_id: str, now: float) -> float | None:
    last = facade.inventory.last_success(node_id)
    return None if last is None else max(0.0, now - last)


def _remaining(facade: FacadeState, node_id: str, now: float) -> float:
    cooldown = facade.stalls.cooldown(node_id)
    return 0.0 if cooldown is None else max(0.0, cooldown.until - now)


_NODE_GAUGES: tuple[tuple[str, str, NodeValue], ...] = (
    (
        "nvpair_inventory_known",
        "1 if the node's model list is known.",
        lambda f, n, now: 1 if f.inventory.known(n) else 0,
    ),
    (
        "nvpair_inventory_models",
        "Models the node advertises.",
        lambda f, n, now: len(f.inventory.models(n)),
    ),
    (
        "nvpair_inventory_age_seconds",
        "Seconds since the node's model list was last polled successfully.",
        _age,
    ),
    (
        "nvpair_node_cooling",
        "1 while the node is in a stall cooldown.",
        lambda f, n, now: 0 if f.stalls.cooldown(n) is None else 1,
    ),
    (
        "nvpair_node_cordoned",
        "1 while the node is cordoned: it takes no new work (docs/behaviour.md 13.1).",
        lambda f, n, now: 1 if f.cordons.blocks(f.directory.get(n)) else 0,
    ),
    (
        "nvpair_cooldown_remaining_seconds",
        "Seconds left of the node's stall cooldown (0 when ready).",
        _remaining,
    ),
    (
        "nvpair_residency_known",
        "1 if the node's last residency poll answered (which models are loaded is known).",
        lambda f, n, now: 0 if f.inventory.loaded(n) is None else 1,
    ),
    (
        "nvpair_slots_in_use",
        "Requests of this facade holding a slot on the node now (docs/behaviour.md 6.4).",
        lambda f, n, now: f.admission.slots_in_use(n),
    ),
    (
        "nvpair_open_tunnels",
        "WebSocket tunnels open to the node through this facade.",
        lambda f, n, now: f.shared.tunnels.count(f.engine, n),
    ),
    (
        "nvpair_slots",
        "The node's slots in this facade (0 = unlimited).",
        lambda f, n, now: f.admission.slots(n),
    ),
)
_LABELS = ["engine", "node"]


class RuntimeCollector(Collector):
    """Gauges computed from the runtime's live state at each scrape."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime
        now = runtime.reactor.seconds()
        gauges = [(GaugeMetricFamily(n, h, labels=_LABELS), value) for n, h, value in _NODE_GAUGES]
        kinds = GaugeMetricFamily(
            "nvpair_node_info",
            "1 for each node, labelled with the engine it runs (its kind, docs/behaviour.md 11.1).",
            labels=[*_LABELS, "kind"],
        )
        loaded = GaugeMetricFamily(
            "nvpair_model_loaded",
            "1 for each model the node reports loaded (only while its residency is known).",
            labels=[*_LABELS, "model"],
        )
        busy = CounterMetricFamily(
            "nvpair_busy_waits",
            "Header-deadline periods waited on the node because it showed progress (not stalls).",
            labels=_LABELS,
        )
        queue = GaugeMetricFamily(
            "nvpair_queue_depth",
            "Inference requests waiting in the facade's queue for a free slot.",
            labels=["engine"],
        )
        node_ids: set[str] = set()
        for engine, facade in runtime.facades.items():
            queue.add_metric([engine], facade.admission.queue_depth)
            for node in facade.directory.nodes():
                node_ids.add(node.id)
                key = [engine, node.id]
                for family, value in gauges:
                    sample = value(facade, node.id, now)
                    if sample is not None:
                        family.add_metric(key, sample)
                for name in sorted(facade.inventory.loaded(node.id) or ()):
                    loaded.add_metric([*key, name], 1)
                busy.add_metric(key, facade.progress.busy_waits(node.id))
                kinds.add_metric([*key, node.kind_of(facade.profile).name], 1)
        yield self._inflight()
        yield from (family for family, _ in gauges)
        yield from (kinds, loaded, queue, busy, self._reservations(node_ids))
        yield from self._store()
        yield from self._traces()
        yield from self._speeds()
        yield from queue_metrics(runtime.facades)

    def _speeds(self) -> Iterator[Metric]:
        """The learnt rates per (node, model) (docs/behaviour.md §15.1)."""
        decode = GaugeMetricFamily(
            "nvpair_node_decode_tokens_per_second",
            "Learnt decode throughput of a node for a model (one request alone), per §15.1.",
            labels=[*_LABELS, "model"],
        )
        prefill = GaugeMetricFamily(
            "nvpair_node_prefill_tokens_per_second",
            "Learnt prompt tokens per second of a node for a model, per §15.1.",
            labels=[*_LABELS, "model"],
        )
        for engine, facade in self._runtime.facades.items():
            for node_id, model, rates in facade.speeds.known():
                decode.add_metric([engine, node_id, model], rates.decode)
                prefill.add_metric([engine, node_id, model], rates.prefill)
        yield from (decode, prefill)

    def _inflight(self) -> Metric:
        """Running workloads by serving node (an empty node: not dispatched yet, or removed)."""
        runtime = self._runtime
        inflight = GaugeMetricFamily(
            "nvpair_inflight_workloads", "Workloads running now, by serving node.", labels=_LABELS
        )
        running = Tally((w.engine, w.scheduled_on or "") for w in runtime.shared.workloads.live())
        for engine, facade in runtime.facades.items():
            for node in facade.directory.nodes():
                inflight.add_metric([engine, node.id], running.pop((engine, node.id), 0))
        for (engine, node_id), count in running.items():
            inflight.add_metric([engine, node_id], count)
        return inflight

    def _reservations(self, node_ids: set[str]) -> Metric:
        ledger = self._runtime.shared.ledger
        reservations = GaugeMetricFamily(
            "nvpair_reservations",
            "Live reservations per node (process-wide ledger).",
            labels=["node"],
        )
        for node_id in sorted(node_ids):
            reservations.add_metric([node_id], ledger.reservations(node_id))
        return reservations

    def _store(self) -> Iterator[Metric]:
        """With ``--state``: whether the fleet store is connected, and the writes it dropped."""
        fleet = self._runtime.fleet
        if fleet is None:
            return
        up = GaugeMetricFamily(
            "nvpair_state_store_up",
            "1 while the fleet store (--state) is connected, 0 while the proxy works alone.",
        )
        up.add_metric([], 1.0 if fleet.up else 0.0)
        dropped = GaugeMetricFamily(
            "nvpair_state_dropped_writes",
            "Writes to the fleet store dropped because its bounded queue was full.",
        )
        dropped.add_metric([], float(fleet.dropped))
        yield from (up, dropped)

    def _traces(self) -> Iterator[Metric]:
        """With ``--otlp-endpoint``: the spans exported, and those dropped (§12.5)."""
        tracing = self._runtime.tracing
        if tracing is None:
            return
        exported = CounterMetricFamily(
            "nvpair_trace_spans_exported",
            "Spans the OTLP collector (--otlp-endpoint) accepted.",
        )
        exported.add_metric([], float(tracing.counts.exported))
        dropped = CounterMetricFamily(
            "nvpair_trace_spans_dropped",
            "Spans dropped: the collector did not take them, or the export queue was full.",
        )
        dropped.add_metric([], float(tracing.counts.dropped))
        yield from (exported, dropped)


_Metric = TypeVar("_Metric", Counter, Histogram)


def _counter(
    registry: CollectorRegistry, name: str, documentation: str, labels: list[str]
) -> Counter:
    return Counter(name, documentation, labels, registry=registry)


class _Children:
    """Each metric's child for a set of label values, made once: prometheus_client's ``labels``
    validates and takes a lock on every call, and the bus asks for about ten a request. The kept
    children are those the metrics keep anyway (none is ever removed)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[object, tuple[str, ...]], Any] = {}

    def __call__(self, metric: _Metric, *values: str) -> _Metric:
        key = (metric, values)
        child: _Metric | None = self._kept.get(key)
        if child is None:
            child = self._kept[key] = metric.labels(*values)
        return child


class ProxyMetrics:
    """The metrics of one runtime: bus-fed counters plus the scrape-time collector."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._child = _Children()
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._define_counters(registry)
        self.duration = Histogram(
            "nvpair_request_duration_seconds",
            "Request duration, arrival to last byte.",
            ["engine", "route"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.ttfb = Histogram(
            "nvpair_ttfb_seconds",
            "Time to the first response byte sent to the client.",
            ["engine", "route"],
            buckets=TTFB_BUCKETS,
            registry=registry,
        )
        self._define_llm(registry)
        registry.register(RuntimeCollector(runtime))
        self._subscription: Subscription | None = runtime.shared.bus.subscribe(
            self._observe, name="metrics"
        )

    def _define_counters(self, registry: CollectorRegistry) -> None:
        """The bus-fed counters (requests, attempts, stalls, cooldowns, workloads, affinity)."""
        self.requests = _counter(
            registry,
            "nvpair_requests",
            "Requests answered, by engine, route kind and status.",
            ["engine", "route", "status"],
        )
        self.attempts = _counter(
            registry,
            "nvpair_attempts",
            "Upstream attempts by outcome.",
            ["engine", "node", "outcome"],
        )
        self.failovers = _counter(
            registry, "nvpair_failovers", "Requests that needed more than one attempt.", ["engine"]
        )
        self.stalls = _counter(
            registry,
            "nvpair_stalls",
            "Attempts that stalled (no headers in time, or first-body timeout).",
            ["engine", "node"],
        )
        self.cooldowns = _counter(
            registry, "nvpair_cooldowns", "Stall cooldowns started.", ["engine", "node"]
        )
        self.cooldowns_ended = _counter(
            registry,
            "nvpair_cooldowns_ended",
            "Stall cooldowns ended, by why (expired or success).",
            ["engine", "node", "why"],
        )
        self.workloads = _counter(
            registry, "nvpair_workloads", "Workloads ended, by final state.", ["engine", "state"]
        )
        self.affinity_hits = _counter(
            registry,
            "nvpair_affinity_hits",
            "Requests served by their warm (prefix-affinity) node.",
            ["engine"],
        )
        self.affinity_requests = _counter(
            registry,
            "nvpair_affinity_requests",
            "Inference requests on affinity routes that reached a node.",
            ["engine"],
        )

    def _define_llm(self, registry: CollectorRegistry) -> None:
        """Tokens, time to first token, generation rate and queue time (docs/behaviour.md §12.3)."""
        self.tokens = _counter(
            registry,
            "nvpair_tokens",
            "Tokens the engines counted, by key and type (prompt or completion).",
            ["engine", "node", "model", "key", "type"],
        )
        self.ttft = Histogram(
            "nvpair_time_to_first_token_seconds",
            "Dispatch of the serving attempt to its first content-bearing chunk.",
            ["engine", "node", "model"],
            buckets=TTFB_BUCKETS,
            registry=registry,
        )
        self.rate = Histogram(
            "nvpair_generation_tokens_per_second",
            "Completion tokens per second (the engine's own figure where given).",
            ["engine", "node", "model"],
            buckets=RATE_BUCKETS,
            registry=registry,
        )
        self.prediction = Histogram(
            "nvpair_prediction_error_ratio",
            "Measured time to the last token over the time predicted for the node that served.",
            ["engine"],
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.queue = Histogram(
            "nvpair_queue_seconds",
            "Time inference requests waited in the facade's queue for a slot.",
            ["engine"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )

    def _model_label(self, engine: str, model: str) -> str:
        """The model as a label: a name some node or the catalogue knows, else ``other`` (so a
        client cannot grow the label set by naming models)."""
        facade = self._runtime.facades.get(engine)
        if facade is None:
            return OTHER
        if model in facade.directory.catalogue.by_name or facade.inventory.owners(model):
            return model
        return OTHER

    def _llm(self, engine: str, payload: Mapping[str, Any]) -> None:
        """An inference record's tokens, first token, rate and queue time."""
        queued = payload.get("queued_ms")
        if isinstance(queued, int | float):
            self._child(self.queue, engine).observe(queued / 1000)
        node = payload.get("node_id")
        model = payload.get("model")
        if not isinstance(node, str) or not isinstance(model, str):
            return
        label = self._model_label(engine, model)
        key = _text(payload.get("key"))
        for kind in ("prompt", "completion"):
            count = payload.get(f"{kind}_tokens")
            if isinstance(count, int) and count > 0:
                self._child(self.tokens, engine, node, label, key, kind).inc(count)
        ttft = payload.get("ttft_ms")
        if isinstance(ttft, int | float):
            self._child(self.ttft, engine, node, label).observe(ttft / 1000)
        rate = payload.get("tokens_per_s")
        if isinstance(rate, int | float):
            self._child(self.rate, engine, node, label).observe(rate)
        predicted, measured = payload.get("predicted_ms"), payload.get("measured_ms")
        if isinstance(predicted, int) and isinstance(measured, int) and predicted > 0:
            self._child(self.prediction, engine).observe(measured / predicted)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stop counting (unsubscribe from the bus)."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def _observe(self, event: Event) -> None:
        payload = event.payload
        if event.name == PROXY_REQUEST:
            self._request(payload)
        elif event.name == NODE_COOLDOWN:
            self._child(
                self.cooldowns, _text(payload.get("engine")), _text(payload.get("node_id"))
            ).inc()
        elif event.name == NODE_COOLDOWN_ENDED:
            self._child(
                self.cooldowns_ended,
                _text(payload.get("engine")),
                _text(payload.get("node_id")),
                _text(payload.get("why")),
            ).inc()
        elif event.name in (WORKLOAD_COMPLETED, WORKLOAD_ERRORED):
            info = payload.get("workload")
            if isinstance(info, Mapping):
                self._child(
                    self.workloads, _text(info.get("engine")), _text(info.get("state"))
                ).inc()

    def _request(self, payload: Mapping[str, Any]) -> None:
        engine = _text(payload.get("engine"))
        method = _text(payload.get("method"), "")
        path = _text(payload.get("path"), "")
        facade = self._runtime.facades.get(engine)
        route = facade.profile.classify(method.encode(), path).value if facade else "unknown"
        self._child(self.requests, engine, route, _text(payload.get("status"))).inc()
        attempts = payload.get("attempts")
        attempts = attempts if isinstance(attempts, list) else []
        for attempt in attempts:
            node = _text(attempt.get("node_id"))
            outcome = _text(attempt.get("outcome"))
            self._child(self.attempts, engine, node, outcome).inc()
            if outcome in STALL_OUTCOMES:
                self._child(self.stalls, engine, node).inc()
        if len(attempts) > 1 and not payload.get("fan_out"):  # a fan-out's parts are no failover
            self._child(self.failovers, engine).inc()
        if route == "inference" and path in AFFINITY_PATHS and payload.get("node_id"):
            self._child(self.affinity_requests, engine).inc()
            if payload.get("cache_affinity") is True:
                self._child(self.affinity_hits, engine).inc()
        duration = payload.get("duration_ms")
        if isinstance(duration, int | float):
            self._child(self.duration, engine, route).observe(duration / 1000)
        ttfb = payload.get("ttfb_ms")
        if isinstance(ttfb, int | float):
            self._child(self.ttfb, engine, route).observe(ttfb / 1000)
        if "model" in payload:
            self._llm(engine, payload)
