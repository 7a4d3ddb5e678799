"""Whole answers assembled from streamed work (docs/behaviour.md §6.5).

First the pure parts (which requests, the rewritten body, folding the four routes' streams), then
the corridor in memory (``MemoryCluster``), then the official ``ollama`` and ``openai`` clients
against a loopback proxy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import ollama
import openai
import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed

from nvpair_tw.assembly._gate import _failed
from nvpair_tw.assembly._whole import (
    AnswerTooLarge,
    Assembled,
    Assembler,
    AssemblyGate,
    AssemblyState,
    Dialect,
    MalformedStream,
    StreamCut,
    plan_assembly,
    rewrite_body,
    rewrite_outlined,
)
from nvpair_tw.core import IllegalCall, Outline, Outlined, ProxyBug, outline_body
from nvpair_tw.core._resolved import Settings
from nvpair_tw.inbound import Parsed, parse_document
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    MemoryCluster,
    ProxyCluster,
    SimulatedEngine,
    always,
)
from nvpair_tw.upstream._attempt import BodyEnd, FirstBodyTimeout
from tests.helpers import refusal_code, refusal_message
from tests.jsonbodies import bodies
from tests.old_rewriters import old_rewrite_body

Make = Callable[..., MemoryCluster]
MODEL = "llama3:latest"
LIMIT = 1 << 20


# --- streams as the engines send them -------------------------------------------------------------


def ndjson(*objects: dict[str, Any]) -> list[bytes]:
    return [json.dumps(o).encode() + b"\n" for o in objects]


def sse(*objects: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objects] + [b"data: [DONE]\n\n"]


FINAL_FIELDS = {
    "done_reason": "stop",
    "done": True,
    "total_duration": 1200,
    "load_duration": 100,
    "prompt_eval_count": 7,
    "prompt_eval_duration": 300,
    "eval_count": 4,
    "eval_duration": 800,
}


def chat_piece(content: str = "", **message: Any) -> dict[str, Any]:
    return {
        "model": "llama3",
        "created_at": "2026-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": content, **message},
        "done": False,
    }


WEATHER = {"function": {"name": "weather", "arguments": {"city": "Oslo"}}}
TIME = {"function": {"name": "time", "arguments": {"zone": "CET"}}}
OLLAMA_CHAT = ndjson(
    chat_piece("", thinking="Let me "),
    chat_piece("", thinking="think."),
    chat_piece("Hel"),
    chat_piece("lo", tool_calls=[WEATHER]),
    chat_piece("!", tool_calls=[TIME]),
    {
        "model": "llama3",
        "created_at": "2026-01-01T00:00:09Z",
        "message": {"role": "assistant", "content": ""},
        **FINAL_FIELDS,
    },
)
OLLAMA_CHAT_ANSWER = {
    "model": "llama3",
    "created_at": "2026-01-01T00:00:09Z",
    "message": {
        "role": "assistant",
        "content": "Hello!",
        "thinking": "Let me think.",
        "tool_calls": [WEATHER, TIME],
    },
    **FINAL_FIELDS,
}


def generate_piece(response: str, **extra: Any) -> dict[str, Any]:
    return {"model": "llama3", "created_at": "t", "response": response, "done": False, **extra}


OLLAMA_GENERATE = ndjson(
    generate_piece("", thinking="Hmm."),
    generate_piece("one"),
    generate_piece(", two"),
    {
        "model": "llama3",
        "created_at": "t9",
        "response": "",
        "done": True,
        "done_reason": "length",
        "context": [1, 2, 3],
        "total_duration": 5,
        "eval_count": 2,
    },
)
OLLAMA_GENERATE_ANSWER = {
    "model": "llama3",
    "created_at": "t9",
    "response": "one, two",
    "thinking": "Hmm.",
    "done": True,
    "done_reason": "length",
    "context": [1, 2, 3],
    "total_duration": 5,
    "eval_count": 2,
}


def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 100,
        "model": "llama3",
        "system_fingerprint": "fp_ollama",
        "choices": choices,
        **extra,
    }


def delta(index: int = 0, finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "finish_reason": finish}


USAGE = {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
OPENAI_CHAT = sse(
    chunk([delta(role="assistant", content="Hi")]),
    chunk([delta(content=" there")]),
    chunk(
        [
            delta(
                tool_calls=[
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "weather", "arguments": ""},
                    },
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "time", "arguments": '{"zo'},
                    },
                ]
            )
        ]
    ),
    chunk([delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city":'}}])]),
    chunk([delta(tool_calls=[{"index": 1, "function": {"arguments": 'ne":"CET"}'}}])]),
    chunk([delta(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}])]),
    chunk([delta(finish="tool_calls", content="")]),
    chunk([], usage=USAGE),
)
OPENAI_CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 100,
    "model": "llama3",
    "system_fingerprint": "fp_ollama",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hi there",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                    },
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "time", "arguments": '{"zone":"CET"}'},
                    },
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": USAGE,
}
ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def text_chunk(choices: list[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": "cmpl-7",
        "object": "text_completion",
        "created": 5,
        "choices": choices,
        "model": "llama3",
        "system_fingerprint": "fp_ollama",
        "usage": usage,
    }


OPENAI_COMPLETIONS = sse(
    text_chunk([{"text": "one", "index": 0, "finish_reason": None}], ZERO),
    text_chunk(
        [{"text": ", two", "index": 0, "finish_reason": None, "logprobs": {"tokens": ["a"]}}], ZERO
    ),
    text_chunk(
        [{"text": "", "index": 0, "finish_reason": "length", "logprobs": {"tokens": ["b"]}}], ZERO
    ),
    text_chunk([], USAGE),
)
OPENAI_COMPLETIONS_ANSWER = {
    "id": "cmpl-7",
    "object": "text_completion",
    "created": 5,
    "choices": [
        {
            "text": "one, two",
            "index": 0,
            "finish_reason": "length",
            "logprobs": {"tokens": ["a", "b"]},
        }
    ],
    "model": "llama3",
    "system_fingerprint": "fp_ollama",
    "usage": USAGE,
}

STREAMS = {
    Dialect.OLLAMA_CHAT: (OLLAMA_CHAT, OLLAMA_CHAT_ANSWER),
    Dialect.OLLAMA_GENERATE: (OLLAMA_GENERATE, OLLAMA_GENERATE_ANSWER),
    Dialect.OPENAI_CHAT: (OPENAI_CHAT, OPENAI_CHAT_ANSWER),
    Dialect.OPENAI_COMPLETIONS: (OPENAI_COMPLETIONS, OPENAI_COMPLETIONS_ANSWER),
}


def fold(dialect: Dialect, pieces: list[bytes], limit: int = LIMIT) -> Assembled:
    assembler = Assembler(dialect, limit)
    for piece in pieces:
        assembler.feed(piece)
    return assembler.finish()


# --- which requests, and the body sent upstream -----------------------------------------------------


def plan(path: str, body: dict[str, Any]) -> Dialect | None:
    raw = json.dumps(body).encode()
    found = plan_assembly(path, raw, body, LIMIT)
    return found.dialect if found is not None else None


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/api/chat", {"stream": False}, Dialect.OLLAMA_CHAT),
        ("/api/generate", {"stream": False}, Dialect.OLLAMA_GENERATE),
        ("/api/chat", {}, None),  # Ollama streams by default
        ("/api/chat", {"stream": True}, None),
        ("/api/chat", {"stream": None}, None),  # null is Ollama's default: a stream
        ("/api/chat", {"stream": 0}, None),  # not a boolean: the engine answers it
        ("/v1/chat/completions", {}, Dialect.OPENAI_CHAT),  # OpenAI does not stream by default
        ("/v1/chat/completions", {"stream": None}, Dialect.OPENAI_CHAT),
        ("/v1/chat/completions", {"stream": False}, Dialect.OPENAI_CHAT),
        ("/v1/completions", {}, Dialect.OPENAI_COMPLETIONS),
        ("/v1/chat/completions", {"stream": True}, None),
        ("/v1/chat/completions", {"stream": 0}, None),
        ("/v1/chat/completions", {"stream_options": "x"}, None),
        ("/api/embed", {"stream": False}, None),
        ("/api/embeddings", {"stream": False}, None),
        ("/v1/embeddings", {}, None),
        ("/v1/messages", {}, None),
    ],
)
def test_which_requests_are_assembled(
    path: str, body: dict[str, Any], expected: Dialect | None
) -> None:
    assert plan(path, {"model": "m", **body}) == expected


def test_a_body_that_is_not_utf8_json_is_left_alone() -> None:
    raw = json.dumps({"model": "m", "stream": False}).encode("utf-16")
    assert plan_assembly("/api/chat", raw, {"model": "m", "stream": False}, LIMIT) is None


def test_rewrite_replaces_only_the_stream_value() -> None:
    raw = b'{ "model" : "m",\n  "stream" :  false , "n": 1e400, "x": 12345678901234567890.10 }'
    assert rewrite_body(Dialect.OLLAMA_CHAT, raw) == raw.replace(b"false", b"true")


def test_rewrite_replaces_every_duplicate_of_stream() -> None:
    raw = b'{"stream":false,"model":"m","stream":false}'
    assert (
        rewrite_body(Dialect.OLLAMA_GENERATE, raw) == b'{"stream":true,"model":"m","stream":true}'
    )


def test_rewrite_adds_stream_and_usage_for_openai() -> None:
    raw = b'{"model":"m","messages":[]}'
    assert rewrite_body(Dialect.OPENAI_CHAT, raw) == (
        b'{"stream":true,"stream_options":{"include_usage":true},"model":"m","messages":[]}'
    )
    assert rewrite_body(Dialect.OPENAI_CHAT, b" {} ") == (
        b' {"stream":true,"stream_options":{"include_usage":true}} '
    )


def test_rewrite_keeps_the_clients_stream_options() -> None:
    raw = b'{"model":"m","stream":null,"stream_options":{"include_usage":false,"x":[1]}}'
    assert rewrite_body(Dialect.OPENAI_COMPLETIONS, raw) == (
        b'{"model":"m","stream":true,"stream_options":{"include_usage":true,"x":[1]}}'
    )
    raw = b'{"stream_options":{ },"model":"m"}'
    assert rewrite_body(Dialect.OPENAI_CHAT, raw) == (
        b'{"stream":true,"stream_options":{"include_usage":true},"model":"m"}'
    )
    raw = b'{"stream_options":null}'
    assert rewrite_body(Dialect.OPENAI_CHAT, raw) == (
        b'{"stream":true,"stream_options":{"include_usage":true}}'
    )


@pytest.mark.parametrize("raw", [b"[]", b'{"a":1} x', b'{"a" 1}', b'{"a":1,}', b"\xff"])
def test_rewrite_refuses_what_is_not_one_json_object(raw: bytes) -> None:
    with pytest.raises(ValueError):
        rewrite_body(Dialect.OLLAMA_CHAT, raw)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
CLIENT_BODIES = st.dictionaries(
    st.text().filter(lambda k: k not in ("stream", "stream_options")), JSON_VALUES, max_size=5
)


@settings(max_examples=200, deadline=None)
@given(
    body=CLIENT_BODIES,
    spaced=st.booleans(),
    ascii_only=st.booleans(),
    dialect=st.sampled_from(list(Dialect)),
)
def test_rewrite_inserts_the_switch_and_keeps_every_client_byte(
    body: dict[str, Any], spaced: bool, ascii_only: bool, dialect: Dialect
) -> None:
    """Whatever the client's JSON looks like, the upstream body is ``{`` + what was inserted +
    the client's bytes, and parses to the client's object plus the streaming switch."""
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(body, separators=separators, ensure_ascii=ascii_only).encode()
    rewritten = rewrite_body(dialect, raw)
    expected = {"stream": True, **body}
    if dialect.sse:
        expected["stream_options"] = {"include_usage": True}
    assert json.loads(rewritten) == expected
    inserted = b'"stream":true' + (
        b',"stream_options":{"include_usage":true}' if dialect.sse else b""
    )
    if body:
        assert rewritten == b"{" + inserted + b"," + raw[1:]
    else:
        assert rewritten == b"{" + inserted + b"}"


# --- folding the streams ------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect))
def test_each_route_folds_to_the_engines_answer(dialect: Dialect) -> None:
    pieces, expected = STREAMS[dialect]
    answer = fold(dialect, pieces)
    assert answer.status == 200
    assert json.loads(answer.body) == expected
    assert list(json.loads(answer.body)) == list(expected)  # the engine's field order too


@settings(max_examples=100, deadline=None)
@given(dialect=st.sampled_from(list(Dialect)), cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_chunk_boundaries_anywhere_give_the_same_answer(dialect: Dialect, cuts: list[int]) -> None:
    pieces, expected = STREAMS[dialect]
    whole = b"".join(pieces)
    points = sorted({c % (len(whole) + 1) for c in cuts})
    parts = [whole[a:b] for a, b in zip([0, *points], [*points, len(whole)], strict=True)]
    assert json.loads(fold(dialect, parts).body) == expected


@pytest.mark.parametrize("dialect", list(Dialect))
def test_the_answer_is_ready_at_the_terminal_frame_and_later_bytes_are_ignored(
    dialect: Dialect,
) -> None:
    pieces, expected = STREAMS[dialect]
    assembler = Assembler(dialect, LIMIT)
    results = [assembler.feed(piece) for piece in pieces]
    terminal = len(pieces) - 1
    assert results[:terminal] == [None] * terminal
    assert results[terminal] is not None
    assert assembler.feed(b"garbage that is not json\n") == results[terminal]
    assert json.loads(assembler.finish().body) == expected


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize("keep", [0, 1, 2])
def test_a_stream_cut_before_its_terminal_frame_is_no_answer(dialect: Dialect, keep: int) -> None:
    pieces, _ = STREAMS[dialect]
    with pytest.raises(StreamCut):
        fold(dialect, pieces[:keep])
    with pytest.raises(StreamCut):
        fold(dialect, pieces[:-1])


def test_a_last_line_without_newline_is_read_at_the_clean_end() -> None:
    pieces, expected = STREAMS[Dialect.OLLAMA_GENERATE]
    assert json.loads(fold(Dialect.OLLAMA_GENERATE, [*pieces[:-1], pieces[-1][:-1]]).body) == (
        expected
    )
    assembler = Assembler(Dialect.OPENAI_CHAT, LIMIT)
    for piece in OPENAI_CHAT[:-1]:
        assembler.feed(piece)
    assembler.feed(b"data: [DONE]")
    assert json.loads(assembler.finish().body) == OPENAI_CHAT_ANSWER


def test_crlf_sse_and_comments_are_understood() -> None:
    wire = b"".join(OPENAI_CHAT).replace(b"\n", b"\r\n")
    assert json.loads(fold(Dialect.OPENAI_CHAT, [b": keep-alive\r\n\r\n", wire]).body) == (
        OPENAI_CHAT_ANSWER
    )


def test_usage_only_chunk_is_consumed_and_zero_usage_chunks_do_not_win() -> None:
    answer = json.loads(fold(Dialect.OPENAI_COMPLETIONS, OPENAI_COMPLETIONS).body)
    assert answer["usage"] == USAGE
    assert len(answer["choices"]) == 1


def test_tool_call_fragments_without_index_join_the_call_they_continue() -> None:
    stream = sse(
        chunk([delta(tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": "{"}}])]),
        chunk([delta(tool_calls=[{"function": {"arguments": "}"}}])]),
        chunk([delta(tool_calls=[{"id": "c2", "function": {"name": "g", "arguments": "[]"}}])]),
        chunk([delta(finish="tool_calls")]),
    )
    message = json.loads(fold(Dialect.OPENAI_CHAT, stream).body)["choices"][0]["message"]
    assert message["tool_calls"] == [
        {"id": "c1", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "function": {"name": "g", "arguments": "[]"}},
    ]
    assert message["content"] is None


def test_several_choices_are_kept_apart_in_index_order() -> None:
    stream = sse(
        chunk([delta(1, content="b"), delta(0, content="a")]),
        chunk([delta(0, "stop", content="A"), delta(1, "length", content="B")]),
    )
    choices = json.loads(fold(Dialect.OPENAI_CHAT, stream).body)["choices"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in choices] == [
        (0, "aA", "stop"),
        (1, "bB", "length"),
    ]


@pytest.mark.parametrize(
    ("dialect", "frame", "expected"),
    [
        (Dialect.OLLAMA_CHAT, b'{"error":"runner died"}\n', {"error": "runner died"}),
        (
            Dialect.OPENAI_CHAT,
            b'data: {"error":{"message":"boom","type":"api_error"}}\n\n',
            {"error": {"message": "boom", "type": "api_error"}},
        ),
    ],
)
def test_an_error_in_the_stream_is_the_engines_500_answer(
    dialect: Dialect, frame: bytes, expected: dict[str, Any]
) -> None:
    pieces, _ = STREAMS[dialect]
    answer = fold(dialect, [pieces[0], frame])
    assert answer.status == 500
    assert json.loads(answer.body) == expected


@pytest.mark.parametrize(
    ("dialect", "frame"),
    [
        (Dialect.OLLAMA_CHAT, b"not json\n"),
        (Dialect.OLLAMA_GENERATE, b"[1, 2]\n"),
        (Dialect.OPENAI_CHAT, b"data: {\n\n"),
        (Dialect.OPENAI_COMPLETIONS, b'data: {"choices": [1]}\n\n'),
    ],
)
def test_a_malformed_frame_fails_the_assembly(dialect: Dialect, frame: bytes) -> None:
    with pytest.raises(MalformedStream):
        fold(dialect, [STREAMS[dialect][0][0], frame])


def test_the_answer_is_capped() -> None:
    pieces = ndjson(*(generate_piece("x" * 100) for _ in range(20)))
    with pytest.raises(AnswerTooLarge):
        fold(Dialect.OLLAMA_GENERATE, pieces, limit=1000)
    fold(Dialect.OLLAMA_GENERATE, [*pieces[:9], *ndjson({"done": True})], limit=1000)


@pytest.mark.parametrize("dialect", [Dialect.OLLAMA_CHAT, Dialect.OPENAI_CHAT])
def test_an_endless_line_is_capped(dialect: Dialect) -> None:
    assembler = Assembler(dialect, 1000)
    with pytest.raises(AnswerTooLarge):
        for _ in range(20):
            assembler.feed((b"data: " if dialect.sse else b"") + b"y" * 100)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_memory_held_is_the_answer_text_and_the_unfinished_line(dialect: Dialect) -> None:
    """Past each complete frame only the answer's text (and tool-call/log-prob parts) is held,
    never the frames' envelopes: what is held stays below the answer's own size."""
    pieces, _ = STREAMS[dialect]
    assembler = Assembler(dialect, LIMIT)
    answer_size = len(fold(dialect, pieces).body)
    for piece in pieces[:-1]:
        assembler.feed(piece)
        assert assembler.held <= answer_size
    assembler.feed(pieces[-1][:10])
    assert assembler.held <= answer_size + 10


# --- the gate ----------------------------------------------------------------------------------------


def gate(
    timeout: float = 0.0, dialect: Dialect = Dialect.OLLAMA_CHAT
) -> tuple[AssemblyGate, Clock]:
    clock = Clock()
    g = AssemblyGate(clock, timeout, dialect, LIMIT)
    g.makeConnection(StringTransport())
    return g, clock


def outcome(d: Any) -> list[Any]:
    seen: list[Any] = []
    d.addBoth(seen.append)
    return seen


def test_gate_commits_only_with_the_whole_answer_and_concludes_at_the_upstream_end() -> None:
    g, _ = gate()
    first = outcome(g.first)
    for piece in OLLAMA_CHAT[:-1]:
        g.dataReceived(piece)
    assert first == []
    states = [g.state]
    g.dataReceived(OLLAMA_CHAT[-1])
    states.append(g.state)
    assert states == [AssemblyState.ASSEMBLING, AssemblyState.HOLDING]
    assert json.loads(first[0]) == OLLAMA_CHAT_ANSWER
    done = outcome(g.done)
    g.start_relay(lambda data: None)
    assert g.state is AssemblyState.DRAINING and done == []
    g.connectionLost(Failure(ResponseDone()))
    assert (done, g.state) == ([BodyEnd.COMPLETE], AssemblyState.ENDED)
    with pytest.raises(IllegalCall):
        g.start_relay(lambda data: None)


def test_gate_fails_a_stream_cut_after_the_first_token_as_a_transport_failure() -> None:
    g, _ = gate()
    first = outcome(g.first)
    g.dataReceived(OLLAMA_CHAT[0])
    g.connectionLost(Failure(ResponseDone()))  # a clean end, but no terminal object
    [failure] = first
    assert isinstance(failure, Failure) and failure.check(ResponseFailed)
    assert isinstance(failure.value, ResponseFailed)
    assert isinstance(failure.value.reasons[0].value, StreamCut)
    g2, _ = gate()
    first2 = outcome(g2.first)
    g2.dataReceived(OLLAMA_CHAT[0])
    g2.connectionLost(Failure(ConnectionLost()))
    assert first2[0].check(ConnectionLost)


def test_gate_first_body_timer_runs_until_the_first_byte_only() -> None:
    g, clock = gate(timeout=2.0)
    first = outcome(g.first)
    clock.advance(1.9)
    g.dataReceived(OLLAMA_CHAT[0])
    clock.advance(100)
    assert first == [] and clock.getDelayedCalls() == []
    silent, clock2 = gate(timeout=2.0)
    never = outcome(silent.first)
    clock2.advance(2.0)
    silent.connectionLost(Failure(ResponseDone()))
    assert never[0].check(FirstBodyTimeout)


def test_gate_stops_the_upstream_when_the_answer_grows_past_the_cap() -> None:
    clock = Clock()
    g = AssemblyGate(clock, 0.0, Dialect.OLLAMA_GENERATE, 100)
    transport = StringTransport()
    g.makeConnection(transport)
    first = outcome(g.first)
    g.dataReceived(b"".join(ndjson(*(generate_piece("z" * 60) for _ in range(3)))))
    assert first[0].check(ResponseFailed)
    assert isinstance(first[0].value, ResponseFailed)
    assert isinstance(first[0].value.reasons[0].value, AnswerTooLarge)
    assert transport.producerState == "stopped"
    g.connectionLost(Failure(ConnectionLost()))  # the end after a failure changes nothing
    assert g.state is AssemblyState.ENDED


# --- in memory: the corridor ----------------------------------------------------------------------


def ollama_script(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
    """An engine that streams the test streams above (and a whole answer when not streaming)."""
    dialect = Dialect(path.decode())
    pieces, answer = STREAMS[dialect]
    return pieces if streaming else [json.dumps(answer).encode()]


def engine(clock: Clock, behaviour: Behaviour = Behaviour.HEALTHY, **kw: Any) -> SimulatedEngine:
    return SimulatedEngine(clock, (MODEL,), always(behaviour), script=ollama_script, **kw)


def ask(path: str, **body: Any) -> dict[str, Any]:
    return {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], **body}


@pytest.mark.parametrize("dialect", list(Dialect))
def test_a_non_streaming_request_reaches_the_engine_as_a_stream_and_is_answered_whole(
    memory_cluster: Make, dialect: Dialect
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": engine(clock, chunk_delay=1.0)})
    body = ask(dialect.value, stream=False) if not dialect.sse else ask(dialect.value)
    sent = json.dumps(body).encode()
    pending = cluster.request("POST", dialect.value, data=sent)
    cluster.flush()
    assert not pending.called  # nothing before the terminal frame
    cluster.advance(len(STREAMS[dialect][0]))
    response = cluster.result(pending)
    assert response.complete
    assert response.status == 200
    assert response.header("content-type") == "application/json; charset=utf-8"
    assert response.length == len(response.body)  # Content-Length: the answer's size
    assert response.header("x-nvpair-node") == "a"
    assert len(response.chunks) == 1
    assert response.json() == STREAMS[dialect][1]
    [upstream] = cluster.received("a")
    assert upstream == rewrite_body(dialect, sent)
    [record] = cluster.named("proxy/request")
    assert record["status"] == 200
    assert [a["outcome"] for a in record["attempts"]] == ["committed"]
    assert [w["workload"]["state"] for w in cluster.named("workload:completed")] == ["completed"]


def test_a_node_that_dies_after_the_first_token_fails_over_and_the_client_gets_one_answer(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = memory_cluster(
        clock,
        {"a": engine(clock, Behaviour.DROP_MID_STREAM), "b": engine(clock)},
    )
    sent = json.dumps(ask("/api/chat", stream=False)).encode()
    response = cluster.fetch("POST", "/api/chat", data=sent)
    assert response.status == 200 and response.complete
    assert response.header("x-nvpair-node") == "b"
    assert response.json() == OLLAMA_CHAT_ANSWER
    assert (
        cluster.received("a") == cluster.received("b") == [rewrite_body(Dialect.OLLAMA_CHAT, sent)]
    )
    [record] = cluster.named("proxy/request")
    assert [(a["node_id"], a["outcome"]) for a in record["attempts"]] == [
        ("a", "dropped"),
        ("b", "committed"),
    ]
    assert cluster.named("node/cooldown") == []
    started = [e["workload"]["scheduledOn"] for e in cluster.named("workload:started")]
    assert started == ["a", "b"]
    [completed] = cluster.named("workload:completed")
    assert completed["workload"]["scheduledOn"] == "b"


def test_a_cut_on_the_last_candidate_is_a_502_and_nothing_partial(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": engine(clock, Behaviour.DROP_MID_STREAM)})
    response = cluster.fetch("POST", "/v1/chat/completions", json=ask("/v1/chat/completions"))
    assert response.status == 502
    assert refusal_code(response.json()) == "upstream-error"
    message = refusal_message(response.json())
    assert "stream ended before its terminal object" in message or "ResponseFailed" in message
    [record] = cluster.named("proxy/request")
    assert [a["outcome"] for a in record["attempts"]] == ["dropped"]


def test_an_error_in_the_stream_moves_on_like_a_500(memory_cluster: Make) -> None:
    clock = Clock()

    def failing(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        return [*OLLAMA_GENERATE[:1], b'{"error":"runner died"}\n']

    cluster = memory_cluster(
        clock,
        {
            "a": SimulatedEngine(clock, (MODEL,), script=failing),
            "b": SimulatedEngine(clock, (MODEL,), script=failing),
        },
    )
    response = cluster.fetch(
        "POST", "/api/generate", json={"model": "llama3", "prompt": "p", "stream": False}
    )
    assert response.status == 500
    assert response.json() == {"error": "runner died"}
    [record] = cluster.named("proxy/request")
    assert [a["outcome"] for a in record["attempts"]] == ["status-500", "committed"]


def test_assemble_off_sends_the_body_unchanged(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(
        clock, {"a": engine(clock)}, settings=Settings(assemble={"ollama": False})
    )
    sent = json.dumps(ask("/api/chat", stream=False)).encode()
    response = cluster.fetch("POST", "/api/chat", data=sent)
    assert cluster.received("a") == [sent]
    assert response.json() == OLLAMA_CHAT_ANSWER  # the engine's own whole answer, relayed


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/embed", {"model": "llama3", "input": "x", "stream": False}),
        ("/api/embeddings", {"model": "llama3", "prompt": "x", "stream": False}),
        ("/v1/embeddings", {"model": "llama3", "input": "x"}),
        ("/api/chat", ask("/api/chat")),  # a stream already
        (  # a stream that asked for its usage chunk itself (else §12.2 asks for it)
            "/v1/chat/completions",
            {**ask("/v1/chat/completions", stream=True), "stream_options": {"include_usage": True}},
        ),
    ],
)
def test_embeddings_and_streaming_requests_are_never_transformed(
    memory_cluster: Make, path: str, body: dict[str, Any]
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, (MODEL,))})
    sent = json.dumps(body).encode()
    response = cluster.fetch("POST", path, data=sent)
    assert response.status == 200
    assert cluster.received("a") == [sent]
    assert response.header("content-type") != "application/json; charset=utf-8"


def test_a_non_2xx_answer_is_relayed_as_it_is(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": engine(clock, Behaviour.STATUS_400)})
    response = cluster.fetch("POST", "/api/chat", json=ask("/api/chat", stream=False))
    assert response.status == 400
    assert response.json() == {"error": "simulated 400"}


def test_an_engine_that_answers_a_whole_document_anyway_is_relayed(memory_cluster: Make) -> None:
    clock = Clock()

    def whole(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        return [b'{"done":true}']

    class Stubborn(SimulatedEngine):
        def render(self, request: Any) -> bytes | int:  # the engine ignores "stream": true
            request.content.seek(0)
            data = json.loads(request.content.read())
            data["stream"] = False
            request.content = __import__("io").BytesIO(json.dumps(data).encode())
            return super().render(request)

    cluster = memory_cluster(clock, {"a": Stubborn(clock, (MODEL,), script=whole)})
    response = cluster.fetch("POST", "/api/chat", json=ask("/api/chat", stream=False))
    assert response.status == 200
    assert response.json() == {"done": True}


def test_the_first_body_timer_stops_at_the_first_token(memory_cluster: Make) -> None:
    """The node is chosen at the first token: an enabled first-body timeout shorter than the
    whole generation does not cut an answer whose tokens keep coming."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        {"a": engine(clock, chunk_delay=2.0)},
        settings=Settings(first_body_timeout=1.0),
    )
    pending = cluster.request("POST", "/api/chat", json=ask("/api/chat", stream=False))
    cluster.advance(20.0)
    response = cluster.result(pending)
    assert response.status == 200
    assert response.json() == OLLAMA_CHAT_ANSWER
    assert cluster.named("node/cooldown") == []


def test_a_client_that_leaves_during_assembly_stops_the_attempt(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(
        clock, {"a": engine(clock, chunk_delay=1.0), "b": engine(clock, chunk_delay=1.0)}
    )
    pending = cluster.request("POST", "/api/chat", json=ask("/api/chat", stream=False))
    cluster.advance(2.0)
    pending.cancel()
    pending.addErrback(lambda _: None)
    cluster.advance(10.0)
    [record] = cluster.named("proxy/request")
    assert record["status"] == 499
    assert [a["outcome"] for a in record["attempts"]] == ["cancelled"]
    assert cluster.received("b") == []


def test_an_assembled_generation_is_progress_for_the_nodes_other_attempts(
    memory_cluster: Make,
) -> None:
    """Busy is not stalled (§6.4) sees the bytes of an answer being assembled: a request whose
    headers a one-slot node withholds while it generates a non-streaming answer is waited for
    (busy waits at 2, 4, 6, 8 and 10 s), not stalled, and nothing cools."""
    from tests.corridor.test_exchange import OneSlotEngine

    clock = Clock()
    cluster = memory_cluster(
        clock,
        {"a": OneSlotEngine(clock, chunks=10, chunk_delay=1.0)},
        settings=Settings(response_header_timeout=2.0),
    )
    whole = cluster.request("POST", "/api/chat", json=ask("/api/chat", stream=False))
    queued = cluster.request("POST", "/api/chat", json=ask("/api/chat"))
    cluster.advance(11.0)
    assert cluster.result(whole).complete
    assert cluster.result(queued).header("x-nvpair-node") == "a"
    assert cluster.facade().progress.busy_waits("a") == 5
    assert cluster.named("node/cooldown") == []
    cluster.advance(11.0)
    records = cluster.named("proxy/request")
    assert sorted(a["busy_waits"] for r in records for a in r["attempts"]) == [0, 5]


# --- the official clients parse the assembled answers -------------------------------------------------


def realistic(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
    """Streams shaped like Ollama 0.9's own (field names, order and types)."""
    assert streaming, "the proxy should have asked for a stream"
    if path == b"/api/chat":
        return OLLAMA_CHAT
    if path == b"/api/generate":
        return OLLAMA_GENERATE
    if path == b"/v1/chat/completions":
        return OPENAI_CHAT
    return OPENAI_COMPLETIONS


@pytest.fixture
def proxied(clusters: Clusters, reactor: Any) -> Iterator[ProxyCluster]:
    yield clusters(ProxyCluster)


@pytest_twisted.ensureDeferred
async def test_official_clients_parse_assembled_answers(
    reactor: Any, proxied: ProxyCluster
) -> None:
    await proxied.start([SimulatedEngine(reactor, (MODEL,), script=realistic)])
    url = proxied.url

    def use_clients() -> tuple[Any, ...]:
        client = ollama.Client(host=url)
        chat = client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
        generated = client.generate(model="llama3", prompt="count")
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as oa:
            completion = oa.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "hi"}]
            )
            text = oa.completions.create(model="llama3", prompt="count")
        return chat, generated, completion, text

    chat, generated, completion, text = await deferToThread(use_clients)
    assert chat.message.content == "Hello!"
    assert chat.message.thinking == "Let me think."
    assert [c.function.name for c in chat.message.tool_calls or []] == ["weather", "time"]
    assert chat.done and chat.eval_count == 4
    assert generated.response == "one, two" and generated.context == [1, 2, 3]
    choice = completion.choices[0]
    assert choice.message.content == "Hi there"
    assert [(c.id, c.function.arguments) for c in choice.message.tool_calls or []] == [
        ("call_a", '{"city":"Oslo"}'),
        ("call_b", '{"zone":"CET"}'),
    ]
    assert completion.usage is not None and completion.usage.total_tokens == 14
    assert text.choices[0].text == "one, two"
    assert text.usage is not None and text.usage.completion_tokens == 5
    bodies = proxied.received(0)
    assert all(json.loads(b)["stream"] is True for b in bodies)


# --- the rewrite on the one parse's spans (docs/behaviour.md §14.1) ------------------------------


def _parsed(body: bytes) -> Parsed:
    parsed = parse_document(body)
    assert isinstance(parsed, Parsed)
    return parsed


@settings(max_examples=300, deadline=None)
@given(body=bodies(), dialect=st.sampled_from(list(Dialect)))
def test_the_rewrite_on_the_parses_spans_is_byte_identical_to_the_scanning_one(
    body: bytes, dialect: Dialect
) -> None:
    expected = old_rewrite_body(dialect, body)
    rewritten = rewrite_outlined(dialect, Outlined(body, _parsed(body)))
    assert rewritten.body == expected == rewrite_body(dialect, body)
    assert rewritten.outline == outline_body(expected).outline


@settings(max_examples=100, deadline=None)
@given(body=bodies(), dialect=st.sampled_from(list(Dialect)))
def test_an_assembly_planned_with_the_outline_sends_the_same_body_and_carries_its_outline(
    body: bytes, dialect: Dialect
) -> None:
    parsed = _parsed(body)
    scanned = plan_assembly(dialect.value, body, parsed.doc, 1000)
    planned = plan_assembly(dialect.value, body, parsed.doc, 1000, parsed)
    assert (planned is None) is (scanned is None)
    if planned is not None and scanned is not None:
        assert planned.body == scanned.body
        assert planned.outline == outline_body(planned.body).outline


def test_the_rewrite_on_spans_reads_only_the_stream_options_object() -> None:
    # outside the members it changes, the body is not read: invalid bytes there do not matter
    body = b'{"x":\xff\xff,"stream_options":{ "a":1 }}'
    outline = Outline(0, len(body) - 1, (("x", 5, 7), ("stream_options", 25, 34)))
    rewritten = rewrite_outlined(Dialect.OPENAI_CHAT, Outlined(body, outline))
    assert (
        rewritten.body
        == b'{"stream":true,"x":\xff\xff,"stream_options":{"include_usage":true, "a":1 }}'
    )


def test_a_folders_own_bug_fails_the_gate_as_the_proxys_not_as_a_drop() -> None:
    """The node's stream (a ``StreamCut``) fails the attempt as a drop; anything else the folder
    raises is a :class:`ProxyBug`, which the attempt loop does not take for the node's fault."""
    cut = StreamCut("cut")
    drop = _failed(cut)
    assert isinstance(drop.value, ResponseFailed)
    assert drop.value.reasons[0].value is cut
    bug = KeyError("choices")
    proxy = _failed(bug)
    assert isinstance(proxy.value, ProxyBug)
    assert proxy.value.error is bug
