# -*- test-case-name: tests.simulated.test_kinds -*-
"""OpenAI-compatible inference answers as a real server of a kind gives them: ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings`` (and LM Studio's ``/api/v0/`` twins, whose whole answers
add ``stats``, ``model_info`` and ``runtime``).

A stream is ``chat.completion.chunk`` events naming the requested model, the last content chunk with
``finish_reason: "stop"``, a usage chunk (``choices: []``) only when the request asked for
``stream_options.include_usage``, then ``data: [DONE]``. A whole answer carries ``usage``."""

from __future__ import annotations

import json
from typing import Any

from nvpair_tw.simulated._asked import Asked, embedding_of, inputs_of

__all__ = ["lmstudio_extras", "openai_frames"]


def openai_frames(asked: Asked, extras: dict[str, Any] | None = None) -> list[bytes] | None:
    """The frames of an OpenAI-style answer to ``asked``, or None for a route this module does not
    answer (``/v1/responses``, ``/v1/messages``, …).

    :param asked: the request.
    :param extras: fields added to a whole chat or text completion (LM Studio's ``stats``, …).
    """
    if asked.path.endswith(b"/embeddings"):
        return [_json(_embeddings(asked))]
    if asked.path.endswith(b"/chat/completions"):
        chat = True
    elif asked.path.endswith(b"/completions"):
        chat = False
    else:
        return None
    if not asked.streaming:
        return [_json({**_whole(asked, chat), **(extras or {})})]
    pieces = asked.pieces()
    events = [
        _event(_chunk(asked, chat, piece, "stop" if i == len(pieces) - 1 else None))
        for i, piece in enumerate(pieces)
    ]
    options = asked.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        events.append(_event({**_head(asked, chat, True), "choices": [], "usage": _usage(asked)}))
    return [*events, b"data: [DONE]\n\n"]


def lmstudio_extras(asked: Asked, facts: dict[str, Any]) -> dict[str, Any]:
    """What LM Studio's ``/api/v0/chat/completions`` and ``/api/v0/completions`` add to a whole
    answer: ``stats``, ``model_info`` and ``runtime``.

    :param asked: the request.
    :param facts: the model's record facts (:func:`~nvpair_tw.simulated._kinds.lmstudio_facts`).
    """
    generation_time = round(0.01 * asked.completion_tokens, 3)
    return {
        "stats": {
            "tokens_per_second": asked.completion_tokens / generation_time,
            "time_to_first_token": 0.1,
            "generation_time": generation_time,
            "stop_reason": "eosFound",
        },
        "model_info": {
            "arch": facts["arch"],
            "quant": facts["quantization"],
            "format": facts["compatibility_type"],
            "context_length": facts["max_context_length"],
        },
        "runtime": {
            "name": "llama.cpp-linux-x86_64-avx2",
            "version": "1.3.0",
            "supported_formats": ["gguf"],
        },
    }


def _usage(asked: Asked) -> dict[str, int]:
    prompt, completion = asked.prompt_tokens, asked.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _head(asked: Asked, chat: bool, streaming: bool) -> dict[str, Any]:
    if chat:
        kind, prefix = ("chat.completion.chunk" if streaming else "chat.completion"), "chatcmpl"
    else:
        kind, prefix = "text_completion", "cmpl"
    return {
        "id": f"{prefix}-sim{asked.number}",
        "object": kind,
        "created": asked.created,
        "model": asked.model,
    }


def _whole(asked: Asked, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": asked.text}
    else:
        choice["text"] = asked.text
    return {**_head(asked, chat, False), "choices": [choice], "usage": _usage(asked)}


def _chunk(asked: Asked, chat: bool, piece: str, finish: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["delta"] = {"role": "assistant", "content": piece}
    else:
        choice["text"] = piece
        choice["logprobs"] = None
    choice["finish_reason"] = finish
    return {**_head(asked, chat, True), "choices": [choice]}


def _embeddings(asked: Asked) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": embedding_of(text)}
        for i, text in enumerate(inputs_of(asked.body))
    ]
    tokens = asked.prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": asked.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()
