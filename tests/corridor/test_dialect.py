"""Every attempt speaks its node's dialect (docs/behaviour.md §11.3, §11.4): the corridor over nodes
of several kinds, in memory on one clock (the timers: failover, cooldown) and over loopback
sockets (framing, truncation, the official client).

A ``SimulatedEngine(kind=…)`` answers only its real server's routes, so a request that reached it
untranslated would get that server's 404: every translated answer here proves the translation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from attrs import evolve
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair_tw.core import AnswerTooLarge, MalformedStream, ProxyBug, Settings, StreamCut
from nvpair_tw.corridor._dialect import AsIs, TranscodedResponse
from nvpair_tw.testing import Behaviour, MemoryCluster, MemoryResponse, SimulatedEngine, always
from tests.corridor.test_attempts import PAYLOAD, Loop
from tests.helpers import chat

pytestmark = pytest.mark.timeout(30)

Make = Callable[..., MemoryCluster]
MODEL = "smollm2"


def lines(response: MemoryResponse) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.body.splitlines() if line.strip()]


def sent(cluster: MemoryCluster, node_id: str) -> list[tuple[bytes, dict[str, Any]]]:
    engine = cluster.engines[node_id]
    assert isinstance(engine, SimulatedEngine)
    return [(r.path, json.loads(r.body)) for r in engine.received if r.method == b"POST"]


def openai_node(clock: Clock, **kw: Any) -> SimulatedEngine:
    return SimulatedEngine(clock, (MODEL,), kind="openai", **kw)


def test_an_ollama_chat_stream_is_translated_for_an_openai_node(memory_cluster: Make) -> None:
    """§11.3: ``/api/chat`` goes to the node as ``/v1/chat/completions`` asking for usage; the
    client gets Ollama NDJSON ending in one ``done: true`` line with the engine's counts."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    response = cluster.fetch("POST", "/api/chat", json=chat(MODEL))
    assert response.status == 200 and response.complete
    assert response.header("content-type") == "application/x-ndjson"
    got = lines(response)
    assert [g["done"] for g in got] == [False] * (len(got) - 1) + [True]
    assert "".join(g["message"]["content"] for g in got) == "hello0hello1hello2"
    assert {g["model"] for g in got} == {MODEL}
    final = got[-1]
    assert final["done_reason"] == "stop"
    assert final["eval_count"] == 3 and isinstance(final["prompt_eval_count"], int)
    [(path, body)] = sent(cluster, "b")
    assert path == b"/v1/chat/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_a_whole_ollama_chat_is_assembled_from_the_translated_stream(memory_cluster: Make) -> None:
    """``stream: false`` is asked of the node as a stream (§6.5) and answered as one object."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    response = cluster.fetch("POST", "/api/chat", json=chat(MODEL, stream=False))
    assert response.status == 200 and response.complete
    answer = response.json()
    assert answer["message"] == {"role": "assistant", "content": "hello0hello1hello2"}
    assert answer["done"] is True and answer["model"] == MODEL and answer["eval_count"] == 3
    [(_, body)] = sent(cluster, "b")
    assert body["stream"] is True


def test_generate_embed_and_embeddings_come_back_in_ollama_shapes(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    generated = cluster.fetch(
        "POST", "/api/generate", json={"model": MODEL, "prompt": "hi", "stream": False}
    )
    assert generated.status == 200
    assert generated.json()["response"] == "hello0hello1hello2"
    embedded = cluster.fetch("POST", "/api/embed", json={"model": MODEL, "input": ["a", "b"]})
    assert embedded.status == 200
    assert len(embedded.json()["embeddings"]) == 2 and embedded.json()["model"] == MODEL
    legacy = cluster.fetch("POST", "/api/embeddings", json={"model": MODEL, "prompt": "a"})
    assert legacy.status == 200 and isinstance(legacy.json()["embedding"], list)
    assert [p for p, _ in sent(cluster, "b")] == [
        b"/v1/chat/completions",
        b"/v1/embeddings",
        b"/v1/embeddings",
    ]


def test_an_untranslatable_request_is_refused_without_contacting_a_node(
    memory_cluster: Make,
) -> None:
    """§11.3: Ollama's ``context`` has no OpenAI counterpart: 400 ``untranslatable`` naming it."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    body = {"model": MODEL, "prompt": "go on", "context": [1, 2, 3]}
    response = cluster.fetch("POST", "/api/generate", json=body)
    assert response.status == 400
    assert response.json()["code"] == "untranslatable"
    assert "context" in response.json()["error"]
    assert sent(cluster, "b") == []


def test_an_untranslatable_request_still_reaches_a_native_node(memory_cluster: Make) -> None:
    """Only nodes of another kind are excluded: the Ollama node takes ``context`` as it is."""
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, (MODEL,), kind="ollama"), "b": openai_node(clock)}
    cluster = memory_cluster(clock, engines)
    body = {"model": MODEL, "prompt": "go on", "context": [1, 2, 3]}
    for _ in range(3):
        response = cluster.fetch("POST", "/api/generate", json=body)
        assert response.status == 200 and response.header("x-nvpair-node") == "a"
    assert sent(cluster, "b") == []


def test_a_frozen_ollama_node_fails_over_to_an_openai_node_translated(
    memory_cluster: Make,
) -> None:
    """§11.3: failover across kinds, the second attempt translated from the client's own body; the
    frozen node cools, so the next request does not wait for it."""
    clock = Clock()
    frozen = SimulatedEngine(clock, (MODEL,), kind="ollama", policy=always(Behaviour.FROZEN))
    engines = {"a": frozen, "b": openai_node(clock)}
    settings = Settings(response_header_timeout=5.0)
    cluster = memory_cluster(clock, engines, settings=settings)
    cluster.facade().pin = "a"
    pending = cluster.request("POST", "/api/chat", json=chat(MODEL))
    cluster.advance(5.0)
    response = cluster.result(pending)
    assert response.status == 200 and response.header("x-nvpair-node") == "b"
    assert lines(response)[-1]["done"] is True
    [(path, _)] = sent(cluster, "b")
    assert path == b"/v1/chat/completions"
    assert [p for p, _ in sent(cluster, "a")] == [b"/api/chat"]
    started = clock.seconds()
    again = cluster.fetch("POST", "/api/chat", json=chat(MODEL))
    assert again.header("x-nvpair-node") == "b" and clock.seconds() == started


def test_a_translated_stream_cut_mid_way_never_looks_complete(memory_cluster: Make) -> None:
    """§11.3: the node drops mid-stream after commit: no ``done: true`` line, framing unfinished."""
    clock = Clock()
    dropping = openai_node(clock, policy=always(Behaviour.DROP_MID_STREAM), chunks=6)
    cluster = memory_cluster(clock, {"b": dropping})
    response = cluster.fetch("POST", "/api/chat", json=chat(MODEL))
    assert response.status == 200 and response.truncated
    assert response.chunks, "the stream was committed before the cut"
    assert all(not line["done"] for line in lines(response))


def test_an_upstream_error_becomes_an_ollama_error_with_the_same_status(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock, policy=always(Behaviour.STATUS_400))})
    response = cluster.fetch("POST", "/api/chat", json=chat(MODEL))
    assert response.status == 400
    assert isinstance(response.json()["error"], str)


def test_an_ollama_list_synthesises_records_from_an_openai_node(memory_cluster: Make) -> None:
    """§11.3, §17.6: ``/api/tags`` from a node that only has ``/v1/models``: its names, with only
    the fields the Ollama CLI cannot do without derived (digest of the name, size 0, first seen)."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest",), kind="ollama"),
        "b": openai_node(clock),
    }
    cluster = memory_cluster(clock, engines)
    listed = cluster.fetch("GET", "/api/tags").json()["models"]
    names = [m["name"] for m in listed]
    assert names == ["llama3:latest", MODEL]
    synthesised = listed[1]
    assert synthesised["model"] == MODEL
    assert synthesised["digest"] == hashlib.sha256(b"smollm2:latest").hexdigest()
    assert synthesised["size"] == 0 and synthesised["details"] == {}
    assert synthesised["modified_at"] == "1970-01-01T00:00:00Z"  # the clock's start
    assert set(synthesised) == {"name", "model", "digest", "size", "modified_at", "details"}


def write_catalogue(
    tmp_path: Path, cluster_urls: dict[str, tuple[str, str]], kinds: dict[str, str]
) -> str:
    nodes = "".join(
        f'[[node]]\nid = "{n}"\nurl = "{url}"\nkind = "{kinds[n]}"\nmodels = ["{m}"]\n\n'
        for n, (url, m) in cluster_urls.items()
    )
    path = tmp_path / "nodes.toml"
    path.write_text(nodes + '[[model]]\nname = "smollm2"\naliases = ["SmolLM2-135M-Instruct"]\n')
    return str(path)


def catalogued(memory_cluster: Make, tmp_path: Path, clock: Clock) -> MemoryCluster:
    """An Ollama node calling the model ``smollm2:latest`` and an LM Studio node calling it
    ``SmolLM2-135M-Instruct``, one public name over both (nodes file, §11.4)."""
    engines = {
        "a": SimulatedEngine(clock, ("smollm2:latest",), kind="ollama"),
        "l": SimulatedEngine(clock, ("SmolLM2-135M-Instruct",), kind="lmstudio"),
    }
    probe = MemoryCluster(clock, engines, nodes={"ollama": []})
    urls = {"a": (probe.url("a"), "smollm2:latest"), "l": (probe.url("l"), "SmolLM2-135M-Instruct")}
    probe.stop()
    path = write_catalogue(tmp_path, urls, {"a": "ollama", "l": "lmstudio"})
    return memory_cluster(
        clock,
        engines,
        nodes={"ollama": [], "openai": []},
        facades=("ollama", "openai"),
        nodes_file=path,
    )


def test_one_public_name_reaches_the_node_by_its_own_name(
    memory_cluster: Make, tmp_path: Path
) -> None:
    """§11.4: the forwarded body names the node's local name; every ``model`` of the answer is
    the name the client sent; on a native route every other byte is the client's."""
    clock = Clock()
    cluster = catalogued(memory_cluster, tmp_path, clock)
    raw = (
        b'{"model": "smollm2",  "messages": [{"role": "user", "content": "hi"}], "stream": true,'
        b' "stream_options": {"include_usage": true}}'
    )
    response = cluster.result(
        cluster.request(
            "POST",
            "/v1/chat/completions",
            data=raw,
            facade="openai",
            headers={"x-nvpair-node": "l", "content-type": "application/json"},
        )
    )
    assert response.status == 200 and response.header("x-nvpair-node") == "l"
    engine = cluster.engines["l"]
    assert isinstance(engine, SimulatedEngine)
    assert engine.received[-1].body == raw.replace(b'"smollm2"', b'"SmolLM2-135M-Instruct"')
    assert b"SmolLM2-135M-Instruct" not in response.body
    assert b'"model":"smollm2"' in response.body or b'"model": "smollm2"' in response.body


def test_a_public_name_is_listed_once(memory_cluster: Make, tmp_path: Path) -> None:
    clock = Clock()
    cluster = catalogued(memory_cluster, tmp_path, clock)
    listed = cluster.fetch("GET", "/v1/models", facade="openai").json()["data"]
    assert [m["id"] for m in listed] == ["smollm2"]
    tags = cluster.fetch("GET", "/api/tags", facade="ollama").json()["models"]
    assert [m["name"] for m in tags] == ["smollm2"]


def test_the_openai_facade_answers_404_to_routes_it_does_not_serve(memory_cluster: Make) -> None:
    """§11.2: only the OpenAI-compatible routes; nothing is passed through to a node."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)}, facades=("openai",))
    response = cluster.fetch("GET", "/api/version", facade="openai")
    assert response.status == 404 and response.json()["code"] == "not-found"
    engine = cluster.engines["b"]
    assert isinstance(engine, SimulatedEngine)
    assert [r.path for r in engine.received if r.path == b"/api/version"] == []


def test_api_show_is_synthesised_from_the_list_of_a_node_of_another_kind(
    memory_cluster: Make,
) -> None:
    """§11.3, §17.6: ``/api/show`` for a model only an LM Studio node has: its list says the type;
    no ``model_info`` (the Ollama CLI asserts four keys of it unchecked when it is present)."""
    clock = Clock()
    studio = SimulatedEngine(clock, (MODEL,), kind="lmstudio", loaded=(), context_length=8192)
    cluster = memory_cluster(clock, {"l": studio})
    response = cluster.fetch("POST", "/api/show", json={"model": MODEL})
    assert response.status == 200
    assert response.json() == {"details": {}, "capabilities": ["completion"]}
    assert [(r.method, r.path) for r in studio.received][-1] == (b"GET", b"/api/v0/models")


def test_an_lmstudio_model_record_is_synthesised_for_an_openai_node(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)}, facades=("lmstudio",))
    response = cluster.fetch("GET", f"/api/v0/models/{MODEL}", facade="lmstudio")
    assert response.status == 200
    assert response.json() == {"id": MODEL, "object": "model"}


def test_a_fan_out_runs_only_on_nodes_whose_kind_serves_the_route(memory_cluster: Make) -> None:
    """§11.1 with §13.2: ``X-NVPair-Node: *`` pulls on the Ollama nodes; naming an LM Studio node
    for ``/api/pull`` is refused before any node is contacted."""
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, (MODEL,), kind="ollama"),
        "l": SimulatedEngine(clock, (MODEL,), kind="lmstudio"),
    }
    cluster = memory_cluster(clock, engines)
    every = cluster.fetch(
        "POST", "/api/pull", json={"model": MODEL, "stream": False}, headers={"x-nvpair-node": "*"}
    )
    final = json.loads(every.body.splitlines()[-1])
    assert every.status == 200 and set(final["nodes"]) == {"a"}
    named = cluster.fetch(
        "POST", "/api/pull", json={"model": MODEL}, headers={"x-nvpair-node": "a,l"}
    )
    assert named.status == 400 and named.json()["code"] == "route-not-served"
    studio = cluster.engines["l"]
    assert isinstance(studio, SimulatedEngine)
    assert [r.path for r in studio.received if r.method == b"POST"] == []


# --- token counts and first tokens (docs/behaviour.md §12.2, §12.3) ------------------------------


def finished(cluster: MemoryCluster, pending: Any, step: float = 0.5) -> MemoryResponse:
    """Move the clock in steps until the answer has ended (bounded: 40 steps)."""
    for _ in range(40):
        if pending.called:
            response = cluster.result(pending)
            if response.ended is not None:
                return response
        cluster.advance(step)
    raise AssertionError("the answer did not end within 40 steps")


def requests_of(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return cluster.named("proxy/request")


def test_a_stream_without_include_usage_asks_for_it_and_the_client_never_sees_it(
    memory_cluster: Make,
) -> None:
    """§12.2: the node is asked for the usage chunk; the client receives the stream it asked for
    (every other byte as the node sent it); the record has the engine's counts."""
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock, chunk_delay=0.5)})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], "stream": True}
    response = finished(cluster, cluster.request("POST", "/v1/chat/completions", json=body))
    assert response.complete
    [(_, sent_body)] = sent(cluster, "b")
    assert sent_body["stream_options"] == {"include_usage": True}
    assert b'"usage"' not in response.body and response.body.endswith(b"data: [DONE]\n\n")
    [record] = requests_of(cluster)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (3, 3)
    # 3 tokens from the first content (0 s) to the answer's end, relayed at the 2.5 s step
    assert record["ttft_ms"] == 0 and record["tokens_per_s"] == 1.2


def test_a_stream_that_asked_for_usage_keeps_its_usage_chunk(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = cluster.fetch("POST", "/v1/chat/completions", json=body)
    assert b'"usage"' in response.body
    assert requests_of(cluster)[0]["completion_tokens"] == 3


def test_translated_and_whole_answers_record_the_engines_counts(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock)})
    cluster.fetch("POST", "/api/chat", json=chat(MODEL))
    cluster.fetch("POST", "/api/chat", json=chat(MODEL, stream=False))
    cluster.fetch("POST", "/api/embed", json={"model": MODEL, "input": "a b"})
    counts = [(r["prompt_tokens"], r["completion_tokens"]) for r in requests_of(cluster)]
    assert counts == [(1, 3), (1, 3), (2, None)]
    assert all(r["translated"] for r in requests_of(cluster))


def test_the_record_names_the_model_the_node_was_sent_on_every_route(memory_cluster: Make) -> None:
    """§12.3: ``model_local`` is the name the serving node was asked for, natively (the client's
    own spelling, the body unchanged) as well as translated."""
    clock = Clock()
    native = SimulatedEngine(clock, (MODEL,), kind="ollama")
    cluster = memory_cluster(clock, {"a": native})
    cluster.fetch("POST", "/api/chat", json=chat(MODEL, stream=False))
    translating = memory_cluster(clock, {"b": openai_node(clock)})
    translating.fetch("POST", "/api/chat", json=chat(MODEL, stream=False))
    [(_, sent_body)] = sent(translating, "b")
    served = [(r["model_local"], r["translated"]) for r in requests_of(cluster)]
    assert served == [(MODEL, False)]
    served = [(r["model_local"], r["translated"]) for r in requests_of(translating)]
    assert served == [(sent_body["model"], True)]


def test_a_stream_cut_before_its_counts_records_them_as_unknown(memory_cluster: Make) -> None:
    clock = Clock()
    dropping = openai_node(clock, policy=always(Behaviour.DROP_MID_STREAM), chunks=6)
    cluster = memory_cluster(clock, {"b": dropping})
    cluster.fetch("POST", "/v1/chat/completions", json={**chat(MODEL), "stream": True})
    [record] = requests_of(cluster)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (None, None)
    assert record["ttft_ms"] is not None


def test_an_assembled_answers_first_token_is_when_its_stream_began(memory_cluster: Make) -> None:
    """§12.3: ``ttft_ms`` of an assembled answer is not the whole answer's time."""
    clock = Clock()
    engine = SimulatedEngine(clock, (MODEL,), kind="ollama", header_delay=1.0, chunk_delay=2.0)
    cluster = memory_cluster(clock, {"a": engine})
    response = finished(
        cluster, cluster.request("POST", "/api/chat", json=chat(MODEL, stream=False))
    )
    assert response.status == 200
    [record] = requests_of(cluster)
    assert record["ttft_ms"] == 1000 and record["ttfb_ms"] >= 5000


def _speech_over(parsed: dict[str, Any], names: dict[str, str]) -> Any:
    from nvpair_tw.core._engines import OLLAMA
    from nvpair_tw.corridor._dialect import Speech
    from nvpair_tw.selection import RouteGaps
    from nvpair_tw.selection._reachability import ReachabilityBook

    body = json.dumps(parsed).encode()
    return Speech(
        facade=OLLAMA,
        method=b"POST",
        target=b"/api/chat",
        path="/api/chat",
        body=body,
        outline=None,
        parsed=parsed,
        model="llama3",
        assembly=None,
        local_name=lambda node_id, model: names.get(node_id),
        assembles=False,
        limit=1 << 20,
        clock=lambda: 0.0,
        gaps=RouteGaps("ollama", ReachabilityBook("ollama")),
    )


def test_a_request_is_translated_once_per_dialect_and_local_name_not_once_per_attempt() -> None:
    """Two openai nodes that know the model by one name share one translated wire; a third that
    knows it by another name gets its own; an ollama node gets the client's request."""
    from nvpair_tw.nodes import Node

    names = {"o1": "llama-3", "o2": "llama-3", "o3": "meta/llama-3", "n": "llama3"}
    speech = _speech_over(chat("llama3", stream=True), names)
    o1, o2, o3 = (
        Node(i, f"http://127.0.0.1:{p}", kind="openai")
        for i, p in (("o1", 1), ("o2", 2), ("o3", 3))
    )
    native = Node("n", "http://127.0.0.1:4")
    first, second, third = speech.wire(o1), speech.wire(o2), speech.wire(o3)
    assert first is second and first.translated
    assert third is not first and third.local_model == "meta/llama-3"
    assert json.loads(third.body)["model"] == "meta/llama-3"
    assert speech.wire(native).body == speech.body and not speech.wire(native).translated


class _Reader(Protocol):
    """The gate's side of a transcoded body: what it received and how the body ended."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.reasons: list[Failure] = []

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.reasons.append(reason)


@implementer(IPushProducer)
class _Upstream:
    """The node's body transport: records a stop."""

    stopped = False

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        self.stopped = True


class _Failing:
    """A transducer raising ``error`` from ``feed`` (or, ``at_end``, from ``end``)."""

    content_type = b"application/x-ndjson"
    tokens = (None, None)

    def __init__(self, error: Exception, where: str) -> None:
        self._error = error
        self._where = where

    def feed(self, data: bytes) -> bytes:
        if self._where == "feed":
            raise self._error
        return data

    def end(self) -> bytes:
        raise self._error


@implementer(IResponse)
class _Node:
    """A node's response whose body is ``body`` then a clean end."""

    version = (b"HTTP", 1, 1)
    code = 200
    phrase = b"OK"
    request = None
    previousResponse = None

    def __init__(self, body: bytes) -> None:
        self.headers = Headers({b"content-type": [b"text/event-stream"]})
        self.length = len(body)
        self._body = body
        self.upstream = _Upstream()

    def deliverBody(self, protocol: Protocol) -> None:
        protocol.makeConnection(self.upstream)  # type: ignore[arg-type]
        protocol.dataReceived(self._body)
        protocol.connectionLost(Failure(ResponseDone()))

    def setPreviousResponse(self, response: IResponse) -> None:
        pass


def _transcoded(error: Exception, where: str) -> tuple[_Reader, _Node]:
    node = _Node(b"data: x\n\n")
    reader = _Reader()
    TranscodedResponse(node, _Failing(error, where)).deliverBody(reader)
    return reader, node


@pytest.mark.parametrize("where", ["feed", "end"])
@pytest.mark.parametrize("error", [StreamCut("cut"), MalformedStream("bad"), AnswerTooLarge("big")])
def test_a_frame_the_transducer_refuses_is_the_nodes_drop(error: Exception, where: str) -> None:
    """A ``StreamCut`` (the node's stream: cut, malformed, too large) ends the body as a transport
    failure, which the attempt loop takes for a drop and the relay for a truncation."""
    reader, node = _transcoded(error, where)
    [reason] = reader.reasons
    assert isinstance(reason.value, ResponseFailed)
    assert reason.value.reasons[0].value is error
    assert node.upstream.stopped is (where == "feed")


@pytest.mark.parametrize("where", ["feed", "end"])
def test_a_transducers_own_bug_is_the_proxys_not_the_nodes(where: str) -> None:
    """Anything else a transducer raises is a :class:`ProxyBug`, no transport failure: before
    commit no stage takes it for the node's drop (no failover, no cooldown), after it the relay
    cuts the stream as ``proxy-error``."""
    bug = KeyError("choices")
    reader, node = _transcoded(bug, where)
    [reason] = reader.reasons
    assert isinstance(reason.value, ProxyBug)
    assert reason.value.error is bug
    assert node.upstream.stopped is (where == "feed")


def test_a_transducers_bug_before_commit_fails_the_request_without_failover_or_cooldown() -> None:
    """The attempt loop does not take a :class:`ProxyBug` for the node's drop: it ends the request
    (the facade answers 500), the node is not cooled and no other node is tried."""
    loop = Loop(gated=True)

    def noted(frame: dict[str, Any]) -> None:
        raise KeyError("usage")  # a bug in what reads the removed usage chunk

    sends = AsIs.of(b"POST", b"/api/chat", PAYLOAD, strip_usage=noted)
    loop.plan = evolve(loop.plan, sends=sends)
    result = loop.run()
    answer = loop.requests(1001)[0]
    answer.setHeader(b"content-type", b"text/event-stream")
    answer.write(b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n')
    loop.pump()
    failures: list[Failure] = []
    result.addErrback(failures.append)
    [failure] = failures
    assert isinstance(failure.value, ProxyBug)
    assert isinstance(failure.value.error, KeyError)
    assert loop.bodies(1002) == []
    assert loop.stalls.cooling() == frozenset() and loop.cooldowns == []
    loop.stalls.stop()


def test_a_translation_bug_before_commit_is_a_500_proxy_error_and_no_failover(
    memory_cluster: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A translation that raises on the first answer bytes (a bug injected here) is the proxy's
    own: 500 ``proxy-error`` in the facade's shape, recorded so; the node is not cooled and the
    other owner is not tried (docs/behaviour.md §6.1)."""
    from nvpair_tw.dialects._ollama_stream import OllamaStream

    def broken(self: OllamaStream, data: bytes) -> bytes:
        raise KeyError("choices")

    monkeypatch.setattr(OllamaStream, "feed", broken)
    clock = Clock()
    cluster = memory_cluster(clock, {"b": openai_node(clock), "c": openai_node(clock)})
    response = cluster.fetch("POST", "/api/chat", json=chat(MODEL))
    assert response.status == 500 and response.json()["code"] == "proxy-error"
    tried = [node for node in ("b", "c") if sent(cluster, node)]
    assert len(tried) == 1
    assert cluster.runtime.facades["ollama"].stalls.cooling() == frozenset()
