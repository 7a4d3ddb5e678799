# -*- test-case-name: tests.bench.test_agents -*-
"""Coding-agent sessions and the requests each agent makes of them, for ``bench/agents.py``
(issue 39).

A :class:`Session` is one conversation, kept independent of any API: a task, then per turn the
model's reply (a text and a tool call) and the tool's result. Every turn an agent resends the
whole conversation so far plus about 1,000 new tokens (the tool result) on a 2,000-token system
prompt shared by every session of that agent (tokens are words). A :class:`Client` renders a
session the way one agent sends it:

- **chat completions** as OpenCode, Continue and aider send it: ``messages`` with the system
  prompt, ``tool_calls`` and ``tool`` messages, ``tools``, ``stream_options.include_usage``;
- **Messages** as Claude Code (2.1.35 and before) sends it: system blocks with
  ``cache_control``, the marker also on the last block of the last message (so it moves every
  turn), ``tool_use`` and ``tool_result`` blocks, ``metadata.user_id``
  ``user_<hash>_account__session_<uuid>``;
- **Messages as Claude Code 2.1.37 sends it**: the same with a first system block
  ``x-anthropic-billing-header: cc_version=2.1.37.<3 hex>; cc_entrypoint=cli; cch=<5 hex>;``
  whose ``cch`` changes on every request, ``metadata.user_id`` a JSON string with
  ``session_id``, and ``X-Claude-Code-Session-Id``;
- **Responses** as Codex sends it: ``instructions``, input items (``message``, ``function_call``,
  ``function_call_output``), no ``previous_response_id``, ``store: false``,
  ``prompt_cache_key`` and the ``session_id`` header both the session's id;
- **Ollama** ``/api/chat``: ``messages`` with ``tool_calls`` (arguments as objects) and ``tool``
  messages.

:func:`read_reply` reads each route's stream back into the reply the next turn carries.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from typing import Any

from attrs import define, field, frozen

__all__ = ["CLIENTS", "Client", "Reply", "Session", "read_reply", "words"]

MODEL = "qwen3-coder:30b"
SYSTEM_WORDS = 2000
TURN_WORDS = 1000
TOOLS = (
    ("Read", "Reads a file from the local filesystem.", {"file_path": "string"}),
    ("Bash", "Runs a shell command and returns its output.", {"command": "string"}),
    ("Edit", "Replaces a string in a file.", {"file_path": "string", "old": "string"}),
)
"""The tools every agent declares: name, description, parameters (all strings)."""


def words(rng: random.Random, count: int) -> str:
    """``count`` pseudo-words (``w`` and five hex digits), one a token."""
    return " ".join(f"w{rng.getrandbits(20):05x}" for _ in range(count))


@frozen
class Reply:
    """What the model answered in one turn: a text, then one tool call."""

    text: str
    call_id: str
    tool: str
    arguments: dict[str, Any]


@frozen
class Result:
    """What the tool call answered."""

    call_id: str
    text: str


@define
class Session:
    """One conversation: a task, then (reply, result) pairs. What it says is drawn from its seed
    alone, so every contender of a run is sent the same words.

    :ivar index: the session's number in its run (the oracle pins it by this).
    :ivar id: the session's UUID (its ``session_id``, ``prompt_cache_key``, ...).
    :ivar system: the agent's system prompt (shared by its sessions).
    """

    index: int
    seed: str
    id: str
    system: str
    task: str
    steps: list[tuple[Reply, Result]] = field(factory=list)
    requests: int = 0

    @classmethod
    def new(cls, index: int, system: str, seed: int) -> Session:
        mine = f"{seed}/{index}"
        rng = random.Random(mine)
        ident = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return cls(index, mine, ident, system, words(rng, TURN_WORDS))

    def answered(self, reply: Reply) -> None:
        """The model answered the last request with ``reply``: the tool runs and its result of
        :data:`TURN_WORDS` tokens joins the conversation."""
        rng = random.Random(f"{self.seed}/result/{len(self.steps)}")
        self.steps.append((reply, Result(reply.call_id, words(rng, TURN_WORDS))))

    def nonce(self, digits: int) -> str:
        """``digits`` hex digits new for each request (Claude Code's ``cch``)."""
        self.requests += 1
        rng = random.Random(f"{self.seed}/nonce/{self.requests}")
        return f"{rng.getrandbits(4 * digits):0{digits}x}"


Build = Callable[[Session], tuple[dict[str, Any], dict[str, str]]]
"""A client's request for a session's next turn: (body, headers)."""


@frozen
class Client:
    """One agent's way of sending a session.

    :ivar name: the row's name in the report.
    :ivar path: the route it sends to.
    :ivar kind: the node kind that serves the route natively (``openai``: llama-server).
    :ivar build: its request for a session's next turn.
    :ivar clean: the request a proxy that knew better would forward for it (the oracle sends
        this); None: ``build``'s.
    """

    name: str
    path: str
    kind: str
    build: Build
    clean: Build | None = None


def _tools_chat() -> list[dict[str, Any]]:
    return [{"type": "function", "function": _function(*tool)} for tool in TOOLS]


def _function(name: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    properties = {key: {"type": kind} for key, kind in parameters.items()}
    schema = {"type": "object", "properties": properties, "required": list(parameters)}
    return {"name": name, "description": description, "parameters": schema}


def _chat_messages(session: Session, arguments: Callable[[Reply], Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": session.system},
        {"role": "user", "content": session.task},
    ]
    for reply, result in session.steps:
        function = {"name": reply.tool, "arguments": arguments(reply)}
        call = {"id": reply.call_id, "type": "function", "function": function}
        messages.append({"role": "assistant", "content": reply.text, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": result.call_id, "content": result.text})
    return messages


def chat_request(session: Session) -> tuple[dict[str, Any], dict[str, str]]:
    """OpenCode's ``/v1/chat/completions``."""
    body = {
        "model": MODEL,
        "messages": _chat_messages(session, lambda r: json.dumps(r.arguments)),
        "tools": _tools_chat(),
        "max_tokens": 32000,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return body, {"user-agent": "opencode/0.15.8 ai-sdk/provider-utils/3.0.9"}


def ollama_request(session: Session) -> tuple[dict[str, Any], dict[str, str]]:
    """An agent on Ollama's ``/api/chat`` (its tool arguments are objects)."""
    messages = _chat_messages(session, lambda r: r.arguments)
    for message in messages:
        message.pop("tool_call_id", None)
        for call in message.get("tool_calls", ()):
            del call["id"], call["type"]
    body = {"model": MODEL, "messages": messages, "tools": _tools_chat(), "stream": True}
    return body, {"user-agent": "ollama-python/0.5.1"}


IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."
CACHED = {"type": "ephemeral"}


def _claude(session: Session) -> dict[str, Any]:
    """Claude Code's Messages body without its billing block."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": session.task}]}
    ]
    for reply, result in session.steps:
        tool_use = {"type": "tool_use", "id": reply.call_id, "name": reply.tool}
        content = [{"type": "text", "text": reply.text}, {**tool_use, "input": reply.arguments}]
        messages.append({"role": "assistant", "content": content})
        block = {"type": "tool_result", "tool_use_id": result.call_id, "content": result.text}
        messages.append({"role": "user", "content": [block]})
    messages[-1]["content"][-1]["cache_control"] = CACHED  # moves to the newest block each turn
    tools = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
        for f in (_function(*tool) for tool in TOOLS)
    ]
    return {
        "model": MODEL,
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": IDENTITY, "cache_control": CACHED},
            {"type": "text", "text": session.system, "cache_control": CACHED},
        ],
        "messages": messages,
        "tools": tools,
        "temperature": 1,
        "stream": True,
    }


def _claude_headers(version: str) -> dict[str, str]:
    return {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        "x-app": "cli",
        "user-agent": f"claude-cli/{version} (external, cli)",
    }


def messages_request(session: Session) -> tuple[dict[str, Any], dict[str, str]]:
    """Claude Code 2.1.35's ``/v1/messages``: no billing block, the session in ``user_id``."""
    body = _claude(session)
    user = f"user_{'0' * 63}1_account__session_{session.id}"
    body["metadata"] = {"user_id": user}
    return body, _claude_headers("2.1.35")


def claude_code_request(session: Session) -> tuple[dict[str, Any], dict[str, str]]:
    """Claude Code 2.1.37's ``/v1/messages``: a billing block first, ``cch`` new every request."""
    body, headers = clean_claude_code(session)
    suffix = session.id[:3]  # fixed per session (Claude Code derives it from the first message)
    billing = f"x-anthropic-billing-header: cc_version=2.1.37.{suffix}; cc_entrypoint=cli; "
    body["system"].insert(0, {"type": "text", "text": f"{billing}cch={session.nonce(5)};"})
    return body, headers


def clean_claude_code(session: Session) -> tuple[dict[str, Any], dict[str, str]]:
    """Claude Code 2.1.37's request without its billing block (what the oracle sends)."""
    body = _claude(session)
    user = {"device_id": "0" * 64, "account_uuid": "", "session_id": session.id}
    body["metadata"] = {"user_id": json.dumps(user)}
    return body, {**_claude_headers("2.1.37"), "x-claude-code-session-id": session.id}


def responses_request(session: Session) -> tuple[dict[str, Any], dict[str, str]]:
    """Codex's ``/v1/responses``: the whole conversation as input items every turn."""
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": session.task}],
        }
    ]
    for reply, result in session.steps:
        text = {"type": "output_text", "text": reply.text}
        items.append({"type": "message", "role": "assistant", "content": [text]})
        arguments = json.dumps(reply.arguments)
        call = {"type": "function_call", "name": reply.tool, "arguments": arguments}
        items.append({**call, "call_id": reply.call_id})
        items.append(
            {"type": "function_call_output", "call_id": result.call_id, "output": result.text}
        )
    tools = [{"type": "function", **_function(*tool), "strict": False} for tool in TOOLS]
    body = {
        "model": MODEL,
        "instructions": session.system,
        "input": items,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": None,
        "store": False,
        "stream": True,
        "include": [],
        "prompt_cache_key": session.id,
    }
    headers = {
        "session_id": session.id,
        "originator": "codex_cli_rs",
        "user-agent": "codex_cli_rs/0.46.0",
        "accept": "text/event-stream",
    }
    return body, headers


CLIENTS = (
    Client("`/v1/chat/completions` (OpenCode, Continue, aider)", "/v1/chat/completions", "openai",
           chat_request),
    Client("`/v1/messages` (Claude Code ≤ 2.1.35)", "/v1/messages", "openai", messages_request),
    Client("`/v1/responses`, no `previous_response_id` (Codex)", "/v1/responses", "openai",
           responses_request),
    Client("`/v1/messages` as Claude Code 2.1.37 sends it (billing block)", "/v1/messages",
           "openai", claude_code_request, clean_claude_code),
    Client("`/api/chat` (an agent on Ollama)", "/api/chat", "ollama", ollama_request),
)  # fmt: skip
"""Every agent shape, in the report's order."""


# -- reading the answer back


def _events(body: bytes) -> list[dict[str, Any]]:
    """The JSON documents of an SSE stream (``data: {...}`` lines) or of NDJSON lines."""
    found = []
    for line in body.splitlines():
        text = line[6:] if line.startswith(b"data: ") else line
        if text.startswith(b"{"):
            found.append(json.loads(text))
    return found


def _read_chat(events: list[dict[str, Any]]) -> Reply:
    text, call = "", {"id": "", "name": "", "arguments": ""}
    for event in events:
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for fragment in delta.get("tool_calls") or []:
                function = fragment.get("function") or {}
                call["id"] = fragment.get("id") or call["id"]
                call["name"] = function.get("name") or call["name"]
                call["arguments"] += function.get("arguments") or ""
    return Reply(text, call["id"], call["name"], json.loads(call["arguments"]))


def _read_messages(events: list[dict[str, Any]]) -> Reply:
    text, call, partial = "", {"id": "", "name": ""}, ""
    for event in events:
        block = event.get("content_block") or {}
        if block.get("type") == "tool_use":
            call = {"id": block["id"], "name": block["name"]}
        delta = event.get("delta") or {}
        text += delta.get("text", "") if delta.get("type") == "text_delta" else ""
        partial += delta.get("partial_json", "") if delta.get("type") == "input_json_delta" else ""
    return Reply(text, call["id"], call["name"], json.loads(partial or "{}"))


def _read_responses(events: list[dict[str, Any]]) -> Reply:
    [done] = [e["response"] for e in events if e.get("type") == "response.completed"]
    text = "".join(
        part["text"]
        for item in done["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    [call] = [item for item in done["output"] if item["type"] == "function_call"]
    return Reply(text, call["call_id"], call["name"], json.loads(call["arguments"]))


def _read_ollama(events: list[dict[str, Any]]) -> Reply:
    text, calls = "", list[dict[str, Any]]()
    for event in events:
        message = event.get("message") or {}
        text += message.get("content") or ""
        calls += message.get("tool_calls") or []
    [call] = calls
    function = call["function"]
    return Reply(
        text, call.get("id", f"ollama_{len(text)}"), function["name"], function["arguments"]
    )


READERS: dict[str, Callable[[list[dict[str, Any]]], Reply]] = {
    "/v1/chat/completions": _read_chat,
    "/v1/messages": _read_messages,
    "/v1/responses": _read_responses,
    "/api/chat": _read_ollama,
}


def read_reply(path: str, body: bytes) -> Reply:
    """The reply a whole stream from route ``path`` carries (ValueError if it has none)."""
    try:
        return READERS[path](_events(body))
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(f"no reply in the {path} stream: {error!r}") from error
