# -*- test-case-name: tests.ops.test_metrics -*-
"""The bus-fed Prometheus counters and histograms (docs/behaviour.md §10, §12.3).

Each group counts what its events say: `RequestCounters` a ``proxy/request`` record's requests,
attempts, stalls, failovers, affinity and durations; `LlmCounters` an inference record's tokens,
first token, rate, queue time and prediction error; `NodeCounters` the cooldowns and the ends of
workloads. They read the events' typed attributes (`nvpair_tw.events`), never their wire form.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import NodeCooldown, NodeCooldownEnded, ProxyRequest, WorkloadInfo
from nvpair_tw.ops._plain import PlainCounter, PlainHistogram
from nvpair_tw.selection import CHAT_PATHS, COMPLETION_PATHS

__all__ = [
    "LlmCounters",
    "NodeCounters",
    "RequestCounters",
]


AFFINITY_PATHS = CHAT_PATHS | COMPLETION_PATHS

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFB_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
RATE_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2, 4, 8)
OTHER = "other"
"""The label of a model no node or catalogue knows."""


def _text(value: object, default: str = "none") -> str:
    return default if value is None else str(value)


class RequestCounters:
    """Requests, attempts, stalls, failovers, affinity and durations, from each request record."""

    def __init__(self, registry: CollectorRegistry, facades: Mapping[str, FacadeState]) -> None:
        self._facades = facades
        self.requests = PlainCounter(
            registry,
            "nvpair_requests",
            "Requests answered, by engine, route kind and status.",
            ["engine", "route", "status"],
        )
        self.attempts = PlainCounter(
            registry,
            "nvpair_attempts",
            "Upstream attempts by outcome.",
            ["engine", "node", "outcome"],
        )
        self.failovers = PlainCounter(
            registry, "nvpair_failovers", "Requests that needed more than one attempt.", ["engine"]
        )
        self.stalls = PlainCounter(
            registry,
            "nvpair_stalls",
            "Attempts that stalled (no headers in time, or first-body timeout).",
            ["engine", "node"],
        )
        self.affinity_hits = PlainCounter(
            registry,
            "nvpair_affinity_hits",
            "Requests served by their warm (prefix-affinity) node.",
            ["engine"],
        )
        self.affinity_requests = PlainCounter(
            registry,
            "nvpair_affinity_requests",
            "Inference requests on affinity routes that reached a node.",
            ["engine"],
        )
        self.duration = PlainHistogram(
            registry,
            "nvpair_request_duration_seconds",
            "Request duration, arrival to last byte.",
            ["engine", "route"],
            DURATION_BUCKETS,
        )
        self.ttfb = PlainHistogram(
            registry,
            "nvpair_ttfb_seconds",
            "Time to the first response byte sent to the client.",
            ["engine", "route"],
            TTFB_BUCKETS,
        )

    def count(self, record: ProxyRequest) -> None:
        """Count one request record."""
        engine, path = record.engine, record.path
        facade = self._facades.get(engine)
        route = facade.profile.classify(record.method.encode(), path).value if facade else "unknown"
        self.requests.inc(engine, route, _text(record.status))
        for attempt in record.attempts:
            self.attempts.inc(engine, attempt.node_id, attempt.outcome.value)
            if attempt.outcome.stalled:
                self.stalls.inc(engine, attempt.node_id)
        if len(record.attempts) > 1 and not record.fan_out:  # a fan-out's parts are no failover
            self.failovers.inc(engine)
        if route == "inference" and path in AFFINITY_PATHS and record.node_id:
            self.affinity_requests.inc(engine)
            if record.cache_affinity:
                self.affinity_hits.inc(engine)
        if record.duration_ms is not None:
            self.duration.observe(engine, route, amount=record.duration_ms / 1000)
        if record.ttfb_ms is not None:
            self.ttfb.observe(engine, route, amount=record.ttfb_ms / 1000)


class LlmCounters:
    """Tokens, time to first token, generation rate, queue time and prediction error of the
    inference records (docs/behaviour.md §12.3, §15.2)."""

    def __init__(self, registry: CollectorRegistry, facades: Mapping[str, FacadeState]) -> None:
        self._facades = facades
        self.tokens = PlainCounter(
            registry,
            "nvpair_tokens",
            "Tokens the engines counted, by key and type (prompt or completion).",
            ["engine", "node", "model", "key", "type"],
        )
        self.cached = PlainCounter(
            registry,
            "nvpair_cached_tokens",
            "Prompt tokens the engines said they found in their cache (part of the prompt tokens).",
            ["engine", "node", "model", "key"],
        )
        per_model = ["engine", "node", "model"]
        self.ttft = PlainHistogram(
            registry,
            "nvpair_time_to_first_token_seconds",
            "Dispatch of the serving attempt to its first content-bearing chunk.",
            per_model,
            TTFB_BUCKETS,
        )
        self.rate = PlainHistogram(
            registry,
            "nvpair_generation_tokens_per_second",
            "Completion tokens per second (the engine's own figure where given).",
            per_model,
            RATE_BUCKETS,
        )
        self.prediction = PlainHistogram(
            registry,
            "nvpair_prediction_error_ratio",
            "Measured time to the last token over the time predicted for the node that served.",
            ["engine"],
            RATIO_BUCKETS,
        )
        self.queue = PlainHistogram(
            registry,
            "nvpair_queue_seconds",
            "Time inference requests waited in the facade's queue for a slot.",
            ["engine"],
            DURATION_BUCKETS,
        )

    def count(self, record: ProxyRequest) -> None:
        """Count one inference record (one naming a model)."""
        engine = record.engine
        self.queue.observe(engine, amount=record.queued_ms / 1000)
        node, model = record.node_id, record.model
        if node is None or model is None:
            return
        label = self._model_label(engine, model, node)
        key = _text(record.key)
        for kind, count in (
            ("prompt", record.prompt_tokens),
            ("completion", record.completion_tokens),
        ):
            if count is not None and count > 0:
                self.tokens.inc(engine, node, label, key, kind, amount=count)
        if record.cached_tokens is not None:  # a stated 0 too: the engine states them
            self.cached.inc(engine, node, label, key, amount=record.cached_tokens)
        if record.ttft_ms is not None:
            self.ttft.observe(engine, node, label, amount=record.ttft_ms / 1000)
        if record.tokens_per_s is not None:
            self.rate.observe(engine, node, label, amount=record.tokens_per_s)
        predicted, measured = record.predicted_ms, record.measured_ms
        if predicted is not None and measured is not None and predicted > 0:
            self.prediction.observe(engine, amount=measured / predicted)

    def _model_label(self, engine: str, model: str, served: str) -> str:
        """The model as a label: a name some node or the catalogue knows, else ``other`` (so a
        client cannot grow the label set by naming models). The node that ``served`` it is
        asked first (it usually does), every node only when it does not."""
        facade = self._facades.get(engine)
        if facade is None:
            return OTHER
        catalogue, inventory = facade.directory.catalogue, facade.inventory
        if model in catalogue.by_name or inventory.advertises(served, model):
            return model
        return model if inventory.owners(model) else OTHER


class NodeCounters:
    """Stall cooldowns started and ended, per node, and workloads ended, by final state."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cooldowns = PlainCounter(
            registry, "nvpair_cooldowns", "Stall cooldowns started.", ["engine", "node"]
        )
        self.cooldowns_ended = PlainCounter(
            registry,
            "nvpair_cooldowns_ended",
            "Stall cooldowns ended, by why (expired or success).",
            ["engine", "node", "why"],
        )
        self.workloads = PlainCounter(
            registry, "nvpair_workloads", "Workloads ended, by final state.", ["engine", "state"]
        )

    def cooled(self, event: NodeCooldown) -> None:
        """A ``node/cooldown``."""
        self.cooldowns.inc(event.engine, event.node_id)

    def cooldown_ended(self, event: NodeCooldownEnded) -> None:
        """A ``node/cooldown-ended``."""
        self.cooldowns_ended.inc(event.engine, event.node_id, event.why)

    def workload_ended(self, info: WorkloadInfo) -> None:
        """A ``workload:completed`` or ``workload:errored``."""
        state = "none" if info.state is None else info.state.value
        self.workloads.inc(info.engine, state)
