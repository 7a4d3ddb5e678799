# -*- test-case-name: tests.bench.test_kvcache -*-
"""How the engine double of ``bench/kvengine.py`` reads a request into tokens, and what it answers
(issue 39).

**Tokens are whitespace-separated words** of the prompt as a chat template lays it out
(:func:`render`): the system prompt, each tool (name, description, parameters as compact JSON),
then each message with a role marker; a tool call is its name and its arguments as compact JSON
(one token), a tool result its words. ``cache_control`` markers and ids are not part of the prompt.
Each route's reader (:func:`read_conversation`) turns its dialect into one :class:`Conversation`:
OpenAI chat completions and Ollama ``/api/chat``, Anthropic Messages, OpenAI Responses input items.
An assistant turn is one message however many items carry it (text, then tool calls), so what
the engine wrote (:func:`reply_tokens`) is, token for token, what it reads back in the next turn.

The answer to every turn (:func:`reply_to`) is an agent's: :data:`ANSWER`, then one ``Read`` call
of a file named after how many messages the conversation has.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from attrs import frozen

from bench.kvdialects import Reply

__all__ = [
    "ANSWER",
    "READERS",
    "Conversation",
    "Part",
    "read_conversation",
    "render",
    "reply_to",
    "reply_tokens",
]


@frozen
class Part:
    """One piece of a message: ``text``, a tool ``call`` (``name``, ``arguments`` as compact
    JSON) or a tool ``result``."""

    kind: str
    text: str
    name: str = ""


@frozen
class Conversation:
    """What a request asks, in the order a template renders it."""

    system: tuple[str, ...]
    tools: tuple[str, ...]
    """Each tool as one line: name, description, parameters (compact JSON)."""
    messages: tuple[tuple[str, tuple[Part, ...]], ...]
    """(role, parts); consecutive assistant items of one turn are one message."""


def render(conversation: Conversation) -> list[str]:
    """The prompt's tokens, ending with the generation prompt ``<|assistant|>``."""
    tokens = ["<|system|>"]
    for text in conversation.system:
        tokens += text.split()
    for tool in conversation.tools:
        tokens += ["<|tool|>", *tool.split()]
    tokens.append("<|end|>")
    for role, parts in conversation.messages:
        tokens.append(f"<|{role}|>")
        for part in parts:
            tokens += _part_tokens(part)
        tokens.append("<|end|>")
    tokens.append("<|assistant|>")
    return tokens


def _part_tokens(part: Part) -> list[str]:
    if part.kind == "call":
        return ["<|call|>", part.name, part.text]
    if part.kind == "result":
        return ["<|result|>", *part.text.split()]
    return part.text.split()


def _compact(value: Any) -> str:
    """Arguments as one token: compact JSON with sorted keys (a JSON string is parsed first)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return "".join(value.split())
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _texts(content: Any, kinds: Iterable[str] = ("text", "input_text", "output_text")) -> str:
    """The text of a content value: a string, or the text blocks of a list."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    wanted = tuple(kinds)
    texts = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") in wanted]
    return " ".join(t for t in texts if isinstance(t, str))


def _tool_line(name: Any, description: Any, parameters: Any) -> str:
    return f"{name} {description or ''} {_compact(parameters or {})}"


def _merge(messages: list[tuple[str, list[Part]]], role: str, parts: list[Part]) -> None:
    """Append a message, folding an assistant item into the assistant message before it."""
    if role == "assistant" and messages and messages[-1][0] == "assistant":
        messages[-1][1].extend(parts)
    else:
        messages.append((role, parts))


def _finish(
    system: list[str], tools: list[str], messages: list[tuple[str, list[Part]]]
) -> Conversation:
    return Conversation(
        tuple(system), tuple(tools), tuple((role, tuple(parts)) for role, parts in messages)
    )


def _read_chat(body: dict[str, Any]) -> Conversation:
    """OpenAI chat completions (and Ollama ``/api/chat``: its arguments are objects)."""
    system: list[str] = []
    tools = [_function_line(t) for t in body.get("tools") or [] if isinstance(t, dict)]
    messages: list[tuple[str, list[Part]]] = []
    for message in body.get("messages") or []:
        role = message.get("role", "user")
        if role in ("system", "developer"):
            system.append(_texts(message.get("content")))
            continue
        parts = [Part("result" if role == "tool" else "text", _texts(message.get("content")))]
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            parts.append(
                Part("call", _compact(function.get("arguments")), function.get("name", ""))
            )
        _merge(messages, role, [p for p in parts if p.text or p.kind == "call"])
    return _finish(system, tools, messages)


def _function_line(tool: dict[str, Any]) -> str:
    function = tool.get("function")
    spec: dict[str, Any] = function if isinstance(function, dict) else tool
    return _tool_line(spec.get("name"), spec.get("description"), spec.get("parameters"))


def _read_messages(body: dict[str, Any]) -> Conversation:
    """Anthropic Messages: ``system`` (a string or text blocks), ``tool_use`` and
    ``tool_result`` blocks; ``cache_control`` markers are not part of the prompt."""
    given = body.get("system")
    system = [given] if isinstance(given, str) else [_texts([b]) for b in given or []]
    tools = [
        _tool_line(t.get("name"), t.get("description"), t.get("input_schema"))
        for t in body.get("tools") or []
        if isinstance(t, dict)
    ]
    messages: list[tuple[str, list[Part]]] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        parts = [_block_part(b) for b in blocks if isinstance(b, dict)]
        _merge(messages, message.get("role", "user"), [p for p in parts if p is not None])
    return _finish(system, tools, messages)


def _block_part(block: dict[str, Any]) -> Part | None:
    kind = block.get("type")
    if kind == "text":
        return Part("text", block.get("text", ""))
    if kind == "tool_use":
        return Part("call", _compact(block.get("input")), block.get("name", ""))
    if kind == "tool_result":
        return Part("result", _texts(block.get("content")))
    return None


def _read_responses(body: dict[str, Any]) -> Conversation:
    """OpenAI Responses without ``previous_response_id``: ``instructions`` and input items."""
    system = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    tools = [_function_line(t) for t in body.get("tools") or [] if isinstance(t, dict)]
    given = body.get("input")
    items = (
        [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    )
    messages: list[tuple[str, list[Part]]] = []
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "function_call":
            _merge(
                messages, "assistant", [Part("call", _compact(item.get("arguments")), item["name"])]
            )
        elif kind == "function_call_output":
            _merge(messages, "tool", [Part("result", _texts(item.get("output")))])
        elif kind == "message" and item.get("role") in ("system", "developer"):
            system.append(_texts(item.get("content")))
        elif kind == "message":
            _merge(messages, item.get("role", "user"), [Part("text", _texts(item.get("content")))])
    return _finish(system, tools, messages)


def reply_tokens(reply: Reply) -> list[str]:
    """What the engine writes for ``reply``, as its template renders it back in the next turn."""
    return [*reply.text, "<|call|>", reply.tool, _compact(reply.arguments)]


ANSWER = (
    "I read the result and will now open the next file of the module to continue with the task "
    "as planned before"
)
"""An agent's text before its tool call (22 tokens)."""


def reply_to(conversation: Conversation, call_id: str) -> Reply:
    """The turn an agent's model answers ``conversation`` with: :data:`ANSWER`, then a ``Read``
    of the file named after how many messages there are."""
    return Reply(
        tuple(ANSWER.split()),
        "Read",
        {"file_path": f"src/part_{len(conversation.messages)}.py"},
        call_id,
    )


READERS: dict[str, Callable[[dict[str, Any]], Conversation]] = {
    "/v1/chat/completions": _read_chat,
    "/api/chat": _read_chat,
    "/v1/messages": _read_messages,
    "/v1/responses": _read_responses,
}
"""Each route's reader."""


def read_conversation(path: str, body: dict[str, Any]) -> Conversation:
    """The conversation a request to ``path`` asks (a route of :data:`READERS`)."""
    return READERS[path](body)
