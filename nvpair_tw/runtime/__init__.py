"""One process put together: the shared pool and clients, twistd services, listeners."""

from __future__ import annotations

from nvpair_tw.runtime._collector import steady_collector
from nvpair_tw.runtime._endpoints import (
    client_url,
    openai_url,
    own_urls,
    owner_only,
    tcp_listener,
)
from nvpair_tw.runtime._process import Runtime, StallTrackerFactory, build_runtime
from nvpair_tw.runtime._service import CannotListen, ListenerService, RuntimeService

__all__ = [
    "CannotListen",
    "ListenerService",
    "Runtime",
    "RuntimeService",
    "StallTrackerFactory",
    "build_runtime",
    "client_url",
    "openai_url",
    "own_urls",
    "owner_only",
    "steady_collector",
    "tcp_listener",
]
