# -*- test-case-name: tests.dialects.test_answers -*-
"""An OpenAI-compatible chat or completions stream as the Ollama client's answer.

:class:`OllamaStream`: a chat (or completions) SSE stream as Ollama's ``/api/chat`` or
``/api/generate`` NDJSON chunks, or, for ``"stream": false``, as the one whole Ollama object at
:meth:`~OllamaStream.end`. Each content delta becomes a chunk ``{"model", "created_at",
"message": {"role": "assistant", "content"}, "done": false}`` (generate: ``"response"`` instead
of ``"message"``); ``reasoning_content`` (or ``reasoning``) becomes ``thinking``; tool calls are
gathered by ``index`` and emitted whole, their ``arguments`` parsed from the JSON string to a
value (kept as the string when it is not JSON), in one chunk when the ``finish_reason`` (or
``[DONE]``) arrives; at ``data: [DONE]`` the final object: ``done_reason`` (``"length"`` for
``length``, else ``"stop"``, ``tool_calls`` included), ``done: true``, ``total_duration``
(answer creation to ``[DONE]``), ``prompt_eval_count`` and ``eval_count`` (from ``usage``;
absent when the node sent none), ``prompt_eval_duration`` (creation to the first content) and
``eval_duration`` (first to last content), in nanoseconds of the injected clock;
``load_duration`` is unknown and absent. ``created_at`` is the clock (seconds since the epoch) in
RFC 3339 UTC with nanoseconds; the content events of one upstream read arrived together and
share one clock reading (one ``created_at``). An error event ``data: {"error": …}`` becomes
``{"error": "<message>"}`` and ends the answer (a whole answer then has :attr:`status` 500). A
node that answered a whole ``chat.completion`` JSON document although asked to stream is
translated the same way at the end.

Plain content events take a fast path (``_ollama_fast``): their content literal is copied into
the chunk without parsing the event. The chunks, the final object and the tool calls gathered are
built in ``_ollama_fold``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import Any

from attrs import frozen

from nvpair_tw.core import event_end
from nvpair_tw.dialects._answers import NS, Buffer, error_message, number, parse
from nvpair_tw.dialects._common import (
    JSON_TYPE,
    NDJSON_TYPE,
    MalformedAnswer,
    SseEvents,
    Stamp,
    StreamCut,
    dump,
)
from nvpair_tw.dialects._ollama_fast import Learned, content_literal, matched_run
from nvpair_tw.dialects._ollama_fold import (
    Gathered,
    OllamaRoute,
    OpenAIRoute,
    as_deltas,
    calls_chunk,
    choice_parts,
    content_chunk,
    final_object,
)

__all__ = ["Framing", "OllamaRoute", "OllamaStream", "OpenAIRoute", "StreamShape", "UpstreamBody"]


class Framing(Enum):
    """How the client's answer is framed: NDJSON chunks, or the one whole object at the end
    (``"stream": false``)."""

    STREAM = "stream"
    WHOLE = "whole"


class UpstreamBody(Enum):
    """What the node sent: the SSE stream it was asked for, or one whole JSON document."""

    SSE = "sse"
    JSON = "json"


@frozen
class StreamShape:
    """What an :class:`OllamaStream` turns into what."""

    asked: OllamaRoute
    answered: OpenAIRoute
    framing: Framing
    body: UpstreamBody = UpstreamBody.SSE


class _Events:
    """The answer event by event (parsed): content, tool calls, usage, errors and the end; the
    state :class:`OllamaStream` shares with it."""

    def __init__(
        self,
        client_model: str,
        clock: Callable[[], float],
        shape: StreamShape,
        *,
        limit: int,
    ) -> None:
        whole = shape.framing is Framing.WHOLE
        self.content_type = JSON_TYPE if whole else NDJSON_TYPE
        self.status = 200
        self._model = client_model
        self._clock = clock
        self._stamp = Stamp(clock)
        self._start = clock()
        self._asked = shape.asked
        self._answered = shape.answered
        self._completions = shape.answered is OpenAIRoute.COMPLETIONS  # read per chunk
        self._whole = whole
        self._limit = limit
        self._gathered = Gathered(limit)
        self._first: float | None = None
        self._last = 0.0
        self._emitted_calls: list[dict[str, Any]] = []
        self._reason: Any = None
        self._prompt: int | None = None
        self._completion: int | None = None
        self._finished = False
        self._answer = b""

    def _event(self, event: bytes, out: list[bytes]) -> None:
        if event.strip() == b"[DONE]":
            self._done(out)
            return
        obj = parse(event, "an event")
        if "error" in obj:
            self._error(obj["error"], out)
            return
        self._fold(obj, out)

    def _fold(self, obj: dict[str, Any], out: list[bytes]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._prompt = number(usage.get("prompt_tokens"))
            self._completion = number(usage.get("completion_tokens"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        choice = next(
            (c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), choices[0]
        )
        if not isinstance(choice, dict):
            raise MalformedAnswer("a choice is not an object")
        text, thought, calls = choice_parts(choice, self._answered)
        if text is not None or thought is not None:
            self._content(text, thought, out)
        if isinstance(calls, list) and calls:
            self._gathered.gather(calls)
        reason = choice.get("finish_reason")
        if reason is not None:
            self._reason = reason
            self._flush_calls(out)

    def _content(self, text: str | None, thought: str | None, out: list[bytes]) -> None:
        when, stamp = self._stamp.now()
        if self._first is None:
            self._first = when
        self._last = when
        if self._whole:
            if text is not None:
                self._gathered.keep("content", text)
            if thought is not None:
                self._gathered.keep("thinking", thought)
            return
        out.append(content_chunk(self._model, stamp, text, thought, self._asked))

    def _flush_calls(self, out: list[bytes]) -> None:
        if not self._gathered.has_calls or self._asked is OllamaRoute.GENERATE:
            return
        calls = self._gathered.take_calls()
        if self._whole:
            self._emitted_calls.extend(calls)
            return
        _, stamp = self._stamp.now()
        out.append(calls_chunk(self._model, stamp, calls))

    def _error(self, error: Any, out: list[bytes]) -> None:
        self._finished = True
        body = dump({"error": error_message(error)})
        if self._whole:
            self.status = 500
            self._answer = body
        else:
            out.append(body + b"\n")

    def _done(self, out: list[bytes]) -> None:
        self._flush_calls(out)
        self._finished = True
        now, stamp = self._stamp.now()
        first = self._first if self._first is not None else now
        texts = {key: "".join(parts) for key, parts in self._gathered.texts.items()}
        durations = (
            round((now - self._start) * NS),
            round((first - self._start) * NS),
            round((self._last - first) * NS) if self._first else 0,
        )
        final = final_object(
            self._model,
            stamp,
            texts,
            self._emitted_calls,
            self._asked,
            reason=self._reason,
            tokens=(self._prompt, self._completion),
            durations=durations,
        )
        if self._whole:
            self._answer = dump(final)
        else:
            out.append(dump(final) + b"\n")

    def _whole_document(self, doc: dict[str, Any], out: list[bytes]) -> None:
        """A whole ``chat.completion`` (or ``text_completion``) answer, as one delta."""
        if "error" in doc:
            self._error(doc["error"], out)
            return
        self._fold(as_deltas(doc), out)
        self._done(out)


class OllamaStream(_Events):
    """An OpenAI SSE stream (``/v1/chat/completions`` or ``/v1/completions``) as Ollama's chat
    or generate answer; see the module docstring for every field.

    :ivar content_type: ``application/x-ndjson`` for a stream, JSON for a whole answer.
    :ivar status: the whole answer's status (500 after an error event), else 200.
    """

    def __init__(
        self,
        client_model: str,
        clock: Callable[[], float],
        shape: StreamShape,
        *,
        limit: int = 8 << 20,
    ) -> None:
        super().__init__(client_model, clock, shape, limit=limit)
        self._events = SseEvents(limit)
        self._json = Buffer(limit) if shape.body is UpstreamBody.JSON else None
        # the plain content event's bytes around its content, learned from the stream
        self._learned = Learned()
        model = json.dumps(client_model, ensure_ascii=False).encode("utf-8")
        self._head = b'{"model":' + model + b',"created_at":"'
        if shape.asked is OllamaRoute.GENERATE:
            self._mid, self._end = b'","response":', b',"done":false}\n'
        else:
            self._mid = b'","message":{"role":"assistant","content":'
            self._end = b'},"done":false}\n'

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens from the ``usage`` chunk, None until then."""
        return (self._prompt, self._completion)

    def feed(self, data: bytes) -> bytes:
        if self._finished:
            return b""
        if self._json is not None:
            self._json.add(data)
            return b""
        if (
            data.startswith(b"data: ")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and self._events.idle
            and not self._completions
            and data[-3] != 13
        ):
            # one whole one-line event, what a paced engine sends per read: no splitting
            literal = content_literal(data[6:-2])
            if literal is not None:
                return self._literal(literal)
        if self._completions:
            return self._split(data)
        head = b""
        if not self._events.idle:
            # the previous read ended inside an event: finish it, then look for a run again
            cut = event_end(data, 0)  # the whole read when it does not end the event
            head = self._split(data[:cut])
            data = data[cut:]
            if not data or self._finished:
                return head
            if not self._events.idle:
                return head + self._split(data)
        if data.startswith(b"data: {"):
            # a read of many events: a run of whole plain content events in one pass
            end, bodies = self._learned.run(data)
            if bodies is not None:
                out = self._run(bodies)
            else:
                matched = matched_run(data)
                if matched is None:
                    return head + self._split(data) if head else self._split(data)
                end, bodies = matched
                out = self._run(bodies)
                self._learned.learn(data)
            if end < len(data):
                out += self._split(data[end:])
            return head + out if head else out
        return head + self._split(data) if head else self._split(data)

    def _run(self, bodies: list[bytes]) -> bytes:
        """Content events read at once, given as their content string bodies: one clock reading
        and one ``created_at`` for all of them (they arrived together)."""
        when, stamp = self._stamp.now()
        if self._first is None:
            self._first = when
        self._last = when
        if self._whole:
            for body in bodies:
                self._gathered.keep("content", json.loads(b'"' + body + b'"'))
            return b""
        head = b"".join((self._head, stamp.encode(), self._mid, b'"'))
        end = b'"' + self._end
        if len(bodies) == 1:
            return b"".join((head, bodies[0], end))
        return b"".join((head, (end + head).join(bodies), end))

    def _split(self, data: bytes) -> bytes:
        """``data`` through the SSE splitter, event by event."""
        events = self._events.feed(data)
        out: list[bytes] = []
        for event in events:
            literal = None if self._completions else content_literal(event)
            if literal is not None:
                out.append(self._literal(literal))
            else:
                self._event(event, out)
                if self._finished:
                    break
        return out[0] if len(out) == 1 else b"".join(out)

    def end(self) -> bytes:
        out: list[bytes] = []
        if not self._finished:
            if self._json is not None:
                self._whole_document(parse(self._json.bytes(), "the answer"), out)
            else:
                for event in self._events.rest():
                    self._event(event, out)
                    if self._finished:
                        break
        if not self._finished:
            raise StreamCut("the upstream stream ended before data: [DONE]")
        if self._whole:
            return self._answer
        return b"".join(out)

    def _literal(self, literal: bytes) -> bytes:
        """A content delta whose JSON string literal is ``literal`` (the fast path): its chunk,
        or nothing for a whole answer."""
        when, stamp = self._stamp.now()
        if self._first is None:
            self._first = when
        self._last = when
        if self._whole:
            self._gathered.keep("content", json.loads(literal))
            return b""
        return b"".join((self._head, stamp.encode(), self._mid, literal, self._end))
