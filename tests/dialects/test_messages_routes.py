"""Anthropic Messages through the corridor to a node that lacks it (docs/behaviour.md §17.3):
translated to chat completions and back, in memory on one clock and over loopback sockets.

The simulated Ollama engine answers ``/v1/messages`` with Gin's 404 (as Ollama 0.9.3 does), so
every Messages answer here proves the translation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from nvpair_tw.core import ENGINES, Settings
from nvpair_tw.nodes import Node
from nvpair_tw.selection import Reach
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    MemoryCluster,
    ProxyCluster,
    SimulatedEngine,
    always,
)

pytestmark = pytest.mark.timeout(30)

Make = Callable[..., MemoryCluster]
MODEL = "smollm2"


def request(stream: bool | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 32,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}],
    }
    if stream is not None:
        body["stream"] = stream
    return body


def events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in body.split(b"\n\n"):
        if frame:
            name, data = frame.split(b"\n")
            doc = json.loads(data.removeprefix(b"data: "))
            assert name == b"event: " + doc["type"].encode()
            out.append(doc)
    return out


def sent(cluster: MemoryCluster, node_id: str) -> list[tuple[bytes, dict[str, Any]]]:
    engine = cluster.engines[node_id]
    assert isinstance(engine, SimulatedEngine)
    return [(r.path, json.loads(r.body)) for r in engine.received if r.method == b"POST"]


def test_the_ollama_profile_lacks_messages_and_the_openai_profile_speaks_it() -> None:
    OLLAMA, OPENAI = ENGINES["ollama"], ENGINES["openai"]  # noqa: N806
    assert OLLAMA.lacks("/v1/messages") and OLLAMA.lacks("/v1/messages/count_tokens")
    assert not OLLAMA.speaks("/v1/messages") and OLLAMA.speaks("/v1/chat/completions")
    assert OPENAI.speaks("/v1/messages") and not OPENAI.lacks("/v1/messages")


@pytest.mark.parametrize("facade", ["ollama", "openai"])
def test_a_messages_stream_to_an_ollama_node_is_translated(
    memory_cluster: Make, facade: str
) -> None:
    """Behind its own facade too: an Ollama node is asked ``/v1/chat/completions``."""
    clock = Clock()
    engine = SimulatedEngine(clock, (MODEL,), kind="ollama")
    cluster = memory_cluster(clock, {"a": engine}, facades=(facade,))
    response = cluster.fetch("POST", "/v1/messages", json=request(stream=True))
    assert response.status == 200 and response.complete
    assert response.header("content-type") == "text/event-stream"
    got = events(response.body)
    assert got[0]["type"] == "message_start" and got[0]["message"]["model"] == MODEL
    assert [e["type"] for e in got[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e["delta"]["text"] for e in got if e["type"] == "content_block_delta")
    assert text == "hello0hello1hello2"
    assert got[-2]["usage"]["output_tokens"] == 3
    [(path, body)] = sent(cluster, "a")
    assert path == b"/v1/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["max_tokens"] == 32 and body["stream"] is True
    [record] = cluster.named("proxy/request")
    assert record["translated"] and (record["prompt_tokens"], record["completion_tokens"]) == (3, 3)


def test_a_whole_messages_answer_is_one_message_object(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, (MODEL,), kind="ollama")})
    response = cluster.fetch("POST", "/v1/messages", json=request())
    assert response.status == 200
    message = response.json()
    assert message["type"] == "message" and message["model"] == MODEL
    assert message["content"] == [{"type": "text", "text": "hello0hello1hello2"}]
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] == 3
    [record] = cluster.named("proxy/request")
    assert record["translated"] and record["completion_tokens"] == 3


def test_an_upstream_error_is_in_messages_error_shape_with_the_same_status(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    engine = SimulatedEngine(clock, (MODEL,), kind="ollama", policy=always(Behaviour.STATUS_400))
    cluster = memory_cluster(clock, {"a": engine})
    response = cluster.fetch("POST", "/v1/messages", json=request(stream=True))
    assert response.status == 400
    answer = response.json()
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert isinstance(answer["error"]["message"], str)


def test_a_translated_messages_stream_cut_mid_way_never_looks_complete(
    memory_cluster: Make,
) -> None:
    """§11.3: no ``message_stop``, the chunked framing left unfinished."""
    clock = Clock()
    dropping = SimulatedEngine(
        clock, (MODEL,), kind="ollama", policy=always(Behaviour.DROP_MID_STREAM), chunks=6
    )
    cluster = memory_cluster(clock, {"a": dropping})
    response = cluster.fetch("POST", "/v1/messages", json=request(stream=True))
    assert response.status == 200 and response.truncated
    assert b"message_start" in response.body and b"message_stop" not in response.body


def test_an_untranslatable_messages_request_is_refused_without_contacting_a_node(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, (MODEL,), kind="ollama")})
    body = {**request(), "mcp_servers": [{"type": "url", "url": "https://x"}]}
    response = cluster.fetch("POST", "/v1/messages", json=body)
    assert response.status == 400 and response.json()["code"] == "untranslatable"
    assert "mcp_servers" in response.json()["error"]["message"]
    assert sent(cluster, "a") == []


@pytest_twisted.ensureDeferred
async def test_a_translated_messages_stream_over_loopback_sockets(
    reactor: Any, clusters: Clusters
) -> None:
    """The same translation over real sockets: the client reads Messages events, whole."""
    cluster = clusters(ProxyCluster)
    await cluster.start({"a": SimulatedEngine(reactor, (MODEL,), kind="ollama")})
    status, body, response = await cluster.post(
        json.dumps(request(stream=True)).encode(), "/v1/messages"
    )
    assert status == 200
    assert response.headers.getRawHeaders(b"content-type") == [b"text/event-stream"]
    got = events(body)
    assert [e["type"] for e in got][:2] == ["message_start", "content_block_start"]
    assert got[-1] == {"type": "message_stop"}
    [upstream] = cluster.received(0)
    assert json.loads(upstream)["stream_options"] == {"include_usage": True}


# --- /v1/messages/count_tokens (docs/behaviour.md §17.3) ------------------------------------------

COUNT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_count_tokens_is_model_routed_on_every_facade() -> None:
    for profile in ENGINES.values():
        route = profile.model_route(b"POST", "/v1/messages/count_tokens")
        assert route is not None and route.model("/v1/messages/count_tokens", COUNT) == MODEL


def test_count_tokens_goes_to_an_owner_that_serves_it(memory_cluster: Make) -> None:
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, (MODEL,), kind="ollama"),
        "b": SimulatedEngine(clock, (MODEL,), kind="openai"),
    }
    cluster = memory_cluster(clock, engines)
    for _ in range(3):
        response = cluster.fetch("POST", "/v1/messages/count_tokens", json=COUNT)
        assert response.header("x-nvpair-node") == "b"
    assert sent(cluster, "a") == []
    assert [path for path, _ in sent(cluster, "b")] == [b"/v1/messages/count_tokens"] * 3


def test_count_tokens_with_no_owner_that_serves_it_is_a_404_in_messages_shape(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, (MODEL,), kind="ollama")})
    response = cluster.fetch("POST", "/v1/messages/count_tokens", json=COUNT)
    assert response.status == 404
    answer = response.json()
    assert answer["type"] == "error" and answer["error"]["type"] == "not_found_error"
    assert answer["code"] == "no-route-owner" and isinstance(answer["error"]["message"], str)
    assert sent(cluster, "a") == []
    unknown = cluster.fetch("POST", "/v1/messages/count_tokens", json={**COUNT, "model": "nope"})
    assert unknown.status == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_a_refusal_on_messages_is_in_messages_error_shape(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, (MODEL,), kind="ollama")})
    response = cluster.fetch("POST", "/v1/messages", json={**request(), "model": "nope"})
    assert response.status == 404
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": f"model: nope (models you may use: {MODEL})",
        },
        "code": "model-not-found",
    }


def test_a_frozen_node_fails_over_to_another_each_attempt_translated(
    memory_cluster: Make,
) -> None:
    """§11.3: the second attempt is translated from the client's own body, like the first."""
    clock = Clock()
    frozen = SimulatedEngine(clock, (MODEL,), kind="ollama", policy=always(Behaviour.FROZEN))
    engines = {"a": frozen, "b": SimulatedEngine(clock, (MODEL,), kind="ollama")}
    cluster = memory_cluster(clock, engines, settings=Settings(response_header_timeout=5.0))
    cluster.facade().pin = "a"
    pending = cluster.request("POST", "/v1/messages", json=request(stream=True))
    cluster.advance(5.0)
    response = cluster.result(pending)
    assert response.status == 200 and response.header("x-nvpair-node") == "b"
    assert events(response.body)[-1] == {"type": "message_stop"}
    assert sent(cluster, "a") == sent(cluster, "b")
    [(path, _)] = sent(cluster, "b")
    assert path == b"/v1/chat/completions"


# --- a node whose build lacks /v1/messages (docs/behaviour.md §17.3) ---------------------------------


def no_messages(_number: int, path: bytes) -> Behaviour:
    """A build without ``/v1/messages``: vLLM and LocalAI answer it ``404 {"detail": "Not
    Found"}``, FastAPI's words for a route it does not have."""
    return Behaviour.NO_ROUTE if path == b"/v1/messages" else Behaviour.HEALTHY


def vllm(clock: Any, **kw: Any) -> SimulatedEngine:
    """An OpenAI-compatible node without ``/v1/messages``, as vLLM and LocalAI builds are."""
    return SimulatedEngine(clock, (MODEL,), kind="openai", policy=no_messages, **kw)


def content(body: bytes) -> list[Any]:
    """A Messages answer (events or one message) without its id."""
    got = events(body) if body.startswith(b"event:") else [json.loads(body)]
    for answer in got:
        answer.get("message", answer).pop("id", None)
    return got


def attempts(record: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["node_id"], a["outcome"]) for a in record["attempts"]]


@pytest.mark.parametrize("stream", [True, False])
def test_a_node_that_lacks_messages_is_sent_the_translation_in_the_same_request(
    memory_cluster: Make, stream: bool
) -> None:
    """Its missing-route 404 reaches no client: the same node is asked again with the
    translation before anything is committed, and every later request is translated from the
    start."""
    clock = Clock()
    cluster = memory_cluster(clock, {"v": vllm(clock)}, facades=("openai",))
    first = cluster.fetch("POST", "/v1/messages", json=request(stream=stream))
    assert first.status == 200 and first.header("x-nvpair-node") == "v"
    if stream:
        assert events(first.body)[-1] == {"type": "message_stop"}
    else:
        assert first.json()["content"] == [{"type": "text", "text": "hello0hello1hello2"}]
    second = cluster.fetch("POST", "/v1/messages", json=request(stream=stream))
    assert second.status == 200 and content(second.body) == content(first.body)
    paths = [path for path, _ in sent(cluster, "v")]
    assert paths == [b"/v1/messages", b"/v1/chat/completions", b"/v1/chat/completions"]
    one, two = cluster.named("proxy/request")
    assert attempts(one) == [("v", "status-404"), ("v", "committed")]
    assert attempts(two) == [("v", "committed")]
    assert one["translated"] and two["translated"] and one["status"] == 200


def test_the_node_that_lacks_messages_keeps_the_request_it_was_chosen_for(
    memory_cluster: Make,
) -> None:
    """Asked again at once, translated, rather than passed over for the next candidate."""
    clock = Clock()
    engines = {"v": vllm(clock), "l": SimulatedEngine(clock, (MODEL,), kind="openai")}
    cluster = memory_cluster(clock, engines, facades=("openai",))
    cluster.facade().pin = "v"
    response = cluster.fetch("POST", "/v1/messages", json=request(stream=True))
    assert response.status == 200 and response.header("x-nvpair-node") == "v"
    assert sent(cluster, "l") == []
    unpinned = cluster.facade()
    unpinned.pin = None
    cluster.fetch("POST", "/v1/messages", json=request(stream=True))
    native = [path for path, _ in sent(cluster, "l")]
    translated = [path for path, _ in sent(cluster, "v")][1:]
    assert set(native) <= {b"/v1/messages"} and set(translated) == {b"/v1/chat/completions"}


def test_a_404_about_the_model_is_not_a_missing_route(memory_cluster: Make) -> None:
    """A 404 whose body is not a missing route's goes on as before (the last candidate's is the
    answer, §6.1), and the node keeps being sent ``/v1/messages``."""
    clock = Clock()
    engine = SimulatedEngine(clock, (MODEL,), kind="openai", policy=always(Behaviour.STATUS_404))
    cluster = memory_cluster(clock, {"v": engine}, facades=("openai",))
    for _ in range(2):
        response = cluster.fetch("POST", "/v1/messages", json=request(stream=True))
        assert response.status == 404 and response.json() == {"error": "simulated 404"}
    assert [path for path, _ in sent(cluster, "v")] == [b"/v1/messages"] * 2
    assert not cluster.facade().gaps.of(cluster.node("v"))


def test_count_tokens_is_not_sent_to_a_node_found_without_messages(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"v": vllm(clock)}, facades=("openai",))
    cluster.fetch("POST", "/v1/messages", json=request())
    response = cluster.fetch("POST", "/v1/messages/count_tokens", json=COUNT)
    assert response.status == 404 and response.json()["code"] == "no-route-owner"
    assert b"/v1/messages/count_tokens" not in [path for path, _ in sent(cluster, "v")]


def test_what_was_learnt_holds_until_the_nodes_restart_is_seen(memory_cluster: Make) -> None:
    """A polled node: the gap holds while it keeps answering its poll (its build unchanged as far
    as the proxy can tell); once its poll fails and it answers again, it is sent ``/v1/messages``
    as it is again (here an upgrade that has it)."""
    clock = Clock()
    engine = vllm(clock)
    polled = Node("v", "http://v.node.test:11434", kind="openai")
    cluster = memory_cluster(clock, {"v": engine}, facades=("openai",), nodes={"openai": [polled]})
    inventory = cluster.facade().inventory

    def poll() -> None:
        cluster.flush()
        pending = inventory.poll_now()
        for _ in range(60):
            if pending.called:
                return
            cluster.advance(1.0)
        raise AssertionError("the poll did not end within 60 s")

    poll()
    cluster.fetch("POST", "/v1/messages", json=request())
    engine.policy = always(Behaviour.HEALTHY)  # upgraded; the proxy has not seen it restart
    poll()
    cluster.fetch("POST", "/v1/messages", json=request())
    engine.frozen = True  # down for the upgrade: its poll goes unanswered
    poll()
    assert inventory.reach.of(polled).state is Reach.UNREACHABLE
    assert cluster.facade().gaps.of(polled) == ()
    engine.frozen = False
    poll()
    cluster.fetch("POST", "/v1/messages", json=request())
    paths = [path for path, _ in sent(cluster, "v")]
    assert paths == [b"/v1/messages", *[b"/v1/chat/completions"] * 2, b"/v1/messages"]


@pytest_twisted.ensureDeferred
async def test_a_node_that_lacks_messages_over_loopback_sockets(
    reactor: Any, clusters: Clusters
) -> None:
    """The same over real sockets: an OpenAI-compatible node answering ``/v1/messages`` as vLLM
    does; the client reads Messages events both times, the node is asked for the route once."""
    cluster = clusters(ProxyCluster)
    cluster.engine_name = "openai"
    engine = vllm(reactor)
    await cluster.start({"v": engine})
    for _ in range(2):
        status, body, response = await cluster.post(
            json.dumps(request(stream=True)).encode(), "/v1/messages"
        )
        assert status == 200 and events(body)[-1] == {"type": "message_stop"}
        assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"v"]
    posted = [r.path for r in engine.received if r.method == b"POST"]
    assert posted == [b"/v1/messages", b"/v1/chat/completions", b"/v1/chat/completions"]
    records = cluster.named("proxy/request")
    first, second = [("v", "status-404"), ("v", "committed")], [("v", "committed")]
    assert [attempts(r) for r in records] == [first, second]
