"""Tests for nvpair_tw.selection._canonical: one conversation, one canonical form, whatever its
dialect (docs/behaviour.md §5.3), and the bound on how much of it is read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvpair_tw.selection._affinity import AffinityKey, affinity_key
from nvpair_tw.selection._canonical import Bound, Canonical, canonical, is_billing_block

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


# --- every shape's branch: what is the same conversation, and what is not --------------------------

WIDE = Bound(text=10**6, steps=10**6, atoms=10**4)


def form(doc: dict[str, Any]) -> Canonical:
    found = canonical(doc, WIDE)
    assert found is not None
    return found


def said(*items: Any, **doc: Any) -> dict[str, Any]:
    return {**doc, "input": list(items)} if "input" in doc else {**doc, "messages": list(items)}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


URL = "https://example.test/cat.png"
DATA = "iVBORw0KGgo="
CALL_JSON = '{"path": "a.py"}'

SAME: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "a Responses custom tool call and a function call",
        said({"type": "custom_tool_call", "name": "t", "input": CALL_JSON}, input=[]),
        said({"type": "function_call", "name": "t", "arguments": CALL_JSON}, input=[]),
    ),
    (
        "a custom tool call's output and a function call's",
        said({"type": "custom_tool_call_output", "output": "ok"}, input=[]),
        said({"type": "function_call_output", "output": "ok"}, input=[]),
    ),
    (
        "an Anthropic tool_use and a chat tool call (its arguments read as JSON)",
        said(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "name": "t", "input": {"path": "a.py"}}],
            }
        ),
        said(
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "t", "arguments": CALL_JSON}}],
            }
        ),
    ),
    (
        "a legacy function_call and a tool call",
        said({"role": "assistant", "function_call": {"name": "t", "arguments": CALL_JSON}}),
        said(
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "t", "arguments": CALL_JSON}}],
            }
        ),
    ),
    (
        "a tool result by role tool, function or ipython, and an Anthropic tool_result",
        said({"role": "function", "content": "ok"}, {"role": "ipython", "content": "ok"}),
        said(
            {"role": "tool", "content": "ok"},
            user([{"type": "tool_result", "content": [{"type": "text", "text": "ok"}]}]),
        ),
    ),
    (
        "a developer message and a system message, leading or later",
        said(
            {"role": "developer", "content": "be brief"},
            user("hi"),
            {"role": "developer", "content": "x"},
        ),
        said(
            {"role": "system", "content": "be brief"},
            user("hi"),
            {"role": "system", "content": "x"},
        ),
    ),
    (
        "an image by URL: Anthropic's url source, chat's image_url object, Responses' input_image",
        said(user([{"type": "image", "source": {"type": "url", "url": URL}}])),
        said(user([{"type": "image_url", "image_url": {"url": URL}}])),
    ),
    (
        "an image by URL as an input_image string",
        said(user([{"type": "input_image", "image_url": URL}])),
        said(user([{"type": "image_url", "image_url": {"url": URL}}])),
    ),
    (
        "an image by file id",
        said(user([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}])),
        said(user([{"type": "input_image", "file_id": "file_1"}])),
    ),
    (
        "an image as a data URL in data_url, and an Ollama image",
        said(user([{"type": "image", "data_url": f"data:image/png;base64,{DATA}"}])),
        said({"role": "user", "images": [DATA]}),
    ),
    (
        "a refusal and the same words as text",
        said({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}),
        said({"role": "assistant", "content": [{"type": "output_text", "text": "no"}]}),
    ),
    (
        "LM Studio's role-less text, image and message items, and user messages",
        said(
            {"type": "text", "text": "hi"},
            {"type": "message", "content": "there"},
            {"type": "image", "data_url": f"data:image/png;base64,{DATA}"},
            input=[],
        ),
        said(user("hi"), user("there"), {"role": "user", "images": [DATA]}),
    ),
    (
        "reasoning items and thinking parts, which are not the conversation",
        said(user("hi"), {"type": "reasoning", "summary": []}, input=[]),
        said(user([{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "hi"}])),
    ),
    (
        "an LM Studio message part inside a message",
        said(user([{"type": "message", "content": [{"type": "text", "text": "hi"}]}])),
        said(user("hi")),
    ),
    (
        "legacy functions, chat tools, Messages tools and Responses tools",
        said(user("hi"), functions=[{"name": "t", "description": "d", "parameters": {"a": 1}}]),
        said(user("hi"), tools=[{"name": "t", "description": "d", "input_schema": {"a": 1}}]),
    ),
    (
        "a tool's volatile members",
        said(user("hi"), tools=[{"type": "web_search", "cache_control": {"type": "ephemeral"}}]),
        said(user("hi"), tools=[{"type": "web_search"}]),
    ),
    (
        "a system prompt given as system, instructions or system_prompt",
        said(user("hi"), system="be brief"),
        said(user("hi"), system_prompt="be brief"),
    ),
]


BASE = said(
    user("hi"), {"role": "assistant", "content": "hello"}, system="s", tools=[{"name": "t"}]
)

DIFFERENT: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "a call's name",
        said({"type": "function_call", "name": "a", "arguments": "{}"}, input=[]),
        said({"type": "function_call", "name": "b", "arguments": "{}"}, input=[]),
    ),
    (
        "a call's arguments",
        said({"type": "function_call", "name": "a", "arguments": "{}"}, input=[]),
        said({"type": "function_call", "name": "a", "arguments": '{"x": 1}'}, input=[]),
    ),
    (
        "a custom call's input",
        said({"type": "custom_tool_call", "name": "a", "input": "x"}, input=[]),
        said({"type": "custom_tool_call", "name": "a", "input": "y"}, input=[]),
    ),
    (
        "a result's output",
        said({"type": "function_call_output", "output": "x"}, input=[]),
        said({"type": "function_call_output", "output": "y"}, input=[]),
    ),
    (
        "a tool message's content",
        said({"role": "tool", "content": "x"}),
        said({"role": "tool", "content": "y"}),
    ),
    (
        "an Anthropic result's content",
        said(user([{"type": "tool_result", "content": "x"}])),
        said(user([{"type": "tool_result", "content": "y"}])),
    ),
    (
        "a tool_use's name",
        said({"role": "assistant", "content": [{"type": "tool_use", "name": "a", "input": {}}]}),
        said({"role": "assistant", "content": [{"type": "tool_use", "name": "b", "input": {}}]}),
    ),
    (
        "a tool_use's input",
        said({"role": "assistant", "content": [{"type": "tool_use", "name": "a", "input": {}}]}),
        said(
            {"role": "assistant", "content": [{"type": "tool_use", "name": "a", "input": {"x": 1}}]}
        ),
    ),
    (
        "a chat call's arguments",
        said({"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]}),
        said({"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "[]"}}]}),
    ),
    (
        "a chat call's name",
        said({"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]}),
        said({"role": "assistant", "tool_calls": [{"function": {"name": "b", "arguments": "{}"}}]}),
    ),
    (
        "a legacy call's arguments",
        said({"role": "assistant", "function_call": {"name": "a", "arguments": "{}"}}),
        said({"role": "assistant", "function_call": {"name": "a", "arguments": "[]"}}),
    ),
    (
        "a legacy call's name",
        said({"role": "assistant", "function_call": {"name": "a", "arguments": "{}"}}),
        said({"role": "assistant", "function_call": {"name": "b", "arguments": "{}"}}),
    ),
    (
        "the same words said by another role",
        said(user("x")),
        said({"role": "assistant", "content": "x"}),
    ),
    ("a result and a user's words", said({"role": "tool", "content": "x"}), said(user("x"))),
    (
        "an image and the same string as text",
        said(user([{"type": "input_image", "image_url": URL}])),
        said(user(URL)),
    ),
    (
        "an image's URL",
        said(user([{"type": "input_image", "image_url": URL}])),
        said(user([{"type": "input_image", "image_url": URL + "?2"}])),
    ),
    (
        "an Anthropic image's data",
        said(user([{"type": "image", "source": {"data": "AAAA"}}])),
        said(user([{"type": "image", "source": {"data": "BBBB"}}])),
    ),
    (
        "an Anthropic image's url",
        said(user([{"type": "image", "source": {"url": "u1"}}])),
        said(user([{"type": "image", "source": {"url": "u2"}}])),
    ),
    (
        "an Ollama image",
        said({"role": "user", "content": "x", "images": ["AAAA"]}),
        said({"role": "user", "content": "x", "images": ["BBBB"]}),
    ),
    (
        "an image and none",
        said({"role": "user", "content": "x", "images": ["AAAA"]}),
        said(user("x")),
    ),
    (
        "a data URL's payload",
        said(user([{"type": "image_url", "image_url": {"url": "data:a,AAAA"}}])),
        said(user([{"type": "image_url", "image_url": {"url": "data:a,BBBB"}}])),
    ),
    (
        "an unknown part",
        said(user([{"type": "audio", "data": "AAAA"}])),
        said(user([{"type": "audio", "data": "BBBB"}])),
    ),
    (
        "an unknown role-less item",
        said({"type": "mystery", "v": 1}, input=[]),
        said({"type": "mystery", "v": 2}, input=[]),
    ),
    (
        "a role that is not a string",
        said({"role": 1, "content": "x"}),
        said({"role": 2, "content": "x"}),
    ),
    (
        "a refusal's words",
        said({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}),
        said({"role": "assistant", "content": [{"type": "refusal", "refusal": "never"}]}),
    ),
    (
        "a text part's text that is not a string",
        said(user([{"type": "text", "text": 1}])),
        said(user([{"type": "text", "text": 2}])),
    ),
    ("a part that is not an object", said(user([1])), said(user([2]))),
    ("content that is neither text nor a list", said(user(1)), said(user(2))),
    (
        "a tool's description",
        said(user("x"), tools=[{"name": "t", "description": "a"}]),
        said(user("x"), tools=[{"name": "t", "description": "b"}]),
    ),
    (
        "a tool's parameters",
        said(user("x"), tools=[{"type": "function", "function": {"name": "t", "parameters": {}}}]),
        said(
            user("x"),
            tools=[{"type": "function", "function": {"name": "t", "parameters": {"a": 1}}}],
        ),
    ),
    (
        "a Messages tool's schema",
        said(user("x"), tools=[{"name": "t", "input_schema": {}}]),
        said(user("x"), tools=[{"name": "t", "input_schema": {"a": 1}}]),
    ),
    (
        "another kind of tool",
        said(user("x"), tools=[{"type": "web_search", "name": "t"}]),
        said(user("x"), tools=[{"type": "function", "name": "t"}]),
    ),
    ("a tool that is not an object", said(user("x"), tools=["a"]), said(user("x"), tools=["b"])),
    ("tools that are not a list", said(user("x"), tools={"a": 1}), said(user("x"), tools={"a": 2})),
    (
        "integrations",
        said(user("x"), integrations=[{"name": "a"}]),
        said(user("x"), integrations=[{"name": "b"}]),
    ),
    ("a system prompt", said(user("x"), system="a"), said(user("x"), instructions="b")),
    (
        "a number",
        said(user([{"type": "audio", "v": 1}])),
        said(user([{"type": "audio", "v": 1.5}])),
    ),
    (
        "true and false",
        said(user([{"type": "audio", "v": True}])),
        said(user([{"type": "audio", "v": False}])),
    ),
    (
        "null and false",
        said(user([{"type": "audio", "v": None}])),
        said(user([{"type": "audio", "v": False}])),
    ),
    (
        "a list's length",
        said(user([{"type": "audio", "v": [1]}])),
        said(user([{"type": "audio", "v": [1, 1]}])),
    ),
]


def test_the_form_is_pinned_byte_for_byte() -> None:
    """Every proxy of a fleet digests the same conversation to the same bytes: a change of the
    canonical form is a change of every key the fleet shares, made on purpose or not at all."""
    found = form(
        said(
            user([{"type": "text", "text": "hé"}, {"type": "input_image", "image_url": "u"}]),
            {"type": "function_call", "name": "t", "arguments": '{"a": [1, 2.5, true, null]}'},
            {"type": "function_call_output", "output": "ok"},
            input=[],
            instructions="s",
            tools=[{"type": "function", "name": "t", "parameters": {}}],
        )
    )
    assert found.preamble == b"l3:s1:sl1:s1:sl1:l4:s1:fs1:tnd0:"
    assert found.atoms == [
        b"l3:s1:ts4:userl1:s3:h\xc3\xa9",
        b"l3:s1:ps4:userl2:s1:is1:u",
        b"l3:s1:cs1:td1:s1:al4:i1;f2.5;tn",
        b"l2:s1:rl1:s2:ok",
    ]


# --- the second mutation run's survivors that were not equivalent ---------------------------------

PARTS = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]

SAME_TOO: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "results whose content is a list of parts",
        said(
            {"role": "tool", "content": PARTS},
            {"type": "function_call_output", "output": PARTS},
            input=[],
        ),
        said(
            {"role": "tool", "content": ["a", "b"]},
            {"type": "function_call_output", "output": ["a", "b"]},
            input=[],
        ),
    ),
    (
        "leading system messages whose content is a list, and the system field",
        said(
            {"role": "system", "content": PARTS}, {"role": "developer", "content": "c"}, user("hi")
        ),
        said(user("hi"), system=[*PARTS, {"type": "text", "text": "c"}]),
    ),
    (
        "a billing block in a leading system message or as the system string",
        said(
            {"role": "system", "content": [{"type": "text", "text": BILLING}, PARTS[0]]}, user("hi")
        ),
        said(user("hi"), system="a"),
    ),
    (
        "a billing block as the whole system string",
        said(user("hi"), system=BILLING),
        said(user("hi")),
    ),
    (
        "LM Studio's role-less message item with a list of parts",
        said({"type": "message", "content": PARTS}, input=[]),
        said(user(["a", "b"])),
    ),
    (
        "a tool call that is not an object",
        said({"role": "assistant", "content": "x", "tool_calls": ["nonsense"]}),
        said({"role": "assistant", "content": "x"}),
    ),
]


SAME_TOO += [
    ("a part with text and no type, and the text", said(user([{"text": "x"}])), said(user("x"))),
    (
        "an LM Studio message block inside a result's list",
        said({"role": "tool", "content": [{"type": "message", "content": ["a"]}]}),
        said({"role": "tool", "content": "a"}),
    ),
]


@pytest.mark.parametrize(
    ("what", "one", "other"), SAME + SAME_TOO, ids=[s[0] for s in SAME + SAME_TOO]
)
def test_the_same_conversation_has_one_form_in_every_shape(
    what: str, one: dict[str, Any], other: dict[str, Any]
) -> None:
    assert form(one) == form(other), what


DIFFERENT_TOO: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "both leading system messages",
        said({"role": "system", "content": "a"}, {"role": "system", "content": "b"}, user("x")),
        said({"role": "system", "content": "b"}, user("x")),
    ),
    ("both system blocks", said(user("x"), system=PARTS), said(user("x"), system=PARTS[1:])),
    ("a user's words that look like a billing block", said(user(BILLING)), said(user(""))),
    (
        "a typed part with a text member that is not a text part",
        said(user([{"type": "audio", "text": "x"}])),
        said(user("x")),
    ),
    ("a part without a type or text", said(user([{"v": 1}])), said(user([{"v": 2}]))),
]


@pytest.mark.parametrize(
    ("what", "one", "other"),
    DIFFERENT + DIFFERENT_TOO,
    ids=[d[0] for d in DIFFERENT + DIFFERENT_TOO],
)
def test_a_conversation_that_differs_has_another_form(
    what: str, one: dict[str, Any], other: dict[str, Any]
) -> None:
    assert form(one) != form(other), what


def test_two_leading_system_messages_are_the_system_prompt_and_not_messages() -> None:
    found = form(
        said({"role": "system", "content": "a"}, {"role": "system", "content": "b"}, user("x"))
    )
    assert len(found.atoms) == 1


def test_text_around_an_image_is_two_runs() -> None:
    found = form(said(user(["a", {"type": "input_image", "image_url": "u"}, "b"])))
    assert found.atoms == [
        b"l3:s1:ts4:userl1:s1:a",
        b"l3:s1:ps4:userl2:s1:is1:u",
        b"l3:s1:ts4:userl1:s1:b",
    ]


def test_a_later_system_message_is_pinned_as_the_system_role() -> None:
    found = form(said(user("x"), {"role": "developer", "content": "y"}))
    assert found.atoms[1] == b"l3:s1:ts6:systeml1:s1:y"


def test_an_input_that_is_neither_text_nor_a_list_holds_no_conversation() -> None:
    assert canonical({"input": {"role": "user"}}, WIDE) is None


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (said("hi"), "a message that is not an object"),
        (said(user([{"type": "audio", "v": object()}])), "not a JSON value"),
    ],
)
def test_a_shape_no_dialect_has_is_a_type_error_that_says_what(
    doc: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=f"^{message}$"):
        canonical(doc, WIDE)
