# -*- test-case-name: tests.dialects.test_messages_request -*-
"""Anthropic Messages requests as OpenAI-compatible chat requests (docs/behaviour.md §17.3,
§17.4).

``POST /v1/messages`` is sent as ``/v1/chat/completions``:

========================================  ========================================================
Messages field                            chat completions field
========================================  ========================================================
``system`` (a string or text blocks)      a first ``system`` message (the blocks' texts joined
                                          with a blank line)
``messages[].content`` text blocks        a string (one text block) or ``text`` parts
``image`` blocks (``base64`` / ``url``)   ``image_url`` parts (a ``data:`` URL for base64)
an assistant's ``tool_use`` blocks        its ``tool_calls`` (``id``, ``function.name``,
                                          ``function.arguments``: ``input`` as a JSON string);
                                          ``content: null`` when the turn has no text
a user's ``tool_result`` blocks           one ``role: "tool"`` message each, before the rest of
                                          that turn (``tool_call_id``; its text content; an
                                          ``is_error`` result's text prefixed ``Error: ``)
an assistant's ``thinking`` blocks        its ``reasoning_content``
``tools`` (client tools)                  ``tools``: ``{"type": "function", "function": {"name",
                                          "description", "parameters": input_schema}}``
``tool_choice``                           ``auto`` → ``"auto"``, ``any`` → ``"required"``,
                                          ``none`` → ``"none"``, ``tool`` → that function;
                                          ``disable_parallel_tool_use`` →
                                          ``parallel_tool_calls: false``
``thinking``                              ``enabled``: ``reasoning_effort`` by ``budget_tokens``
                                          (below 4,096 ``low``, below 16,384 ``medium``, else
                                          ``high``); ``adaptive``: ``medium``; ``disabled``:
                                          ``chat_template_kwargs: {"enable_thinking": false}``
``max_tokens``, ``stop_sequences``        ``max_tokens``, ``stop``
``temperature``, ``top_p``, ``top_k``     by name (``top_k`` as the extra field servers accept)
``stream``                                always ``stream: true`` with
                                          ``stream_options.include_usage``; a whole answer is
                                          assembled from the stream
========================================  ========================================================

Dropped: ``metadata`` (no counterpart), ``service_tier``, ``cache_control`` on blocks and
``redacted_thinking`` blocks (earlier reasoning the node cannot read). Untranslatable (the
request is not sent to a node of another kind): a ``messages`` that is not a list of objects,
a block of another type (``document``, ``search_result``, server tool results…), a server tool
(a ``tools`` entry with a ``type`` but no ``input_schema``), ``mcp_servers`` and
``container``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nvpair_tw.dialects._common import Untranslatable, dump

__all__ = ["MESSAGES_PATH", "messages_request"]

MESSAGES_PATH = "/v1/messages"

_BY_NAME = (
    ("max_tokens", "max_tokens"),
    ("stop_sequences", "stop"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
)
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_UNTRANSLATABLE = ("mcp_servers", "container")


def messages_request(parsed: Mapping[str, Any], local_model: str) -> bytes:
    """The chat completions body for an Anthropic Messages request; :class:`Untranslatable`
    names the field when there is none."""
    for name in _UNTRANSLATABLE:
        if parsed.get(name):
            raise Untranslatable(name, "it names resources only Anthropic's API has")
    out: dict[str, Any] = {"model": local_model, "messages": _conversation(parsed)}
    for name, upstream in _BY_NAME:
        if parsed.get(name) is not None:
            out[upstream] = parsed[name]
    tools = parsed.get("tools")
    if tools:
        out["tools"] = _tools(tools)
    _choice(parsed.get("tool_choice"), out)
    _thinking(parsed.get("thinking"), out)
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}
    return dump(out)


def _conversation(parsed: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = parsed.get("messages")
    if not isinstance(messages, list):
        raise Untranslatable("messages", "messages is not a list")
    out: list[dict[str, Any]] = []
    system = parsed.get("system")
    if system:
        out.append({"role": "system", "content": _system_text(system)})
    for message in messages:
        if not isinstance(message, Mapping):
            raise Untranslatable("messages", "a message is not an object")
        out.extend(_turn(message))
    return out


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(_text_of(block, "system") for block in system)
    raise Untranslatable("system", "system is neither a string nor a list of text blocks")


def _text_of(block: Any, where: str) -> str:
    if isinstance(block, Mapping) and block.get("type") == "text":
        text = block.get("text")
        if isinstance(text, str):
            return text
    raise Untranslatable(where, "a block that is not text")


def _turn(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: its tool results first, then the turn itself."""
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise Untranslatable("messages", "a message's content is neither a string nor a list")
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, "messages")})
        elif kind == "image":
            parts.append(_image(block.get("source")))
        elif kind == "tool_use":
            calls.append(_call(block))
        elif kind == "tool_result":
            results.append(_result(block))
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif kind != "redacted_thinking":
            raise Untranslatable("messages", f"a {kind!r} content block has no counterpart")
    if not parts and not calls and not thinking:
        return results
    # calls alone: content null, as OpenAI writes it (Ollama 0.9.3's /v1 drops the calls of a
    # message whose content is a string, even an empty one)
    item: dict[str, Any] = {"role": role, "content": _parts(parts) if parts or not calls else None}
    if calls:
        item["tool_calls"] = calls
    if thinking:
        item["reasoning_content"] = "".join(thinking)
    return [*results, item]


def _parts(parts: list[dict[str, Any]]) -> Any:
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts if parts else ""


def _image(source: Any) -> dict[str, Any]:
    if isinstance(source, Mapping):
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            media = source.get("media_type") or "image/png"
            url = f"data:{media};base64,{source['data']}"
            return {"type": "image_url", "image_url": {"url": url}}
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise Untranslatable("messages", "an image source that is neither base64 nor a URL")


def _call(block: Mapping[str, Any]) -> dict[str, Any]:
    name, ident = block.get("name"), block.get("id")
    if not isinstance(name, str) or not isinstance(ident, str):
        raise Untranslatable("messages", "a tool_use block without its id or name")
    arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def _result(block: Mapping[str, Any]) -> dict[str, Any]:
    ident = block.get("tool_use_id")
    if not isinstance(ident, str):
        raise Untranslatable("messages", "a tool_result block without its tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        text = "\n".join(_text_of(part, "messages") for part in content)
    elif isinstance(content, str):
        text = content
    else:
        raise Untranslatable("messages", "a tool_result whose content is not text")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": ident, "content": text}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise Untranslatable("tools", "tools is not a list")
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping) or not isinstance(tool.get("input_schema"), Mapping):
            raise Untranslatable("tools", "a server tool (no input_schema) has no counterpart")
        function: dict[str, Any] = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _choice(choice: Any, out: dict[str, Any]) -> None:
    if not isinstance(choice, Mapping):
        return
    kind = choice.get("type")
    if kind in _CHOICES:
        out["tool_choice"] = _CHOICES[kind]
    elif kind == "tool" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def _thinking(thinking: Any, out: dict[str, Any]) -> None:
    if not isinstance(thinking, Mapping):
        return
    kind = thinking.get("type")
    if kind == "disabled":
        out["chat_template_kwargs"] = {"enable_thinking": False}
    elif kind == "adaptive":
        out["reasoning_effort"] = "medium"
    elif kind == "enabled":
        budget = thinking.get("budget_tokens")
        size = budget if isinstance(budget, int) and not isinstance(budget, bool) else 8192
        out["reasoning_effort"] = "low" if size < 4096 else "medium" if size < 16384 else "high"
