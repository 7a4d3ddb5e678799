# -*- test-case-name: tests.assembly.test_whole -*-
"""Folding an OpenAI server-sent-event stream (``/v1/chat/completions``, ``/v1/completions``)
into its answer: the events, the per-choice fold, and the answer built from the choices."""

from __future__ import annotations

from typing import Any

from attrs import define, field

from nvpair_tw.assembly._frames import (
    Assembled,
    Dialect,
    MalformedStream,
    Tally,
    Text,
    dump,
    parse_object,
)
from nvpair_tw.core import ToolCalls

__all__ = ["Choice", "OpenAIFolder"]


@define
class Choice:
    """One OpenAI choice being assembled (by ``index``)."""

    template: dict[str, Any]
    texts: dict[str, Text] = field(factory=dict)
    nulls: set[str] = field(factory=set)
    others: dict[str, Any] = field(factory=dict)
    tools: ToolCalls = field(factory=ToolCalls)
    finish_reason: Any = None
    logprobs: Any = None
    logprobs_seen: bool = False


@define
class OpenAIFolder:
    """Folds SSE events (their data, gathered by the core framer): each event's chunk grows the
    choices; ``data: [DONE]`` makes the answer (an error event, a 500)."""

    dialect: Dialect
    tally: Tally
    _top: dict[str, Any] = field(factory=dict, init=False, repr=False)
    _choices: dict[int, Choice] = field(factory=dict, init=False, repr=False)
    _usage: Any = field(default=None, init=False, repr=False)

    def frame(self, data: bytes) -> Assembled | None:
        """Fold one event's data; the answer once it is the terminal event."""
        if data.strip() == b"[DONE]":
            return Assembled(200, dump(self._answer()))
        obj = parse_object(data)
        if "error" in obj:
            return Assembled(500, dump({"error": obj["error"]}))
        for key, value in obj.items():
            if key == "usage":
                self._top.setdefault(key, None)  # a place in the engine's field order
                if isinstance(value, dict):
                    self._usage = value
            elif key == "choices":
                self._top.setdefault(key, None)
            else:
                self._top[key] = value
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return None
        for position, fragment in enumerate(choices):
            if not isinstance(fragment, dict):
                raise MalformedStream("a choice is not an object")
            index = fragment.get("index", position)
            if not isinstance(index, int):
                raise MalformedStream("a choice index is not an integer")
            choice = self._choices.get(index)
            if choice is None:
                choice = self._choices[index] = Choice(fragment)
            self._fold_choice(choice, fragment)
        return None

    def _fold_choice(self, choice: Choice, fragment: dict[str, Any]) -> None:
        if fragment.get("finish_reason") is not None:
            choice.finish_reason = fragment["finish_reason"]
        if "logprobs" in fragment:
            choice.logprobs_seen = True
            _fold_logprobs(self.tally, choice, fragment["logprobs"])
        if self.dialect is Dialect.OPENAI_COMPLETIONS:
            self.tally.grow(choice.texts, "text", fragment.get("text"))
            return
        delta = fragment.get("delta")
        if not isinstance(delta, dict):
            return
        for key, value in delta.items():
            if key == "tool_calls":
                if isinstance(value, list):
                    _fold_tool_calls(self.tally, choice, value)
            elif key == "role":
                if value:
                    choice.others["role"] = value
            elif isinstance(value, str):
                self.tally.grow(choice.texts, key, value)
                choice.texts.setdefault(key, Text())
            elif value is None:
                choice.nulls.add(key)
            else:
                choice.others[key] = value

    def _answer(self) -> dict[str, Any]:
        chat = self.dialect is Dialect.OPENAI_CHAT
        choices = [_choice_answer(c, chat) for _, c in sorted(self._choices.items())]
        kind = "chat.completion" if chat else "text_completion"
        answer: dict[str, Any] = {}
        for key, value in self._top.items():
            if key == "object":
                answer[key] = kind
            elif key == "choices":
                answer[key] = choices
            elif key == "usage":
                if self._usage is not None:
                    answer[key] = self._usage
            else:
                answer[key] = value
        answer.setdefault("object", kind)
        answer.setdefault("choices", choices)
        if self._usage is not None:
            answer.setdefault("usage", self._usage)
        return answer


def _fold_logprobs(tally: Tally, choice: Choice, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        choice.logprobs = value
        return
    if not isinstance(choice.logprobs, dict):
        choice.logprobs = {}
    for key, item in value.items():
        if isinstance(item, list):
            kept = choice.logprobs.get(key)
            choice.logprobs[key] = (kept if isinstance(kept, list) else []) + item
            tally.held += len(dump(item))
            tally.check()
        else:
            choice.logprobs[key] = item


def _fold_tool_calls(tally: Tally, choice: Choice, fragments: list[Any]) -> None:
    """The fragments folded by the one rule (``core.ToolCalls``), their text counted."""
    before = choice.tools.size
    choice.tools.add(fragments)
    tally.held += choice.tools.size - before
    tally.check()


def _choice_answer(choice: Choice, chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in choice.template:
        if key == "delta":
            out["message"] = _message(choice)
        elif key == "text":
            out["text"] = choice.texts.get("text", Text()).text()
        elif key == "finish_reason":
            out[key] = choice.finish_reason
        elif key == "logprobs":
            out[key] = choice.logprobs
        else:
            out[key] = choice.template[key]
    if chat and "message" not in out:
        out["message"] = _message(choice)
    if not chat and "text" not in out:
        out["text"] = choice.texts.get("text", Text()).text()
    out.setdefault("finish_reason", choice.finish_reason)
    if choice.logprobs_seen:
        out.setdefault("logprobs", choice.logprobs)
    return out


def _message(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": choice.others.get("role", "assistant")}
    for key in ("content", *choice.texts, *sorted(choice.nulls)):
        if key in message:
            continue
        if key in choice.texts:
            message[key] = choice.texts[key].text()
        elif key in choice.nulls or key == "content":
            message[key] = None
    for key, value in choice.others.items():
        message.setdefault(key, value)
    if choice.tools:
        message["tool_calls"] = [call for _, call in choice.tools.calls()]
    return message
