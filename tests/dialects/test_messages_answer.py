"""OpenAI-compatible chat answers as Anthropic Messages answers (docs/behaviour.md §17.3, §17.4):
the event stream, the whole message object and the error object, from streams shaped as
llama.cpp, vLLM and Ollama's ``/v1`` send them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvpair_tw.dialects import StreamCut, Transducer, translate
from tests.dialects.streams import BASE, DONE, chat_stream, delta, event, finish, usage

pytestmark = pytest.mark.timeout(60)

SSE = b"text/event-stream"
REQUEST = {
    "model": "claude-local",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}


def answer(stream: bool, status: int = 200, content_type: bytes | None = SSE) -> Transducer:
    t = translate(
        "/v1/messages",
        {**REQUEST, "stream": stream},
        local_model="smollm2",
        client_model="claude-local",
    )
    return t.answer(status, content_type, lambda: 0.0)


def run(transducer: Transducer, data: bytes, step: int = 0) -> bytes:
    """``data`` fed whole, or ``step`` bytes at a time, then the end."""
    if not step:
        return transducer.feed(data) + transducer.end()
    parts = [transducer.feed(data[i : i + step]) for i in range(0, len(data), step)]
    return b"".join(parts) + transducer.end()


def events(body: bytes) -> list[dict[str, Any]]:
    """The events of a Messages stream, each checked to be named as its ``type`` says."""
    out = []
    for frame in body.split(b"\n\n"):
        if not frame:
            continue
        name, data = frame.split(b"\n")
        doc = json.loads(data.removeprefix(b"data: "))
        assert name == b"event: " + doc["type"].encode()
        out.append(doc)
    return out


def tool_fragments() -> bytes:
    """A tool call streamed as llama.cpp streams it: id and name first, then argument pieces."""
    first = {
        "index": 0,
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    return (
        delta(role="assistant", content=None, tool_calls=[first])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '{"location":'}}])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": ' "Paris"}'}}])
        + finish("tool_calls")
        + usage(12, 9)
        + DONE
    )


def test_a_chat_stream_becomes_the_messages_event_sequence() -> None:
    body = run(answer(True), chat_stream("Hel", 'lo "you"', "!"))
    got = events(body)
    assert [e["type"] for e in got] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = got[0]["message"]
    assert start["id"] == "msg_chatcmpl-1" and start["model"] == "claude-local"
    assert start["content"] == [] and start["role"] == "assistant"
    assert got[1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert "".join(e["delta"]["text"] for e in got[2:5]) == 'Hello "you"!'
    assert got[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert got[6]["usage"] == {"input_tokens": 5, "output_tokens": 3}


@pytest.mark.parametrize("step", [1, 7, 64])
def test_a_stream_split_anywhere_gives_the_same_events(step: int) -> None:
    data = chat_stream("a", "é\\n", "c") + b""
    assert run(answer(True), data, step) == run(answer(True), data)


def test_reasoning_then_content_are_a_thinking_block_then_a_text_block() -> None:
    data = (
        delta(role="assistant", content="", reasoning_content="Let me")
        + delta(reasoning_content=" think.")
        + delta(content="4")
        + finish()
        + usage()
        + DONE
    )
    got = events(run(answer(True), data))
    blocks = [(e["index"], e["content_block"]) for e in got if e["type"] == "content_block_start"]
    assert blocks == [(0, {"type": "thinking", "thinking": ""}), (1, {"type": "text", "text": ""})]
    deltas = [(e["index"], e["delta"]) for e in got if e["type"] == "content_block_delta"]
    assert deltas == [
        (0, {"type": "thinking_delta", "thinking": "Let me"}),
        (0, {"type": "thinking_delta", "thinking": " think."}),
        (1, {"type": "text_delta", "text": "4"}),
    ]
    stops = [e["index"] for e in got if e["type"] == "content_block_stop"]
    assert stops == [0, 1]


def test_a_streamed_tool_call_is_a_tool_use_block_of_input_json_deltas() -> None:
    """§17.4: Messages streams the arguments, so the fragments pass as they come."""
    got = events(run(answer(True), tool_fragments()))
    [start] = [e for e in got if e["type"] == "content_block_start"]
    assert start["content_block"] == {
        "type": "tool_use",
        "id": "call_7",
        "name": "get_weather",
        "input": {},
    }
    partial = "".join(e["delta"]["partial_json"] for e in got if e["type"] == "content_block_delta")
    assert json.loads(partial) == {"location": "Paris"}
    assert got[-2]["delta"]["stop_reason"] == "tool_use"
    assert got[-2]["usage"] == {"input_tokens": 12, "output_tokens": 9}


def test_two_tool_calls_are_two_blocks_after_the_text() -> None:
    calls = [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
        {"index": 1, "id": "b", "function": {"name": "g", "arguments": {"x": 1}}},
    ]
    data = delta(content="ok") + delta(tool_calls=calls) + finish("tool_calls") + DONE
    got = events(run(answer(True), data))
    blocks = [e["content_block"]["type"] for e in got if e["type"] == "content_block_start"]
    assert blocks == ["text", "tool_use", "tool_use"]
    partials = [e["delta"]["partial_json"] for e in got if "partial_json" in e.get("delta", {})]
    assert partials == ["{}", '{"x": 1}']


def test_length_is_max_tokens_and_missing_usage_is_zero() -> None:
    data = delta(content="a") + finish("length") + DONE
    got = events(run(answer(True), data))
    assert got[-2]["delta"]["stop_reason"] == "max_tokens"
    assert got[-2]["usage"] == {"input_tokens": 0, "output_tokens": 0}


def test_a_stream_cut_before_done_raises_and_never_sends_message_stop() -> None:
    transducer = answer(True)
    out = transducer.feed(delta(content="a") + delta(content="b"))
    assert b"message_stop" not in out and b"message_delta" not in out
    with pytest.raises(StreamCut):
        transducer.end()


def test_an_error_event_is_an_error_event_and_ends_the_answer() -> None:
    transducer = answer(True)
    out = transducer.feed(delta(content="a") + event({"error": {"message": "boom"}}) + DONE)
    got = events(out + transducer.end())
    assert got[-1] == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert "message_stop" not in [e["type"] for e in got]


def test_a_whole_answer_is_one_message_object() -> None:
    data = (
        delta(role="assistant", content="", reasoning_content="Hmm.")
        + delta(content="Calling.")
        + tool_fragments()
    )
    transducer = answer(False)
    assert transducer.feed(data[: -len(DONE)]) == b"", "nothing before the answer is whole"
    assert transducer.content_type.startswith(b"application/json")
    message = json.loads(transducer.feed(DONE) + transducer.end())
    assert message == {
        "id": "msg_chatcmpl-1",
        "type": "message",
        "role": "assistant",
        "model": "claude-local",
        "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": ""},
            {"type": "text", "text": "Calling."},
            {
                "type": "tool_use",
                "id": "call_7",
                "name": "get_weather",
                "input": {"location": "Paris"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 9},
    }


def test_a_whole_json_answer_although_asked_to_stream_is_translated() -> None:
    document = {
        **BASE,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    transducer = answer(False, content_type=b"application/json")
    message = json.loads(run(transducer, json.dumps(document).encode()))
    assert message["content"] == [{"type": "text", "text": "hi!"}]
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 2}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            {"error": {"message": "bad max_tokens", "type": "invalid_request_error"}},
            ("invalid_request_error", "bad max_tokens"),
        ),
        (404, {"error": "model 'x' not found"}, ("not_found_error", "model 'x' not found")),
        (500, {"detail": "Internal"}, ("api_error", "Internal")),
        (503, "Loading model", ("overloaded_error", "Loading model")),
    ],
)
def test_an_upstream_error_is_in_messages_error_shape(
    status: int, body: Any, expected: tuple[str, str]
) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    out = json.loads(run(answer(True, status, b"application/json"), raw))
    assert out == {"type": "error", "error": {"type": expected[0], "message": expected[1]}}


def test_an_error_already_in_messages_shape_passes_unchanged() -> None:
    raw = b'{"type": "error", "error": {"type": "permission_error", "message": "no"}}'
    assert run(answer(False, 404, b"application/json"), raw) == raw
