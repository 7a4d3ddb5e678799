# -*- test-case-name: tests.dialects.test_answers -*-
"""OpenAI-compatible answers as the client's dialect: one transducer per kind of answer, and
the helpers (:class:`Buffer`, :func:`parse`, :func:`number`, :func:`error_message`) they share
with :class:`~nvpair_tw.dialects._ollama_stream.OllamaStream`, the chat (or completions) stream
as Ollama's answer, whose fields are in ``_ollama_stream``'s docstring.

- :class:`EmbedAnswer`: ``/v1/embeddings`` as ``/api/embed`` (``{"model", "embeddings",
  "total_duration", "prompt_eval_count"}``) or ``/api/embeddings`` (``{"embedding"}``).
- :class:`V0Whole` and :class:`V0Stream`: LM Studio's ``/api/v0`` answers from the ``/v1`` twin.
  A whole answer gets the ``stats`` object of LM Studio's REST API v0
  (https://lmstudio.ai/docs/developer/rest/endpoints): ``tokens_per_second`` (completion tokens
  over ``generation_time``), ``time_to_first_token`` (seconds from the answer's creation to its
  first byte: for a whole upstream answer that is when the node had finished, not its first
  token), ``generation_time`` (seconds from the first byte to the end) and ``stop_reason``
  (``stop`` → ``eosFound``, ``length`` → ``maxPredictedTokensReached``, ``tool_calls`` →
  ``toolCalls``, others as the node said); ``model_info`` and ``runtime`` are unknown and absent.
  A stream passes through unchanged but for its ``model`` members (no ``stats``: LM Studio's own
  v0 streams carry none).
- :class:`ErrorAnswer`: a non-2xx answer; ``{"error": {"message": m}}`` becomes ``{"error": m}``
  for an Ollama client; anything else (and every error for an LM Studio client) passes unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import Any

from nvpair_tw.dialects._common import (
    JSON_TYPE,
    AnswerTooLarge,
    MalformedAnswer,
    StreamCut,
    dump,
    media_type,
)
from nvpair_tw.dialects._rename import Identity, Renamer

__all__ = [
    "NS",
    "Buffer",
    "EmbedAnswer",
    "EmbedRoute",
    "ErrorAnswer",
    "ErrorShape",
    "V0Stream",
    "V0Whole",
    "error_message",
    "number",
    "parse",
]

NS = 1e9


class EmbedRoute(Enum):
    """The Ollama embeddings route the client asked: ``embeddings`` lists, or one legacy
    ``embedding``."""

    EMBED = "/api/embed"
    LEGACY = "/api/embeddings"


class ErrorShape(Enum):
    """How a non-2xx answer reaches the client."""

    OLLAMA = "ollama"
    """An OpenAI error object becomes Ollama's ``{"error": "<message>"}``."""
    AS_IS = "as-is"
    """It passes through as it came."""


def error_message(error: Any) -> str:
    """The message of an OpenAI ``error`` value (an object with ``message``, or a string)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return dump(error).decode("utf-8")


def number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise MalformedAnswer(f"{what} is not JSON") from error
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{what} is not a JSON object")
    return value


class Buffer:
    """A whole answer gathered, capped at ``limit`` bytes."""

    __slots__ = ("_limit", "_parts", "_size")

    def __init__(self, limit: int) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._limit = limit

    def add(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            raise AnswerTooLarge(f"the answer passed {self._limit} bytes")
        self._parts.append(data)

    def bytes(self) -> bytes:
        return b"".join(self._parts)


class EmbedAnswer:
    """``/v1/embeddings`` as Ollama's ``/api/embed`` or legacy ``/api/embeddings`` answer."""

    content_type = JSON_TYPE

    def __init__(
        self, client_model: str, clock: Callable[[], float], route: EmbedRoute, *, limit: int
    ) -> None:
        self._model = client_model
        self._clock = clock
        self._start = clock()
        self._legacy = route is EmbedRoute.LEGACY
        self._buffer = Buffer(limit)
        self._prompt: int | None = None

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (self._prompt, None)

    def feed(self, data: bytes) -> bytes:
        self._buffer.add(data)
        return b""

    def end(self) -> bytes:
        doc = parse(self._buffer.bytes(), "the embeddings answer")
        data = doc.get("data")
        if not isinstance(data, list) or not all(
            isinstance(item, dict) and isinstance(item.get("embedding"), list) for item in data
        ):
            raise MalformedAnswer("the embeddings answer has no data list of embeddings")
        ordered = sorted(
            enumerate(data), key=lambda pair: (number(pair[1].get("index")) or 0, pair[0])
        )
        vectors = [item["embedding"] for _, item in ordered]
        if self._legacy:
            return dump({"embedding": vectors[0] if vectors else []})
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self._prompt = number(usage.get("prompt_tokens"))
        answer: dict[str, Any] = {
            "model": self._model,
            "embeddings": vectors,
            "total_duration": round((self._clock() - self._start) * NS),
        }
        if self._prompt is not None:
            answer["prompt_eval_count"] = self._prompt
        return dump(answer)


_STOP_REASONS = {
    "stop": "eosFound",
    "length": "maxPredictedTokensReached",
    "tool_calls": "toolCalls",
}


class V0Whole:
    """A whole ``/v1`` chat or completions answer as LM Studio's ``/api/v0`` answer: the model
    renamed and ``stats`` added (see the module docstring)."""

    def __init__(
        self,
        client_model: str,
        clock: Callable[[], float],
        content_type: bytes | None,
        limit: int,
    ) -> None:
        self.content_type = JSON_TYPE
        self._model = client_model
        self._clock = clock
        self._start = clock()
        self._first: float | None = None
        self._buffer = Buffer(limit)
        self._tokens: tuple[int | None, int | None] = (None, None)

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return self._tokens

    def feed(self, data: bytes) -> bytes:
        if self._first is None and data:
            self._first = self._clock()
        self._buffer.add(data)
        return b""

    def end(self) -> bytes:
        now = self._clock()
        doc = parse(self._buffer.bytes(), "the answer")
        first = self._first if self._first is not None else now
        if "model" in doc:
            doc["model"] = self._model
        usage = doc.get("usage")
        completion = None
        if isinstance(usage, dict):
            completion = number(usage.get("completion_tokens"))
            self._tokens = (number(usage.get("prompt_tokens")), completion)
        generation = now - first
        stats: dict[str, Any] = {}
        if completion is not None and generation > 0:
            stats["tokens_per_second"] = completion / generation
        stats["time_to_first_token"] = round(first - self._start, 3)
        stats["generation_time"] = round(generation, 3)
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if isinstance(reason, str):
                stats["stop_reason"] = _STOP_REASONS.get(reason, reason)
        doc["stats"] = stats
        return dump(doc)


class V0Stream:
    """A ``/v1`` SSE stream passed to an LM Studio ``/api/v0`` client with its ``model`` members
    renamed; :meth:`end` raises :class:`StreamCut` when ``data: [DONE]`` never came."""

    def __init__(self, inner: Renamer | Identity) -> None:
        self._inner = inner
        self.content_type = inner.content_type
        self._recent = b""
        self._done = False

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (None, None)

    def feed(self, data: bytes) -> bytes:
        if not self._done:
            window = self._recent + data
            self._done = b"[DONE]" in window
            self._recent = window[-8:]
        return self._inner.feed(data)

    def end(self) -> bytes:
        rest = self._inner.end()
        if not self._done:
            raise StreamCut("the upstream stream ended before data: [DONE]")
        return rest


class ErrorAnswer:
    """A non-2xx answer: an OpenAI error object becomes Ollama's ``{"error": "<message>"}`` for an
    Ollama client, same status; anything else passes through as it came."""

    def __init__(self, content_type: bytes | None, shape: ErrorShape, *, limit: int) -> None:
        self._ollama = shape is ErrorShape.OLLAMA
        self.content_type = content_type if content_type is not None else JSON_TYPE
        self._buffer = Buffer(limit)

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (None, None)

    def feed(self, data: bytes) -> bytes:
        if not self._ollama:
            return data
        self._buffer.add(data)
        return b""

    def end(self) -> bytes:
        if not self._ollama:
            return b""
        body = self._buffer.bytes()
        if media_type(self.content_type) in (b"application/json", b""):
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):
                return body
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                message = doc["error"].get("message")
                if isinstance(message, str):
                    return dump({"error": message})
        return body
