"""Simulated engines of one kind over real loopback sockets: each answers its own server's routes in
that server's documented shapes, and 404s the others in that server's own error shape."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
import treq
from attrs import frozen
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed, ResponseNeverReceived

from nvpair_tw.simulated import Behaviour, SimulatedEngine, always, stream_kind

pytestmark = pytest.mark.timeout(30)

OPENAI_KINDS = ("ollama", "lmstudio", "omlx", "openai")
ENDS_APART = {"ollama"}
"""Kinds whose server ends a stream's content with an empty chunk of its own carrying the
``finish_reason`` (Ollama 0.9.3, compared with the real one); the others put it on the last one."""
MODEL = "llama3:latest"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "say hi to me"}]}


@frozen
class Answer:
    """One answer as the client saw it."""

    status: int
    content_type: str
    body: bytes
    truncated: bool

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The ``data:`` payloads of an SSE body (``[DONE]`` as the string)."""
        payloads = [e[len(b"data: ") :] for e in self.body.split(b"\n\n") if e]
        return [p.decode() if p == b"[DONE]" else json.loads(p) for p in payloads]

    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.body.splitlines()]


@pytest.fixture
def client(reactor: Any) -> Iterator[HTTPClient]:
    """A treq client that closes each connection after its answer."""
    pool = HTTPConnectionPool(reactor, persistent=False)
    yield HTTPClient(Agent(reactor, pool=pool))
    pytest_twisted.blockon(pool.closeCachedConnections())


@frozen
class Served:
    """An engine listening on loopback, and a way to ask it."""

    engine: SimulatedEngine
    port: int
    client: HTTPClient

    async def ask(self, method: str, path: str, body: Any = None) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        url = f"http://127.0.0.1:{self.port}{path}"
        response = await self.client.request(method, url, data=data)
        parts: list[bytes] = []
        truncated = False
        try:
            await treq.collect(response, parts.append)
        except ResponseFailed:
            truncated = True
        content = b"".join(parts)
        [content_type] = response.headers.getRawHeaders(b"content-type", [b""])
        return Answer(response.code, content_type.decode(), content, truncated)


Serve = Callable[..., Served]


@pytest.fixture
def serve(reactor: Any, listen: Callable[[Any], int], client: HTTPClient) -> Iterator[Serve]:
    """Starts simulated engines of a kind on loopback; stops them afterwards."""
    engines: list[SimulatedEngine] = []

    def start(kind: str, **kw: Any) -> Served:
        engine = SimulatedEngine(reactor, kind=kind, **kw)
        engines.append(engine)
        return Served(engine, listen(engine.site()), client)

    yield start
    for engine in engines:
        engine.stop()


# --- ollama --------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ollama_kind_lists_its_models_and_404s_other_engines_routes(serve: Serve) -> None:
    """Kind ollama answers /api/tags, /api/version and /v1/models, and answers LM Studio's
    /api/v0/models, llama.cpp's /slots and an unserved /v1/responses with Gin's plain 404."""
    served = serve("ollama", models=(MODEL,))
    tags = (await served.ask("GET", "/api/tags")).json()
    [record] = tags["models"]
    assert (record["name"], record["model"]) == (MODEL, MODEL)
    assert {"modified_at", "size", "digest", "details"} <= record.keys()
    assert (await served.ask("GET", "/api/version")).json() == {"version": "0.0.0-simulated"}
    listed = (await served.ask("GET", "/v1/models")).json()
    assert [(m["id"], m["owned_by"]) for m in listed["data"]] == [(MODEL, "library")]
    for method, path in (("GET", "/api/v0/models"), ("GET", "/slots"), ("POST", "/v1/responses")):
        refused = await served.ask(method, path, {} if method == "POST" else None)
        assert (refused.status, refused.content_type, refused.body) == (
            404,
            "text/plain",
            b"404 page not found",
        )
    assert served.engine.inference_count == 0


@pytest_twisted.ensureDeferred
async def test_ollama_kind_chat_stream_names_the_model_and_ends_with_counts(serve: Serve) -> None:
    """Every /api/chat line names the model and has a created_at; the last says done with
    done_reason, prompt_eval_count (the prompt's words), eval_count (the chunks) and durations."""
    served = serve("ollama", chunks=2)
    answer = await served.ask("POST", "/api/chat", CHAT)
    assert answer.content_type == "application/x-ndjson"
    *parts, final = answer.lines()
    assert [p["message"]["content"] for p in parts] == ["hello0", "hello1"]
    assert all(p["model"] == MODEL and p["done"] is False for p in parts)
    assert all(line["created_at"].endswith("Z") for line in answer.lines())
    assert (final["done"], final["done_reason"]) == (True, "stop")
    assert (final["prompt_eval_count"], final["eval_count"]) == (4, 2)
    durations = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
    assert all(isinstance(final[d], int) and final[d] > 0 for d in durations)


@pytest_twisted.ensureDeferred
async def test_ollama_kind_whole_generate_and_embeddings(serve: Serve) -> None:
    """/api/generate with stream false is one object with ``response`` and the counts; /api/embed
    embeds each input; /api/embeddings answers one ``embedding``."""
    served = serve("ollama")
    whole = (
        await served.ask(
            "POST", "/api/generate", {"model": MODEL, "prompt": "a b", "stream": False}
        )
    ).json()
    assert (whole["model"], whole["response"], whole["done"]) == (MODEL, "hello", True)
    assert whole["prompt_eval_count"] == 2
    embedded = (
        await served.ask("POST", "/api/embed", {"model": MODEL, "input": ["x", "y"]})
    ).json()
    assert embedded["model"] == MODEL and len(embedded["embeddings"]) == 2
    assert embedded["embeddings"][0] != embedded["embeddings"][1]
    old = (await served.ask("POST", "/api/embeddings", {"model": MODEL, "prompt": "x"})).json()
    assert old == {"embedding": embedded["embeddings"][0]}


@pytest_twisted.ensureDeferred
async def test_ollama_kind_shows_a_model_at_once_with_what_the_cli_reads(serve: Serve) -> None:
    """``POST /api/show`` is answered from what the engine holds, not as inference (no policy
    applies): details, ``model_info`` with the architecture, parameter count, context and
    embedding lengths, capabilities; ``llama3`` is ``llama3:latest``; a model it lacks is
    Ollama's 404."""
    served = serve("ollama", models=(MODEL,), policy=always(Behaviour.FROZEN), context_length=8192)
    shown = (await served.ask("POST", "/api/show", {"model": "llama3"})).json()
    assert {"modelfile", "parameters", "template", "details", "model_info"} <= shown.keys()
    arch = shown["model_info"]["general.architecture"]
    assert shown["details"]["family"] == arch and shown["details"]["families"] == [arch]
    assert shown["model_info"][f"{arch}.context_length"] == 8192
    assert shown["model_info"]["general.parameter_count"] > 0
    assert shown["capabilities"] == ["completion"]
    missing = await served.ask("POST", "/api/show", {"model": "nope"})
    assert (missing.status, missing.json()) == (404, {"error": "model 'nope' not found"})
    assert served.engine.inference_count == 0


# --- every kind's OpenAI-compatible routes -------------------------------------------------------


@pytest.mark.parametrize("kind", OPENAI_KINDS)
@pytest_twisted.ensureDeferred
async def test_chat_stream_chunks_name_the_model_and_the_last_says_stop(
    serve: Serve, kind: str
) -> None:
    """A streamed /v1/chat/completions is chat.completion.chunk events naming the requested model,
    the last chunk with finish_reason stop (Ollama's an empty one of its own), no usage chunk
    unless asked, then [DONE]."""
    served = serve(kind, chunks=3)
    answer = await served.ask("POST", "/v1/chat/completions", {**CHAT, "stream": True})
    assert answer.content_type == "text/event-stream"
    *chunks, done = answer.events()
    said = ["hello0", "hello1", "hello2", *([""] if kind in ENDS_APART else [])]
    assert done == "[DONE]" and len(chunks) == len(said)
    for chunk, content in zip(chunks, said, strict=True):
        assert {"id", "created"} <= chunk.keys()
        assert (chunk["object"], chunk["model"]) == ("chat.completion.chunk", MODEL)
        [choice] = chunk["choices"]
        assert choice["index"] == 0
        assert choice["delta"] == {"role": "assistant", "content": content}
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes == [None] * (len(said) - 1) + ["stop"]
    fingerprints = {c.get("system_fingerprint") for c in chunks}
    assert fingerprints == ({"fp_ollama"} if kind == "ollama" else {None})


@pytest.mark.parametrize("kind", OPENAI_KINDS)
@pytest_twisted.ensureDeferred
async def test_include_usage_adds_a_usage_chunk_before_done(serve: Serve, kind: str) -> None:
    """With stream_options.include_usage the stream ends with a choices-less usage chunk."""
    served = serve(kind, chunks=2)
    asked = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    *_, usage, done = (await served.ask("POST", "/v1/chat/completions", asked)).events()
    assert done == "[DONE]"
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


@pytest.mark.parametrize("kind", OPENAI_KINDS)
@pytest_twisted.ensureDeferred
async def test_whole_answers_carry_usage_and_model_and_completions_use_text(
    serve: Serve, kind: str
) -> None:
    """A whole chat answer has the message, finish_reason, usage and model; /v1/completions says
    ``text`` instead, whole or streamed."""
    served = serve(kind, chunks=2)
    chat = (await served.ask("POST", "/v1/chat/completions", CHAT)).json()
    assert (chat["object"], chat["model"]) == ("chat.completion", MODEL)
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 2
    asked = {"model": MODEL, "prompt": "once upon"}
    whole = (await served.ask("POST", "/v1/completions", asked)).json()
    assert (whole["object"], whole["choices"][0]["text"]) == ("text_completion", "hello")
    assert whole["usage"]["prompt_tokens"] == 2
    *chunks, _ = (await served.ask("POST", "/v1/completions", {**asked, "stream": True})).events()
    said = ["hello0", "hello1", *([""] if kind in ENDS_APART else [])]
    assert [c["choices"][0]["text"] for c in chunks] == said
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("kind", OPENAI_KINDS)
@pytest.mark.parametrize("given", ["one text", ["one", "two"]])
@pytest_twisted.ensureDeferred
async def test_embeddings_answer_a_string_or_a_list(serve: Serve, kind: str, given: Any) -> None:
    """/v1/embeddings answers one embedding object per input, with the model and usage."""
    served = serve(kind)
    answer = (await served.ask("POST", "/v1/embeddings", {"model": "e", "input": given})).json()
    count = 1 if isinstance(given, str) else len(given)
    assert (answer["object"], answer["model"]) == ("list", "e")
    assert [(d["object"], d["index"]) for d in answer["data"]] == [
        ("embedding", i) for i in range(count)
    ]
    assert all(all(isinstance(x, float) for x in d["embedding"]) for d in answer["data"])
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] == 2


@pytest.mark.parametrize("kind", OPENAI_KINDS)
@pytest_twisted.ensureDeferred
async def test_behaviours_still_apply_to_an_engine_of_a_kind(serve: Serve, kind: str) -> None:
    """STATUS_503 answers 503; DROP_MID_STREAM cuts a kind's SSE stream before [DONE]."""
    served = serve(kind, policy=always(Behaviour.STATUS_503))
    assert (await served.ask("POST", "/v1/chat/completions", CHAT)).status == 503
    served.engine.policy = always(Behaviour.DROP_MID_STREAM)
    cut = await served.ask("POST", "/v1/chat/completions", {**CHAT, "stream": True, "x": 1})
    assert cut.truncated and cut.body.startswith(b"data: {") and b"[DONE]" not in cut.body


# --- lmstudio ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_lmstudio_kind_v0_models_are_the_documented_records(serve: Serve) -> None:
    """/api/v0/models lists every model with id, object, type, publisher, arch,
    compatibility_type, quantization, state and max_context_length; /api/v0/models/{id} one record
    (404 for a model it lacks); /v1/models the short records; Ollama's /api/tags is LM Studio's
    unexpected-endpoint 404."""
    models = ("lmstudio-community/qwen3-8b", "text-embedding-nomic-embed-text-v1.5")
    served = serve("lmstudio", models=models, loaded=(models[0],), context_length=32768)
    listed = (await served.ask("GET", "/api/v0/models")).json()
    assert listed["object"] == "list"
    first, second = listed["data"]
    assert first == {
        "id": models[0],
        "object": "model",
        "type": "llm",
        "publisher": "lmstudio-community",
        "arch": "qwen",
        "compatibility_type": "gguf",
        "quantization": "Q4_K_M",
        "state": "loaded",
        "max_context_length": 32768,
    }
    assert (second["type"], second["state"]) == ("embeddings", "not-loaded")
    assert (await served.ask("GET", f"/api/v0/models/{models[1]}")).json() == second
    assert (await served.ask("GET", "/api/v0/models/nope")).status == 404
    short = (await served.ask("GET", "/v1/models")).json()["data"]
    assert short[0] == {"id": models[0], "object": "model", "owned_by": "organization_owner"}
    refused = await served.ask("GET", "/api/tags")
    assert (refused.status, refused.json()) == (
        404,
        {"error": "Unexpected endpoint or method. (GET /api/tags)"},
    )
    assert (await served.ask("POST", "/api/chat", CHAT)).status == 404


@pytest_twisted.ensureDeferred
async def test_lmstudio_kind_v0_chat_completion_has_stats_model_info_and_runtime(
    serve: Serve,
) -> None:
    """A whole /api/v0/chat/completions adds stats (tokens/s, time to first token, generation time,
    stop reason), model_info and runtime to the OpenAI answer; /v1/chat/completions does not."""
    served = serve("lmstudio", models=(MODEL,), context_length=8192, chunks=4)
    answer = (await served.ask("POST", "/api/v0/chat/completions", CHAT)).json()
    assert answer["choices"][0]["message"]["content"] == "hello"
    stats = answer["stats"]
    assert stats["stop_reason"] == "eosFound"
    assert stats["tokens_per_second"] == pytest.approx(4 / stats["generation_time"])
    assert stats["time_to_first_token"] > 0
    assert answer["model_info"] == {
        "arch": "llama",
        "quant": "Q4_K_M",
        "format": "gguf",
        "context_length": 8192,
    }
    assert set(answer["runtime"]) == {"name", "version", "supported_formats"}
    plain = (await served.ask("POST", "/v1/chat/completions", CHAT)).json()
    assert "stats" not in plain


# --- omlx ----------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_omlx_kind_lists_models_and_their_status(serve: Serve) -> None:
    """oMLX's /v1/models records are owned_by omlx with max_model_len; /v1/models/status says
    which are loaded with their context window; other engines' routes get FastAPI's 404."""
    served = serve(
        "omlx", models=("Qwen3-8B", "bge-m3-embed"), loaded=("Qwen3-8B",), context_length=32768
    )
    listed = (await served.ask("GET", "/v1/models")).json()
    assert [(m["id"], m["object"], m["owned_by"], m["max_model_len"]) for m in listed["data"]] == [
        ("Qwen3-8B", "model", "omlx", 32768),
        ("bge-m3-embed", "model", "omlx", 32768),
    ]
    status = (await served.ask("GET", "/v1/models/status")).json()
    assert (status["model_count"], status["loaded_count"]) == (2, 1)
    assert [(m["id"], m["loaded"], m["model_type"]) for m in status["models"]] == [
        ("Qwen3-8B", True, "llm"),
        ("bge-m3-embed", False, "embedding"),
    ]
    assert status["models"][0]["max_context_window"] == 32768
    for path in ("/api/tags", "/api/v0/models", "/props"):
        refused = await served.ask("GET", path)
        assert (refused.status, refused.json()) == (404, {"detail": "Not Found"})


# --- openai (llama.cpp's llama-server) ------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_openai_kind_answers_health_props_and_slots_like_llama_server(
    reactor: Any, serve: Serve
) -> None:
    """/health says ok; /props has default_generation_settings.n_ctx and total_slots; /slots lists
    each slot with id, n_ctx and is_processing (true while a request is in flight); other engines'
    routes get llama-server's JSON 404."""
    served = serve("openai", models=("qwen.gguf",), slots=2, context_length=65536)
    assert (await served.ask("GET", "/health")).json() == {"status": "ok"}
    props = (await served.ask("GET", "/props")).json()
    assert (props["default_generation_settings"]["n_ctx"], props["total_slots"]) == (65536, 2)
    listed = (await served.ask("GET", "/v1/models")).json()["data"]
    assert [(m["id"], m["owned_by"]) for m in listed] == [("qwen.gguf", "llamacpp")]
    served.engine.policy = always(Behaviour.FROZEN)
    pending = Deferred.fromCoroutine(served.ask("POST", "/v1/chat/completions", CHAT))
    for _ in range(500):  # until the engine holds the request (at most 5 s)
        if served.engine.open_requests:
            break
        await deferLater(reactor, 0.01, lambda: None)
    slots = (await served.ask("GET", "/slots")).json()
    assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in slots] == [
        (0, 65536, True),
        (1, 65536, False),
    ]
    served.engine.stop()
    with pytest.raises((ResponseFailed, ResponseNeverReceived)):
        await pending
    refused = await served.ask("GET", "/api/tags")
    assert refused.status == 404
    assert refused.json() == {
        "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
    }


# --- residency and construction -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "path", "body"),
    [
        ("ollama", "/api/ps", b"404 page not found"),
        (
            "lmstudio",
            "/api/v0/models",
            b'{"error": "Unexpected endpoint or method. (GET /api/v0/models)"}',
        ),
        ("omlx", "/v1/models/status", b'{"detail": "Not Found"}'),
    ],
)
@pytest_twisted.ensureDeferred
async def test_residency_routes_404_in_the_kinds_shape_while_loaded_is_none(
    serve: Serve, kind: str, path: str, body: bytes
) -> None:
    """Without ``loaded`` an engine of a kind has no residency route, as an older server."""
    refused = await serve(kind).ask("GET", path)
    assert (refused.status, refused.body) == (404, body)


def test_an_unknown_kind_is_refused(reactor: Any) -> None:
    """``kind`` is one of docs/behaviour.md §11.1's kinds or None."""
    with pytest.raises(ValueError, match="kind"):
        SimulatedEngine(reactor, kind="vllm")


def test_lmstudio_v0_inference_streams_like_openai() -> None:
    """LM Studio's /api/v0 inference streams only when asked, as SSE."""
    assert stream_kind(b"/api/v0/chat/completions", b'{"stream": true}') == (
        True,
        b"text/event-stream",
    )
    assert stream_kind(b"/api/v0/chat/completions", b"{}") == (False, b"application/json")
