"""Traces end to end (docs/behaviour.md §12.5): a proxy over simulated engines on loopback exports
its spans over OTLP/HTTP to a collector run in the test, which decodes them with the OTLP protobuf
messages. Export runs on the SDK's thread, so every flush runs on a thread too (the reactor keeps
serving the collector meanwhile); nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from nvpair_tw.core import Settings
from nvpair_tw.events import PROXY_REQUEST, Event
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.runtime import Runtime
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    ProxyCluster,
    SimulatedEngine,
    always,
    http_client,
)
from nvpair_tw.traces import RequestTracing, otlp_tracing
from tests.helpers import chat_body

pytestmark = pytest.mark.timeout(60)

CANARY = "cnry-trace-prompt-3e71a9"
REPLY = "cnry-trace-reply-8b02c4"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


class Traces(Resource):
    """A tiny OTLP/HTTP collector: ``POST /v1/traces`` with a protobuf body, kept and decoded."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []
        self.paths: list[bytes] = []

    def render_POST(self, request: Request) -> bytes:
        assert request.content is not None
        self.paths.append(request.path)
        self.bodies.append(request.content.read())
        request.setHeader(b"content-type", b"application/x-protobuf")
        answer: bytes = ExportTraceServiceResponse().SerializeToString()
        return answer

    def spans(self) -> list[Span]:
        found = []
        for body in self.bodies:
            export = ExportTraceServiceRequest()
            export.ParseFromString(body)
            for resource_spans in export.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    found.extend(scope_spans.spans)
        return found

    def resources(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for body in self.bodies:
            export = ExportTraceServiceRequest()
            export.ParseFromString(body)
            found.extend(_attrs(r.resource.attributes) for r in export.resource_spans)
        return found


class Collector:
    def __init__(self, traces: Traces, port: IListeningPort) -> None:
        self.traces = traces
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"  # type: ignore[attr-defined]


@pytest_twisted.async_yield_fixture()
async def collector(reactor: Any) -> AsyncIterator[Collector]:
    """Set up before the clusters, so it outlives the proxy's last export at its stop."""
    traces = Traces()
    port = reactor.listenTCP(0, Site(traces), interface="127.0.0.1")
    yield Collector(traces, port)
    await maybeDeferred(port.stopListening)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attrs(attributes: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in attributes}


def records(cluster: ProxyCluster, count: int) -> Deferred[list[Event]]:
    """Fires once ``count`` ``proxy/request`` records are published (the tracer's sink, subscribed
    first, has ended their spans by then)."""
    done: Deferred[list[Event]] = Deferred()
    assert cluster.proxy is not None
    seen: list[Event] = [e for e in cluster.events if e.name == PROXY_REQUEST]

    def sink(event: Event) -> None:
        if event.name == PROXY_REQUEST:
            seen.append(event)
        if len(seen) >= count and not done.called:
            done.callback(seen)

    cluster.proxy.runtime.shared.bus.subscribe(sink, name="test-records")
    if len(seen) >= count:
        done.callback(seen)
    return done


def tracing_of(cluster: ProxyCluster) -> RequestTracing:
    assert cluster.proxy is not None and cluster.proxy.runtime.tracing is not None
    return cluster.proxy.runtime.tracing


async def flushed(reactor: Any, cluster: ProxyCluster, collector: Collector) -> list[Span]:
    assert await tracing_of(cluster).flush(reactor)
    return collector.traces.spans()


def by_kind(spans: list[Span], kind: int) -> list[Span]:
    return [s for s in spans if s.kind == kind]


async def traced(
    reactor: Any, clusters: Clusters, collector: Collector, engines: dict[str, SimulatedEngine]
) -> ProxyCluster:
    cluster = clusters(ProxyCluster)
    await cluster.start(engines, Settings(otlp_endpoint=collector.url))
    return cluster


@pytest_twisted.ensureDeferred
async def test_one_server_span_per_request_with_genai_and_nvpair_attributes(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """A chat answered by one node: a SERVER span ``chat llama3`` with the GenAI attributes, the
    serving node, the status and the nvpair ones, and one CLIENT child span for its attempt."""
    cluster = await traced(reactor, clusters, collector, {"n0": SimulatedEngine(reactor)})
    code, _, _ = await cluster.post(chat_body("llama3", CANARY, stream=True))
    assert code == 200
    [event] = await records(cluster, 1)
    payload = event.payload
    spans = await flushed(reactor, cluster, collector)
    [server] = by_kind(spans, Span.SPAN_KIND_SERVER)
    [client] = by_kind(spans, Span.SPAN_KIND_CLIENT)
    assert server.name == "chat llama3"
    attrs = _attrs(server.attributes)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "llama3"
    assert attrs["gen_ai.response.model"] == (payload["model_local"] or "llama3")
    for name, key in [
        ("gen_ai.usage.input_tokens", "prompt_tokens"),
        ("gen_ai.usage.output_tokens", "completion_tokens"),
        ("nvpair.ttft_ms", "ttft_ms"),
    ]:
        if payload[key] is None:
            assert name not in attrs  # unknown is absent, never zero
        else:
            assert attrs[name] == payload[key]
    assert attrs["server.address"] == "n0"
    assert attrs["http.response.status_code"] == 200
    assert attrs["nvpair.request_id"] == payload["id"]
    assert isinstance(attrs["nvpair.workload_id"], int)
    assert attrs["nvpair.queue_ms"] == 0 and attrs["nvpair.busy_waits"] == 0
    assert attrs["nvpair.translated"] is False
    assert attrs.get("nvpair.key") == payload.get("key")  # a key name, when keys are asked for
    assert server.status.code != Status.STATUS_CODE_ERROR
    assert client.parent_span_id == server.span_id and client.trace_id == server.trace_id
    client_attrs = _attrs(client.attributes)
    assert client_attrs["server.address"] == "n0" and client_attrs["nvpair.outcome"] == "committed"
    assert server.start_time_unix_nano <= client.start_time_unix_nano
    assert client.end_time_unix_nano <= server.end_time_unix_nano
    duration_ms = (server.end_time_unix_nano - server.start_time_unix_nano) / 1e6
    assert abs(duration_ms - payload["duration_ms"]) <= 1
    assert collector.traces.paths and set(collector.traces.paths) == {b"/v1/traces"}
    assert {"service.name": "nvpair-tw"}.items() <= collector.traces.resources()[0].items()


@pytest_twisted.ensureDeferred
async def test_client_traceparent_is_continued_and_the_node_sees_the_request_span(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """The request span is the client's span's child (same trace id, its span id as parent,
    ``tracestate`` kept), and the node is sent the request span as its parent instead."""
    engine = SimulatedEngine(reactor)
    cluster = await traced(reactor, clusters, collector, {"n0": engine})
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"}
    code, _, _ = await cluster.post(chat_body("llama3", CANARY, stream=True), headers=headers)
    assert code == 200
    await records(cluster, 1)
    spans = await flushed(reactor, cluster, collector)
    [server] = by_kind(spans, Span.SPAN_KIND_SERVER)
    assert server.trace_id.hex() == CLIENT_TRACE
    assert server.parent_span_id.hex() == CLIENT_SPAN
    assert server.trace_state == "vendor=opaque"
    [received] = [r for r in engine.received if r.method == b"POST"]
    [forwarded] = received.headers[b"traceparent"]
    assert forwarded == f"00-{CLIENT_TRACE}-{server.span_id.hex()}-01".encode()
    assert received.headers[b"tracestate"] == [b"vendor=opaque"]


@pytest_twisted.ensureDeferred
async def test_without_a_client_trace_a_new_one_starts_and_is_forwarded(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """No ``traceparent``: the request span is a root, and the node still gets its context."""
    engine = SimulatedEngine(reactor)
    cluster = await traced(reactor, clusters, collector, {"n0": engine})
    await cluster.post(chat_body("llama3", CANARY, stream=True))
    await records(cluster, 1)
    [server] = by_kind(await flushed(reactor, cluster, collector), Span.SPAN_KIND_SERVER)
    assert server.parent_span_id == b""
    [received] = [r for r in engine.received if r.method == b"POST"]
    [forwarded] = received.headers[b"traceparent"]
    version, trace_id, parent_id, flags = forwarded.decode().split("-")
    assert (version, trace_id, parent_id) == ("00", server.trace_id.hex(), server.span_id.hex())
    assert int(flags, 16) & 1  # sampled
    assert b"tracestate" not in received.headers


@pytest_twisted.ensureDeferred
async def test_failover_gives_one_child_span_per_attempt_the_failed_one_an_error(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """A 503 from the first node, then the second answers: two CLIENT spans in attempt order,
    the first with status ERROR and its outcome, the request span names the serving node."""
    engines = {
        "bad": SimulatedEngine(reactor, policy=always(Behaviour.STATUS_503)),
        "good": SimulatedEngine(reactor),
    }
    cluster = await traced(reactor, clusters, collector, engines)
    cluster.facade.pin = "bad"
    code, _, _ = await cluster.post(chat_body("llama3", CANARY, stream=True))
    assert code == 200
    await records(cluster, 1)
    spans = await flushed(reactor, cluster, collector)
    [server] = by_kind(spans, Span.SPAN_KIND_SERVER)
    attempts = sorted(by_kind(spans, Span.SPAN_KIND_CLIENT), key=lambda s: s.start_time_unix_nano)
    assert [_attrs(s.attributes)["server.address"] for s in attempts] == ["bad", "good"]
    assert [_attrs(s.attributes)["nvpair.outcome"] for s in attempts] == [
        "status-503",
        "committed",
    ]
    assert attempts[0].status.code == Status.STATUS_CODE_ERROR
    assert _attrs(attempts[0].attributes)["http.response.status_code"] == 503
    assert attempts[1].status.code != Status.STATUS_CODE_ERROR
    assert all(s.parent_span_id == server.span_id for s in attempts)
    assert attempts[0].end_time_unix_nano <= attempts[1].start_time_unix_nano
    attrs = _attrs(server.attributes)
    assert attrs["server.address"] == "good" and attrs["nvpair.attempts"] == 2


@pytest_twisted.ensureDeferred
async def test_every_request_gets_a_span_rejections_and_other_routes_included(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """A model nobody has (404, no attempt: a client's mistake, not an ERROR span) and a model
    list are spans too, named by method and path where they are no inference of a known model."""
    cluster = await traced(reactor, clusters, collector, {"n0": SimulatedEngine(reactor)})
    code, _, _ = await cluster.post(chat_body("nobody-has-this", CANARY, stream=True))
    assert code == 404
    response = await cluster_get(reactor, cluster, "/api/tags")
    assert response == 200
    await records(cluster, 2)
    spans = await flushed(reactor, cluster, collector)
    assert by_kind(spans, Span.SPAN_KIND_CLIENT) == []
    named = {s.name: s for s in by_kind(spans, Span.SPAN_KIND_SERVER)}
    # a record names its model once a node serves it: the refused chat is just "chat"
    assert set(named) == {"chat", "GET /api/tags"}
    refused = named["chat"]
    assert _attrs(refused.attributes)["gen_ai.operation.name"] == "chat"
    assert refused.status.code == Status.STATUS_CODE_UNSET
    assert _attrs(refused.attributes)["error.type"] == "model-not-found"
    assert "server.address" not in _attrs(refused.attributes)
    assert "gen_ai.operation.name" not in _attrs(named["GET /api/tags"].attributes)


async def cluster_get(reactor: Any, cluster: ProxyCluster, path: str) -> int:
    response = await http_client(reactor).get(cluster.url + path)
    await response.content()
    return int(response.code)


@pytest_twisted.ensureDeferred
async def test_no_prompt_or_completion_reaches_the_exported_bytes(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """The prompt and the reply ride through streaming and non-streaming chats; neither is in any
    byte the collector received."""
    engine = SimulatedEngine(reactor, reply_text=REPLY)
    cluster = await traced(reactor, clusters, collector, {"n0": engine})
    for stream in (True, False):
        code, body, _ = await cluster.post(chat_body("llama3", CANARY, stream=stream))
        assert code == 200 and REPLY.encode() in body.replace(b" ", b"")
    await records(cluster, 2)
    spans = await flushed(reactor, cluster, collector)
    assert len(by_kind(spans, Span.SPAN_KIND_SERVER)) == 2
    exported = b"".join(collector.traces.bodies)
    assert CANARY.encode() not in exported and REPLY.encode() not in exported


def attach(runtime: Runtime, url: str, **kw: Any) -> RequestTracing:
    """Tracing with the test's own export timeout, on a runtime built without it."""
    tracing = otlp_tracing(runtime.reactor, runtime.shared.bus, url, **kw)
    runtime.tracing = tracing
    runtime.shared.tracer = tracing
    return tracing


@pytest_twisted.ensureDeferred
async def test_an_unreachable_collector_fails_no_request_and_counts_the_drops(
    reactor: Any, clusters: Clusters
) -> None:
    """Nothing listens at the collector's address: requests are answered as ever, the failed
    export drops their spans, and ``/metrics`` counts them."""
    closed = reactor.listenTCP(0, Site(Resource()), interface="127.0.0.1")
    url = f"http://127.0.0.1:{closed.getHost().port}"
    await maybeDeferred(closed.stopListening)
    cluster = clusters(ProxyCluster)
    await cluster.start({"n0": SimulatedEngine(reactor)})
    assert cluster.proxy is not None
    runtime = cluster.proxy.runtime
    metrics = ProxyMetrics(runtime)
    tracing = attach(runtime, url, export_timeout=0.3)
    for _ in range(2):
        code, _, _ = await cluster.post(chat_body("llama3", CANARY, stream=True))
        assert code == 200
    await records(cluster, 2)
    await tracing.flush(reactor)
    # two request spans and their two attempts
    assert tracing.counts.dropped == 4 and tracing.counts.exported == 0
    exposition = metrics.exposition().decode()
    assert "nvpair_trace_spans_dropped_total 4.0" in exposition
    assert "nvpair_trace_spans_exported_total 0.0" in exposition
    metrics.close()


@pytest_twisted.ensureDeferred
async def test_metrics_count_exported_spans_and_none_without_tracing(
    reactor: Any, collector: Collector, clusters: Clusters
) -> None:
    """With a collector, ``/metrics`` counts exported spans; without ``--otlp-endpoint`` there is
    no trace metric, no tracer and the client's ``traceparent`` is forwarded untouched."""
    cluster = await traced(reactor, clusters, collector, {"n0": SimulatedEngine(reactor)})
    await cluster.post(chat_body("llama3", CANARY, stream=True))
    await records(cluster, 1)
    await flushed(reactor, cluster, collector)
    assert cluster.proxy is not None
    metrics = ProxyMetrics(cluster.proxy.runtime)
    assert "nvpair_trace_spans_exported_total 2.0" in metrics.exposition().decode()
    metrics.close()

    engine = SimulatedEngine(reactor)
    plain = clusters(ProxyCluster)
    await plain.start({"n0": engine})
    assert plain.proxy is not None
    assert plain.proxy.runtime.tracing is None and plain.proxy.runtime.shared.tracer is None
    await plain.post(chat_body("llama3", CANARY, stream=True), headers={"traceparent": TRACEPARENT})
    [received] = [r for r in engine.received if r.method == b"POST"]
    assert received.headers[b"traceparent"] == [TRACEPARENT.encode()]
    metrics = ProxyMetrics(plain.proxy.runtime)
    assert "nvpair_trace" not in metrics.exposition().decode()
    metrics.close()
