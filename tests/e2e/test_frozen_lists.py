"""A frozen node is paid for once by every route (docs/behaviour.md §4.3), over real loopback
sockets: two simulated engines behind one facade, one of them frozen as a whole process (every
route, its lists included, read and never answered). The first list pays the response-header
deadline once and cools the node; every later list, on any list route, answers at once from what
the facade last knew of it and names it in ``X-NVPair-Stale``; ``/api/show`` goes to the owner
that is not cooling."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq

from nvpair_tw.core import Settings
from nvpair_tw.nodes import Node
from nvpair_tw.testing import Clusters, ProxyCluster, SimulatedEngine, http_client

pytestmark = pytest.mark.e2e

DEADLINE = 1.0
QUICK = DEADLINE / 2
"""Well under the deadline: what a list that does not wait takes on loopback."""

LISTS = {
    "ollama": ("/api/tags", "/v1/models", "/api/ps"),
    "lmstudio": ("/api/v0/models", "/api/v1/models", "/v1/models"),
}


async def _frozen_pair(
    clusters: Clusters, reactor: Any, engine: str
) -> tuple[ProxyCluster, SimulatedEngine]:
    """Nodes ``a`` (``only-a`` and ``shared``, ``only-a`` loaded) and ``b`` (``shared``), both
    polled once, then ``a`` frozen; the first candidate of every list is ``a``."""
    cluster = clusters(ProxyCluster)
    cluster.engine_name = engine
    a = SimulatedEngine(reactor, models=("only-a", "shared"), loaded=("only-a",), kind=engine)
    b = SimulatedEngine(reactor, models=("shared",), loaded=(), kind=engine)
    nodes = [await cluster.add_engine("a", a), await cluster.add_engine("b", b)]
    polled = [Node(n.id, n.url) for n in nodes]  # no static list: the facade polls them
    settings = Settings(response_header_timeout=DEADLINE, inventory_interval=3600.0)
    await cluster.start_proxy(polled, settings)
    await cluster.facade.inventory.poll_now()
    a.frozen = True
    return cluster, a


async def _get(reactor: Any, url: str) -> tuple[float, int, str | None, Any]:
    """Seconds to the whole answer, its status, its ``X-NVPair-Stale`` and its JSON."""
    started = reactor.seconds()
    response = await http_client(reactor).get(url)
    body = json.loads(await treq.content(response))
    stale = response.headers.getRawHeaders(b"x-nvpair-stale")
    return reactor.seconds() - started, response.code, stale and stale[0].decode(), body


def _names(path: str, body: Any) -> set[str]:
    records = body.get("models", body.get("data", []))
    return {r.get("model") or r.get("name") or r.get("id") or r.get("key") for r in records}


@pytest.mark.parametrize("engine", sorted(LISTS))
@pytest_twisted.ensureDeferred
async def test_every_list_pays_a_frozen_node_once_then_answers_from_what_it_knew(
    reactor: Any, clusters: Clusters, engine: str
) -> None:
    """Three of each list route with node ``a`` frozen: only the very first waits (the deadline,
    once, and ``a`` is cooled); the rest answer at once, ``a``'s models still listed from its last
    answers, ``a`` named stale; ``a`` is asked for a list once."""
    cluster, a = await _frozen_pair(clusters, reactor, engine)
    asked_before = len(a.received)
    seconds = []
    for path in LISTS[engine]:
        for _ in range(3):
            took, status, stale, body = await _get(reactor, cluster.url + path)
            assert (status, stale) == (200, "a"), (path, body)
            seconds.append(took)
            if path != "/api/ps":
                assert "only-a" in {n.removesuffix(":latest") for n in _names(path, body)}
            else:
                assert [(r["name"], r["nvpair_node"]) for r in body["models"]] == [("only-a", "a")]
    assert DEADLINE * 0.9 <= seconds[0] < DEADLINE + QUICK, seconds
    assert all(s < QUICK for s in seconds[1:]), seconds
    assert len(a.received) == asked_before + 1
    [cooled] = cluster.named("node/cooldown")
    assert (cooled["node_id"], cooled["reason"]) == ("a", "no model list within 1s")


@pytest_twisted.ensureDeferred
async def test_show_goes_to_an_owner_that_is_not_cooling(reactor: Any, clusters: Clusters) -> None:
    """``/api/show`` of a model both nodes have: the frozen first candidate costs the first show
    the deadline once (a stall: it cools); later shows go to ``b`` at once, never to ``a`` (a
    cooling owner comes after every ready one). A model only the cooling node has is still asked
    of it (the only owner) and waits the deadline."""
    cluster, a = await _frozen_pair(clusters, reactor, "ollama")
    shows = []
    for _ in range(3):
        started = reactor.seconds()
        status, _, response = await cluster.post(b'{"model": "shared"}', "/api/show")
        node = response.headers.getRawHeaders(b"x-nvpair-node")
        shows.append((status, node, reactor.seconds() - started))
    assert [(s, n) for s, n, _ in shows] == [(200, [b"b"])] * 3
    assert DEADLINE * 0.9 <= shows[0][2] < DEADLINE + QUICK
    assert all(took < QUICK for _, _, took in shows[1:]), shows
    assert sum(1 for r in a.received if r.path == b"/api/show") == 1
    started = reactor.seconds()
    status, _, _ = await cluster.post(b'{"model": "only-a"}', "/api/show")
    assert status == 502 and reactor.seconds() - started >= DEADLINE * 0.9
