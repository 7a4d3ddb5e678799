# -*- test-case-name: tests.simulated.test_kinds -*-
"""Ollama's inference answers as a real Ollama (0.9.3) gives them: ``/api/chat`` and ``/api/generate``
NDJSON chunks naming the ``model`` with a ``created_at``, ending with an object that carries
``done: true``, ``done_reason``, ``prompt_eval_count``, ``eval_count`` and the durations in
nanoseconds (a paced engine's own, :mod:`~nvpair_tw.simulated._pace`; else 1 ms to load, 1 ms a
prompt token and 10 ms an answer token); a chat's last line still has its ``message`` (empty), and
a generate's its ``context`` (the token ids of prompt and answer); ``/api/embed`` (``embeddings``)
and the older ``/api/embeddings`` (``embedding``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nvpair_tw.simulated._asked import Asked, embedding_of, inputs_of

__all__ = ["ollama_frames"]

_MS = 1_000_000
"""A millisecond in nanoseconds."""


def ollama_frames(asked: Asked) -> list[bytes] | None:
    """The frames of Ollama's answer to ``asked``, or None for a route this module does not answer
    (``/api/show``, ``/api/pull``, …).

    :param asked: the request.
    """
    if asked.path == b"/api/embed":
        vectors = [embedding_of(text) for text in inputs_of(asked.body)]
        return [_line(_embed(asked, vectors), newline=False)]
    if asked.path == b"/api/embeddings":
        prompt = asked.body.get("prompt")
        text = prompt if isinstance(prompt, str) else ""
        return [_line({"embedding": embedding_of(text)}, newline=False)]
    if asked.path not in (b"/api/chat", b"/api/generate"):
        return None
    chat = asked.path == b"/api/chat"
    final = _final(asked) if chat else {**_final(asked), "context": _context(asked)}
    if not asked.streaming:
        return [_line({**_piece(asked, chat, asked.answer), **final}, newline=False)]
    parts = [_line({**_piece(asked, chat, piece), "done": False}) for piece in asked.pieces()]
    return [*parts, _line({**_piece(asked, chat, ""), **final})]


def _piece(asked: Asked, chat: bool, content: str) -> dict[str, Any]:
    said: dict[str, Any] = {"model": asked.model, "created_at": asked.created_at}
    if chat:
        said["message"] = {"role": "assistant", "content": content}
    else:
        said["response"] = content
    return said


def _final(asked: Asked) -> dict[str, Any]:
    """The closing fields: counts and durations (nanoseconds), as Ollama ends an answer."""
    prompt, evaluated = asked.prompt_tokens, asked.completion_tokens
    load, prompt_eval, evaluation = _MS, prompt * _MS, evaluated * 10 * _MS
    if asked.timing is not None:
        timing = asked.timing
        load, prompt_eval, evaluation = (
            _ns(timing.load),
            _ns(timing.prompt_eval),
            _ns(timing.eval),
        )
    return {
        "done": True,
        "done_reason": asked.finish,
        "total_duration": load + prompt_eval + evaluation,
        "load_duration": load,
        "prompt_eval_count": prompt,
        "prompt_eval_duration": prompt_eval,
        "eval_count": evaluated,
        "eval_duration": evaluation,
    }


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


def _context(asked: Asked) -> list[int]:
    """A generate's ``context``: a token id for each prompt and answer token (a word's digest;
    the same words give the same ids)."""
    words = [w for text in asked.prompt_texts() for w in text.split()] or [""]
    return [_token_id(word) for word in [*words, *asked.pieces()]]


def _token_id(word: str) -> int:
    return int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % 49152


def _embed(asked: Asked, vectors: list[list[float]]) -> dict[str, Any]:
    tokens = asked.prompt_tokens
    return {
        "model": asked.model,
        "embeddings": vectors,
        "total_duration": _MS + tokens * _MS,
        "load_duration": _MS,
        "prompt_eval_count": tokens,
    }


def _line(document: dict[str, Any], *, newline: bool = True) -> bytes:
    return json.dumps(document).encode() + (b"\n" if newline else b"")
