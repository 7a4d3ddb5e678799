"""llama.cpp router nodes (docs/behaviour.md §17.2) over real sockets: a simulated router of kind
``openai`` (``models_max`` set, :mod:`nvpair_tw.simulated._router`) whose inventory, residency and
``models_max`` the proxy polls (the nodes have no static model list).

- No model swap on a router whose loaded models are all busy while another candidate exists.
- A prompt-less ``/api/generate`` (``ollama run``'s preload, §17.6) loads through the router's own
  ``POST /models/load``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet.defer import Deferred

from nvpair_tw.nodes import Node
from nvpair_tw.simulated import Behaviour, Policy, SimulatedEngine, always
from nvpair_tw.testing import Clusters, ProxyCluster, http_client
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(30)


def held_first(number: int, _path: bytes) -> Behaviour:
    """The first inference request gets its headers and then silence: it stays in flight."""
    return Behaviour.HEADERS_ONLY if number == 1 else Behaviour.HEALTHY


HEALTHY = always(Behaviour.HEALTHY)


def router(reactor: Any, policy: Policy = HEALTHY) -> SimulatedEngine:
    """A router holding ``a`` and ``b``, ``a`` loaded, room for one model (``--models-max 1``)."""
    return SimulatedEngine(
        reactor, ("a", "b"), policy=policy, loaded=["a"], kind="openai", models_max=1, slots=4
    )


async def polled(
    clusters: Clusters,
    engine_name: str,
    engines: dict[str, SimulatedEngine],
    speeds: dict[str, float] | None = None,
) -> ProxyCluster:
    """``engines`` behind one facade as polled ``openai`` nodes (``speeds``: a node's ``speed``
    in the nodes file, §15.1), once every node's inventory has been read (each advertises its
    models and the router is known as one)."""
    cluster = clusters(ProxyCluster)
    cluster.engine_name = engine_name
    nodes = []
    for node_id, engine in engines.items():
        listened = await cluster.add_engine(node_id, engine)
        speed = (speeds or {}).get(node_id)
        nodes.append(Node(node_id, listened.url, kind="openai", speed=speed))
    await cluster.start_proxy(nodes)
    inventory = cluster.facade.inventory

    def read() -> bool:
        advertised = all(
            inventory.advertises(node_id, model)
            for node_id, engine in engines.items()
            for model in engine.models
        )
        routers = [i for i, e in engines.items() if e.models_max is not None]
        return advertised and all(inventory.facts.models_max(i) is not None for i in routers)

    await eventually(cluster.reactor, read, what="every node's inventory polled")
    return cluster


def posted(engine: SimulatedEngine) -> list[tuple[bytes, Any]]:
    return [(r.path, json.loads(r.body)) for r in engine.received if r.method == b"POST"]


def hold(reactor: Any, cluster: ProxyCluster, engine: SimulatedEngine) -> Deferred[None]:
    """A request for ``a`` that the router keeps in flight (:func:`held_first`); the Deferred
    fires once its answer has ended, whole or cut off."""
    sent = http_client(reactor).post(
        f"{cluster.url}/v1/chat/completions", data=chat("a"), headers={}
    )
    read = sent.addCallback(treq.content)
    return read.addCallbacks(lambda _: None, lambda _: None)


def chat(model: str) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"model": model, "messages": messages, "stream": False}).encode()


@pytest_twisted.ensureDeferred
async def test_a_router_whose_loaded_models_are_all_busy_is_spared_a_swap(
    reactor: Any, clusters: Clusters
) -> None:
    """``r`` (a machine ten times faster than ``o``, by its ``speed``, with free slots) has ``a``
    loaded, at its ``models_max``, with a request for ``a`` in flight; a request for ``b`` goes to
    the slow ``o``, and ``r`` is neither asked for ``b`` nor made to load it, so its request for
    ``a`` is not aborted."""
    busy_router = router(reactor, held_first)
    other = SimulatedEngine(reactor, ("b",), kind="openai", slots=1)
    speeds = {"r": 10.0, "o": 1.0}
    cluster = await polled(clusters, "openai", {"r": busy_router, "o": other}, speeds)
    held = hold(reactor, cluster, busy_router)
    await eventually(reactor, lambda: len(busy_router.open_requests) == 1, what="a in flight")
    status, _, response = await cluster.post(chat("b"), "/v1/chat/completions")
    assert status == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"o"]
    assert [model["model"] for _, model in posted(busy_router)] == ["a"]
    assert busy_router.loaded == ["a"] and len(busy_router.open_requests) == 1
    busy_router.stop()  # the request for a ends (its connection closed)
    await held


@pytest_twisted.ensureDeferred
async def test_a_router_busy_with_a_model_it_loaded_for_the_proxy_is_spared_a_swap(
    reactor: Any, clusters: Clusters
) -> None:
    """The router had nothing loaded at its last poll; the proxy's request for ``a`` made it load
    ``a`` and is still running there. Until the next poll the proxy's residency says nothing is
    loaded, but a model with a request in flight on a router is loaded there: a request for ``b``
    goes to the slower plain node that has it, and ``a``'s request is not aborted."""
    busy_router = SimulatedEngine(
        reactor, ("a", "b"), policy=held_first, loaded=[], kind="openai", models_max=1, slots=4
    )
    other = SimulatedEngine(reactor, ("b",), kind="openai", slots=1)
    speeds = {"r": 10.0, "o": 1.0}
    cluster = await polled(clusters, "openai", {"r": busy_router, "o": other}, speeds)
    held = hold(reactor, cluster, busy_router)
    await eventually(reactor, lambda: len(busy_router.open_requests) == 1, what="a in flight")
    assert busy_router.loaded == ["a"] and cluster.facade.inventory.loaded("r") == frozenset()
    status, _, response = await cluster.post(chat("b"), "/v1/chat/completions")
    assert status == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"o"]
    assert [model["model"] for _, model in posted(busy_router)] == ["a"]
    assert busy_router.loaded == ["a"] and len(busy_router.open_requests) == 1
    busy_router.stop()
    await held


@pytest_twisted.ensureDeferred
async def test_the_only_owner_is_a_busy_router_and_it_still_serves(
    reactor: Any, clusters: Clusters
) -> None:
    """With no other candidate the router is asked (§17.2: sparing never leaves none)."""
    busy_router = router(reactor, held_first)
    cluster = await polled(clusters, "openai", {"r": busy_router})
    held = hold(reactor, cluster, busy_router)
    await eventually(reactor, lambda: len(busy_router.open_requests) == 1, what="a in flight")
    status, _, response = await cluster.post(chat("b"), "/v1/chat/completions")
    assert status == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"r"]
    assert busy_router.loaded == ["b"]  # a was evicted, and its request aborted
    await held


@pytest_twisted.ensureDeferred
async def test_a_promptless_generate_loads_through_the_routers_own_api(
    reactor: Any, clusters: Clusters
) -> None:
    """``ollama run``'s preload ``{"model", "keep_alive"}`` for a model the router has not loaded:
    ``POST /models/load {"model"}`` on the router, then Ollama's ``done_reason: "load"``, and the
    router's residency read again."""
    engine = router(reactor)
    cluster = await polled(clusters, "ollama", {"r": engine})
    body = json.dumps({"model": "b", "keep_alive": "5m"}).encode()
    status, answer, response = await cluster.post(body, "/api/generate")
    assert status == 200
    assert json.loads(answer)["done_reason"] == "load"
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"r"]
    assert posted(engine) == [(b"/models/load", {"model": "b"})]
    assert engine.loaded == ["b"]
    # read again at once, as after model/load (§13.3), not at the next poll 10 s later
    resident = cluster.facade.inventory.resident
    await eventually(reactor, lambda: resident("r", "b") is True, within=2.0, what="b resident")
