"""Issue 14 through the facade: per-node credentials, model-routed and aggregated routes, LM Studio's
REST API, ``/v1/responses`` and ``X-NVPair-Node`` (docs/behaviour.md §2.1, §3), on simulated
engines in memory (``MemoryCluster``) and over loopback (``ProxyCluster``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from zope.interface import implementer

from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import StatusBoard
from nvpair_tw.ops._control import ControlMethods
from nvpair_tw.selection._speed import Sample
from nvpair_tw.simulated._engine import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import Clusters, MemoryCluster, ProxyCluster
from tests.helpers import refusal_code

pytestmark = pytest.mark.e2e

Make = Callable[..., MemoryCluster]

CANARY_A = "cnry-nodekey-a-4e1f9c"
CANARY_B = "cnry-nodekey-b-7a20d3"
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}


def host(node_id: str) -> str:
    """The base URL ``MemoryCluster`` serves engine ``node_id`` at (ids that are host names)."""
    return f"http://{node_id}.node.test:11434"


def authorizations(engine: SimulatedEngine, method: bytes | None = None) -> set[bytes]:
    """Every ``Authorization`` value the engine received (``b""`` for a request without one)."""
    return {
        b",".join(r.headers.get(b"authorization", [b""]))
        for r in engine.received
        if method is None or r.method == method
    }


@implementer(ILogObserver)
class LogLines:
    """Every log event while installed, rendered."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)

    def texts(self) -> list[str]:
        return [str(formatEvent(e)) + repr(e) for e in self.events]


@pytest.fixture
def log_lines() -> Iterator[LogLines]:
    lines = LogLines()
    globalLogPublisher.addObserver(lines)
    yield lines
    globalLogPublisher.removeObserver(lines)


# --- per-node credentials (docs/behaviour.md §3) -------------------------------------------------------------


def keyed_cluster(make: Make, clock: Clock, **kw: Any) -> MemoryCluster:
    """Nodes a and b each requiring their own bearer key, polled for inventory."""
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",), api_key=CANARY_A, **kw),
        "b": SimulatedEngine(clock, ("llama3:latest", "qwen:latest"), api_key=CANARY_B, **kw),
    }
    nodes = [Node("a", host("a"), api_key=CANARY_A), Node("b", host("b"), api_key=CANARY_B)]
    cluster = make(clock, engines, nodes={"ollama": nodes})
    cluster.flush()
    return cluster


def test_each_node_is_sent_only_its_own_key_on_every_kind_of_request(memory_cluster: Make) -> None:
    """Inventory polls, inference (the client's own Authorization replaced), pass-through and the
    model-list fan-out all reach each keyed node with its own key, and only with it."""
    clock = Clock()
    cluster = keyed_cluster(memory_cluster, clock)
    facade = cluster.facade()
    assert facade.inventory.models("b") == {"llama3:latest", "qwen:latest"}  # the polls succeeded
    qwen = cluster.fetch(
        "POST", "/api/chat", json={**CHAT, "model": "qwen"}, headers={"authorization": "Bearer x"}
    )
    assert (qwen.status, qwen.header("x-nvpair-node")) == (200, "b")
    tags = cluster.fetch("GET", "/api/tags")
    assert tags.status == 200 and len(tags.json()["models"]) == 2
    version = cluster.fetch("GET", "/api/version")
    assert version.status == 200
    a, b = cluster.engines["a"], cluster.engines["b"]
    assert isinstance(a, SimulatedEngine) and isinstance(b, SimulatedEngine)
    assert authorizations(a) == {f"Bearer {CANARY_A}".encode()}
    assert authorizations(b) == {f"Bearer {CANARY_B}".encode()}
    assert {r.path for r in b.received} >= {b"/api/tags", b"/api/chat"}


def test_a_node_without_a_key_still_gets_the_clients_authorization(memory_cluster: Make) -> None:
    """Only a node with its own credential has the client's header replaced."""
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock)})
    response = cluster.fetch("POST", "/api/chat", json=CHAT, headers={"authorization": "Bearer c"})
    assert response.status == 200
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    assert authorizations(engine, b"POST") == {b"Bearer c"}


def test_url_userinfo_becomes_basic_authorization_and_is_never_sent_in_the_url(
    memory_cluster: Make,
) -> None:
    """``http://user:pass@host`` reaches the node as ``Authorization: Basic`` on inference and on
    the inventory poll."""
    clock = Clock()
    engine = SimulatedEngine(clock, api_key=None)
    cluster = memory_cluster(
        clock,
        {"a": engine},
        nodes={"ollama": [Node("a", "http://us%40r:p%3Ass@a.node.test:11434")]},
    )
    cluster.flush()
    assert cluster.fetch("POST", "/api/chat", json=CHAT).status == 200
    assert authorizations(engine) == {b"Basic dXNAcjpwOnNz"}  # base64("us@r:p:ss")
    assert all(b"@" not in r.path for r in engine.received)
    assert {r.path for r in engine.received} == {b"/api/tags", b"/api/ps", b"/api/chat"}


def test_no_node_key_or_userinfo_reaches_logs_events_nodes_list_or_the_status_page(
    memory_cluster: Make, log_lines: LogLines
) -> None:
    """Canary keys (and a URL password) appear in no log line, event, ``nodes/list`` answer or
    ``/api/state`` snapshot, through success, a 401 and a failed poll."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, api_key=CANARY_A),
        "b": SimulatedEngine(clock, api_key="another"),  # b refuses its key: a 401, a failed poll
    }
    nodes = [
        Node("a", host("a"), api_key=CANARY_A),
        Node("b", f"http://u:{CANARY_B}@b.node.test:11434"),
    ]
    cluster = memory_cluster(clock, engines, nodes={"ollama": nodes})
    cluster.flush()
    cluster.fetch("POST", "/api/chat", json=CHAT)
    cluster.fetch("GET", "/api/tags")
    cluster.fetch("GET", "/api/version", headers={"x-nvpair-node": "b"})
    listed = ControlMethods(cluster.runtime).call("nodes/list", {})
    assert isinstance(listed, dict)
    board = StatusBoard(cluster.runtime)
    state = board.state(lambda _engine: True)
    board.close()
    texts = [
        *log_lines.texts(),
        *(json.dumps(dict(e.payload)) + repr(e) for e in cluster.events),
        json.dumps(listed),
        json.dumps(state),
        repr(cluster.facade().directory.nodes()),
    ]
    failed = f"node b unreachable: status 401 at {host('b')} (ollama facade)"
    assert any(t.startswith(failed) for t in texts)  # the failure was logged, without userinfo
    assert [u["url"] for u in listed["nodes"]] == [host("a"), host("b")]
    basic = base64.b64encode(f"u:{CANARY_B}".encode()).decode()
    for canary in (CANARY_A, CANARY_B, basic):
        assert not [t for t in texts if canary in t], canary


# --- model-routed and aggregated routes ---------------------------------------------------------


def engine(cluster: MemoryCluster, node_id: str) -> SimulatedEngine:
    found = cluster.engines[node_id]
    assert isinstance(found, SimulatedEngine)
    return found


def paths(cluster: MemoryCluster, node_id: str) -> list[bytes]:
    return [r.path for r in engine(cluster, node_id).received]


def test_api_show_goes_to_the_only_owner_and_never_to_another_node(memory_cluster: Make) -> None:
    """``/api/show`` for a model only b has goes to b (``model`` or the older ``name``), never a."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",)),
        "b": SimulatedEngine(clock, ("smollm2:latest",)),
    }
    cluster = memory_cluster(clock, engines)
    for body in ({"model": "smollm2"}, {"name": "smollm2:latest"}):
        response = cluster.fetch("POST", "/api/show", json=body)
        assert (response.status, response.header("x-nvpair-node")) == (200, "b")
        assert response.json()["details"] == {"family": "sim"}
    assert paths(cluster, "a") == []
    assert paths(cluster, "b") == [b"/api/show", b"/api/show"]
    assert cluster.named("workload:started") == []  # no workload


def test_api_show_of_an_unknown_model_is_404_without_contacting_a_node(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock), "b": SimulatedEngine(clock)})
    response = cluster.fetch("POST", "/api/show", json={"model": "nope:7b"})
    assert response.status == 404
    assert response.json() == {
        "error": "model 'nope:7b' not found (models you may use: llama3:latest)",
        "code": "model-not-found",
    }
    assert paths(cluster, "a") == paths(cluster, "b") == []


def test_api_show_moves_on_past_a_stale_owner_404_and_a_5xx(memory_cluster: Make) -> None:
    """An owner whose inventory is stale (404) or that fails (503) is passed over, like inference."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",)),  # a advertises qwen but lost it: 404
        "b": SimulatedEngine(clock, ("qwen:latest",), policy=always(Behaviour.STATUS_503)),
        "c": SimulatedEngine(clock, ("qwen:latest",)),
    }
    nodes = [
        Node("a", host("a"), ("qwen:latest",)),
        Node("b", host("b"), ("qwen:latest",)),
        Node("c", host("c"), ("qwen:latest",)),
    ]
    cluster = memory_cluster(clock, engines, nodes={"ollama": nodes})
    response = cluster.fetch("POST", "/api/show", json={"model": "qwen"})
    assert (response.status, response.header("x-nvpair-node")) == (200, "c")
    assert [len(paths(cluster, n)) for n in "abc"] == [1, 1, 1]


def test_api_ps_lists_every_nodes_loaded_models_tagged_and_never_merged(
    memory_cluster: Make,
) -> None:
    """A model loaded on two nodes is listed twice, once per ``nvpair_node``; records verbatim."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest", "qwen:latest"), loaded=("llama3:latest",)),
        "b": SimulatedEngine(
            clock, ("llama3:latest", "qwen:latest"), loaded=("llama3:latest", "qwen:latest")
        ),
        "c": SimulatedEngine(clock),  # no /api/ps (404): left out, like any failing node
    }
    cluster = memory_cluster(clock, engines)
    response = cluster.fetch("GET", "/api/ps")
    assert response.status == 200
    listed = [(m["model"], m["nvpair_node"], m["size_vram"]) for m in response.json()["models"]]
    assert listed == [
        ("llama3:latest", "a", 1),
        ("llama3:latest", "b", 1),
        ("qwen:latest", "b", 1),
    ]


# --- LM Studio's REST API -------------------------------------------------------------------------


def lmstudio(make: Make, clock: Clock, **kw: Any) -> MemoryCluster:
    engines = {
        "a": SimulatedEngine(clock, ("qwen-7b",), loaded=(), **kw),
        "b": SimulatedEngine(clock, ("qwen-7b", "gemma-3"), loaded=("gemma-3",), **kw),
    }
    settings = Settings(response_header_timeout=5.0)
    return make(clock, engines, facades=("lmstudio",), settings=settings)


def test_lmstudio_native_chat_is_gated_404_for_an_unknown_model(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = lmstudio(memory_cluster, clock)
    response = cluster.fetch("POST", "/api/v0/chat/completions", json={**CHAT, "model": "x"})
    assert response.status == 404 and response.json()["code"] == "model-not-found"
    assert paths(cluster, "a") == paths(cluster, "b") == []


@pytest.mark.parametrize(
    "path", ["/api/v0/chat/completions", "/api/v0/completions", "/api/v0/embeddings"]
)
def test_lmstudio_native_inference_fails_over_past_a_frozen_owner(
    memory_cluster: Make, path: str
) -> None:
    """A frozen owner stalls (header deadline), cools, and the other owner answers, like ``/v1``."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("qwen-7b",), policy=always(Behaviour.FROZEN)),
        "b": SimulatedEngine(clock, ("qwen-7b",)),
    }
    settings = Settings(response_header_timeout=5.0)
    cluster = memory_cluster(clock, engines, facades=("lmstudio",), settings=settings)
    pending = cluster.request("POST", path, json={**CHAT, "model": "qwen-7b", "stream": True})
    cluster.advance(5.0)
    response = cluster.result(pending)
    cluster.flush()
    assert (response.status, response.header("x-nvpair-node")) == (200, "b")
    assert response.complete
    assert paths(cluster, "a") == paths(cluster, "b") == [path.encode()]
    assert cluster.facade().stalls.cooldown("a") is not None
    assert cluster.named("workload:started")  # inference: a workload
    assert cluster.named("workload:completed")


def test_lmstudio_model_list_is_aggregated_and_a_model_lookup_goes_to_an_owner(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = lmstudio(memory_cluster, clock)
    listed = cluster.fetch("GET", "/api/v0/models")
    assert listed.status == 200
    assert [(r["id"], r["state"]) for r in listed.json()["data"]] == [
        ("qwen-7b", "not-loaded"),  # a's record comes first, verbatim
        ("gemma-3", "loaded"),
    ]
    assert all("nvpair_node" not in r for r in listed.json()["data"])
    one = cluster.fetch("GET", "/api/v0/models/gemma-3")
    assert (one.status, one.header("x-nvpair-node"), one.json()["id"]) == (200, "b", "gemma-3")
    assert b"/api/v0/models/gemma-3" not in paths(cluster, "a")
    missing = cluster.fetch("GET", "/api/v0/models/nope")
    assert missing.status == 404 and missing.json()["code"] == "model-not-found"


# --- /v1/responses --------------------------------------------------------------------------------


def responses_cluster(make: Make, clock: Clock, facade: str = "ollama") -> MemoryCluster:
    engines = {
        "a": SimulatedEngine(clock, ("gpt-oss:latest",), response_prefix="resp_a"),
        "b": SimulatedEngine(clock, ("gpt-oss:latest",), response_prefix="resp_b"),
    }
    return make(clock, engines, facades=(facade,), settings=Settings(response_header_timeout=5.0))


@pytest.mark.parametrize("facade", ["ollama", "lmstudio", "omlx"])
def test_responses_is_inference_on_every_facade_and_a_stream_ends_at_response_completed(
    memory_cluster: Make, facade: str
) -> None:
    """Gated (502 for an unknown model), failed over past a frozen node, and relayed as SSE up to
    ``response.completed`` on every facade."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("gpt-oss:latest",), policy=always(Behaviour.FROZEN)),
        "b": SimulatedEngine(clock, ("gpt-oss:latest",)),
    }
    cluster = memory_cluster(
        clock, engines, facades=(facade,), settings=Settings(response_header_timeout=5.0)
    )
    unknown = cluster.fetch("POST", "/v1/responses", json={"model": "nope", "input": "hi"})
    assert unknown.status == 404 and refusal_code(unknown.json()) == "model-not-found"
    body = {"model": "gpt-oss:latest", "input": "hi", "stream": True}
    pending = cluster.request("POST", "/v1/responses", json=body)
    cluster.advance(5.0)
    response = cluster.result(pending)
    cluster.flush()
    assert (response.status, response.header("x-nvpair-node")) == (200, "b") and response.complete
    assert response.body.rstrip().rsplit(b"\n\n", 1)[-1].startswith(b"event: response.completed")
    [record] = [r for r in cluster.named("proxy/request") if r["status"] == 200]
    assert record["node_id"] == "b"


@pytest.mark.parametrize("stream", [True, False])
def test_previous_response_id_goes_back_to_the_node_that_produced_it(
    memory_cluster: Make, stream: bool
) -> None:
    """The id is read from the first SSE event or the JSON ``id``; a follow-up naming it goes to
    that node even when the order now puts another node first; an unknown id follows the order."""
    clock = Clock()
    cluster = responses_cluster(memory_cluster, clock)
    facade = cluster.facade()
    body = {"model": "gpt-oss", "input": "hi", "stream": stream}
    facade.pin = "a"
    first = cluster.fetch("POST", "/v1/responses", json=body)
    assert first.header("x-nvpair-node") == "a" and b"resp_a_1" in first.body
    facade.pin = "b"
    again = cluster.fetch(
        "POST", "/v1/responses", json={**body, "previous_response_id": "resp_a_1"}
    )
    assert again.header("x-nvpair-node") == "a"
    other = cluster.fetch("POST", "/v1/responses", json={**body, "previous_response_id": "resp_x"})
    assert other.header("x-nvpair-node") == "b"


def test_previous_response_id_goes_to_its_node_even_when_another_is_predicted_faster(
    memory_cluster: Make,
) -> None:
    """§2.1 over §15.2: ``a`` has measured ten times slower than ``b``, but the follow-up naming
    ``a``'s response goes to ``a`` (its choice among the candidates is not made by prediction)."""
    clock = Clock()
    cluster = responses_cluster(memory_cluster, clock)
    facade = cluster.facade()
    facade.speeds.learn("a", "gpt-oss", Sample(decode_rate=10.0, completion_tokens=3))
    facade.speeds.learn("b", "gpt-oss", Sample(decode_rate=100.0, completion_tokens=3))
    body = {"model": "gpt-oss", "input": "hi"}
    facade.pin = "a"
    first = cluster.fetch("POST", "/v1/responses", json=body)
    assert first.header("x-nvpair-node") == "a" and b"resp_a_1" in first.body
    facade.pin = ""
    fresh = cluster.fetch("POST", "/v1/responses", json=body)
    assert fresh.header("x-nvpair-node") == "b"
    again = cluster.fetch(
        "POST", "/v1/responses", json={**body, "previous_response_id": "resp_a_1"}
    )
    assert again.header("x-nvpair-node") == "a"


def test_previous_response_id_is_forgotten_after_the_session_ttl(memory_cluster: Make) -> None:
    """A stored response is kept as long as a session (docs/behaviour.md §2.1): past the affinity
    TTL it still binds, past the session TTL it is forgotten."""
    clock = Clock()
    cluster = responses_cluster(memory_cluster, clock)
    facade = cluster.facade()
    body = {"model": "gpt-oss", "input": "hi"}
    facade.pin = "a"
    cluster.fetch("POST", "/v1/responses", json=body)
    facade.pin = "b"
    cluster.advance(Settings().affinity_ttl)
    kept = cluster.fetch("POST", "/v1/responses", json={**body, "previous_response_id": "resp_a_1"})
    assert kept.header("x-nvpair-node") == "a"
    cluster.advance(Settings().session_ttl)
    later = cluster.fetch(
        "POST", "/v1/responses", json={**body, "previous_response_id": "resp_a_1"}
    )
    assert later.header("x-nvpair-node") == "b"


# --- X-NVPair-Node ------------------------------------------------------------------------------


def test_x_nvpair_node_reaches_only_that_node_and_never_the_engine(memory_cluster: Make) -> None:
    """Pass-through, inference for a model the node does not advertise (no gate) and a model list
    go to the targeted node alone; the header is removed before forwarding."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",)),
        "b": SimulatedEngine(clock, ("qwen:latest",)),
    }
    cluster = memory_cluster(clock, engines)
    to_b = {"x-nvpair-node": "b"}
    pull = cluster.fetch("POST", "/api/pull", json={"model": "llama3"}, headers=to_b)
    unowned = {**CHAT, "model": "nobody-has-it"}  # no gate: no 502 no-model-owner
    chat = cluster.fetch("POST", "/api/chat", json=unowned, headers=to_b)
    tags = cluster.fetch("GET", "/api/tags", headers=to_b)
    assert [r.header("x-nvpair-node") for r in (pull, chat)] == ["b", "b"]
    assert [m["model"] for m in tags.json()["models"]] == ["qwen:latest"]
    assert paths(cluster, "a") == []
    assert paths(cluster, "b") == [b"/api/pull", b"/api/chat", b"/api/tags"]
    assert all(b"x-nvpair-node" not in r.headers for r in engine(cluster, "b").received)


@pytest.mark.parametrize("wanted", [["zzz"], ["a", "b"]])
def test_x_nvpair_node_naming_no_node_is_404_unknown_node(
    memory_cluster: Make, wanted: list[str]
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock), "b": SimulatedEngine(clock)})
    response = cluster.fetch("POST", "/api/chat", json=CHAT, headers={"x-nvpair-node": wanted})
    assert response.status == 404
    assert response.json() == {
        "error": "X-NVPair-Node names a node this facade does not know",
        "code": "unknown-node",
    }
    assert paths(cluster, "a") == paths(cluster, "b") == []


def test_x_nvpair_node_does_not_fail_over(memory_cluster: Make) -> None:
    """A targeted node that stalls is the only attempt: 502 (and it cools); the other is idle."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, policy=always(Behaviour.FROZEN)),
        "b": SimulatedEngine(clock),
    }
    cluster = memory_cluster(clock, engines, settings=Settings(response_header_timeout=5.0))
    pending = cluster.request("POST", "/api/chat", json=CHAT, headers={"x-nvpair-node": "a"})
    cluster.advance(5.0)
    response = cluster.result(pending)
    assert response.status == 502 and response.json()["code"] == "upstream-error"
    assert paths(cluster, "b") == []
    assert cluster.facade().stalls.cooldown("a") is not None


# --- over loopback sockets ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_over_sockets_keyed_nodes_are_polled_and_served_each_with_its_own_credential(
    clusters: Clusters,
) -> None:
    """Real treq polls and real upstream connections: a (Bearer from ``api_key``) and b (Basic from
    URL userinfo, never in the request line) each see only their own credential; the client's
    ``X-NVPair-Node`` reaches neither engine."""
    cluster = clusters(ProxyCluster)
    a = SimulatedEngine(cluster.reactor, ("llama3:latest",), api_key=CANARY_A)
    b = SimulatedEngine(cluster.reactor, ("qwen:latest",), api_key=None)
    node_a = await cluster.add_engine("a", a)
    node_b = await cluster.add_engine("b", b)
    userinfo = node_b.url.replace("http://", f"http://u:{CANARY_B}@")
    proxy = await cluster.start_proxy(
        [Node("a", node_a.url, api_key=CANARY_A), Node("b", userinfo)]
    )
    await proxy.runtime.facades["ollama"].inventory.poll_now()
    chat_a = json.dumps(CHAT).encode()
    chat_b = json.dumps({**CHAT, "model": "qwen"}).encode()
    mine = {"authorization": "Bearer client-own"}
    code_a, _, answer_a = await cluster.post(chat_a, headers=mine)
    code_b, _, answer_b = await cluster.post(chat_b, headers=mine)
    show, body, _ = await cluster.post(
        json.dumps({"model": "qwen"}).encode(), "/api/show", headers={"x-nvpair-node": "b"}
    )
    assert (code_a, code_b, show) == (200, 200, 200), body
    assert answer_a.headers.getRawHeaders("x-nvpair-node") == ["a"]
    assert answer_b.headers.getRawHeaders("x-nvpair-node") == ["b"]
    basic = b"Basic " + base64.b64encode(f"u:{CANARY_B}".encode())
    assert authorizations(a) == {f"Bearer {CANARY_A}".encode()}
    assert authorizations(b) == {basic}
    assert [r.path for r in b.received if r.method == b"POST"] == [b"/api/chat", b"/api/show"]
    assert {r.path for r in b.received if r.method == b"GET"} == {b"/api/tags", b"/api/ps"}
    assert all(b"x-nvpair-node" not in r.headers for r in (*a.received, *b.received))
