"""Tests for nvpair_tw.ops._metrics: bus-fed counters, scrape-time gauges, a per-runtime registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest_twisted
import treq
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel
from twisted.web.client import Agent, HTTPConnectionPool

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import (
    Attempt,
    AttemptOutcome,
    NodeCooldown,
    NodeCooldownEnded,
    ProxyRequest,
    StatusOutcome,
)
from nvpair_tw.logs import current_level, set_level
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import AdminService, StatusBoard
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.runtime._process import Runtime, build_runtime
from nvpair_tw.selection._admission import Slot, Waiter
from nvpair_tw.selection._speed import Sample
from nvpair_tw.testing import (
    Behaviour,
    MemoryCluster,
    SimulatedEngine,
    always,
    start_engine,
    start_proxy,
)
from tests.helpers import proxy_request

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


def _runtime(nodes: list[Node] | None = None) -> tuple[MemoryReactorClock, Runtime]:
    clock = MemoryReactorClock()
    clock.advance(1_700_000_000)
    default = [Node("a", "http://127.0.0.1:1", ("llama3:latest",))]
    runtime = build_runtime(
        cast(IProxyReactor, clock),
        Settings(),
        ["ollama"],
        nodes={"ollama": nodes if nodes is not None else default},
    )
    return clock, runtime


def samples(text: str) -> Samples:
    """Every sample of a scrape, keyed by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: Samples, name: str, **labels: str) -> float | None:
    return scraped.get((name, frozenset(labels.items())))


def _request(**fields: Any) -> ProxyRequest:
    record: dict[str, Any] = {
        "id": "r-1",
        "engine": "ollama",
        "node_id": "b",
        "method": "POST",
        "path": "/api/chat",
        "status": 200,
        "duration_ms": 1500,
        "ttfb_ms": 700,
        "attempts": (Attempt("b", AttemptOutcome.COMMITTED, 700),),
    }
    record.update(fields)
    return proxy_request(**record)


def test_a_fan_out_counts_each_node_part_as_an_attempt_and_no_failover() -> None:
    """A fan-out record (docs/behaviour.md §13.2) has one attempt per node, run at once: each is
    counted by outcome, but they are no failover."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    runtime.shared.bus.publish(
        _request(
            path="/api/pull",
            node_id=None,
            fan_out=("a", "b"),
            attempts=(
                Attempt("a", AttemptOutcome.COMMITTED, 5),
                Attempt("b", AttemptOutcome.COMMITTED, 3),
            ),
        ),
    )
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_failovers_total", engine="ollama") is None
    for node in "ab":
        assert (
            value(scraped, "nvpair_attempts_total", engine="ollama", node=node, outcome="committed")
            == 1
        )


def test_request_with_two_attempts_counts_one_failover_and_each_attempt() -> None:
    """A request record with two attempts is one failover, one stall and two attempts by outcome."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    runtime.shared.bus.publish(
        _request(
            attempts=(
                Attempt("a", AttemptOutcome.STALL, 500),
                Attempt("b", AttemptOutcome.COMMITTED, 3),
            )
        )
    )
    runtime.shared.bus.publish(_request(id="r-2"))
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_failovers_total", engine="ollama") == 1
    assert value(scraped, "nvpair_stalls_total", engine="ollama", node="a") == 1
    assert value(scraped, "nvpair_attempts_total", engine="ollama", node="a", outcome="stall") == 1
    assert (
        value(scraped, "nvpair_attempts_total", engine="ollama", node="b", outcome="committed") == 2
    )
    assert (
        value(scraped, "nvpair_requests_total", engine="ollama", route="inference", status="200")
        == 2
    )


def test_first_body_timeout_is_a_stall_but_a_5xx_is_not() -> None:
    """Both stall outcomes count as stalls; a fast failure (status-503) does not."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    runtime.shared.bus.publish(
        _request(
            attempts=(
                Attempt("a", AttemptOutcome.FIRST_BODY_TIMEOUT, 500),
                Attempt("b", StatusOutcome(503), 3),
            ),
            status=503,
        ),
    )
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_stalls_total", engine="ollama", node="a") == 1
    assert value(scraped, "nvpair_stalls_total", engine="ollama", node="b") is None


def test_routes_are_labelled_by_kind_not_by_raw_path() -> None:
    """Pass-through and model-list requests get their route kind; paths never become labels."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    bus = runtime.shared.bus
    bus.publish(_request(method="GET", path="/api/tags", attempts=()))
    bus.publish(_request(method="GET", path="/api/version/x1", status=404))
    scraped = samples(metrics.exposition().decode())
    assert (
        value(scraped, "nvpair_requests_total", engine="ollama", route="model-list", status="200")
        == 1
    )
    assert (
        value(scraped, "nvpair_requests_total", engine="ollama", route="pass-through", status="404")
        == 1
    )


def test_latency_histograms_observe_seconds() -> None:
    """duration_ms and ttfb_ms land in the histograms in seconds; a missing ttfb is not observed."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    runtime.shared.bus.publish(_request(duration_ms=1500, ttfb_ms=700))
    runtime.shared.bus.publish(_request(duration_ms=20, ttfb_ms=None, status=502))
    scraped = samples(metrics.exposition().decode())
    labels = {"engine": "ollama", "route": "inference"}
    assert value(scraped, "nvpair_request_duration_seconds_sum", **labels) == 1.52
    assert value(scraped, "nvpair_request_duration_seconds_count", **labels) == 2
    assert value(scraped, "nvpair_ttfb_seconds_count", **labels) == 1
    assert value(scraped, "nvpair_ttfb_seconds_bucket", le="1.0", **labels) == 1
    assert value(scraped, "nvpair_ttfb_seconds_bucket", le="0.5", **labels) == 0


def test_affinity_hits_and_totals() -> None:
    """Served requests on affinity routes count toward the total; cache_affinity ones are hits."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    bus = runtime.shared.bus
    bus.publish(_request(cache_affinity=True))
    bus.publish(_request(cache_affinity=False))
    bus.publish(_request(path="/api/embed"))  # not an affinity route
    bus.publish(_request(node_id=None, status=502))  # never reached a node
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_affinity_hits_total", engine="ollama") == 1
    assert value(scraped, "nvpair_affinity_requests_total", engine="ollama") == 2


def test_cooldowns_and_terminal_workloads_are_counted_from_events() -> None:
    """node/cooldown, node/cooldown-ended and terminal workload events each bump their counter."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    bus = runtime.shared.bus
    bus.publish(NodeCooldown("ollama", "a", "x", 1))
    bus.publish(NodeCooldownEnded("ollama", "a", "success"))
    workload = runtime.shared.workloads.create("ollama", "llama3")
    workload.running("a")
    workload.cancel("client disconnected")
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_cooldowns_total", engine="ollama", node="a") == 1
    assert (
        value(scraped, "nvpair_cooldowns_ended_total", engine="ollama", node="a", why="success")
        == 1
    )
    assert value(scraped, "nvpair_workloads_total", engine="ollama", state="cancelled") == 1


def test_gauges_read_live_state_at_scrape_time() -> None:
    """In-flight workloads, cooldown, reservations and inventory come from the runtime when scraped."""
    clock, runtime = _runtime(
        [Node("a", "http://127.0.0.1:1", ("llama3:latest",)), Node("b", "http://127.0.0.1:2")]
    )
    metrics = ProxyMetrics(runtime)
    facade = runtime.facades["ollama"]
    workload = runtime.shared.workloads.create("ollama", "llama3")
    workload.running("a")
    runtime.shared.ledger.reserve("a")
    facade.stalls.cool("b", "no response headers within 1s")
    clock.advance(30)
    first = samples(metrics.exposition().decode())
    assert value(first, "nvpair_inflight_workloads", engine="ollama", node="a") == 1
    assert value(first, "nvpair_inflight_workloads", engine="ollama", node="b") == 0
    assert value(first, "nvpair_reservations", node="a") == 1
    assert value(first, "nvpair_node_cooling", engine="ollama", node="b") == 1
    assert value(first, "nvpair_cooldown_remaining_seconds", engine="ollama", node="b") == 90
    assert value(first, "nvpair_inventory_known", engine="ollama", node="a") == 1
    assert value(first, "nvpair_inventory_known", engine="ollama", node="b") == 0
    assert value(first, "nvpair_inventory_models", engine="ollama", node="a") == 1
    workload.complete()
    facade.stalls.clear("b")
    second = samples(metrics.exposition().decode())
    assert value(second, "nvpair_inflight_workloads", engine="ollama", node="a") == 0
    assert value(second, "nvpair_node_cooling", engine="ollama", node="b") == 0
    runtime.stop()


def test_residency_gauges_follow_the_last_residency_poll() -> None:
    """``nvpair_residency_known`` is 1 when the node's residency is known, and
    ``nvpair_model_loaded`` has a 1 per loaded model; a node with unknown residency has none."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, loaded=["llama3:latest", "qwen:7b"]),
        "b": SimulatedEngine(clock),
    }
    nodes = [Node(i, f"http://{i}.node.test:11434") for i in "ab"]
    cluster = MemoryCluster(clock, engines, nodes={"ollama": nodes})
    try:
        cluster.flush()
        metrics = ProxyMetrics(cluster.runtime)
        scraped = samples(metrics.exposition().decode())
        assert value(scraped, "nvpair_residency_known", engine="ollama", node="a") == 1
        assert value(scraped, "nvpair_residency_known", engine="ollama", node="b") == 0
        loaded = {
            dict(labels)["model"]
            for (name, labels), v in scraped.items()
            if name == "nvpair_model_loaded" and dict(labels)["node"] == "a" and v == 1
        }
        assert loaded == {"llama3:latest", "qwen:7b"}
        assert not [k for k in scraped if k[0] == "nvpair_model_loaded" and ("node", "b") in k[1]]
        engine_a = engines["a"]
        engine_a.loaded = []
        cluster.facade().inventory.poll_now()
        cluster.flush()
        again = samples(metrics.exposition().decode())
        assert value(again, "nvpair_residency_known", engine="ollama", node="a") == 1
        assert not [k for k in again if k[0] == "nvpair_model_loaded"]
    finally:
        cluster.stop()


def test_queue_depth_slots_and_slots_in_use_are_read_at_scrape_time() -> None:
    """The facade's queue depth, and per node its slots and the slots in use, come from admission."""
    one = Node("a", "http://127.0.0.1:1", ("llama3:latest",), slots=1)
    _, runtime = _runtime([one, Node("b", "http://127.0.0.1:2")])
    metrics = ProxyMetrics(runtime)
    admission = runtime.facades["ollama"].admission
    held = admission.admit([one])
    waiting = admission.admit([one])
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_queue_depth", engine="ollama") == 1
    assert value(scraped, "nvpair_slots_in_use", engine="ollama", node="a") == 1
    assert value(scraped, "nvpair_slots_in_use", engine="ollama", node="b") == 0
    assert value(scraped, "nvpair_slots", engine="ollama", node="a") == 1
    assert value(scraped, "nvpair_slots", engine="ollama", node="b") == 0
    assert isinstance(held, Slot) and isinstance(waiting, Waiter)
    held.release()  # binds the waiter: still one in use, nobody waiting
    bound: list[Slot] = []
    waiting.bound.addCallback(bound.append)
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_queue_depth", engine="ollama") == 0
    assert value(scraped, "nvpair_slots_in_use", engine="ollama", node="a") == 1
    bound[0].release()
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_slots_in_use", engine="ollama", node="a") == 0


def test_busy_waits_are_a_live_counter_per_node() -> None:
    """Busy waits granted on a node show at the next scrape, counted per node, as a counter."""
    _, runtime = _runtime(
        [Node("a", "http://127.0.0.1:1", ("llama3:latest",)), Node("b", "http://127.0.0.1:2")]
    )
    metrics = ProxyMetrics(runtime)
    progress = runtime.facades["ollama"].progress
    before = samples(metrics.exposition().decode())
    assert value(before, "nvpair_busy_waits_total", engine="ollama", node="a") == 0
    progress.busy_waited("a")
    progress.busy_waited("a")
    after = samples(metrics.exposition().decode())
    assert value(after, "nvpair_busy_waits_total", engine="ollama", node="a") == 2
    assert value(after, "nvpair_busy_waits_total", engine="ollama", node="b") == 0
    runtime.stop()


def test_registry_is_per_runtime_and_never_the_global_one() -> None:
    """Two runtimes count separately and nothing is registered in the default registry."""
    _, one = _runtime()
    _, two = _runtime()
    first, second = ProxyMetrics(one), ProxyMetrics(two)
    one.shared.bus.publish(_request())
    assert first.registry is not second.registry
    assert value(samples(first.exposition().decode()), "nvpair_failovers_total") is None
    scraped_two = samples(second.exposition().decode())
    assert (
        value(
            scraped_two, "nvpair_requests_total", engine="ollama", route="inference", status="200"
        )
        is None
    )
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("nvpair")]


def test_close_stops_counting() -> None:
    """After close the subscriber is gone and later events are not counted."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    metrics.close()
    runtime.shared.bus.publish(_request())
    scraped = samples(metrics.exposition().decode())
    assert (
        value(scraped, "nvpair_requests_total", engine="ollama", route="inference", status="200")
        is None
    )


CHAT = json.dumps(
    {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
).encode()


@on_reactor
async def test_scripted_failover_is_counted_once_on_the_metrics_endpoint(reactor: Any) -> None:
    """A frozen first node: /metrics shows one stall, one cooldown and one failover."""
    frozen = await start_engine(reactor, SimulatedEngine(reactor, policy=always(Behaviour.FROZEN)))
    healthy = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor,
        {
            "ollama": [
                Node("a-frozen", frozen.url, ("llama3:latest",)),
                Node("b-healthy", healthy.url, ("llama3:latest",)),
            ]
        },
        Settings(response_header_timeout=0.5),
    )
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    pool = HTTPConnectionPool(reactor, persistent=False)
    http = treq.client.HTTPClient(Agent(reactor, pool=pool))
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        response = await http.post(proxy.url() + "/api/chat", data=CHAT)
        await treq.content(response)
        assert response.code == 200
        assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"b-healthy"]
        scrape = await http.get(f"http://127.0.0.1:{port}/metrics")
        assert scrape.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
        scraped = samples((await treq.content(scrape)).decode())
        assert value(scraped, "nvpair_stalls_total", engine="ollama", node="a-frozen") == 1
        assert value(scraped, "nvpair_cooldowns_total", engine="ollama", node="a-frozen") == 1
        assert value(scraped, "nvpair_failovers_total", engine="ollama") == 1
        assert value(scraped, "nvpair_node_cooling", engine="ollama", node="a-frozen") == 1
        assert (
            value(
                scraped,
                "nvpair_attempts_total",
                engine="ollama",
                node="b-healthy",
                outcome="committed",
            )
            == 1
        )
    finally:
        await admin.stopService()
        await proxy.stop()
        await frozen.stop()
        await healthy.stop()


def test_tokens_first_token_rate_and_queue_are_observed_with_bounded_labels() -> None:
    """§12.3: the engine's counts by key and type; a model no node knows is labelled ``other``."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    llm = {
        "model": "llama3:latest",
        "key": "alice",
        "prompt_tokens": 7,
        "completion_tokens": 40,
        "ttft_ms": 300,
        "tokens_per_s": 25.0,
        "queued_ms": 1500,
    }
    runtime.shared.bus.publish(_request(**llm))
    runtime.shared.bus.publish(_request(**{**llm, "model": "made-up-123"}))
    unknown = {**llm, "prompt_tokens": None, "completion_tokens": None, "tokens_per_s": None}
    runtime.shared.bus.publish(_request(**unknown))
    scraped = samples(metrics.exposition().decode())
    where = {"engine": "ollama", "node": "b", "key": "alice"}
    assert value(scraped, "nvpair_tokens_total", model="llama3:latest", type="prompt", **where) == 7
    assert (
        value(scraped, "nvpair_tokens_total", model="llama3:latest", type="completion", **where)
        == 40
    )
    assert value(scraped, "nvpair_tokens_total", model="other", type="completion", **where) == 40
    per = {"engine": "ollama", "node": "b", "model": "llama3:latest"}
    assert value(scraped, "nvpair_time_to_first_token_seconds_count", **per) == 2
    assert value(scraped, "nvpair_time_to_first_token_seconds_sum", **per) == 0.6
    assert value(scraped, "nvpair_generation_tokens_per_second_count", **per) == 1
    assert value(scraped, "nvpair_generation_tokens_per_second_bucket", le="30.0", **per) == 1
    assert value(scraped, "nvpair_queue_seconds_count", engine="ollama") == 3
    models = {dict(labels).get("model") for (_, labels) in scraped if dict(labels).get("model")}
    assert "made-up-123" not in models


def test_cached_prompt_tokens_are_counted_where_the_engine_stated_them() -> None:
    """§12.3: ``nvpair_cached_tokens_total`` sums the prompt tokens the engines said they found
    cached (part of the prompt tokens), by the same bounded labels; a stated 0 makes the series
    (the engine states cached counts), an unknown count adds nothing."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    llm = {"model": "llama3:latest", "key": "alice", "prompt_tokens": 48, "cached_tokens": 47}
    runtime.shared.bus.publish(_request(**llm))
    runtime.shared.bus.publish(_request(**{**llm, "model": "made-up-123"}))
    runtime.shared.bus.publish(_request(**{**llm, "node_id": "a", "cached_tokens": 0}))
    runtime.shared.bus.publish(_request(**{**llm, "node_id": "c", "cached_tokens": None}))
    scraped = samples(metrics.exposition().decode())
    where = {"engine": "ollama", "key": "alice"}
    cached = "nvpair_cached_tokens_total"
    assert value(scraped, cached, node="b", model="llama3:latest", **where) == 47
    assert value(scraped, cached, node="b", model="other", **where) == 47
    assert value(scraped, cached, node="a", model="llama3:latest", **where) == 0
    assert value(scraped, cached, node="c", model="llama3:latest", **where) is None
    prompt = value(scraped, "nvpair_tokens_total", node="b", type="prompt", model="other", **where)
    assert prompt == 48  # the cached tokens are part of these, not another type of them


def test_learnt_rates_and_the_prediction_error_are_exposed() -> None:
    """§15.1, §15.2: the decode and prefill gauges per (engine, node, model), and the measured
    over predicted ratio of each record that carries both."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    runtime.facades["ollama"].speeds.learn(
        "b", "llama3", Sample(decode_rate=57.7, prefill_rate=900)
    )
    record = {"model": "llama3:latest", "predicted_ms": 1000, "measured_ms": 1200}
    runtime.shared.bus.publish(_request(**record))
    runtime.shared.bus.publish(_request(model="llama3:latest"))
    scraped = samples(metrics.exposition().decode())
    per = {"engine": "ollama", "node": "b", "model": "llama3"}
    assert value(scraped, "nvpair_node_decode_tokens_per_second", **per) == 57.7
    assert value(scraped, "nvpair_node_prefill_tokens_per_second", **per) == 900
    assert value(scraped, "nvpair_prediction_error_ratio_count", engine="ollama") == 1
    assert value(scraped, "nvpair_prediction_error_ratio_bucket", engine="ollama", le="1.25") == 1
    assert value(scraped, "nvpair_prediction_error_ratio_bucket", engine="ollama", le="1.1") == 0


class _NoWire(ProxyRequest):
    """A record whose wire object cannot be made: a consumer that asks for it fails (and the bus
    drops it)."""

    def _build(self) -> dict[str, Any]:
        raise AssertionError("a counting consumer asked for the wire object")


def test_metrics_and_the_status_board_count_the_typed_record_without_its_wire_object() -> None:
    """``/metrics`` and the status board read a ``ProxyRequest``'s attributes (attempts, node,
    tokens); with no log line to write, nothing makes its wire object."""
    _, runtime = _runtime()
    metrics = ProxyMetrics(runtime)
    board = StatusBoard(runtime)
    bus = runtime.shared.bus
    record = _NoWire(
        "r-1", "ollama", "a", "POST", "/api/chat", 200, 40, 10, None,
        (Attempt("b", AttemptOutcome.STALL, 20), Attempt("a", AttemptOutcome.COMMITTED, 12)), False, 0,
        model="llama3:latest", prompt_tokens=7, completion_tokens=9,
    )  # fmt: skip
    level = current_level()
    set_level(LogLevel.warn)
    try:
        bus.publish(record)
    finally:
        set_level(level)
    assert {"metrics", "status-board"} <= {s.name for s in bus.subscriptions}
    scraped = samples(metrics.exposition().decode())
    assert value(scraped, "nvpair_stalls_total", engine="ollama", node="b") == 1
    assert value(scraped, "nvpair_failovers_total", engine="ollama") == 1
    where = {"engine": "ollama", "node": "a", "model": "llama3:latest", "key": "none"}
    assert value(scraped, "nvpair_tokens_total", type="completion", **where) == 9
    assert board.throughput.kept() == 1 and [f["id"] for f in board.failovers] == ["r-1"]
    metrics.close()
    board.close()
