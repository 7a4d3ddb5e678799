"""Tests for nvpair_tw.selection._canonical: one conversation, one canonical form, whatever its
dialect (docs/behaviour.md §5.3), and the bound on how much of it is read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvpair_tw.selection._affinity import AffinityKey, affinity_key
from nvpair_tw.selection._canonical import Bound, canonical, is_billing_block

pytestmark = pytest.mark.timeout(10)

SYSTEM = "You are a careful coding agent."
TOOL = {"name": "read", "description": "Read a file.", "schema": {"type": "object"}}
ARGS = {"path": "src/app.py", "limit": 20}
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch=3f2a1;"

# One conversation: a question, a tool call with its result, the answer, the next question.
TURNS: list[tuple[str, Any]] = [
    ("user", "What does app.py do?"),
    ("call", ARGS),
    ("result", "def main(): ..."),
    ("assistant", "It starts the server."),
    ("user", "And the tests?"),
]


def chat_completions(turns: list[tuple[str, Any]] = TURNS) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for n, (kind, value) in enumerate(turns):
        if kind == "call":
            call = {"name": TOOL["name"], "arguments": json.dumps(value)}
            call_id = f"call_{n}"
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": call_id, "type": "function", "function": call}],
                }
            )
        elif kind == "result":
            messages.append({"role": "tool", "tool_call_id": f"call_{n - 1}", "content": value})
        else:
            messages.append({"role": kind, "content": value})
    tool = {"name": TOOL["name"], "description": TOOL["description"], "parameters": TOOL["schema"]}
    return {"model": "m", "tools": [{"type": "function", "function": tool}], "messages": messages}


def ollama_chat(turns: list[tuple[str, Any]] = TURNS) -> dict[str, Any]:
    body = chat_completions(turns)
    for message in body["messages"]:
        for call in message.get("tool_calls") or ():
            call.pop("id"), call.pop("type")
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        message.pop("tool_call_id", None)
    return body


def anthropic(
    turns: list[tuple[str, Any]] = TURNS, *, billing: str | None = None
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for n, (kind, value) in enumerate(turns):
        if kind == "call":
            block = {"type": "tool_use", "id": f"toolu_{n}", "name": TOOL["name"], "input": value}
            messages.append({"role": "assistant", "content": [block]})
        elif kind == "result":
            block = {"type": "tool_result", "tool_use_id": f"toolu_{n - 1}", "content": value}
            messages.append({"role": "user", "content": [block]})
        else:
            content = [{"type": "text", "text": value, "cache_control": {"type": "ephemeral"}}]
            messages.append({"role": kind, "content": content})
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    if billing is not None:
        system.insert(0, {"type": "text", "text": billing})
    tool = {
        "name": TOOL["name"],
        "description": TOOL["description"],
        "input_schema": TOOL["schema"],
    }
    return {
        "model": "m",
        "max_tokens": 512,
        "system": system,
        "tools": [tool],
        "messages": messages,
    }


def responses(turns: list[tuple[str, Any]] = TURNS) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for n, (kind, value) in enumerate(turns):
        if kind == "call":
            items.append(
                {
                    "type": "function_call",
                    "call_id": f"call_{n}",
                    "name": TOOL["name"],
                    "arguments": json.dumps(value, indent=2),
                }
            )
        elif kind == "result":
            items.append(
                {"type": "function_call_output", "call_id": f"call_{n - 1}", "output": value}
            )
        elif kind == "assistant":
            content = [{"type": "output_text", "text": value, "annotations": []}]
            items.append({"type": "message", "role": "assistant", "content": content})
        else:
            items.append({"role": "user", "content": [{"type": "input_text", "text": value}]})
    tool = {
        "type": "function",
        "name": TOOL["name"],
        "description": TOOL["description"],
        "parameters": TOOL["schema"],
        "strict": False,
    }
    return {"model": "m", "instructions": SYSTEM, "tools": [tool], "input": items}


def key(body: dict[str, Any], path: str = "/v1/chat/completions") -> AffinityKey:
    found = affinity_key(path, "m", body)
    assert found is not None
    return found


def test_one_conversation_has_one_chain_in_every_dialect() -> None:
    """Chat completions, Ollama's chat, Anthropic Messages and Responses input items give the same
    digests at every boundary."""
    expected = key(chat_completions())
    assert key(ollama_chat(), "/api/chat") == expected
    assert key(anthropic(), "/v1/messages") == expected
    assert key(responses(), "/v1/responses") == expected
    assert len(expected.lookups) == len(TURNS)


def test_each_turn_finds_the_turn_before_in_another_dialect() -> None:
    """Turn N's lookups hold turn N-1's key whichever dialect each turn came in."""
    earlier = key(anthropic(TURNS[:3]), "/v1/messages")
    assert earlier.key in key(responses(), "/v1/responses").lookups[1:]


def test_the_billing_block_and_cache_markers_are_not_the_conversation() -> None:
    """Claude Code's billing block changes on every request, its cache_control markers move: the
    chain is the one without them."""
    plain = key(anthropic(), "/v1/messages")
    assert key(anthropic(billing=BILLING), "/v1/messages") == plain
    other = BILLING.replace("3f2a1", "9c0d4")
    assert key(anthropic(billing=other), "/v1/messages") == plain
    moved = anthropic()
    for message in moved["messages"]:
        for block in message["content"]:
            block.pop("cache_control", None)
    moved["messages"][-1]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert key(moved, "/v1/messages") == plain


def test_reasoning_and_ids_are_not_the_conversation() -> None:
    with_thinking = anthropic()
    with_thinking["messages"][1]["content"].insert(
        0, {"type": "thinking", "thinking": "Let me look.", "signature": "sig"}
    )
    assert key(with_thinking, "/v1/messages") == key(anthropic(), "/v1/messages")
    renamed = chat_completions()
    renamed["messages"][2]["tool_calls"][0]["id"] = "call_other"
    assert key(renamed) == key(chat_completions())


def test_a_string_and_a_text_part_are_one_text() -> None:
    one = {"messages": [{"role": "user", "content": "hi"}]}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert key(one) == key(parts)
    assert key({"input": "hi"}, "/v1/responses") == key(one)


def test_an_image_is_the_same_as_a_data_url_a_base64_source_or_an_ollama_image() -> None:
    data = "iVBORw0KGgo="
    chat = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is it?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                ],
            }
        ]
    }
    messages = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is it?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": data},
                    },
                ],
            }
        ]
    }
    ollama = {"messages": [{"role": "user", "content": "what is it?", "images": [data]}]}
    assert key(chat) == key(messages, "/v1/messages") == key(ollama, "/api/chat")


def test_what_changes_the_prompt_changes_the_chain() -> None:
    base = key(chat_completions())
    edited = chat_completions()
    edited["messages"][0]["content"] = SYSTEM + " Be brief."
    assert key(edited).lookups[-1] != base.lookups[-1]
    other_tool = chat_completions()
    other_tool["tools"][0]["function"]["name"] = "write"
    assert key(other_tool).key != base.key
    other_args = chat_completions()
    other_args["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"path": "b.py"}'
    assert key(other_args).lookups[-1] == base.lookups[-1]  # the question before it is shared
    assert key(other_args).key != base.key


def test_a_system_message_later_in_the_conversation_is_a_message() -> None:
    """Only the leading system messages are the system prompt."""
    late = {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}
    early = {"messages": [{"role": "system", "content": "b"}, {"role": "user", "content": "a"}]}
    assert len(key(late).lookups) == 2 and len(key(early).lookups) == 1


def test_lm_studio_chat_is_its_system_prompt_and_its_input() -> None:
    """``/api/v1/chat``: ``system_prompt`` and ``input`` are the system and the one message."""
    native = {"model": "m", "system_prompt": SYSTEM, "input": "What does app.py do?"}
    chat = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What does app.py do?"},
        ]
    }
    assert key(native, "/api/v1/chat") == key(chat)


@pytest.mark.parametrize(
    "block",
    [BILLING, {"type": "text", "text": BILLING}, {"type": "text", "text": " " + BILLING}],
)
def test_a_billing_block_is_one_that_starts_with_the_header(block: Any) -> None:
    assert is_billing_block(block) is (block != {"type": "text", "text": " " + BILLING})


def test_a_long_conversation_is_known_by_its_beginning() -> None:
    """Past the bound the atoms stop at the same place in every turn: the next turn, longer
    still, finds the one before by that beginning."""
    bound = Bound(text=1000, steps=10_000, atoms=100)
    said = [{"role": "user", "content": f"message {i:03} " + "x" * 90} for i in range(30)]
    turn = canonical({"messages": said}, bound)
    later = canonical({"messages": [*said, {"role": "user", "content": "more"}]}, bound)
    assert turn is not None and later is not None
    assert len(turn.atoms) == 9  # nine of 102 bytes, and the preamble, fit in 1,000
    assert turn == later


@pytest.mark.parametrize(
    "doc",
    [
        {"messages": [{"role": "user", "content": "x" * 2000}]},  # one string past the bound
        {"system": "x" * 2000, "messages": [{"role": "user", "content": "hi"}]},  # the preamble
        {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 50_000}]},
        {"tools": [{"name": "t"}] * 50_000, "messages": [{"role": "user", "content": "hi"}]},
    ],
)
def test_a_walk_past_the_bound_stops_and_gives_nothing(doc: dict[str, Any]) -> None:
    """A first message, a preamble or a list past the bound: no chain (and no walk of the rest)."""
    assert canonical(doc, Bound(text=1000, steps=1000, atoms=100)) is None


def test_the_atom_bound_stops_the_chain() -> None:
    said = [{"role": "user", "content": str(i)} for i in range(50)]
    found = canonical({"messages": said}, Bound(text=10**6, steps=10**6, atoms=20))
    assert found is not None and len(found.atoms) == 20
