# -*- test-case-name: tests.dialects.test_requests -*-
"""Ollama requests as OpenAI-compatible requests (docs/behaviour.md §11.3).

The translation table:

=========================  ==========================  ==============================================
client route               sent as                     request fields
=========================  ==========================  ==============================================
``POST /api/chat``         ``/v1/chat/completions``    ``messages`` (below), ``tools``, ``format``,
                                                       ``options`` (below)
``POST /api/generate``     ``/v1/chat/completions``    ``system`` → a system message, ``prompt`` (and
                                                       ``images``) → the user message
``POST /api/generate``     ``/v1/completions``         when ``raw: true`` or with a ``suffix``:
                                                       ``prompt``, ``suffix``
``POST /api/embed``        ``/v1/embeddings``          ``input`` (a string or a list), ``dimensions``
``POST /api/embeddings``   ``/v1/embeddings``          ``prompt`` → ``input``
``POST /api/v0/…``         the ``/v1/…`` twin          the body unchanged but ``model``
=========================  ==========================  ==============================================

Every chat and completion request is sent with ``"stream": true`` and
``"stream_options": {"include_usage": true}``, whatever the client asked (Ollama's default is to
stream): the answer is translated chunk by chunk, or assembled whole for ``"stream": false``.

Messages: ``role`` and ``content``; ``images`` (base64) → content parts ``{"type": "text"}`` then
one ``{"type": "image_url", "image_url": {"url": "data:image/<png|jpeg|gif|webp>;base64,…"}}`` per
image (the type read from the base64 magic, else png; a data URL is kept as it is); an assistant's
``tool_calls`` → OpenAI tool calls ``{"id": "call_<n>", "type": "function", "function": {"name",
"arguments": <the argument object as a JSON string>}}`` (``n`` counts the calls of the whole
conversation from 0; an id the client gave is kept); a ``role: "tool"`` message → its
``tool_call_id``: the id it gives, else the earliest unanswered call of the latest assistant turn
with that ``tool_name``, else the earliest unanswered call.

Options: ``temperature``, ``top_p``, ``seed``, ``stop``, ``frequency_penalty``,
``presence_penalty`` by name; ``num_predict`` → ``max_tokens`` (negative: omitted, no limit);
``top_k``, ``min_p``, ``repeat_penalty`` as top-level extra fields (llama.cpp, vLLM, LM Studio and
oMLX accept them). ``format: "json"`` → ``response_format: {"type": "json_object"}``; a JSON-schema
object → ``{"type": "json_schema", "json_schema": {"name": "schema", "schema": …}}``.

Reasoning (docs/behaviour.md §17.4): ``think: "low" | "medium" | "high"`` → ``reasoning_effort``
of the same name; ``think: true`` → ``reasoning_effort: "medium"``; ``think: false`` → no
``reasoning_effort`` and ``chat_template_kwargs: {"enable_thinking": false}`` (what llama.cpp
and vLLM read); an assistant message's ``thinking`` → its ``reasoning_content``.

Dropped fields, and why:

=================================  ===============================================================
field                              why
=================================  ===============================================================
``keep_alive``                     residency is the node's own policy; no OpenAI counterpart
``options.num_ctx``                the context length is fixed when the node loads the model
``options.*`` (others: ``num_keep``,  sampler and runtime settings with no OpenAI-compatible name
``typical_p``, ``repeat_last_n``,
``mirostat*``, ``tfs_z``,
``num_batch``, ``num_gpu``,
``num_thread``, ``use_mmap``, …)
``truncate`` (embed)               OpenAI servers truncate or refuse by their own rule
``logprobs``, ``top_logprobs``     their answer is not translated back
other unknown top-level fields     no known meaning to carry over
=================================  ===============================================================

Untranslatable (:class:`~nvpair_tw.dialects._common.Untranslatable`, the request is not sent to
a node of another kind): generate's ``context`` (a non-empty array: tokens of an earlier answer,
meaningful only to that Ollama), a ``template`` (Ollama's prompt template language), a generate
with no ``prompt`` (Ollama's load request, or an unload with ``keep_alive: 0``: model management,
not inference), ``images`` on a raw or ``suffix`` generate (``/v1/completions`` takes no images),
a ``format`` that is neither ``"json"``, empty nor an object, a ``messages`` that is not a list of
objects, a ``tool`` message answering no earlier call, an embedding ``input`` that is not a
string or a list, and an LM Studio body that is not one JSON object naming a model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nvpair_tw.dialects._common import Untranslatable, dump
from nvpair_tw.dialects._json import rename_request
from nvpair_tw.dialects._messages_request import MESSAGES_PATH, messages_request

__all__ = ["OLLAMA_ROUTES", "V0_ROUTES", "UpstreamRequest", "translate_request"]

V0_ROUTES = {
    "/api/v0/chat/completions": "/v1/chat/completions",
    "/api/v0/completions": "/v1/completions",
    "/api/v0/embeddings": "/v1/embeddings",
}
OLLAMA_ROUTES = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"})

_BY_NAME = ("temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty")
_EXTRA = ("top_k", "min_p", "repeat_penalty")
_MAGIC = (("iVBORw0KGgo", "png"), ("/9j/", "jpeg"), ("R0lGOD", "gif"), ("UklGR", "webp"))

UpstreamRequest = tuple[str, bytes, bool]
"""(upstream path, upstream body, whether the client asked for a stream)."""


def translate_request(
    client_path: str, parsed: Mapping[str, Any], body: bytes | None, local_model: str
) -> UpstreamRequest:
    """The upstream request for ``client_path``; :class:`Untranslatable` when there is none.

    ``body`` (the client's bytes) is needed only for the LM Studio routes, whose body is kept but
    for ``model``; without it, ``parsed`` is dumped.
    """
    if client_path in V0_ROUTES:
        raw = body if body is not None else dump(dict(parsed))
        try:
            renamed = rename_request(raw, local_model)
        except ValueError as error:
            raise Untranslatable("model", str(error)) from error
        stream = parsed.get("stream") is True and not client_path.endswith("/embeddings")
        return V0_ROUTES[client_path], renamed, stream
    if client_path == "/api/chat":
        return _chat(parsed, local_model)
    if client_path == "/api/generate":
        return _generate(parsed, local_model)
    if client_path in ("/api/embed", "/api/embeddings"):
        return _embed(client_path, parsed, local_model)
    if client_path == MESSAGES_PATH:  # §17.3; Messages' default is a whole answer
        body = messages_request(parsed, local_model)
        return "/v1/chat/completions", body, parsed.get("stream") is True
    raise ValueError(f"{client_path} is not a translated route")


def _streams(parsed: Mapping[str, Any]) -> bool:
    return parsed.get("stream", True) is not False


def _sampling(parsed: Mapping[str, Any], out: dict[str, Any]) -> None:
    options = parsed.get("options")
    if isinstance(options, Mapping):
        for name in _BY_NAME:
            if options.get(name) is not None:
                out[name] = options[name]
        limit = options.get("num_predict")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            out["max_tokens"] = limit
        for name in _EXTRA:
            if options.get(name) is not None:
                out[name] = options[name]
    fmt = parsed.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, Mapping):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "schema", "schema": fmt},
        }
    elif fmt not in (None, ""):
        raise Untranslatable("format", 'only "json" or a JSON schema object is translated')
    _think(parsed.get("think"), out)
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}


_EFFORTS = frozenset({"low", "medium", "high"})


def _think(think: Any, out: dict[str, Any]) -> None:
    """Ollama's ``think`` as ``reasoning_effort`` (docs/behaviour.md §17.4)."""
    if think is True:
        out["reasoning_effort"] = "medium"
    elif think is False:
        out["chat_template_kwargs"] = {"enable_thinking": False}
    elif isinstance(think, str) and think in _EFFORTS:
        out["reasoning_effort"] = think


def _image_url(image: Any) -> dict[str, Any]:
    if not isinstance(image, str):
        raise Untranslatable("images", "an image is not a base64 string")
    if image.startswith("data:"):
        url = image
    else:
        kind = next((k for magic, k in _MAGIC if image.startswith(magic)), "png")
        url = f"data:image/{kind};base64,{image}"
    return {"type": "image_url", "image_url": {"url": url}}


def _content(text: Any, images: Any) -> Any:
    content = text if isinstance(text, str) else ("" if text is None else text)
    if not images:
        return content
    if not isinstance(images, list):
        raise Untranslatable("images", "images is not a list")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str) and content:
        parts.append({"type": "text", "text": content})
    parts.extend(_image_url(image) for image in images)
    return parts


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise Untranslatable("messages", "messages is not a list")
    out: list[dict[str, Any]] = []
    count = 0
    open_calls: list[tuple[str, str | None]] = []  # (id, function name) not yet answered
    for message in messages:
        if not isinstance(message, Mapping):
            raise Untranslatable("messages", "a message is not an object")
        role = message.get("role")
        item: dict[str, Any] = {
            "role": role,
            "content": _content(message.get("content"), message.get("images")),
        }
        thinking = message.get("thinking")
        if isinstance(thinking, str) and thinking and role == "assistant":
            item["reasoning_content"] = thinking
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise Untranslatable("messages", "tool_calls is not a list")
            open_calls = []
            translated = []
            for call in calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(function, Mapping):
                    raise Untranslatable("messages", "a tool call has no function")
                ident = call.get("id")
                if not isinstance(ident, str) or not ident:
                    ident = f"call_{count}"
                count += 1
                arguments = function.get("arguments", {})
                name = function.get("name")
                translated.append(
                    {
                        "id": ident,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": arguments
                            if isinstance(arguments, str)
                            else json.dumps(arguments, ensure_ascii=False),
                        },
                    }
                )
                open_calls.append((ident, name if isinstance(name, str) else None))
            item["tool_calls"] = translated
            if item["content"] == "":
                # An empty string beside tool calls makes some engines drop the calls (Ollama's
                # /v1/chat/completions does): OpenAI itself writes null there.
                item["content"] = None
        if role == "tool":
            item["tool_call_id"] = _answered(message, open_calls)
        out.append(item)
    return out


def _answered(message: Mapping[str, Any], open_calls: list[tuple[str, str | None]]) -> str:
    """The id of the call a tool message answers (removed from ``open_calls``)."""
    given = message.get("tool_call_id")
    if isinstance(given, str) and given:
        open_calls[:] = [call for call in open_calls if call[0] != given]
        return given
    name = message.get("tool_name")
    for position, (ident, function) in enumerate(open_calls):
        if name is None or function == name:
            del open_calls[position]
            return ident
    if open_calls:
        return open_calls.pop(0)[0]
    raise Untranslatable("messages", "a tool message answers no earlier tool call")


def _chat(parsed: Mapping[str, Any], local_model: str) -> UpstreamRequest:
    out: dict[str, Any] = {"model": local_model, "messages": _messages(parsed.get("messages"))}
    if parsed.get("tools"):
        out["tools"] = parsed["tools"]
    _sampling(parsed, out)
    return "/v1/chat/completions", dump(out), _streams(parsed)


def _generate(parsed: Mapping[str, Any], local_model: str) -> UpstreamRequest:
    context = parsed.get("context")
    if context:
        raise Untranslatable("context", "it holds tokens only the Ollama that made them knows")
    if parsed.get("template"):
        raise Untranslatable("template", "Ollama's prompt templates have no counterpart")
    prompt = parsed.get("prompt")
    images = parsed.get("images")
    if not isinstance(prompt, str) or (not prompt and not images):
        raise Untranslatable("prompt", "a generate without a prompt manages the model")
    suffix = parsed.get("suffix")
    out: dict[str, Any] = {"model": local_model}
    if parsed.get("raw") is True or (isinstance(suffix, str) and suffix):
        if images:
            raise Untranslatable("images", "a raw or suffix completion takes no images")
        out["prompt"] = prompt
        if isinstance(suffix, str) and suffix:
            out["suffix"] = suffix
        path = "/v1/completions"
    else:
        messages: list[dict[str, Any]] = []
        system = parsed.get("system")
        if isinstance(system, str) and system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": _content(prompt, images)})
        out["messages"] = messages
        path = "/v1/chat/completions"
    _sampling(parsed, out)
    return path, dump(out), _streams(parsed)


def _embed(path: str, parsed: Mapping[str, Any], local_model: str) -> UpstreamRequest:
    key = "input" if path == "/api/embed" else "prompt"
    value = parsed.get(key)
    if not isinstance(value, (str, list)):
        raise Untranslatable(key, f"{key} is neither a string nor a list")
    out: dict[str, Any] = {"model": local_model, "input": value}
    dimensions = parsed.get("dimensions")
    if path == "/api/embed" and isinstance(dimensions, int) and not isinstance(dimensions, bool):
        out["dimensions"] = dimensions
    return "/v1/embeddings", dump(out), False
