# -*- test-case-name: tests.test_metrics -*-
"""Prometheus metrics of one proxy process (SPEC §10).

Counters and histograms are fed by a bus subscriber, so they count exactly what the events say
(``proxy/request``, ``workload:*``, ``node/cooldown``). Gauges (in-flight workloads, inventory age,
residency, cooldowns, slots in use, queue depth, reservations) are read from the runtime at scrape
time by a custom collector. Every ``ProxyMetrics`` has its own ``CollectorRegistry``: the global
default registry is never touched, so several runtimes (tests, several processes' worth of facades)
never collide.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from nvpair_tw.affinity import CHAT_PATHS, COMPLETION_PATHS
from nvpair_tw.events import (
    NODE_COOLDOWN,
    NODE_COOLDOWN_ENDED,
    PROXY_REQUEST,
    WORKLOAD_COMPLETED,
    WORKLOAD_ERRORED,
    Event,
    Subscription,
)
from nvpair_tw.runtime import Runtime

__all__ = ["STALL_OUTCOMES", "ProxyMetrics", "RuntimeCollector"]

STALL_OUTCOMES = frozenset({"stall", "first-body-timeout"})
"""Attempt outcomes that are stalls (SPEC §6.1): both cool the node."""

AFFINITY_PATHS = CHAT_PATHS | COMPLETION_PATHS

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFB_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _text(value: Any, default: str = "none") -> str:
    return default if value is None else str(value)


class RuntimeCollector(Collector):
    """Gauges computed from the runtime's live state at each scrape."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime
        now = runtime.reactor.seconds()
        labels = ["engine", "node"]
        inflight = GaugeMetricFamily(
            "nvpair_inflight_workloads", "Workloads running now, by serving node.", labels=labels
        )
        known = GaugeMetricFamily(
            "nvpair_inventory_known", "1 if the node's model list is known.", labels=labels
        )
        models = GaugeMetricFamily(
            "nvpair_inventory_models", "Models the node advertises.", labels=labels
        )
        age = GaugeMetricFamily(
            "nvpair_inventory_age_seconds",
            "Seconds since the node's model list was last polled successfully.",
            labels=labels,
        )
        cooling = GaugeMetricFamily(
            "nvpair_node_cooling", "1 while the node is in a stall cooldown.", labels=labels
        )
        remaining = GaugeMetricFamily(
            "nvpair_cooldown_remaining_seconds",
            "Seconds left of the node's stall cooldown (0 when ready).",
            labels=labels,
        )
        residency = GaugeMetricFamily(
            "nvpair_residency_known",
            "1 if the node's last residency poll answered (which models are loaded is known).",
            labels=labels,
        )
        loaded = GaugeMetricFamily(
            "nvpair_model_loaded",
            "1 for each model the node reports loaded (only while its residency is known).",
            labels=[*labels, "model"],
        )
        in_use = GaugeMetricFamily(
            "nvpair_slots_in_use",
            "Requests of this facade holding a slot on the node now (docs/behaviour.md 6.4).",
            labels=labels,
        )
        slots = GaugeMetricFamily(
            "nvpair_slots", "The node's slots in this facade (0 = unlimited).", labels=labels
        )
        queue = GaugeMetricFamily(
            "nvpair_queue_depth",
            "Inference requests waiting in the facade's queue for a free slot.",
            labels=["engine"],
        )
        reservations = GaugeMetricFamily(
            "nvpair_reservations",
            "Live reservations per node (process-wide ledger).",
            labels=["node"],
        )
        running = Tally((w.engine, w.scheduled_on or "") for w in runtime.shared.workloads.live())
        ledger = runtime.shared.ledger
        node_ids: set[str] = set()
        for engine, facade in runtime.facades.items():
            queue.add_metric([engine], facade.admission.queue_depth)
            for node in facade.directory.nodes():
                node_ids.add(node.id)
                key = [engine, node.id]
                inflight.add_metric(key, running.pop((engine, node.id), 0))
                known.add_metric(key, 1 if facade.inventory.known(node.id) else 0)
                models.add_metric(key, len(facade.inventory.models(node.id)))
                last = facade.inventory.last_success(node.id)
                if last is not None:
                    age.add_metric(key, max(0.0, now - last))
                cooldown = facade.stalls.cooldown(node.id)
                cooling.add_metric(key, 0 if cooldown is None else 1)
                remaining.add_metric(key, 0 if cooldown is None else max(0.0, cooldown.until - now))
                names = facade.inventory.loaded(node.id)
                residency.add_metric(key, 0 if names is None else 1)
                for name in sorted(names or ()):
                    loaded.add_metric([*key, name], 1)
                in_use.add_metric(key, facade.admission.slots_in_use(node.id))
                slots.add_metric(key, facade.admission.slots(node.id))
        for (engine, node_id), count in running.items():
            inflight.add_metric([engine, node_id], count)  # not dispatched yet, or node removed
        for node_id in sorted(node_ids):
            reservations.add_metric([node_id], ledger.reservations(node_id))
        yield from (inflight, known, models, age, cooling, remaining, residency, loaded)
        yield from (in_use, slots, queue)
        yield reservations


class ProxyMetrics:
    """The metrics of one runtime: bus-fed counters plus the scrape-time collector."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            "nvpair_requests",
            "Requests answered, by engine, route kind and status.",
            ["engine", "route", "status"],
            registry=registry,
        )
        self.attempts = Counter(
            "nvpair_attempts",
            "Upstream attempts by outcome.",
            ["engine", "node", "outcome"],
            registry=registry,
        )
        self.failovers = Counter(
            "nvpair_failovers",
            "Requests that needed more than one attempt.",
            ["engine"],
            registry=registry,
        )
        self.stalls = Counter(
            "nvpair_stalls",
            "Attempts that stalled (no headers in time, or first-body timeout).",
            ["engine", "node"],
            registry=registry,
        )
        self.cooldowns = Counter(
            "nvpair_cooldowns",
            "Stall cooldowns started.",
            ["engine", "node"],
            registry=registry,
        )
        self.cooldowns_ended = Counter(
            "nvpair_cooldowns_ended",
            "Stall cooldowns ended, by why (expired or success).",
            ["engine", "node", "why"],
            registry=registry,
        )
        self.workloads = Counter(
            "nvpair_workloads",
            "Workloads ended, by final state.",
            ["engine", "state"],
            registry=registry,
        )
        self.affinity_hits = Counter(
            "nvpair_affinity_hits",
            "Requests served by their warm (prefix-affinity) node.",
            ["engine"],
            registry=registry,
        )
        self.affinity_requests = Counter(
            "nvpair_affinity_requests",
            "Inference requests on affinity routes that reached a node.",
            ["engine"],
            registry=registry,
        )
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
        registry.register(RuntimeCollector(runtime))
        self._subscription: Subscription | None = runtime.shared.bus.subscribe(
            self._observe, name="metrics"
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
        payload = event.payload
        if event.name == PROXY_REQUEST:
            self._request(payload)
        elif event.name == NODE_COOLDOWN:
            self.cooldowns.labels(_text(payload.get("engine")), _text(payload.get("node_id"))).inc()
        elif event.name == NODE_COOLDOWN_ENDED:
            self.cooldowns_ended.labels(
                _text(payload.get("engine")),
                _text(payload.get("node_id")),
                _text(payload.get("why")),
            ).inc()
        elif event.name in (WORKLOAD_COMPLETED, WORKLOAD_ERRORED):
            info = payload.get("workload")
            if isinstance(info, Mapping):
                self.workloads.labels(_text(info.get("engine")), _text(info.get("state"))).inc()

    def _request(self, payload: Mapping[str, Any]) -> None:
        engine = _text(payload.get("engine"))
        method = _text(payload.get("method"), "")
        path = _text(payload.get("path"), "")
        facade = self._runtime.facades.get(engine)
        route = facade.profile.classify(method.encode(), path).value if facade else "unknown"
        self.requests.labels(engine, route, _text(payload.get("status"))).inc()
        attempts = payload.get("attempts")
        attempts = attempts if isinstance(attempts, list) else []
        for attempt in attempts:
            node = _text(attempt.get("node_id"))
            outcome = _text(attempt.get("outcome"))
            self.attempts.labels(engine, node, outcome).inc()
            if outcome in STALL_OUTCOMES:
                self.stalls.labels(engine, node).inc()
        if len(attempts) > 1:
            self.failovers.labels(engine).inc()
        if route == "inference" and path in AFFINITY_PATHS and payload.get("node_id"):
            self.affinity_requests.labels(engine).inc()
            if payload.get("cache_affinity") is True:
                self.affinity_hits.labels(engine).inc()
        duration = payload.get("duration_ms")
        if isinstance(duration, int | float):
            self.duration.labels(engine, route).observe(duration / 1000)
        ttfb = payload.get("ttfb_ms")
        if isinstance(ttfb, int | float):
            self.ttfb.labels(engine, route).observe(ttfb / 1000)
