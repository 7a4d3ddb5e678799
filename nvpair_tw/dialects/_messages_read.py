# -*- test-case-name: tests.dialects.test_messages_answer -*-
"""An OpenAI-compatible chat answer read for a Messages client (docs/behaviour.md §17.3): the
upstream SSE events (or one whole ``chat.completion`` document a node sent although asked to
stream) turned into calls of a :class:`Sink`: the answer's start (its id), text, thinking, tool
call fragments, the end (``[DONE]``) and an error event.

Plain content events (nothing but one non-empty content delta of choice 0) are recognised on
their bytes and their JSON string literal handed on without parsing the event
(``_ollama_fast``'s :func:`content_literal`, :func:`matched_run` and :class:`Learned`, the same
fast path the Ollama translation takes).
"""

from __future__ import annotations

from typing import Any, Protocol

from nvpair_tw.dialects._answers import Buffer, error_message, number, parse
from nvpair_tw.dialects._common import MalformedAnswer, SseEvents, StreamCut
from nvpair_tw.dialects._ollama_fast import Learned, content_literal, matched_run
from nvpair_tw.dialects._ollama_fold import OpenAIRoute, as_deltas, choice_parts

__all__ = ["Reader", "Sink"]


class Sink(Protocol):
    """What a :class:`Reader` tells, in the answer's order; each returns the client bytes."""

    def start(self, ident: str | None) -> bytes: ...
    def text(self, text: str) -> bytes: ...
    def literals(self, bodies: list[bytes]) -> bytes:
        """Content text given as JSON string bodies (without their quotes)."""

    def thinking(self, text: str) -> bytes: ...
    def calls(self, fragments: list[Any]) -> bytes: ...
    def done(self, reason: Any, tokens: tuple[int | None, int | None]) -> bytes: ...
    def error(self, message: str) -> bytes: ...


class Reader:
    """Upstream bytes in, :class:`Sink` calls out (see the module docstring)."""

    def __init__(self, sink: Sink, limit: int, upstream_json: Buffer | None) -> None:
        self._sink = sink
        self._events = SseEvents(limit)
        self._json = upstream_json
        self._learned = Learned()
        self.started = False
        self.finished = False
        self._reason: Any = None
        self.prompt: int | None = None
        self.completion: int | None = None

    def feed(self, data: bytes) -> bytes:
        if self.finished:
            return b""
        if self._json is not None:
            self._json.add(data)
            return b""
        head = b""
        if not self._events.idle:
            # the previous read ended inside an event: finish it, then look for a run again
            cut = data.find(b"\n\n") + 2
            if cut < 2:
                return self._split(data)
            head, data = self._split(data[:cut]), data[cut:]
            if not data or self.finished:
                return head
        if self.started and data.startswith(b"data: {"):
            end, bodies = self._learned.run(data)
            if bodies is None:
                matched = matched_run(data)
                if matched is not None:
                    end, bodies = matched
                    self._learned.learn(data)
            if bodies is not None:
                out = head + self._sink.literals(bodies)
                return out + self._split(data[end:]) if end < len(data) else out
        return head + self._split(data)

    def _split(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for event in self._events.feed(data):
            literal = content_literal(event) if self.started else None
            if literal is not None:
                out.append(self._sink.literals([literal[1:-1]]))
            else:
                out.append(self._event(event))
                if self.finished:
                    break
        return b"".join(out)

    def end(self) -> bytes:
        out = b""
        if not self.finished:
            if self._json is not None:
                out = self._document(parse(self._json.bytes(), "the answer"))
            else:
                out = b"".join(self._event(event) for event in self._events.rest())
        if not self.finished:
            raise StreamCut("the upstream stream ended before data: [DONE]")
        return out

    def _event(self, event: bytes) -> bytes:
        if self.finished:
            return b""
        if event.strip() == b"[DONE]":
            return self._done()
        obj = parse(event, "an event")
        if "error" in obj:
            self.finished = True
            return self._sink.error(error_message(obj["error"]))
        return self._fold(obj)

    def _fold(self, obj: dict[str, Any]) -> bytes:
        out = b""
        if not self.started:
            self.started = True
            ident = obj.get("id")
            out = self._sink.start(ident if isinstance(ident, str) and ident else None)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.prompt = number(usage.get("prompt_tokens"))
            self.completion = number(usage.get("completion_tokens"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return out
        choice = next(
            (c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), choices[0]
        )
        if not isinstance(choice, dict):
            raise MalformedAnswer("a choice is not an object")
        text, thought, calls = choice_parts(choice, OpenAIRoute.CHAT)
        if thought is not None:
            out += self._sink.thinking(thought)
        if text is not None:
            out += self._sink.text(text)
        if isinstance(calls, list) and calls:
            out += self._sink.calls(calls)
        reason = choice.get("finish_reason")
        if reason is not None:
            self._reason = reason
        return out

    def _done(self) -> bytes:
        out = b"" if self.started else self._sink.start(None)
        self.started = self.finished = True
        return out + self._sink.done(self._reason, (self.prompt, self.completion))

    def _document(self, doc: dict[str, Any]) -> bytes:
        """A whole ``chat.completion`` answer, as one delta."""
        if "error" in doc:
            self.finished = True
            return self._sink.error(error_message(doc["error"]))
        return self._fold(as_deltas(doc)) + self._done()
