# -*- test-case-name: tests.traces.test_tracing -*-
"""The OpenTelemetry SDK pipeline of ``--otlp-endpoint``: a private ``TracerProvider``, a bounded
``BatchSpanProcessor`` on its own thread, the OTLP/HTTP exporter, and counts of what was exported
and what was dropped (docs/behaviour.md §12.5).

The reactor thread only hands an ended span to the processor's queue; encoding and HTTP happen on
the processor's thread. A span the collector did not take (unreachable, refused, timed out) or that
found the queue full is dropped and counted, never retried past the exporter's own timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from nvpair_tw.logs import LevelledLogger

__all__ = ["MAX_QUEUE", "SERVICE_NAME", "SpanCounts", "make_provider", "traces_url"]

SERVICE_NAME = "nvpair-tw"
MAX_QUEUE = 2048
"""Spans waiting for export at most; beyond, an ended span is dropped (and counted)."""

log = LevelledLogger(namespace=__name__)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: ``endpoint`` as given, or with ``/v1/traces`` when it has no path
    (``http://collector:4318`` is the collector's base, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is).

    Raises ``ValueError`` for anything but an ``http`` or ``https`` URL with a host.
    """
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL with a host: {endpoint!r}")
    path = parts.path if parts.path not in ("", "/") else "/v1/traces"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class SpanCounts:
    """Spans handed to export, exported and dropped; updated from both threads, read at scrape."""

    def __init__(self, limit: int = MAX_QUEUE) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._pending = 0
        self._exported = 0
        self._dropped = 0

    @property
    def exported(self) -> int:
        """Spans the collector accepted."""
        with self._lock:
            return self._exported

    @property
    def dropped(self) -> int:
        """Spans lost: the queue was full, or the collector did not take their batch."""
        with self._lock:
            return self._dropped

    def admit(self) -> bool:
        """One more ended span for the queue; False (and counted dropped) when it is full."""
        with self._lock:
            if self._pending >= self._limit:
                self._dropped += 1
                return False
            self._pending += 1
            return True

    def settled(self, count: int, ok: bool) -> None:
        """A batch of ``count`` spans left the queue: exported if ``ok``, else dropped."""
        with self._lock:
            self._pending = max(0, self._pending - count)
            if ok:
                self._exported += count
            else:
                self._dropped += count


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what each batch became."""

    def __init__(self, inner: SpanExporter, counts: SpanCounts) -> None:
        self._inner = inner
        self._counts = counts

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            log.failure("span export raised")
            result = SpanExportResult.FAILURE
        self._counts.settled(len(spans), result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _BoundedProcessor(SpanProcessor):
    """The batch processor behind a bound it can be seen to keep: a span that would overflow the
    queue is dropped here, counted, instead of silently inside the SDK."""

    def __init__(self, inner: BatchSpanProcessor, counts: SpanCounts) -> None:
        self._inner = inner
        self._counts = counts

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        if self._counts.admit():
            self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def make_provider(
    endpoint: str,
    counts: SpanCounts,
    *,
    export_timeout: float = 10.0,
    schedule_delay: float = 1.0,
) -> TracerProvider:
    """A private provider (the global one is never set) exporting to ``endpoint``'s traces URL.

    ``export_timeout`` bounds one batch's export, retries included (seconds); ``schedule_delay``
    is how long ended spans may wait to be batched.
    """
    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=export_timeout)
    batch = BatchSpanProcessor(
        _CountingExporter(exporter, counts),
        max_queue_size=MAX_QUEUE,
        schedule_delay_millis=schedule_delay * 1000,
        max_export_batch_size=512,
    )
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
    provider.add_span_processor(_BoundedProcessor(batch, counts))
    return provider
