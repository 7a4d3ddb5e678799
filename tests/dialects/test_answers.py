"""OpenAI answers as the client's dialect: Ollama NDJSON chunks and whole objects, embeddings,
LM Studio stats, errors, and the split-point property."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair_tw.dialects import AnswerTooLarge, MalformedAnswer, StreamCut, Translation, translate
from nvpair_tw.dialects._ollama_fast import _EVENTS, _RUN, content_literal
from tests.dialects.streams import (
    BASE,
    DONE,
    Ticks,
    chat_stream,
    delta,
    event,
    finish,
    usage,
)

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


def translation(path: str = "/api/chat", **fields: Any) -> Translation:
    body = {**CHAT, **fields} if path == "/api/chat" else {"model": "llama3", **fields}
    return translate(path, body, local_model="smollm2", client_model="llama3", limit=1 << 16)


def lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.split(b"\n") if line]


def run(t: Translation, data: bytes, status: int = 200, ct: bytes = b"text/event-stream") -> bytes:
    tr = t.answer(status, ct, Ticks())
    return tr.feed(data) + tr.end()


def test_chat_stream_becomes_ollama_chunks_and_a_final_object_with_measured_durations() -> None:
    # one event per read, as engines send them: one clock reading per read
    tr = translation().answer(200, b"text/event-stream", Ticks())
    stream = chat_stream("Hi", " there")
    pieces = [piece + b"\n\n" for piece in stream.split(b"\n\n") if piece]
    out = lines(b"".join(tr.feed(piece) for piece in pieces) + tr.end())
    assert [o["message"]["content"] for o in out] == ["Hi", " there", ""]
    assert all(o["model"] == "llama3" for o in out)
    assert out[0] == {
        "model": "llama3",
        "created_at": out[0]["created_at"],
        "message": {"role": "assistant", "content": "Hi"},
        "done": False,
    }
    final = out[-1]
    # creation at t0+0.25; contents at +0.5, +0.75; [DONE] at +1.0
    assert final == {
        "model": "llama3",
        "created_at": final["created_at"],
        "message": {"role": "assistant", "content": ""},
        "done_reason": "stop",
        "done": True,
        "total_duration": 750_000_000,
        "prompt_eval_count": 5,
        "prompt_eval_duration": 250_000_000,
        "eval_count": 2,
        "eval_duration": 250_000_000,
    }
    assert out[0]["created_at"].endswith("Z") and len(out[0]["created_at"]) == 30


def test_created_at_is_rfc3339_utc_with_nanoseconds() -> None:
    tr = translation().answer(200, b"text/event-stream", Ticks(1_796_085_388.5, 0.0))
    first = lines(tr.feed(delta(content="x")))[0]
    assert first["created_at"] == "2026-12-01T00:36:28.500000000Z"


def test_whole_answer_for_stream_false_is_one_object_and_nothing_before_end() -> None:
    tr = translation(stream=False).answer(200, b"text/event-stream", Ticks())
    assert tr.content_type == b"application/json; charset=utf-8"
    assert tr.feed(chat_stream("Hi", " there")) == b""
    whole = json.loads(tr.end())
    assert whole["message"] == {"role": "assistant", "content": "Hi there"}
    assert whole["done"] is True and whole["eval_count"] == 2
    assert tr.tokens == (5, 2)


def test_streaming_content_type_is_ndjson() -> None:
    assert translation().answer(200, b"text/event-stream", Ticks()).content_type == (
        b"application/x-ndjson"
    )


def test_length_finish_is_done_reason_length_and_tool_calls_is_stop() -> None:
    assert lines(run(translation(), chat_stream("a", reason="length")))[-1]["done_reason"] == (
        "length"
    )
    assert lines(run(translation(), chat_stream("a", reason="tool_calls")))[-1]["done_reason"] == (
        "stop"
    )


def test_reasoning_content_and_reasoning_become_thinking() -> None:
    data = delta(reasoning_content="hmm") + delta(reasoning=" so") + chat_stream("ok")
    out = lines(run(translation(), data))
    assert out[0]["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}
    assert out[1]["message"]["thinking"] == " so"
    whole = json.loads(run(translation(stream=False), data))
    assert whole["message"] == {"role": "assistant", "content": "ok", "thinking": "hmm so"}


def tool_stream() -> bytes:
    return (
        delta(
            role="assistant",
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"ci'},
                }
            ],
        )
        + delta(tool_calls=[{"index": 0, "function": {"arguments": 'ty":"Paris"}'}}])
        + delta(tool_calls=[{"index": 1, "function": {"name": "now", "arguments": ""}}])
        + finish("tool_calls")
        + usage()
        + DONE
    )


def test_tool_calls_are_gathered_by_index_and_emitted_whole_at_finish() -> None:
    out = lines(run(translation(), tool_stream()))
    assert len(out) == 2
    assert out[0]["message"] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_abc",
                "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}},
            },
            {"function": {"index": 1, "name": "now", "arguments": {}}},
        ],
    }
    assert out[1]["done"] is True and out[1]["done_reason"] == "stop"
    whole = json.loads(run(translation(stream=False), tool_stream()))
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_a_stream_without_done_raises_stream_cut_and_emits_no_terminal_line() -> None:
    tr = translation().answer(200, b"text/event-stream", Ticks())
    data = chat_stream("Hi")
    out = tr.feed(data[: -len(DONE)])
    assert all(not o["done"] for o in lines(out))
    with pytest.raises(StreamCut):
        tr.end()


def test_done_without_its_blank_line_still_ends_the_stream() -> None:
    out = lines(run(translation(), chat_stream("Hi")[:-2]))
    assert out[-1]["done"] is True


def test_an_error_event_becomes_an_ollama_error_line_and_ends_the_answer() -> None:
    data = delta(content="a") + event({"error": {"message": "model crashed"}}) + delta(content="b")
    out = lines(run(translation(), data))
    assert out[-1] == {"error": "model crashed"}
    assert len(out) == 2
    tr = translation(stream=False).answer(200, b"text/event-stream", Ticks())
    tr.feed(data)
    assert json.loads(tr.end()) == {"error": "model crashed"}
    assert tr.status == 500  # type: ignore[attr-defined]


def test_sse_comments_event_lines_crlf_and_data_without_space_are_understood() -> None:
    data = (
        b": keep-alive\r\n\r\nevent: message\r\nid: 1\r\ndata:"
        + json.dumps({**BASE, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}).encode()
        + b"\r\n\r\n"
        + DONE.replace(b"\n", b"\r\n")
    )
    out = lines(run(translation(), data))
    assert out[0]["message"]["content"] == "Hi"
    assert out[-1]["done"] is True


def test_multi_line_data_is_joined_with_newlines() -> None:
    document = json.dumps({**BASE, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}, indent=1)
    data = b"".join(b"data: " + line.encode() + b"\n" for line in document.split("\n")) + b"\n"
    assert lines(run(translation(), data + DONE))[0]["message"]["content"] == "Hi"


def test_a_frame_that_is_not_json_is_malformed() -> None:
    tr = translation().answer(200, b"text/event-stream", Ticks())
    with pytest.raises(MalformedAnswer):
        tr.feed(b"data: {nope\n\n")


def test_a_whole_answer_past_the_limit_raises_answer_too_large() -> None:
    tr = translation(stream=False).answer(200, b"text/event-stream", Ticks())
    with pytest.raises(AnswerTooLarge):
        tr.feed(delta(content="x" * (1 << 17)))


def test_a_whole_json_answer_although_asked_to_stream_is_translated() -> None:
    doc = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "model": "smollm2",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    }
    out = lines(run(translation(), json.dumps(doc).encode(), ct=b"application/json"))
    assert out[0]["message"]["content"] == "Hi"
    assert out[-1]["done"] is True and out[-1]["eval_count"] == 1


def test_generate_answers_use_response_not_message() -> None:
    t = translation("/api/generate", prompt="hi")
    out = lines(run(t, chat_stream("Hi", "!")))
    assert [o["response"] for o in out] == ["Hi", "!", ""]
    assert "message" not in out[-1]
    whole = json.loads(
        run(translation("/api/generate", prompt="hi", stream=False), chat_stream("Hi"))
    )
    assert whole["response"] == "Hi" and whole["done"] is True


def test_raw_generate_reads_completion_text_chunks() -> None:
    t = translation("/api/generate", prompt="1, 2,", raw=True)
    assert t.path == "/v1/completions"

    def text(value: str, reason: str | None = None) -> bytes:
        return event(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": "smollm2",
                "choices": [{"index": 0, "text": value, "finish_reason": reason}],
            }
        )

    out = lines(run(t, text(" 3") + text(",", "length") + usage(3, 2) + DONE))
    assert [o["response"] for o in out] == [" 3", ",", ""]
    assert out[-1]["done_reason"] == "length"


def test_embed_answer_is_ollama_embeddings_with_prompt_eval_count() -> None:
    t = translation("/api/embed", input=["a", "b"])
    doc = {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": [0.3, 0.4], "index": 1},
            {"object": "embedding", "embedding": [0.1, 0.2], "index": 0},
        ],
        "model": "smollm2",
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    answer = json.loads(run(t, json.dumps(doc).encode(), ct=b"application/json"))
    assert answer == {
        "model": "llama3",
        "embeddings": [[0.1, 0.2], [0.3, 0.4]],
        "total_duration": 250_000_000,
        "prompt_eval_count": 2,
    }
    del doc["usage"]
    assert "prompt_eval_count" not in json.loads(run(t, json.dumps(doc).encode()))


def test_legacy_embeddings_answer_is_one_embedding() -> None:
    t = translation("/api/embeddings", prompt="a")
    doc = {"data": [{"embedding": [0.5], "index": 0}]}
    assert json.loads(run(t, json.dumps(doc).encode())) == {"embedding": [0.5]}


def test_openai_error_becomes_ollama_error_with_the_same_body_shape() -> None:
    t = translation()
    body = b'{"error":{"message":"model \\"x\\" not found","type":"not_found_error"}}'
    tr = t.answer(404, b"application/json", Ticks())
    assert tr.feed(body) + tr.end() == b'{"error":"model \\"x\\" not found"}'


def test_other_error_bodies_pass_through_unchanged() -> None:
    tr = translation().answer(502, b"text/plain", Ticks())
    assert tr.feed(b"bad ") + tr.feed(b"gateway") + tr.end() == b"bad gateway"
    assert tr.content_type == b"text/plain"
    tr = translation().answer(500, b"application/json", Ticks())
    assert tr.feed(b'{"error":"plain"}') + tr.end() == b'{"error":"plain"}'


def test_v0_error_passes_through_as_it_came() -> None:
    t = translate("/api/v0/chat/completions", dict(CHAT), local_model="m", client_model="llama3")
    tr = t.answer(400, b"application/json", Ticks())
    assert tr.feed(b'{"error":{"message":"x"}}') + tr.end() == b'{"error":{"message":"x"}}'


def test_v0_whole_answer_gets_stats_and_the_clients_model() -> None:
    t = translate("/api/v0/chat/completions", dict(CHAT), local_model="m", client_model="llama3")
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 14},
    }
    clock = Ticks()
    tr = t.answer(200, b"application/json", clock)
    tr.feed(json.dumps(doc).encode())
    answer = json.loads(tr.end())
    assert answer["model"] == "llama3"
    assert answer["stats"] == {
        "tokens_per_second": 40.0,
        "time_to_first_token": 0.25,
        "generation_time": 0.25,
        "stop_reason": "eosFound",
    }
    assert tr.tokens == (4, 10)


def test_v0_stream_passes_through_renamed_and_needs_done() -> None:
    t = translate(
        "/api/v0/chat/completions",
        {**CHAT, "stream": True},
        local_model="smollm2",
        client_model="llama3",
    )
    tr = t.answer(200, b"text/event-stream", Ticks())
    data = chat_stream("Hi")
    assert tr.feed(data) + tr.end() == data.replace(b'"model":"smollm2"', b'"model":"llama3"')
    cut = t.answer(200, b"text/event-stream", Ticks())
    cut.feed(data[:-8])
    with pytest.raises(StreamCut):
        cut.end()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return pieces


SAMPLE = (
    b": comment\n\n"
    + delta(role="assistant", content="H\u00e9llo \u2603 \U0001f600")
    + delta(content='"quoted"\\n')
    + delta(reasoning_content="th\u00efnk")
    + tool_stream()[: -len(usage() + DONE)]
    + usage()
    + DONE
).replace(b"\n\n", b"\r\n\r\n", 2)


@settings(max_examples=150, deadline=None)
@given(
    whole=st.booleans(),
    cuts=st.lists(st.integers(0, len(SAMPLE)), max_size=20),
)
def test_any_split_of_the_upstream_stream_gives_the_same_client_bytes(
    whole: bool, cuts: list[int]
) -> None:
    t = translation(stream=not whole)
    # a clock that does not move, so time stamps do not depend on how many reads a split makes
    expected_tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
    expected = expected_tr.feed(SAMPLE) + expected_tr.end()
    tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
    got = b"".join(tr.feed(piece) for piece in _split(SAMPLE, cuts)) + tr.end()
    assert got == expected
    assert b"\xf0\x9f\x98\x80" in got or b"\\ud83d" in got


PLAIN = [
    delta(role="assistant", content="Hi"),
    delta(content='say \\"x\\" \\\\'),
    event(
        {
            **BASE,
            "choices": [
                {"index": 0, "delta": {"content": "é"}, "logprobs": None, "finish_reason": None}
            ],
        }
    ),
]
OTHER = [
    delta(content=""),
    delta(content="a", reasoning_content="b"),
    event(
        {
            **BASE,
            "usage": {"prompt_tokens": 1},
            "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}],
        }
    ),
    event({**BASE, "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}),
    event(
        {
            **BASE,
            "choices": [
                {"index": 0, "delta": {"content": "a"}, "finish_reason": None},
                {"index": 1, "delta": {"content": "b"}, "finish_reason": None},
            ],
        }
    ),
]


@pytest.mark.parametrize("frame", PLAIN)
def test_a_plain_content_chunk_takes_the_literal_copying_fast_path(frame: bytes) -> None:
    event_data = frame[6:-2]
    literal = content_literal(event_data)
    assert literal is not None
    assert json.loads(literal) == json.loads(event_data)["choices"][0]["delta"]["content"]
    # the run fast path recognises the same events and copies the same literal
    match = _EVENTS.fullmatch(frame)
    assert match is not None and match.group(1) == literal


@pytest.mark.parametrize("frame", OTHER)
def test_any_other_chunk_is_parsed(frame: bytes) -> None:
    assert content_literal(frame[6:-2]) is None
    assert _RUN.match(frame) is None


def _one_by_one(t: Translation, frames: list[bytes]) -> bytes:
    tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
    return b"".join(tr.feed(frame) for frame in frames) + tr.end()


@pytest.mark.parametrize("whole", [False, True])
def test_a_read_of_many_plain_events_is_translated_in_one_pass_as_event_by_event(
    whole: bool,
) -> None:
    """The run fast path (one read of plain content events, then whatever follows in the same
    read) gives the bytes the event-by-event path gives."""
    t = translation(stream=not whole)
    frames = [*PLAIN, *PLAIN, delta(content="x"), *OTHER, *PLAIN, finish(), usage(), DONE]
    expected = _one_by_one(t, frames)
    tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
    got = tr.feed(b"".join(frames)) + tr.end()
    assert got == expected
    if not whole:
        contents = [o["message"]["content"] for o in lines(got)]
        assert contents[:4] == ["Hi", 'say \\"x\\" \\\\', "é", "Hi"]


def test_a_run_of_plain_events_is_one_clock_reading_and_one_created_at() -> None:
    readings = Ticks()
    tr = translation().answer(200, b"text/event-stream", readings)
    start = readings.now
    out = lines(tr.feed(delta(content="a") + delta(content="b") + delta(content="c")))
    assert [o["message"]["content"] for o in out] == ["a", "b", "c"]
    assert len({o["created_at"] for o in out}) == 1
    assert readings.now == start + 0.25  # one reading for the three
    # a run ending in another event: the run, then the rest event by event
    out = lines(tr.feed(delta(content="d") + finish() + usage() + DONE))
    assert [o["message"]["content"] for o in out] == ["d", ""]
    assert out[-1]["done"] is True and out[-1]["eval_count"] == 3


def test_a_run_cut_inside_an_event_keeps_the_cut_event_for_the_next_read() -> None:
    frames = [delta(content=w) for w in ("one", " two", " three")] + [finish(), usage(), DONE]
    body = b"".join(frames)
    cut = len(frames[0]) + len(frames[1]) + 7
    t = translation()
    expected = _one_by_one(t, frames)
    tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
    first = tr.feed(body[:cut])
    assert [o["message"]["content"] for o in lines(first)] == ["one", " two"]
    assert first + tr.feed(body[cut:]) + tr.end() == expected


def test_after_a_read_cut_inside_an_event_the_next_read_finishes_it_and_runs_again() -> None:
    frames = [delta(content=f"w{i}") for i in range(12)]
    body = b"".join(frames)
    size = len(frames[0])
    cuts = [0, 4 * size + 9, 8 * size + 3, len(body)]
    reads = [body[a:b] for a, b in itertools.pairwise(cuts)]
    t = translation()
    expected = _one_by_one(t, [*frames, finish(), usage(), DONE])
    readings = Ticks(step=0.0)
    calls = 0

    def clock() -> float:
        nonlocal calls
        calls += 1
        return readings()

    tr = t.answer(200, b"text/event-stream", clock)
    start = calls
    got = b"".join(tr.feed(read) for read in reads)
    # per read: the cut event finished (one reading), then one run (one reading)
    assert calls - start == 5
    assert got + tr.feed(finish() + usage() + DONE) + tr.end() == expected


def test_the_learned_prefix_path_gives_the_event_by_event_bytes_without_a_regex(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After one read the stream's bytes around the content are known; later reads of such
    events (escapes included) are split, not matched, and give the same bytes."""
    from nvpair_tw.dialects import _ollama_fast

    words = ["a", ' "q" ', "back\\slash\\", "new\nline", "é ☃", "x"]
    first = [delta(content=w) for w in words]
    second = [delta(content=w + "!") for w in reversed(words)]
    rest = [finish(), usage(), DONE]
    t = translation()
    expected = _one_by_one(t, [*first, *second, *rest])
    tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
    got = tr.feed(b"".join(first))

    class NoRegex:
        def match(self, *args: Any) -> None:
            raise AssertionError("the learned path was not taken")

    monkeypatch.setattr(_ollama_fast, "_RUN", NoRegex())
    got += tr.feed(b"".join(second) + rest[0])  # a run, then the finish event after it
    monkeypatch.undo()
    got += tr.feed(b"".join(rest[1:])) + tr.end()
    assert got == expected


@pytest.mark.parametrize(
    "odd",
    [
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"smollm2",'
        b'"system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"content":"a"b"},'
        b'"finish_reason":null}]}\n\n',
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"smollm2",'
        b'"system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"content":"a\\"},'
        b'"finish_reason":null}]}\n\n',
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"smollm2",'
        b'"system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"content":""},'
        b'"finish_reason":null}]}\n\n',
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"smollm2",'
        b'"system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"content":"a\nb"},'
        b'"finish_reason":null}]}\n\n',
        b"xyz",
    ],
)
def test_an_odd_event_among_learned_ones_is_not_copied_blindly(odd: bytes) -> None:
    """An event the learned path must refuse (an unescaped quote, a lone last backslash, empty
    content, a raw newline, junk glued on): the read goes the event-by-event way, with the same
    bytes or the same error."""
    t = translation()
    reads = [delta(content="a") + delta(content="b"), delta(content="c") + odd + delta(content="d")]
    reads += [finish() + usage() + DONE]

    def outcome(slow: bool) -> bytes | str:
        tr = t.answer(200, b"text/event-stream", Ticks(step=0.0))
        feed = tr._split if slow else tr.feed  # type: ignore[attr-defined]
        try:
            return b"".join(feed(read) for read in reads) + tr.end()
        except StreamCut as error:
            return type(error).__name__

    assert outcome(slow=False) == outcome(slow=True)


def test_tool_call_fragments_without_an_index_are_told_apart_by_their_ids() -> None:
    """The one rule of ``core.ToolCalls`` (docs/behaviour.md §6.5): a fragment without ``index``
    and with a new ``id`` starts a call, one without an ``id`` continues it; list position would
    have folded both calls, each at position 0 of its chunk, into one."""
    stream = (
        delta(tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": '{"a":'}}])
        + delta(tool_calls=[{"function": {"arguments": "1}"}}])
        + delta(tool_calls=[{"id": "c2", "function": {"name": "g", "arguments": "{}"}}])
        + finish("tool_calls")
        + DONE
    )
    whole = json.loads(run(translation(stream=False), stream))
    assert whole["message"]["tool_calls"] == [
        {"id": "c1", "function": {"index": 0, "name": "f", "arguments": {"a": 1}}},
        {"id": "c2", "function": {"index": 1, "name": "g", "arguments": {}}},
    ]
