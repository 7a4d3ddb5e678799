# -*- test-case-name: tests.assembly.test_whole -*-
"""Folding an Ollama NDJSON stream (``/api/chat``, ``/api/generate``) into its answer."""

from __future__ import annotations

from typing import Any

from attrs import define, field

from nvpair_tw.assembly._frames import (
    Assembled,
    Dialect,
    Tally,
    Text,
    dump,
    insert_after,
    parse_object,
)

__all__ = ["OllamaFolder"]


@define
class OllamaFolder:
    """Folds NDJSON lines: the message (or response) text and thinking grow, tool calls gather,
    and the ``"done": true`` object, with the text put back, is the answer."""

    dialect: Dialect
    tally: Tally
    _texts: dict[str, Text] = field(factory=dict, init=False, repr=False)
    _tool_calls: list[Any] = field(factory=list, init=False, repr=False)

    def frame(self, line: bytes) -> Assembled | None:
        """Fold one line (without its line end); the answer once it is the terminal object."""
        if line.strip():
            return self._fold(parse_object(line))
        return None

    def _fold(self, obj: dict[str, Any]) -> Assembled | None:
        if "error" in obj and obj.get("done") is not True:
            return Assembled(500, dump({"error": obj["error"]}))
        if self.dialect is Dialect.OLLAMA_CHAT:
            message = obj.get("message")
            if isinstance(message, dict):
                self.tally.grow(self._texts, "content", message.get("content"))
                self.tally.grow(self._texts, "thinking", message.get("thinking"))
                calls = message.get("tool_calls")
                if isinstance(calls, list) and calls:
                    self._tool_calls.extend(calls)
                    self.tally.held += len(dump(calls))
                    self.tally.check()
        else:
            self.tally.grow(self._texts, "response", obj.get("response"))
            self.tally.grow(self._texts, "thinking", obj.get("thinking"))
        if obj.get("done") is True:
            return Assembled(200, dump(self._answer(obj)))
        return None

    def _answer(self, final: dict[str, Any]) -> dict[str, Any]:
        texts = {key: parts.text() for key, parts in self._texts.items()}
        if self.dialect is Dialect.OLLAMA_GENERATE:
            answer = {**final, "response": texts.get("response", "")}
            if texts.get("thinking"):
                answer = insert_after(answer, "response", "thinking", texts["thinking"])
            return answer
        message = final.get("message")
        message = dict(message) if isinstance(message, dict) else {"role": "assistant"}
        message["content"] = texts.get("content", "")
        if texts.get("thinking"):
            message = insert_after(message, "content", "thinking", texts["thinking"])
        if self._tool_calls:
            message["tool_calls"] = self._tool_calls
        return {**final, "message": message}
