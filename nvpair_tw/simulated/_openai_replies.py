# -*- test-case-name: tests.simulated.test_kinds -*-
"""OpenAI-compatible inference answers as a real server of a kind gives them: ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings`` (and LM Studio's ``/api/v0/`` twins, whose whole answers
add ``stats``, ``model_info`` and ``runtime``).

A stream is ``chat.completion.chunk`` events naming the requested model, the last content chunk with
the ``finish_reason`` (``stop``, or ``length`` when a limit cut the answer), a usage chunk
(``choices: []``) only when the request asked for ``stream_options.include_usage``, then
``data: [DONE]``. A whole answer carries ``usage``.

Where a kind's server writes these its own way, the difference is a :class:`Style` in
:data:`STYLES`: Ollama (0.9.3, compared field by field) puts ``system_fingerprint: "fp_ollama"`` on
every chunk and answer, ends the content with a chunk of its own (empty content, the
``finish_reason``), and sends no ``logprobs``."""

from __future__ import annotations

import json
from typing import Any

from attrs import frozen

from nvpair_tw.simulated._asked import Asked, embedding_of, inputs_of

__all__ = ["STYLES", "Style", "lmstudio_extras", "openai_frames"]


@frozen
class Style:
    """How one kind's server writes an OpenAI-style answer.

    :ivar fingerprint: the ``system_fingerprint`` of every chunk and answer, or None for none.
    :ivar finish_chunk: whether the ``finish_reason`` comes on an empty chunk of its own after the
        content (else on the last content chunk).
    :ivar logprobs: whether each choice carries ``"logprobs": null``.
    """

    fingerprint: str | None = None
    finish_chunk: bool = False
    logprobs: bool = True


STYLES = {"ollama": Style("fp_ollama", finish_chunk=True, logprobs=False)}
"""Each kind's :class:`Style`; a kind not listed writes ``Style()``."""


def openai_frames(
    asked: Asked, extras: dict[str, Any] | None = None, style: Style = Style()
) -> list[bytes] | None:
    """The frames of an OpenAI-style answer to ``asked``, or None for a route this module does not
    answer (``/v1/responses``, ``/v1/messages``, …).

    :param asked: the request.
    :param extras: fields added to a whole chat or text completion (LM Studio's ``stats``, …).
    :param style: how the kind's server writes it.
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
        return [_json({**_whole(asked, chat, style), **(extras or {})})]
    pieces = asked.pieces()
    last = len(pieces) - 1
    if style.finish_chunk:
        pieces, last = [*pieces, ""], len(pieces)
    events = [
        _event(_chunk(asked, chat, style, piece, asked.finish if i == last else None))
        for i, piece in enumerate(pieces)
    ]
    options = asked.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        usage = {**_head(asked, chat, True, style), "choices": [], "usage": _usage(asked)}
        events.append(_event(usage))
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


def _head(asked: Asked, chat: bool, streaming: bool, style: Style) -> dict[str, Any]:
    if chat:
        kind, prefix = ("chat.completion.chunk" if streaming else "chat.completion"), "chatcmpl"
    else:
        kind, prefix = "text_completion", "cmpl"
    head: dict[str, Any] = {
        "id": f"{prefix}-sim{asked.number}",
        "object": kind,
        "created": asked.created,
        "model": asked.model,
    }
    if style.fingerprint is not None:
        head["system_fingerprint"] = style.fingerprint
    return head


def _whole(asked: Asked, chat: bool, style: Style) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": asked.finish}
    if not style.logprobs:
        del choice["logprobs"]
    if chat:
        choice["message"] = {"role": "assistant", "content": asked.answer}
    else:
        choice["text"] = asked.answer
    answer = _head(asked, chat, False, style)
    return {**answer, "choices": [choice], "usage": _usage(asked)}


def _chunk(
    asked: Asked, chat: bool, style: Style, piece: str, finish: str | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["delta"] = {"role": "assistant", "content": piece}
    else:
        choice["text"] = piece
        if style.logprobs:
            choice["logprobs"] = None
    choice["finish_reason"] = finish
    return {**_head(asked, chat, True, style), "choices": [choice]}


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
