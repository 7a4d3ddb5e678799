# -*- test-case-name: tests.dialects.test_answers -*-
"""The parts of :class:`~nvpair_tw.dialects._ollama_stream.OllamaStream`'s answer: what a chunk
takes from a choice, the Ollama chunks and the final object, and a whole answer's texts and tool
calls gathered (:class:`Gathered`: tool calls folded by the one rule of ``core.ToolCalls``, their
``arguments`` parsed from the JSON string to a value, kept as the string when it is not JSON).
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from nvpair_tw.core import ToolCalls
from nvpair_tw.dialects._common import AnswerTooLarge, dump

__all__ = [
    "Gathered",
    "OllamaRoute",
    "OpenAIRoute",
    "as_deltas",
    "calls_chunk",
    "choice_parts",
    "content_chunk",
    "final_object",
]


class OllamaRoute(Enum):
    """The Ollama answer the client asked for: chat chunks carry a ``message``, generate chunks
    a ``response``."""

    CHAT = "/api/chat"
    GENERATE = "/api/generate"


class OpenAIRoute(Enum):
    """The OpenAI-compatible route the node answers: chat choices carry a ``delta`` (or a
    ``message``), completions choices a ``text``."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


class Gathered:
    """The texts (a whole answer's) and the tool calls of an answer, capped at ``limit``
    characters together; the calls are folded by the one rule (``core.ToolCalls``)."""

    __slots__ = ("_calls", "_held", "_limit", "texts")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.texts: dict[str, list[str]] = {}
        self._held = 0
        self._calls = ToolCalls()

    @property
    def has_calls(self) -> bool:
        """Whether tool call fragments were gathered since the last :meth:`take_calls`."""
        return bool(self._calls)

    def keep(self, key: str, text: str) -> None:
        self._held += len(text)
        self._check()
        self.texts.setdefault(key, []).append(text)

    def gather(self, fragments: list[Any]) -> None:
        before = self._calls.size
        self._calls.add(fragments)
        self._held += self._calls.size - before
        self._check()

    def take_calls(self) -> list[dict[str, Any]]:
        """The tool calls gathered, whole and in ``index`` order, each ``arguments`` parsed from
        its JSON text (kept as the text when it is not JSON); forgotten here."""
        return [_ollama_call(index, call) for index, call in self._calls.take()]

    def _check(self) -> None:
        if self._held > self._limit:
            raise AnswerTooLarge(f"the assembled answer passed {self._limit} characters")


def _ollama_call(index: int, call: dict[str, Any]) -> dict[str, Any]:
    """One folded OpenAI call as Ollama's: its ``arguments`` a value, ``index`` in its function."""
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name")
    raw = function.get("arguments")
    arguments: Any = raw
    if not isinstance(raw, dict):
        text = raw if isinstance(raw, str) else ""
        try:
            arguments = json.loads(text) if text.strip() else {}
        except ValueError:
            arguments = text
    out = {"index": index, "name": name if isinstance(name, str) else "", "arguments": arguments}
    ident = call.get("id")
    return {"id": ident, "function": out} if isinstance(ident, str) and ident else {"function": out}


def choice_parts(
    choice: dict[str, Any], answered: OpenAIRoute
) -> tuple[str | None, str | None, Any]:
    """A choice's content text and thinking (None when absent or empty) and its tool calls, as
    the route ``answered`` puts them."""
    if answered is OpenAIRoute.COMPLETIONS:
        content, thinking, calls = choice.get("text"), None, None
    else:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        content = delta.get("content")
        thinking = delta.get("reasoning_content") or delta.get("reasoning")
        calls = delta.get("tool_calls")
    text = content if isinstance(content, str) and content else None
    thought = thinking if isinstance(thinking, str) and thinking else None
    return text, thought, calls


def content_chunk(
    model: str, stamp: str, text: str | None, thought: str | None, asked: OllamaRoute
) -> bytes:
    """The NDJSON line of one content (or thinking) delta, in the answer ``asked``."""
    body: dict[str, Any] = {"role": "assistant", "content": text or ""}
    if thought is not None:
        body["thinking"] = thought
    if asked is OllamaRoute.GENERATE:
        chunk: dict[str, Any] = {
            "model": model,
            "created_at": stamp,
            "response": text or "",
        }
        if thought is not None:
            chunk["thinking"] = thought
    else:
        chunk = {"model": model, "created_at": stamp, "message": body}
    chunk["done"] = False
    return dump(chunk) + b"\n"


def calls_chunk(model: str, stamp: str, calls: list[dict[str, Any]]) -> bytes:
    """The NDJSON line of the whole tool calls."""
    message = {"role": "assistant", "content": "", "tool_calls": calls}
    return dump({"model": model, "created_at": stamp, "message": message, "done": False}) + b"\n"


def final_object(
    model: str,
    stamp: str,
    texts: dict[str, str],
    calls: list[dict[str, Any]],
    asked: OllamaRoute,
    *,
    reason: Any,
    tokens: tuple[int | None, int | None],
    durations: tuple[int, int, int],
) -> dict[str, Any]:
    """The final object (``done: true``) of the answer ``asked``; ``durations`` are the total, prompt evaluation and
    evaluation ones in nanoseconds, ``tokens`` the prompt and completion counts."""
    final: dict[str, Any] = {"model": model, "created_at": stamp}
    if asked is OllamaRoute.GENERATE:
        final["response"] = texts.get("content", "")
        if texts.get("thinking"):
            final["thinking"] = texts["thinking"]
    else:
        message: dict[str, Any] = {"role": "assistant", "content": texts.get("content", "")}
        if texts.get("thinking"):
            message["thinking"] = texts["thinking"]
        if calls:
            message["tool_calls"] = calls
        final["message"] = message
    final["done_reason"] = "length" if reason == "length" else "stop"
    final["done"] = True
    prompt, completion = tokens
    total, prompt_eval, evaluation = durations
    final["total_duration"] = total
    if prompt is not None:
        final["prompt_eval_count"] = prompt
    final["prompt_eval_duration"] = prompt_eval
    if completion is not None:
        final["eval_count"] = completion
    final["eval_duration"] = evaluation
    return final


def as_deltas(doc: dict[str, Any]) -> dict[str, Any]:
    """A whole ``chat.completion`` (or ``text_completion``) answer with each choice's
    ``message`` as its ``delta``."""
    choices = doc.get("choices")
    if isinstance(choices, list):
        delta_choices = []
        for choice in choices:
            if isinstance(choice, dict):
                message = choice.get("message")
                delta = {"delta": message} if isinstance(message, dict) else {}
                delta_choices.append({**choice, **delta})
        doc = {**doc, "choices": delta_choices}
    return doc
