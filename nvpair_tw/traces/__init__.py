"""Traces (``--otlp-endpoint``, docs/behaviour.md §12.5): one OpenTelemetry span per request and
one per attempt, the client's W3C trace continued and forwarded to the node, exported over OTLP/HTTP.

Importing this package needs the ``traces`` extra (the OpenTelemetry SDK and OTLP/HTTP exporter);
nothing imports it unless ``--otlp-endpoint`` is given.
"""

from __future__ import annotations

from nvpair_tw.traces._export import SERVICE_NAME, SpanCounts, traces_url
from nvpair_tw.traces._tracing import RequestTracing, otlp_tracing

__all__ = ["SERVICE_NAME", "RequestTracing", "SpanCounts", "otlp_tracing", "traces_url"]
