"""Usage sums shared through a real redis-server (docs/behaviour.md §12.4): two proxies' minutes in
one report while the store is up, local minutes only while it is away."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted

from nvpair_tw.events import ProxyRequest
from nvpair_tw.fleet._store import FleetStore
from nvpair_tw.usage._minutes import parse_report
from nvpair_tw.usage._recorder import UsageRecorder
from tests.fleet.test_store import RedisServer, _wait_sync, store_up
from tests.helpers import eventually, proxy_request

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    _wait_sync(server)
    yield server
    server.kill()


def inference(node: str, cached: int | None = None) -> ProxyRequest:
    return proxy_request(
        model="llama3",
        key="team-a",
        node_id=node,
        status=200,
        prompt_tokens=2,
        completion_tokens=3,
        cached_tokens=cached,
    )


@pytest_twisted.ensureDeferred
async def test_a_report_covers_the_fleet_and_falls_back_to_local(
    reactor: Any, redis: RedisServer
) -> None:
    from nvpair_tw.events import EventBus

    stores, recorders, buses = [], [], []
    for name in ("p1", "p2"):
        fleet = FleetStore(reactor, redis.config(), proxy_id=name)
        fleet.start()
        bus = EventBus(reactor)
        stores.append(fleet)
        buses.append(bus)
        recorders.append(UsageRecorder(reactor, bus, path=None, fleet=fleet))
    try:
        for fleet in stores:
            await eventually(reactor, store_up(fleet), 5.0, "store connected")
        buses[0].publish(inference("n1"))  # its engine said nothing of a cache
        buses[1].publish(inference("n2", cached=1))
        buses[1].publish(inference("n2", cached=1))
        for recorder in recorders:
            await recorder.flush()
        report = parse_report("1h", None, ["node"], reactor.seconds())

        async def fleet_rows() -> list[Any]:
            return list((await recorders[0].report(report))["rows"])

        seen: list[Any] = []

        async def settled() -> None:
            seen[:] = await fleet_rows()

        for _ in range(200):  # bounded: the batched writer sends within milliseconds
            await settled()
            if sum(r["requests"] for r in seen) == 3:
                break
        counts = ("requests", "prompt_tokens", "cached_tokens", "unknown_cached")
        assert [(r["node"], *(r[c] for c in counts)) for r in seen] == [
            ("n1", 1, 2, 0, 1),
            ("n2", 2, 4, 2, 0),
        ]
        assert "usage" in redis.cli("--scan")
        redis.kill()
        await eventually(reactor, lambda: not stores[0].up, 5.0, "store away")
        buses[0].publish(inference("n1"))  # never fails, counted locally
        local = await recorders[0].report(report)
        assert local["scope"] == "local"
        assert [(r["node"], r["requests"]) for r in local["rows"]] == [("n1", 2)]
    finally:
        for recorder in recorders:
            await recorder.stop()
        for fleet in stores:
            await fleet.stop()
