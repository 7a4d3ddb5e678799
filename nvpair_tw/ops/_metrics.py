# -*- test-case-name: tests.ops.test_metrics -*-
"""Prometheus metrics of one proxy process (docs/behaviour.md §10).

Counters and histograms are fed by a bus subscriber, so they count exactly what the events say
(``proxy/request``, ``workload:*``, ``node/cooldown``; the groups of `nvpair_tw.ops._counters`).
Gauges (in-flight workloads, inventory age, residency, cooldowns, slots in use, queue depth,
reservations) and the per-node busy-wait counter
(live, so a long wait shows while it lasts) are read from the runtime at scrape time by a custom
collector. Every ``ProxyMetrics`` has its own ``CollectorRegistry``: the global default registry is
never touched, so several runtimes (tests, several processes' worth of facades) never collide.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import (
    Event,
    NodeCooldown,
    NodeCooldownEnded,
    ProxyRequest,
    Subscription,
    WorkloadCompleted,
    WorkloadErrored,
)
from nvpair_tw.ops._counters import (
    LlmCounters,
    NodeCounters,
    RequestCounters,
)
from nvpair_tw.ops._queues import queue_metrics
from nvpair_tw.runtime import Runtime

__all__ = ["ProxyMetrics", "RuntimeCollector"]

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


class ProxyMetrics:
    """The metrics of one runtime: bus-fed counters plus the scrape-time collector."""

    def __init__(self, runtime: Runtime) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = RequestCounters(self.registry, runtime.facades)
        self._llm = LlmCounters(self.registry, runtime.facades)
        self._nodes = NodeCounters(self.registry)
        self.registry.register(RuntimeCollector(runtime))
        self._subscription: Subscription | None = runtime.shared.bus.subscribe(
            self._observe,
            name="metrics",
            kinds=(
                ProxyRequest,
                NodeCooldown,
                NodeCooldownEnded,
                WorkloadCompleted,
                WorkloadErrored,
            ),
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stop counting (unsubscribe from the bus)."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def _observe(self, event: Event) -> None:
        match event.value:
            case ProxyRequest() as record:
                self._requests.count(record)
                if record.model is not None:
                    self._llm.count(record)
            case NodeCooldown() as cooled:
                self._nodes.cooled(cooled)
            case NodeCooldownEnded() as ended:
                self._nodes.cooldown_ended(ended)
            case WorkloadCompleted(workload=info) | WorkloadErrored(workload=info):
                self._nodes.workload_ended(info)
