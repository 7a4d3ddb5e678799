# -*- test-case-name: tests.traces.test_tracing -*-
"""One span per request, one child per attempt, the client's trace continued (docs/behaviour.md
§12.5).

The facade calls :meth:`RequestTracing.begin` as a request starts: its span is started then, as a
child of the client's W3C ``traceparent`` (and ``tracestate``) when it sent one, and the client's
headers are rewritten so every node is sent the request span as the parent. The span ends when the
request's ``proxy/request`` record is published: its attributes and its attempts' spans come from
that record, the attempts laid out one after another by their durations.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.web.http_headers import Headers

from nvpair_tw.events import Event, EventBus, ProxyRequest, Subscription
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.traces._attributes import attempt_spans, request_attributes, span_name
from nvpair_tw.traces._export import SpanCounts, make_provider

__all__ = ["RequestTracing", "otlp_tracing"]

log = LevelledLogger(namespace=__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = (b"traceparent", b"tracestate")
_OPEN_LIMIT = 100_000
"""Request spans open at once at most (a safety bound: every record is published)."""


def _carrier(headers: Headers) -> dict[str, str]:
    """The client's trace-context headers (first value of each), as the propagator reads them."""
    found = {}
    for name in _TRACE_HEADERS:
        values = headers.getRawHeaders(name)
        if values:
            found[name.decode()] = values[0].decode("latin-1")
    return found


class RequestTracing:
    """The tracer of one process: spans from request records, exported by ``provider``."""

    def __init__(
        self,
        clock: IReactorTime,
        bus: EventBus,
        provider: TracerProvider,
        counts: SpanCounts,
    ) -> None:
        self._clock = clock
        self.provider = provider
        self.counts = counts
        self._tracer = provider.get_tracer("nvpair_tw")
        self._open: dict[str, tuple[Span, float, int]] = {}
        self._subscription: Subscription | None = bus.subscribe(
            self._observe, name="traces", kinds=(ProxyRequest,)
        )

    @property
    def open_spans(self) -> int:
        """Request spans started whose record is not published yet."""
        return len(self._open)

    def _wall_ns(self, clock_seconds: float) -> int:
        """A time on the proxy's clock as wall-clock nanoseconds (the clock may be a test's)."""
        return time.time_ns() + round((clock_seconds - self._clock.seconds()) * 1e9)

    def begin(self, request_id: str, name: str, started: float, headers: Headers) -> None:
        """Start the span of request ``request_id`` (continuing the client's trace) and make
        ``headers`` carry it."""
        if len(self._open) >= _OPEN_LIMIT:
            return
        parent = _PROPAGATOR.extract(_carrier(headers))
        start = self._wall_ns(started)
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, start_time=start)
        self._open[request_id] = (span, started, start)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        for header in _TRACE_HEADERS:
            headers.removeHeader(header)
            value = carrier.get(header.decode())
            if value:
                headers.setRawHeaders(header, [value.encode("latin-1")])

    def _observe(self, event: Event) -> None:
        if not isinstance(event.value, ProxyRequest):
            return
        try:
            self._end(event.value, event.time)
        except Exception:
            log.failure("a request span could not be ended")

    def _end(self, record: ProxyRequest, now: float) -> None:
        opened = self._open.pop(record.id, None)
        if opened is None:
            # A record made below the facade (413, 408, ...): its span is made whole now.
            duration = max(0, record.duration_ms or 0)
            end = self._wall_ns(now)
            start = end - duration * 1_000_000
            span = self._tracer.start_span(
                span_name(record), kind=SpanKind.SERVER, start_time=start
            )
        else:
            span, started, start = opened
            end = start + round((now - started) * 1e9)
            span.update_name(span_name(record))
        span.set_attributes(request_attributes(record, record.workload_id))
        status = record.status
        if status is not None and status >= 500:
            span.set_status(Status(StatusCode.ERROR, record.error or str(status)))
        parent = trace.set_span_in_context(span)
        for attempt in attempt_spans(record):
            attempt_start = min(end, start + attempt.offset_ms * 1_000_000)
            child = self._tracer.start_span(
                attempt.name,
                context=parent,
                kind=SpanKind.CLIENT,
                start_time=attempt_start,
                attributes=attempt.attributes,
            )
            if attempt.failed:
                child.set_status(
                    Status(StatusCode.ERROR, str(attempt.attributes["nvpair.outcome"]))
                )
            child.end(end_time=min(end, attempt_start + attempt.ms * 1_000_000))
        span.end(end_time=end)

    def flush(self, reactor: IReactorThreads) -> Deferred[bool]:
        """Export every ended span now, on a thread (the reactor keeps running meanwhile)."""
        return deferToThreadPool(reactor, reactor.getThreadPool(), self.provider.force_flush)

    def shutdown(self, reactor: object) -> Deferred[None]:
        """Stop: no more spans; the queue is exported (bounded by the exporter's timeout) on a
        thread when ``reactor`` has threads, else here."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        for span, _, _ in self._open.values():
            span.end()
        self._open.clear()
        if IReactorThreads.providedBy(reactor):
            return deferToThreadPool(reactor, reactor.getThreadPool(), self.provider.shutdown)
        self.provider.shutdown()
        return succeed(None)


def otlp_tracing(
    clock: IReactorTime,
    bus: EventBus,
    endpoint: str,
    *,
    export_timeout: float = 10.0,
    schedule_delay: float = 1.0,
) -> RequestTracing:
    """Traces of every request on ``bus``, exported over OTLP/HTTP to ``endpoint``."""
    counts = SpanCounts()
    provider = make_provider(
        endpoint, counts, export_timeout=export_timeout, schedule_delay=schedule_delay
    )
    return RequestTracing(clock, bus, provider, counts)
