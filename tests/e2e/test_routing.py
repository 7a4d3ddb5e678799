"""Acceptance checks of the routing issue over real loopback sockets.

The capability gate per engine, the model-list fan-out, inventory polling, pin and priority,
reservations under concurrency and prefix affinity, each seen from a client of the proxy: which
node saw which request, and what the proxy answered and recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import pytest_twisted
import treq
from attrs import define, field
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import IDelayedCall, IListeningPort
from twisted.web.iweb import IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._reservations import make_rank
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    Policy,
    ProxyCluster,
    SimulatedEngine,
    always,
    http_client,
)
from tests.helpers import chat, eventually, refusal_code

pytestmark = pytest.mark.e2e

T = TypeVar("T")
NO_OWNER = "model-not-found"


async def together(requests: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run coroutines concurrently; their results in order."""
    return await gatherResults([Deferred.fromCoroutine(r) for r in requests])


def quiet_site(resource: Resource) -> Site:
    """A Site that does not log every connection."""
    site = Site(resource)
    site.noisy = False
    return site


class Canned(Resource):
    """A node that answers every GET with fixed bytes per path (garbage for unknown paths)."""

    isLeaf = True

    def __init__(self, clock: Any, answers: dict[bytes, Any], delay: float = 0.0) -> None:
        super().__init__()
        self._clock = clock
        self._answers = {path: json.dumps(doc).encode() for path, doc in answers.items()}
        self._delay = delay
        self._timers: list[IDelayedCall] = []

    def render_GET(self, request: Request) -> bytes | int:
        body = self._answers.get(request.path, b"<html>not json</html>")
        if self._delay <= 0:
            return body
        self._timers.append(self._clock.callLater(self._delay, self._answer, request, body))
        return NOT_DONE_YET

    def _answer(self, request: Request, body: bytes) -> None:
        if request.channel is not None:
            request.write(body)
            request.finish()

    def stop(self) -> None:
        for timer in self._timers:
            if timer.active():
                timer.cancel()


class Switch(Resource):
    """Wraps an engine; while ``down`` its inventory GETs are refused (the connection is aborted)."""

    isLeaf = True

    def __init__(self, engine: SimulatedEngine) -> None:
        super().__init__()
        self.engine = engine
        self.down = False
        self.refused = 0

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        if self.down and request.method == b"GET":
            self.refused += 1
            assert request.transport is not None
            request.transport.abortConnection()  # type: ignore[attr-defined]
            return NOT_DONE_YET
        return self.engine.render(request)


@define
class Cluster(ProxyCluster):
    """A proxy cluster whose nodes may also be plain resources, posting JSON documents."""

    engines: dict[str, SimulatedEngine] = field(factory=dict)
    ports: list[IListeningPort] = field(factory=list)
    canned: list[Canned] = field(factory=list)

    async def node(
        self,
        node_id: str,
        models: tuple[str, ...],
        policy: Policy | None = None,
        **kw: Any,
    ) -> Node:
        """A healthy (or ``policy``-driven) simulated engine advertising ``models`` statically."""
        engine = SimulatedEngine(
            self.reactor, models, policy if policy is not None else always(Behaviour.HEALTHY), **kw
        )
        self.engines[node_id] = engine
        return await self.add_engine(node_id, engine)

    def serve(self, resource: Resource) -> str:
        """Listen ``resource`` on loopback; its base URL."""
        if isinstance(resource, Canned):
            self.canned.append(resource)
        port = self.reactor.listenTCP(0, quiet_site(resource), interface="127.0.0.1")
        self.ports.append(port)
        return f"http://127.0.0.1:{port.getHost().port}"

    async def closed_url(self) -> str:
        """The URL of a loopback port nobody listens on any more."""
        port = self.reactor.listenTCP(0, quiet_site(Resource()), interface="127.0.0.1")
        number = port.getHost().port
        await port.stopListening()
        return f"http://127.0.0.1:{number}"

    async def post_json(self, path: str, document: Any) -> tuple[int, bytes, IResponse]:
        """POST ``document`` as JSON to the proxy."""
        return await self.post(json.dumps(document).encode(), path)

    async def get(self, path: str) -> tuple[int, bytes]:
        response = await http_client(self.reactor).get(self.url + path)
        return response.code, await treq.content(response)

    def models_seen(self, node_id: str) -> list[str]:
        """The ``model`` of every inference request ``node_id`` received."""
        return [
            json.loads(r.body)["model"]
            for r in self.engines[node_id].received
            if r.method == b"POST"
        ]

    async def stop(self) -> None:
        await super().stop()
        for canned in self.canned:
            canned.stop()
        for port in self.ports:
            await maybeDeferred(port.stopListening)


@pytest.fixture
def cluster(clusters: Clusters) -> Cluster:
    """A cluster stopped (proxy, then nodes) after the test."""
    return clusters(Cluster)


def served_by(response: Any) -> str:
    """The node named by the response's ``X-NVPair-Node`` header."""
    [node] = response.headers.getRawHeaders(b"x-nvpair-node")
    return str(node.decode())


# --- the capability gate -------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_each_model_reaches_only_its_owners(reactor: Any, cluster: Cluster) -> None:
    """Concurrent requests for three models, spread by reservations, land only on owners; ``llama3``
    reaches owners of ``llama3:latest``."""
    nodes = [
        await cluster.node("n0", ("llama3:latest",), chunk_delay=0.1),
        await cluster.node("n1", ("mistral:7b",), chunk_delay=0.1),
        await cluster.node("n2", ("llama3:latest", "phi3:mini"), chunk_delay=0.1),
    ]
    await cluster.start_proxy(nodes)
    cluster.facade.shared.ledger.apply(1, ["n0", "n1", "n2"], [])
    wanted = ["llama3", "llama3", "mistral:7b", "phi3:mini", "llama3", "mistral:7b"]
    answers = await together([cluster.post_json("/api/chat", chat(m)) for m in wanted])
    assert [code for code, _, _ in answers] == [200] * len(wanted)
    by_model: dict[str, set[str]] = {}
    for model, (_, _, response) in zip(wanted, answers, strict=True):
        by_model.setdefault(model, set()).add(served_by(response))
    assert by_model == {"llama3": {"n0", "n2"}, "mistral:7b": {"n1"}, "phi3:mini": {"n2"}}
    assert Counter(cluster.models_seen("n0")) == Counter({"llama3": 2})
    assert Counter(cluster.models_seen("n1")) == Counter({"mistral:7b": 2})
    assert Counter(cluster.models_seen("n2")) == Counter({"llama3": 1, "phi3:mini": 1})


@pytest.mark.parametrize(
    ("engine", "first", "second", "requested", "served"),
    [
        ("omlx", "llama3", "Mistral-7B-Instruct", "mistral-7b-instruct", "n1"),
        ("omlx", "Mistral-7B-Instruct", "llama3", "MISTRAL-7B-INSTRUCT", "n0"),
        ("lmstudio", "Mistral-7B-Instruct", "mistral-7b-instruct", "mistral-7b-instruct", "n1"),
        ("lmstudio", "Mistral-7B-Instruct", "llama3", "mistral-7b-instruct", None),
        ("ollama", "llama3:8b", "llama3:latest", "llama3", "n1"),
        ("ollama", "mistral:7b", "llama3", "llama3:latest", "n1"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_engine_matching_rule_picks_the_owner(
    reactor: Any,
    cluster: Cluster,
    engine: str,
    first: str,
    second: str,
    requested: str,
    served: str | None,
) -> None:
    """omlx matches case-insensitively, lmstudio exactly, ollama with ``:latest``; n0 is tried first
    whenever it matches, so a request served by n1 shows that n0 did not match."""
    cluster.engine_name = engine
    nodes = [await cluster.node("n0", (first,)), await cluster.node("n1", (second,))]
    await cluster.start_proxy(nodes)
    code, content, response = await cluster.post_json("/v1/chat/completions", chat(requested))
    if served is None:
        assert code == 404 and refusal_code(content) == NO_OWNER
        assert cluster.models_seen("n0") == cluster.models_seen("n1") == []
        return
    assert code == 200 and served_by(response) == served
    assert cluster.models_seen(served) == [requested]
    assert cluster.models_seen("n1" if served == "n0" else "n0") == []


@pytest_twisted.ensureDeferred
async def test_model_nobody_has_gets_404_and_no_node_is_contacted(
    reactor: Any, cluster: Cluster
) -> None:
    """An unowned model is answered 404 JSON by the proxy itself; no node sees any request."""
    nodes = [
        await cluster.node("n0", ("llama3:latest",)),
        await cluster.node("n1", ("mistral:7b",)),
        await cluster.node("n2", ("phi3:mini",)),
    ]
    await cluster.start_proxy(nodes)
    code, content, response = await cluster.post_json("/api/chat", chat("gemma:2b"))
    assert code == 404
    assert refusal_code(content) == NO_OWNER
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert all(engine.received == [] for engine in cluster.engines.values())
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["attempts"]) == (404, [])


# --- model lists -----------------------------------------------------------------------------------

A_TAGS = {
    "models": [
        {"name": "llama3:latest", "model": "llama3:latest", "size": 1},
        {"name": "mistral:7b", "model": "mistral:7b", "size": 2},
    ]
}
A_MODELS = {
    "object": "list",
    "data": [
        {"id": "llama3:latest", "object": "model", "owned_by": "a"},
        {"id": "mistral:7b", "object": "model", "owned_by": "a"},
    ],
}
D_MODELS = ("llama3", "mistral:7b", "qwen2:0.5b")


def _tag(name: str) -> dict[str, Any]:
    return {"name": name, "model": name}


def _oai(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model"}


@pytest.mark.parametrize(
    ("path", "priority", "expected"),
    [
        ("/api/tags", [], {"models": [*A_TAGS["models"], _tag("qwen2:0.5b")]}),
        ("/api/tags", ["d"], {"models": [_tag(m) for m in D_MODELS]}),
        (
            "/v1/models",
            [],
            {"object": "list", "data": [*A_MODELS["data"], _oai("llama3"), _oai("qwen2:0.5b")]},
        ),
        (
            "/v1/models",
            ["d"],
            {"object": "list", "data": [*(_oai(m) for m in D_MODELS), A_MODELS["data"][0]]},
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_model_lists_merge_in_candidate_order_skipping_bad_nodes(
    reactor: Any, cluster: Cluster, path: str, priority: list[str], expected: Any
) -> None:
    """Two good nodes (the first candidate answering last), one down, one answering garbage: the
    good answers merge in candidate order, de-duplicated, the first record winning verbatim."""
    slow = Canned(reactor, {b"/api/tags": A_TAGS, b"/v1/models": A_MODELS}, delay=0.2)
    nodes = [
        Node("a", cluster.serve(slow), ("llama3:latest",)),
        Node("b", await cluster.closed_url(), ("llama3:latest",)),
        Node("c", cluster.serve(Canned(reactor, {})), ("llama3:latest",)),
        await cluster.node("d", D_MODELS),
    ]
    await cluster.start_proxy(nodes)
    if priority:
        cluster.facade.shared.ledger.apply(1, priority, [])
    code, content = await cluster.get(path)
    assert code == 200
    assert json.loads(content) == expected


@pytest.mark.parametrize("path", ["/api/tags", "/v1/models"])
@pytest_twisted.ensureDeferred
async def test_model_list_with_every_node_down_is_503(
    reactor: Any, cluster: Cluster, path: str
) -> None:
    """No good answer from any node (down or garbage) → 503 ``model inventory unavailable``."""
    nodes = [
        Node("a", await cluster.closed_url(), ("llama3:latest",)),
        Node("b", await cluster.closed_url(), ("llama3:latest",)),
        Node("c", await cluster.closed_url(), ("llama3:latest",)),
    ]
    await cluster.start_proxy(nodes)
    code, content = await cluster.get(path)
    assert code == 503
    assert json.loads(content)["error"] == "model inventory unavailable"


# --- inventory polling -------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_polled_node_is_eligible_once_polled_and_keeps_its_last_inventory(
    reactor: Any, cluster: Cluster
) -> None:
    """Never polled → ineligible (502); first good poll → eligible; failing polls afterwards keep
    the last good inventory, so the node still serves the model."""
    engine = SimulatedEngine(reactor, ("llama3:latest",))
    switch = Switch(engine)
    switch.down = True
    cluster.engines["n0"] = engine
    polled = Node("n0", cluster.serve(switch))
    await cluster.start_proxy(
        [polled, await cluster.node("n1", ("mistral:7b",))],
        Settings(inventory_interval=0.05, inventory_timeout=1.0),
    )
    inventory = cluster.facade.inventory
    await eventually(reactor, lambda: switch.refused >= 1)
    assert not inventory.known("n0")
    code, content, response = await cluster.post_json("/api/chat", chat("llama3"))
    # n0 may own it once it answers (docs/behaviour.md §4.2): not a 404, and the client may retry
    assert code == 503 and refusal_code(content) == "model-unavailable"
    assert response.headers.getRawHeaders(b"retry-after") == [b"1"]

    switch.down = False
    await eventually(reactor, lambda: inventory.known("n0"))
    code, _, response = await cluster.post_json("/api/chat", chat("llama3"))
    assert code == 200 and served_by(response) == "n0"

    switch.down = True
    refused = switch.refused
    await eventually(reactor, lambda: switch.refused >= refused + 2)
    assert inventory.models("n0") == frozenset({"llama3:latest"})
    code, _, response = await cluster.post_json("/api/chat", chat("llama3"))
    assert code == 200 and served_by(response) == "n0"
    assert cluster.models_seen("n0") == ["llama3", "llama3"]


# --- pin and priority --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_eligible_pin_wins_and_ineligible_pin_is_ignored(
    reactor: Any, cluster: Cluster
) -> None:
    """A pin on an owner takes the request; a pin on a non-owner is ignored and never contacted."""
    nodes = [
        await cluster.node("n0", ("llama3:latest",)),
        await cluster.node("n1", ("llama3:latest",)),
        await cluster.node("n2", ("mistral:7b",)),
    ]
    await cluster.start_proxy(nodes)
    cluster.facade.pin = "n1"
    _, _, response = await cluster.post_json("/api/chat", chat("llama3"))
    assert served_by(response) == "n1"
    cluster.facade.pin = "n2"
    code, _, response = await cluster.post_json("/api/chat", chat("llama3", "another chat"))
    assert code == 200 and served_by(response) == "n0"
    assert cluster.models_seen("n2") == []


@pytest_twisted.ensureDeferred
async def test_priority_snapshot_reorders_and_stale_generation_is_ignored(
    reactor: Any, cluster: Cluster
) -> None:
    """The priority list puts its least-loaded node first; a snapshot not newer changes nothing."""
    nodes = [await cluster.node(f"n{i}", ("llama3:latest",)) for i in range(3)]
    await cluster.start_proxy(nodes)
    ledger = cluster.facade.shared.ledger
    assert ledger.apply(5, ["n2", "n1"], [make_rank("n2", 0, 0), make_rank("n1", 0, 0)])
    _, _, response = await cluster.post_json("/api/chat", chat("llama3"))
    assert served_by(response) == "n2"
    assert ledger.apply(6, ["n2", "n1"], [make_rank("n2", 3, 1)])
    _, _, response = await cluster.post_json("/api/chat", chat("llama3"))
    assert served_by(response) == "n1"
    assert not ledger.apply(6, ["n0"], [])
    assert not ledger.apply(2, ["n0"], [])
    _, _, response = await cluster.post_json("/api/chat", chat("llama3"))
    assert served_by(response) == "n1"


# --- reservations ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_concurrent_requests_spread_evenly_and_release_their_reservations(
    reactor: Any, cluster: Cluster
) -> None:
    """100 overlapping equal-load requests over a 4-node priority list: per-node counts differ by at
    most one, and every reservation is released once they are done."""
    ids = [f"n{i}" for i in range(4)]
    nodes = [await cluster.node(i, ("llama3:latest",), chunks=4, chunk_delay=0.2) for i in ids]
    await cluster.start_proxy(nodes)
    ledger = cluster.facade.shared.ledger
    ledger.apply(1, ids, [make_rank(i, 0, 0) for i in ids])
    pending: list[Deferred[tuple[int, bytes, Any]]] = []

    def admitted() -> bool:
        return len(cluster.named("workload:started")) == len(pending)

    # Batches below the listen backlog (50), each admitted before the next, so none waits for a
    # SYN retry and all 100 overlap.
    for batch in range(4):
        pending.extend(
            Deferred.fromCoroutine(cluster.post_json("/api/chat", chat("llama3", f"q{batch}-{n}")))
            for n in range(25)
        )
        await eventually(reactor, admitted)
    assert cluster.named("workload:completed") == [], "the requests did not overlap"
    assert sum(ledger.reservations(i) for i in ids) == 100
    answers = await gatherResults(pending)
    assert all(code == 200 for code, _, _ in answers)
    counts = Counter(served_by(response) for _, _, response in answers)
    assert set(counts) == set(ids)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert {i: len(cluster.engines[i].received) for i in ids} == dict(counts)
    assert [ledger.reservations(i) for i in ids] == [0, 0, 0, 0]


# --- prefix affinity ---------------------------------------------------------------------------------


def ndjson_reply(content: bytes) -> str:
    """The assistant text of a complete Ollama NDJSON stream."""
    lines = [json.loads(line) for line in content.splitlines() if line.strip()]
    assert lines[-1]["done"] is True
    return "".join(line["message"]["content"] for line in lines if not line["done"])


def sse_reply(content: bytes) -> str:
    """The assistant text of a complete OpenAI SSE stream."""
    frames = [f[len(b"data: ") :] for f in content.split(b"\n\n") if f.startswith(b"data: ")]
    assert frames[-1] == b"[DONE]"
    return "".join(json.loads(f)["choices"][0]["delta"]["content"] for f in frames[:-1])


@pytest_twisted.ensureDeferred
async def test_chat_returns_to_the_node_that_served_its_prefix(
    reactor: Any, cluster: Cluster
) -> None:
    """A 5-turn chat stays on n0 through a priority inversion; a turn n0 fails (503) is served and
    recorded by n1, so the next turn goes to n1; ``cache_affinity`` marks promoted-and-served turns."""

    def n0_fails_fourth(number: int, _path: bytes) -> Behaviour:
        return Behaviour.STATUS_503 if number == 4 else Behaviour.HEALTHY

    nodes = [
        await cluster.node("n0", ("llama3:latest",), n0_fails_fourth),
        await cluster.node("n1", ("llama3:latest",)),
        await cluster.node("n2", ("llama3:latest",)),
    ]
    await cluster.start_proxy(nodes)
    ledger = cluster.facade.shared.ledger
    ledger.apply(1, ["n0", "n1", "n2"], [])
    messages: list[dict[str, Any]] = []
    served = []
    for turn in range(1, 6):
        if turn == 3:
            assert ledger.apply(2, ["n1", "n2", "n0"], [])
        messages.append({"role": "user", "content": f"turn {turn}"})
        code, content, response = await cluster.post_json(
            "/api/chat", {"model": "llama3", "messages": messages}
        )
        assert code == 200
        served.append(served_by(response))
        messages.append({"role": "assistant", "content": ndjson_reply(content)})
    assert served == ["n0", "n0", "n0", "n1", "n1"]
    records = cluster.named("proxy/request")
    assert [r["cache_affinity"] for r in records] == [False, True, True, False, True]
    assert [a["outcome"] for a in records[3]["attempts"]] == ["status-503", "committed"]


@pytest_twisted.ensureDeferred
async def test_generation_settings_keep_affinity_and_tools_break_it(
    reactor: Any, cluster: Cluster
) -> None:
    """Turn 2 resent with another ``temperature`` returns to the warm node; another ``tools`` schema
    does not; neither does a warm node whose gate fails (queue above one)."""
    nodes = [await cluster.node(f"n{i}", ("llama3:latest",)) for i in range(2)]
    await cluster.start_proxy(nodes)
    ledger = cluster.facade.shared.ledger
    ledger.apply(1, ["n0", "n1"], [])
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    other_tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    first = [{"role": "user", "content": "turn 1"}]
    turn1 = {"model": "llama3", "stream": True, "tools": tools, "temperature": 0.2}
    code, content, response = await cluster.post_json(
        "/v1/chat/completions", {**turn1, "messages": first}
    )
    assert code == 200 and served_by(response) == "n0"
    messages = [
        *first,
        {"role": "assistant", "content": sse_reply(content)},
        {"role": "user", "content": "turn 2"},
    ]
    ledger.apply(2, ["n1", "n0"], [])

    async def turn2(**changes: Any) -> str:
        document = {**turn1, "messages": messages, **changes}
        code, content, response = await cluster.post_json("/v1/chat/completions", document)
        assert code == 200
        sse_reply(content)
        return served_by(response)

    assert await turn2(temperature=0.9) == "n0"
    assert await turn2(tools=other_tools) == "n1"
    ledger.apply(3, ["n1", "n0"], [make_rank("n0", 2, 0)])
    assert await turn2() == "n1"
    records = cluster.named("proxy/request")
    assert [r["cache_affinity"] for r in records] == [False, True, False, False]
