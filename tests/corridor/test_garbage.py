"""A finished request leaves nothing for the cyclic collector (docs/performance.md): reference
counting frees its objects when it ends, so no collector pass walks them later."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted

from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import Clusters, ProxyCluster

pytestmark = pytest.mark.timeout(30)

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def saved_garbage() -> Iterator[list[Any]]:
    """While the test runs, what the collector finds unreachable is kept in ``gc.garbage``."""
    gc.collect()
    del gc.garbage[:]
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        del gc.garbage[:]


PER_REQUEST = frozenset(
    {
        "LimitedRequest",
        "LimitedChannel",
        "Head",
        "Inbound",
        "Route",
        "AttemptPlan",
        "AsIs",
        "Speech",
        "Wire",
        "Facts",
        "Exchange",
        "Driver",
        "Serving",
        "Asked",
        "Writer",
        "Workload",
        "CallerState",
        "Trip",
        "ReplayBodyProducer",
        "_HeaderDeadline",
        "_Deadline",
        "Assembly",
        "BodyGate",
    }
)
"""The proxy's objects made for one request or one client connection (a runtime torn down by an
earlier test may still leave its own objects to the collector while this one runs)."""


def _ours(garbage: list[Any]) -> set[str]:
    return {
        type(o).__qualname__
        for o in garbage
        if type(o).__module__.startswith("nvpair_tw.") and type(o).__qualname__ in PER_REQUEST
    }


@pytest_twisted.ensureDeferred
async def test_finished_requests_leave_no_reference_cycle_of_the_proxy(
    reactor: Any, clusters: Clusters, saved_garbage: list[Any]
) -> None:
    cluster = clusters(ProxyCluster)
    await cluster.start([SimulatedEngine(reactor, chunks=3)])
    await cluster.post(CHAT)  # warm: connections pooled, modules' caches filled
    gc.collect()
    del saved_garbage[:]
    for stream in (True, False):
        body = json.dumps({**json.loads(CHAT), "stream": stream}).encode()
        for _ in range(5):
            status, _, _ = await cluster.post(body)
            assert status == 200
    gc.collect()
    assert _ours(saved_garbage) == set()
