"""Fallback models (docs/behaviour.md §16.2), over real sockets to simulated Ollama nodes: what
serves when no node can take a model, what the client and the record are told, and what never
falls back."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import pytest_twisted
import treq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed

from nvpair_tw.corridor._fallback import Fallbacks, RouteOf
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.inbound import Rejection
from nvpair_tw.nodes import Node
from nvpair_tw.nodes._catalogue import parse_catalogue
from nvpair_tw.selection import Admission, QueueTimeout, Slot, Waiter
from nvpair_tw.simulated import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import Clusters, http_client
from tests.corridor.catalogued import CataloguedCluster
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(30)

TABLES = """
[[model]]
name = "big"
defaults = { keep_alive = "1h" }
fallbacks = ["small", "tiny"]

[[model]]
name = "small"
defaults = { options = { num_ctx = 4096 } }
"""

CHAT = b'{"model":"big","messages":[{"role":"user","content":"hi"}],"stream":false}'


def node(reactor: Any, model: str, behaviour: Behaviour = Behaviour.HEALTHY) -> SimulatedEngine:
    return SimulatedEngine(reactor, (model,), policy=always(behaviour), kind="ollama")


async def fleet(
    reactor: Any,
    clusters: Clusters,
    tmp_path: Path,
    engines: dict[str, SimulatedEngine],
    tables: str = TABLES,
    **kw: Any,
) -> CataloguedCluster:
    cluster = clusters(CataloguedCluster)
    await cluster.start_catalogued(engines, tables, tmp_path, **kw)
    return cluster


async def recorded(cluster: CataloguedCluster) -> dict[str, Any]:
    """The last ``proxy/request`` record (published when the answer ended)."""
    records = cluster.named("proxy/request")
    assert records
    return records[-1]


@pytest_twisted.ensureDeferred
async def test_a_model_nobody_owns_is_served_by_its_first_fallback_with_its_own_table(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    cluster = await fleet(reactor, clusters, tmp_path, {"s": node(reactor, "small")})
    status, body, response = await cluster.post(CHAT)
    assert status == 200
    assert json.loads(body)["model"] == "small"
    assert response.headers.getRawHeaders(b"x-nvpair-model") == [b"small"]
    received = json.loads(cluster.bodies("s")[-1])
    assert received["model"] == "small"
    assert received["options"] == {"num_ctx": 4096} and "keep_alive" not in received
    record = await recorded(cluster)
    assert (record["model"], record["fallback_from"], record["node_id"]) == ("small", "big", "s")


@pytest_twisted.ensureDeferred
async def test_the_asked_model_is_served_when_a_node_has_it(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    engines = {"b": node(reactor, "big"), "s": node(reactor, "small")}
    cluster = await fleet(reactor, clusters, tmp_path, engines)
    status, body, response = await cluster.post(CHAT)
    assert status == 200 and json.loads(body)["model"] == "big"
    assert response.headers.getRawHeaders(b"x-nvpair-model") is None
    assert json.loads(cluster.bodies("b")[-1])["keep_alive"] == "1h"
    assert cluster.bodies("s") == []
    assert "fallback_from" not in await recorded(cluster)


@pytest_twisted.ensureDeferred
async def test_every_owner_cordoned_falls_back(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    engines = {"b": node(reactor, "big"), "s": node(reactor, "small")}
    cluster = await fleet(reactor, clusters, tmp_path, engines, node_lines={"b": "cordon = true"})
    status, body, _ = await cluster.post(CHAT)
    assert status == 200 and json.loads(body)["model"] == "small"
    assert cluster.bodies("b") == []


@pytest_twisted.ensureDeferred
async def test_every_owner_failing_before_commit_falls_back(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    engines = {"b": node(reactor, "big", Behaviour.STATUS_503), "s": node(reactor, "small")}
    cluster = await fleet(reactor, clusters, tmp_path, engines)
    status, body, response = await cluster.post(CHAT)
    assert status == 200 and json.loads(body)["model"] == "small"
    assert response.headers.getRawHeaders(b"x-nvpair-model") == [b"small"]
    record = await recorded(cluster)
    assert [a["node_id"] for a in record["attempts"]] == ["b", "s"]
    assert record["fallback_from"] == "big"
    workloads = cluster.named("workload:errored")
    assert [w["workload"]["model"] for w in workloads] == ["big"]


@pytest_twisted.ensureDeferred
async def test_nothing_falls_back_after_commit(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    engines = {"b": node(reactor, "big", Behaviour.DROP_MID_STREAM), "s": node(reactor, "small")}
    cluster = await fleet(reactor, clusters, tmp_path, engines)
    streamed = CHAT.replace(b'"stream":false', b'"stream":true')
    response = await http_client(reactor).post(cluster.url + "/api/chat", data=streamed)
    assert response.code == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"b"]
    with pytest.raises(ResponseFailed):
        await treq.content(response)
    assert cluster.bodies("s") == []


@pytest_twisted.ensureDeferred
async def test_fallbacks_are_one_level_deep(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """``big`` falls back to ``mid``, which nobody owns: ``mid``'s own fallback is not followed."""
    tables = '[[model]]\nname = "big"\nfallbacks = ["mid"]\n\n'
    tables += '[[model]]\nname = "mid"\nfallbacks = ["small"]\n'
    cluster = await fleet(reactor, clusters, tmp_path, {"s": node(reactor, "small")}, tables)
    status, body, _ = await cluster.post(CHAT)
    assert status == 404 and json.loads(body)["code"] == "model-not-found"
    assert cluster.bodies("s") == []


@pytest_twisted.ensureDeferred
async def test_a_fallback_outside_the_keys_scope_is_skipped(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[[key]]\nname = "k"\nkey = "sk-k-0123456789"\nmodels = ["big", "tiny"]\n')
    keys.chmod(0o600)
    engines = {"s": node(reactor, "small"), "t": node(reactor, "tiny")}
    cluster = await fleet(reactor, clusters, tmp_path, engines, keys_file=str(keys))
    auth = {"Authorization": "Bearer sk-k-0123456789"}
    status, body, response = await cluster.post(CHAT, headers=auth)
    assert status == 200 and json.loads(body)["model"] == "tiny"
    assert response.headers.getRawHeaders(b"x-nvpair-model") == [b"tiny"]
    assert cluster.bodies("s") == []
    refused, answer, _ = await cluster.post(CHAT.replace(b"big", b"small"), headers=auth)
    assert (refused, json.loads(answer)["code"]) == (403, "model-not-allowed")


@pytest_twisted.ensureDeferred
async def test_show_of_a_model_nobody_owns_answers_from_its_first_available_fallback(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """The Ollama CLI asks ``/api/show`` before it runs a model, and pulls on a 404."""
    cluster = await fleet(reactor, clusters, tmp_path, {"t": node(reactor, "tiny")})
    status, _, response = await cluster.post(b'{"name":"big"}', "/api/show")
    assert status == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"t"]
    assert json.loads(cluster.bodies("t")[-1]) == {"name": "tiny"}


@pytest_twisted.ensureDeferred
async def test_a_request_waiting_past_fallback_after_goes_to_the_fallback(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """``big``'s one slot is held by a request its node answers only after 2 s: the next request
    waits 100 ms in the queue, then the fallback serves it; the first still ends on ``big``."""
    tables = TABLES.replace('fallbacks = ["small", "tiny"]', 'fallbacks = ["small"]\n')
    tables = tables.replace('keep_alive = "1h" }', 'keep_alive = "1h" }\nfallback_after = "100ms"')
    slow = SimulatedEngine(reactor, ("big",), kind="ollama", header_delay=2.0)
    engines = {"b": slow, "s": node(reactor, "small")}
    cluster = await fleet(
        reactor, clusters, tmp_path, engines, tables, node_lines={"b": "slots = 1"}
    )
    first: Deferred[tuple[int, bytes, Any]] = Deferred.fromCoroutine(cluster.post(CHAT))
    # The two requests come on two connections: the second is sent once the first holds the slot.
    await eventually(reactor, lambda: slow.inference_count == 1, what="the first request on big")
    status, body, _ = await cluster.post(CHAT)
    assert status == 200 and json.loads(body)["model"] == "small"
    record = await recorded(cluster)
    assert record["fallback_from"] == "big" and record["queued_ms"] >= 100
    held, answer, _ = await first
    assert held == 200 and json.loads(answer)["model"] == "big"
    assert [w["workload"]["model"] for w in cluster.named("workload:errored")] == ["big"]


def waiting_fallbacks(
    clock: Clock, route_of: RouteOf, tables: list[dict[str, Any]]
) -> tuple[Fallbacks, Admission, Waiter]:
    """A request for ``big`` waiting for the one slot of ``b`` (held), with ``tables``' policies."""
    facade = cast(
        FacadeState,
        SimpleNamespace(directory=SimpleNamespace(catalogue=parse_catalogue("f", tables))),
    )
    client = cast(Inbound, SimpleNamespace(model="big", doc=None, outline=None))
    fallbacks = Fallbacks(facade, client, route_of, "big", ["small"], 5.0)
    admission = Admission(clock, lambda node_id: 1, 4, 60.0)
    nodes = [Node("b", "http://127.0.0.1:1")]
    assert isinstance(admission.admit(nodes), Slot)
    waiter = admission.admit(nodes)
    assert isinstance(waiter, Waiter)
    return fallbacks, admission, waiter


def test_a_wait_with_no_fallback_to_take_goes_on_waiting_for_its_slot() -> None:
    clock = Clock()
    asked: list[str] = []

    def nobody(facade: FacadeState, inbound: Inbound) -> Rejection:
        asked.append("routed")
        return Rejection(404, "model-not-found", "none")

    fallbacks, admission, waiter = waiting_fallbacks(clock, nobody, [{"name": "big"}])
    result = fallbacks.waited(waiter, clock)
    clock.advance(5)
    assert asked == ["routed"] and not result.called and admission.queue_depth == 1
    admission.wake()
    clock.advance(56)  # the queue timeout runs out: the wait fails as it would without fallbacks
    failures: list[Failure] = []
    result.addErrback(failures.append)
    assert [f.type for f in failures] == [QueueTimeout]
    assert clock.getDelayedCalls() == []


def test_a_caller_leaving_a_wait_takes_it_out_of_the_queue_and_stops_its_timer() -> None:
    clock = Clock()

    def never(facade: FacadeState, inbound: Inbound) -> Rejection:
        raise AssertionError("no fallback is routed for a caller who left")

    fallbacks, admission, waiter = waiting_fallbacks(clock, never, [{"name": "big"}])
    result = fallbacks.waited(waiter, clock)
    result.addErrback(lambda failure: failure.trap(CancelledError))
    result.cancel()
    assert admission.queue_depth == 0 and clock.getDelayedCalls() == []
