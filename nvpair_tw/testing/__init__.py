# -*- test-case-name: tests.test_testing -*-
"""Test doubles for the proxy: in-memory (no sockets) and loopback clusters of simulated engines.

:class:`MemoryCluster` is to the proxy what ``treq.testing.StubTreq`` is to a treq client: it runs
one or more real facades (built by :func:`nvpair_tw.runtime._process.build_runtime`) over
:class:`~nvpair_tw.simulated._engine.SimulatedEngine` nodes, with every connection (client to facade, facade
to node) held in memory and every timer on one ``task.Clock``. Nothing listens and nothing waits: a
test sends a request, then moves time with :meth:`MemoryCluster.flush` and
:meth:`MemoryCluster.advance` and looks at what arrived. For example::

    clock = Clock()
    cluster = MemoryCluster(clock, {"a": SimulatedEngine(clock, chunk_delay=1.0)})
    pending = cluster.request("POST", "/api/chat", json={"model": "llama3", "messages": []})
    response = cluster.result(pending)      # flushes: the headers are in, the first chunk too
    cluster.advance(1.0)                    # one more chunk per simulated second
    assert response.header("x-nvpair-node") == "a" and len(response.chunks) == 2
    cluster.stop()                          # the clock holds no timer afterwards

Bytes move through ``twisted.test.iosim`` transports, so the proxy sees HTTP/1.1 as on the wire
(framing, keep-alive, a peer that hangs up or resets), but nothing the kernel does: no socket
buffers, backpressure or connection refusal timing. Tests about those use :class:`ProxyCluster`,
:func:`start_engine` and :func:`start_proxy`, which listen on real loopback ports.

The simulated engine itself lives in :mod:`nvpair_tw.simulated._engine` (production code, ``--demo`` uses
it) and is re-exported here for tests.
"""

from __future__ import annotations

from nvpair_tw.simulated import (
    Behaviour,
    Policy,
    Received,
    SimulatedEngine,
    alternate,
    always,
    reply_frames,
    stream_kind,
)
from nvpair_tw.testing._loopback import (
    Clusters,
    EngineHandle,
    ProxyCluster,
    ProxyHandle,
    http_client,
    start_engine,
    start_proxy,
)
from nvpair_tw.testing._memory import MemoryCluster, MemoryResponse
from nvpair_tw.testing._network import MemoryNetwork

__all__ = [
    "Behaviour",
    "Clusters",
    "EngineHandle",
    "MemoryCluster",
    "MemoryNetwork",
    "MemoryResponse",
    "Policy",
    "ProxyCluster",
    "ProxyHandle",
    "Received",
    "SimulatedEngine",
    "alternate",
    "always",
    "http_client",
    "reply_frames",
    "start_engine",
    "start_proxy",
    "stream_kind",
]
