"""Tool calls as coding agents' engines stream them, through every translation of an
OpenAI-compatible answer (docs/behaviour.md §6.5 "Tool calls without an index", §17.4): one rule,
``core.CallOrder``, places every fragment (by its ``index``; without one, an id starts a call), so
the same two calls come out of every shape in every dialect:

- to a Messages client, streamed (``tool_use`` blocks of ``input_json_delta`` events) and whole;
- to an Ollama client, streamed (the calls whole at the finish) and whole;
- to an OpenAI client whose stream the proxy assembles into one answer (§6.5).

Before the rule reached the Messages stream, two index-less calls came out of it as one
``tool_use`` block with the second call's id and name lost and the input ``{"a":1}{}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from nvpair_tw.assembly import Dialect
from nvpair_tw.assembly._lines import Assembler
from nvpair_tw.dialects import StreamCut, translate
from tests.dialects.streams import DONE, delta, finish, usage

pytestmark = pytest.mark.timeout(60)

Call = tuple[str, str, Any]
"""A call as every dialect must give it back: its id, its function's name, its arguments."""

CALLS: list[Call] = [("call_a", "f", {"a": 1}), ("call_b", "g", {})]


def piece(
    ident: str | None = None, name: str | None = None, arguments: str = "", index: int | None = None
) -> dict[str, Any]:
    """One fragment of ``delta.tool_calls``: a call's first one names its id and function."""
    function: dict[str, Any] = {"arguments": arguments}
    out: dict[str, Any] = {}
    if index is not None:
        out["index"] = index
    if ident is not None:
        out |= {"id": ident, "type": "function"}
        function = {"name": name, **function}
    return {**out, "function": function}


def calls(*fragments: dict[str, Any]) -> bytes:
    return delta(tool_calls=list(fragments))


def end() -> bytes:
    return finish("tool_calls") + usage(12, 9) + DONE


SHAPES: dict[str, bytes] = {
    # vLLM, llama.cpp, OpenAI: every fragment has its index; parallel calls one after the other.
    "parallel calls by index, thinking and text first": (
        delta(role="assistant", reasoning_content="Two lookups.")
        + delta(content="Calling both.")
        + calls(piece("call_a", "f", "", 0))
        + calls(piece(arguments='{"a":', index=0))
        + calls(piece(arguments="1}", index=0))
        + calls(piece("call_b", "g", "", 1))
        + calls(piece(arguments="{}", index=1))
        + end()
    ),
    # Ollama's /v1 and Mistral's: whole calls, several in one chunk.
    "whole parallel calls in one chunk by index": (
        calls(piece("call_a", "f", '{"a":1}', 0), piece("call_b", "g", "{}", 1)) + end()
    ),
    # Engines that leave index out: one fragment per chunk, each at list position 0.
    "calls without an index, one fragment per chunk": (
        calls(piece("call_a", "f", ""))
        + calls(piece(arguments='{"a":'))
        + calls(piece(arguments="1}"))
        + calls(piece("call_b", "g", ""))
        + calls(piece(arguments="{}"))
        + end()
    ),
    "calls without an index, text and thinking between them": (
        delta(role="assistant", reasoning_content="First f.")
        + calls(piece("call_a", "f", '{"a":'))
        + calls(piece(arguments="1}"))
        + delta(content="Then g.")
        + delta(reasoning_content="Now g.")
        + calls(piece("call_b", "g", "{}"))
        + end()
    ),
    "whole calls without an index in one chunk": (
        calls(piece("call_a", "f", '{"a":1}'), piece("call_b", "g", "{}")) + end()
    ),
    "fragments of two calls interleaved by index": (
        calls(piece("call_a", "f", '{"a":', 0))
        + calls(piece("call_b", "g", "{", 1))
        + calls(piece(arguments="1}", index=0))
        + calls(piece(arguments="}", index=1))
        + end()
    ),
}


def messages_events(data: bytes) -> list[dict[str, Any]]:
    t = translate(
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        },
        local_model="m",
        client_model="m",
    )
    tr = t.answer(200, b"text/event-stream", lambda: 0.0)
    out = tr.feed(data) + tr.end()
    return [json.loads(frame.split(b"\n")[1][6:]) for frame in out.split(b"\n\n") if frame]


def messages_stream(data: bytes) -> list[Call]:
    """The ``tool_use`` blocks of the event stream, each input its ``partial_json`` joined."""
    opened: dict[int, list[Any]] = {}
    for event in messages_events(data):
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            block = event["content_block"]
            opened[event["index"]] = [block["id"], block["name"], ""]
        elif (
            event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta"
        ):
            opened[event["index"]][2] += event["delta"]["partial_json"]
    return [(i, n, json.loads(j)) for i, n, j in opened.values()]


def messages_whole(data: bytes) -> list[Call]:
    t = translate(
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]},
        local_model="m",
        client_model="m",
    )
    tr = t.answer(200, b"text/event-stream", lambda: 0.0)
    message = json.loads(tr.feed(data) + tr.end())
    blocks = [b for b in message["content"] if b["type"] == "tool_use"]
    return [(b["id"], b["name"], b["input"]) for b in blocks]


def ollama(stream: bool) -> Callable[[bytes], list[Call]]:
    def answer(data: bytes) -> list[Call]:
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
        t = translate("/api/chat", body, local_model="m", client_model="m")
        tr = t.answer(200, b"text/event-stream", lambda: 0.0)
        out = tr.feed(data) + tr.end()
        found: list[dict[str, Any]] = []
        for line in out.splitlines():
            found += json.loads(line)["message"].get("tool_calls") or []
        return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in found]

    return answer


def openai_assembled(data: bytes) -> list[Call]:
    assembler = Assembler(Dialect.OPENAI_CHAT, 1 << 20)
    assembler.feed(data)
    whole = json.loads(assembler.finish().body)
    found = whole["choices"][0]["message"]["tool_calls"]
    return [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found]


DIRECTIONS: dict[str, Callable[[bytes], list[Call]]] = {
    "messages stream": messages_stream,
    "messages whole": messages_whole,
    "ollama stream": ollama(stream=True),
    "ollama whole": ollama(stream=False),
    "openai assembled": openai_assembled,
}


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_gives_the_same_two_calls_in_every_dialect(shape: str, direction: str) -> None:
    assert DIRECTIONS[direction](SHAPES[shape]) == CALLS


def test_a_messages_stream_keeps_the_order_of_thinking_text_and_calls() -> None:
    """Each run of one kind is one block, opened after the one before it stops."""
    got = messages_events(SHAPES["calls without an index, text and thinking between them"])
    kinds = [e["content_block"]["type"] for e in got if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "tool_use", "text", "thinking", "tool_use"]
    open_block = None
    for event in got:
        if event["type"] == "content_block_start":
            assert open_block is None
            open_block = event["index"]
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_block
        elif event["type"] == "content_block_stop":
            assert event["index"] == open_block
            open_block = None
    assert open_block is None


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_tool_call_that_is_not_an_object_is_a_malformed_answer_in_every_dialect(
    direction: str,
) -> None:
    with pytest.raises(StreamCut, match=r"^a tool call is not an object$"):
        DIRECTIONS[direction](delta(tool_calls=["call_a"]) + end())
