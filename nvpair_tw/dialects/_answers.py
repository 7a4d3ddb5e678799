# -*- test-case-name: tests.dialects.test_answers -*-
"""OpenAI-compatible answers as the client's dialect: one transducer per kind of answer.

- :class:`OllamaStream`: a chat (or completions) SSE stream as Ollama's ``/api/chat`` or
  ``/api/generate`` NDJSON chunks, or, for ``"stream": false``, as the one whole Ollama object
  at :meth:`~OllamaStream.end`. Each content delta becomes a chunk ``{"model", "created_at",
  "message": {"role": "assistant", "content"}, "done": false}`` (generate: ``"response"``
  instead of ``"message"``); ``reasoning_content`` (or ``reasoning``) becomes ``thinking``; tool
  calls are gathered by ``index`` and emitted whole, their ``arguments`` parsed from the JSON
  string to a value (kept as the string when it is not JSON), in one chunk when the
  ``finish_reason`` (or ``[DONE]``) arrives; at ``data: [DONE]`` the final object: ``done_reason``
  (``"length"`` for ``length``, else ``"stop"``, ``tool_calls`` included), ``done: true``,
  ``total_duration`` (answer creation to ``[DONE]``), ``prompt_eval_count`` and ``eval_count``
  (from ``usage``; absent when the node sent none), ``prompt_eval_duration`` (creation to the first
  content) and ``eval_duration`` (first to last content), in nanoseconds of the injected clock;
  ``load_duration`` is unknown and absent. ``created_at`` is the clock (seconds since the epoch)
  in RFC 3339 UTC with nanoseconds; the content events of one upstream read arrived together and
  share one clock reading (one ``created_at``). An error event ``data: {"error": …}`` becomes
  ``{"error": "<message>"}`` and ends the answer (a whole answer then has :attr:`status` 500). A
  node that answered a whole ``chat.completion`` JSON document although asked to stream is
  translated the same way at the end.
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
import re
from collections.abc import Callable
from typing import Any

from nvpair_tw.dialects._common import (
    JSON_TYPE,
    NDJSON_TYPE,
    AnswerTooLarge,
    MalformedAnswer,
    SseEvents,
    Stamp,
    StreamCut,
    dump,
    media_type,
)
from nvpair_tw.dialects._rename import Identity, Renamer

__all__ = [
    "EmbedAnswer",
    "ErrorAnswer",
    "OllamaStream",
    "V0Stream",
    "V0Whole",
    "content_literal",
    "error_message",
]

_CHOICE_DELTA = b'"choices":[{"index":0,"delta":{'
_ROLE = b'"role":"assistant",'
_CONTENT = b'"content":"'
_REST = b'},"finish_reason":null}]}'
_REST_LOGPROBS = b'},"logprobs":null,"finish_reason":null}]}'


def content_literal(event: bytes) -> bytes | None:
    """The JSON string literal of the content, when ``event`` holds nothing but one non-empty
    content delta of choice 0 in the member order Ollama, vLLM and LM Studio send
    (``{<members without objects>,"choices":[{"index":0,"delta":{["role":"assistant",]"content":
    "…"}[,"logprobs":null],"finish_reason":null}]}``); else None (and the event is parsed). The
    literal is copied into the Ollama chunk as it is: JSON escapes are the same in both."""
    at = event.find(_CHOICE_DELTA)
    if at < 0:
        return None
    start = at + 31
    if event.startswith(_ROLE, start):
        start += 19
    if not event.startswith(_CONTENT, start):
        return None
    start += 10  # the opening quote
    end = start + 1
    while True:
        end = event.find(b'"', end)
        if end < 0:
            return None
        back = end - 1
        while event[back] == 92:  # a backslash
            back -= 1
        if (end - 1 - back) % 2 == 0:
            break
        end += 1
    rest = len(event) - end - 1
    if end == start + 1 or not (
        (rest == len(_REST) and event.endswith(_REST))
        or (rest == len(_REST_LOGPROBS) and event.endswith(_REST_LOGPROBS))
    ):
        return None
    # the members before "choices" hold no object (no usage, no error): "{" only at the start
    if event.find(b"{", 1, at) >= 0:
        return None
    return event[start : end + 1]


# One whole one-line SSE event that content_literal() copies (the same shape: members without
# objects before "choices", choice 0's delta with an optional role and a non-empty content string,
# an optional null logprobs, a null finish_reason, nothing after): group 1 is the content literal.
# No newline or CR inside, so a run of these is a run of whole events, each "data: …\n\n".
_EVENT = (
    rb'data: \{[^{\n\r]*"choices":\[\{"index":0,"delta":\{(?:"role":"assistant",)?"content":'
    rb'("(?:[^"\\\n\r]|\\[^\n\r])+")\}(?:,"logprobs":null)?,"finish_reason":null\}\]\}\n\n'
)
_EVENTS = re.compile(_EVENT)
_RUN = re.compile(rb"(?:" + _EVENT + rb")+")
# The body of a non-empty JSON string with escapes (no unescaped quote, no lone last backslash).
_BODY = re.compile(rb'(?:[^"\\\n\r]|\\[^\n\r])+')

_NS = 1e9


def error_message(error: Any) -> str:
    """The message of an OpenAI ``error`` value (an object with ``message``, or a string)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return dump(error).decode("utf-8")


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise MalformedAnswer(f"{what} is not JSON") from error
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{what} is not a JSON object")
    return value


class _Buffer:
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


class OllamaStream:
    """An OpenAI SSE stream (``/v1/chat/completions`` or ``/v1/completions``) as Ollama's chat
    or generate answer; see the module docstring for every field.

    :ivar content_type: ``application/x-ndjson`` for a stream, JSON for a whole answer.
    :ivar status: the whole answer's status (500 after an error event), else 200.
    """

    def __init__(
        self,
        client_model: str,
        clock: Callable[[], float],
        *,
        generate: bool,
        completions: bool,
        whole: bool,
        upstream_json: bool = False,
        limit: int = 8 << 20,
    ) -> None:
        self.content_type = JSON_TYPE if whole else NDJSON_TYPE
        self.status = 200
        self._model = client_model
        self._clock = clock
        self._stamp = Stamp(clock)
        self._start = clock()
        self._generate = generate
        self._completions = completions
        self._whole = whole
        self._limit = limit
        self._events = SseEvents(limit)
        self._json = _Buffer(limit) if upstream_json else None
        self._first: float | None = None
        self._last = 0.0
        self._texts: dict[str, list[str]] = {}
        self._held = 0
        self._calls: dict[int, dict[str, Any]] = {}
        self._emitted_calls: list[dict[str, Any]] = []
        self._reason: Any = None
        self._prompt: int | None = None
        self._completion: int | None = None
        self._finished = False
        self._answer = b""
        # the plain content event's bytes around its content, learned from the stream (_learn)
        self._prefix = self._suffix = self._sep = b""
        self._quotes = 0
        model = json.dumps(client_model, ensure_ascii=False).encode("utf-8")
        self._head = b'{"model":' + model + b',"created_at":"'
        if generate:
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
                when, stamp = self._stamp.now()
                if self._first is None:
                    self._first = when
                self._last = when
                if self._whole:
                    self._keep("content", json.loads(literal))
                    return b""
                return b"".join((self._head, stamp.encode(), self._mid, literal, self._end))
        if self._completions:
            return self._split(data)
        head = b""
        if not self._events.idle:
            # the previous read ended inside an event: finish it, then look for a run again
            cut = data.find(b"\n\n") + 2
            if cut < 2:
                return self._split(data)
            head = self._split(data[:cut])
            data = data[cut:]
            if not data or self._finished:
                return head
            if not self._events.idle:
                return head + self._split(data)
        if data.startswith(b"data: {"):
            # a read of many events: a run of whole plain content events in one pass
            end, bodies = self._learned_run(data)
            if bodies is not None:
                out = self._run(bodies)
            else:
                run = _RUN.match(data)
                if run is None:
                    return head + self._split(data) if head else self._split(data)
                end = run.end()
                out = self._run([b[1:-1] for b in _EVENTS.findall(data, 0, end)])
                self._learn(data)
            if end < len(data):
                out += self._split(data[end:])
            return head + out if head else out
        return head + self._split(data) if head else self._split(data)

    def _learn(self, data: bytes) -> None:
        """The bytes around the content of the plain event that starts ``data``: engines repeat
        them in every event of a stream (id, object, created, model; the rest of the choice)."""
        event = _EVENTS.match(data)
        if event is not None:
            start, end = event.span(1)
            prefix, suffix = data[: start + 1], data[end - 1 : event.end()]
            self._prefix, self._suffix, self._sep = prefix, suffix, suffix + prefix
            self._quotes = prefix.count(b'"') + suffix.count(b'"')

    def _learned_run(self, data: bytes) -> tuple[int, list[bytes] | None]:
        """The content string bodies (without their quotes) of the run of events that starts
        ``data`` when every one of them is the learned prefix, a non-empty JSON string body and
        the learned suffix (so each is an event :func:`content_literal` copies); with the end
        of the run. Splitting and counting only (no regular expression over the events): every
        newline is an event's end, every quote is the prefix's or the suffix's (or escaped, in
        a body checked on its own)."""
        prefix, suffix = self._prefix, self._suffix
        if not prefix or not data.startswith(prefix):
            return 0, None
        end = len(data)
        size = len(prefix)
        if data.endswith(suffix) and data.count(b"\n") == 2:
            # one event (what most engines send per read): no search for the separator, whose
            # set-up alone costs more than the event
            if end < size + len(suffix) or data.find(b"\r") >= 0:
                return 0, None
            bodies = [data[size : end - len(suffix)]]
        else:
            if not data.endswith(suffix):
                # a read that ends inside an event, or with other events (finish, usage, [DONE])
                end = data.rfind(suffix) + len(suffix)
                if end < len(suffix):
                    return 0, None
            # (bytes.split with the long prefix + suffix separator is slow: split at each
            # suffix, then check that every suffix but the last is followed by the prefix)
            events = data[:end].split(suffix)
            events.pop()  # the empty rest after the last suffix
            count = len(events)
            if (
                data.count(b"\n", 0, end) != 2 * count
                or data.find(b"\r", 0, end) >= 0
                or data.count(self._sep, 0, end) != count - 1
            ):
                return 0, None
            bodies = [event[size:] for event in events]
        count = len(bodies)
        quotes = data.count(b'"', 0, end)
        if data.find(b"\\", 0, end) >= 0:
            for body in bodies:
                if b"\\" in body:
                    if _BODY.fullmatch(body) is None:
                        return 0, None
                    quotes -= body.count(b'"')
        if quotes != count * self._quotes or b"" in bodies:
            return 0, None
        return end, bodies

    def _run(self, bodies: list[bytes]) -> bytes:
        """Content events read at once, given as their content string bodies: one clock reading
        and one ``created_at`` for all of them (they arrived together)."""
        when, stamp = self._stamp.now()
        if self._first is None:
            self._first = when
        self._last = when
        if self._whole:
            for body in bodies:
                self._keep("content", json.loads(b'"' + body + b'"'))
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
                self._literal(literal, out)
            else:
                self._event(event, out)
                if self._finished:
                    break
        return out[0] if len(out) == 1 else b"".join(out)

    def end(self) -> bytes:
        out: list[bytes] = []
        if not self._finished:
            if self._json is not None:
                self._whole_document(_parse(self._json.bytes(), "the answer"), out)
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

    # ---------------------------------------------------------------------------------- events

    def _literal(self, literal: bytes, out: list[bytes]) -> None:
        """A content delta whose JSON string literal is ``literal`` (the fast path)."""
        when, stamp = self._stamp.now()
        if self._first is None:
            self._first = when
        self._last = when
        if self._whole:
            self._keep("content", json.loads(literal))
        else:
            out.append(b"".join((self._head, stamp.encode(), self._mid, literal, self._end)))

    def _event(self, event: bytes, out: list[bytes]) -> None:
        if event.strip() == b"[DONE]":
            self._done(out)
            return
        obj = _parse(event, "an event")
        if "error" in obj:
            self._error(obj["error"], out)
            return
        self._fold(obj, out)

    def _fold(self, obj: dict[str, Any], out: list[bytes]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._prompt = _number(usage.get("prompt_tokens"))
            self._completion = _number(usage.get("completion_tokens"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        choice = next(
            (c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), choices[0]
        )
        if not isinstance(choice, dict):
            raise MalformedAnswer("a choice is not an object")
        if self._completions:
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
        if text is not None or thought is not None:
            self._content(text, thought, out)
        if isinstance(calls, list) and calls:
            self._gather(calls)
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
                self._keep("content", text)
            if thought is not None:
                self._keep("thinking", thought)
            return
        body: dict[str, Any] = {"role": "assistant", "content": text or ""}
        if thought is not None:
            body["thinking"] = thought
        if self._generate:
            chunk: dict[str, Any] = {
                "model": self._model,
                "created_at": stamp,
                "response": text or "",
            }
            if thought is not None:
                chunk["thinking"] = thought
        else:
            chunk = {"model": self._model, "created_at": stamp, "message": body}
        chunk["done"] = False
        out.append(dump(chunk) + b"\n")

    def _keep(self, key: str, text: str) -> None:
        self._held += len(text)
        if self._held > self._limit:
            raise AnswerTooLarge(f"the assembled answer passed {self._limit} characters")
        self._texts.setdefault(key, []).append(text)

    def _gather(self, fragments: list[Any]) -> None:
        for position, fragment in enumerate(fragments):
            if not isinstance(fragment, dict):
                raise MalformedAnswer("a tool call is not an object")
            index = fragment.get("index")
            if not isinstance(index, int):
                index = position
            call = self._calls.setdefault(index, {"id": None, "name": [], "arguments": []})
            if isinstance(fragment.get("id"), str) and fragment["id"]:
                call["id"] = fragment["id"]
            function = fragment.get("function")
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    part = function.get(key)
                    if isinstance(part, str):
                        call[key].append(part)
                        self._held += len(part)
                    elif isinstance(part, dict) and key == "arguments":
                        call[key].append(json.dumps(part))
            if self._held > self._limit:
                raise AnswerTooLarge(f"the assembled answer passed {self._limit} characters")

    def _flush_calls(self, out: list[bytes]) -> None:
        if not self._calls or self._generate:
            return
        calls = []
        for index, call in sorted(self._calls.items()):
            text = "".join(call["arguments"])
            try:
                arguments: Any = json.loads(text) if text.strip() else {}
            except ValueError:
                arguments = text
            function = {"index": index, "name": "".join(call["name"]), "arguments": arguments}
            calls.append(
                {"id": call["id"], "function": function} if call["id"] else {"function": function}
            )
        self._calls.clear()
        if self._whole:
            self._emitted_calls.extend(calls)
            return
        _, stamp = self._stamp.now()
        message = {"role": "assistant", "content": "", "tool_calls": calls}
        out.append(
            dump({"model": self._model, "created_at": stamp, "message": message, "done": False})
            + b"\n"
        )

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
        final: dict[str, Any] = {"model": self._model, "created_at": stamp}
        texts = {key: "".join(parts) for key, parts in self._texts.items()}
        if self._generate:
            final["response"] = texts.get("content", "")
            if texts.get("thinking"):
                final["thinking"] = texts["thinking"]
        else:
            message: dict[str, Any] = {"role": "assistant", "content": texts.get("content", "")}
            if texts.get("thinking"):
                message["thinking"] = texts["thinking"]
            if self._emitted_calls:
                message["tool_calls"] = self._emitted_calls
            final["message"] = message
        final["done_reason"] = "length" if self._reason == "length" else "stop"
        final["done"] = True
        final["total_duration"] = round((now - self._start) * _NS)
        if self._prompt is not None:
            final["prompt_eval_count"] = self._prompt
        final["prompt_eval_duration"] = round((first - self._start) * _NS)
        if self._completion is not None:
            final["eval_count"] = self._completion
        final["eval_duration"] = round((self._last - first) * _NS) if self._first else 0
        if self._whole:
            self._answer = dump(final)
        else:
            out.append(dump(final) + b"\n")

    def _whole_document(self, doc: dict[str, Any], out: list[bytes]) -> None:
        """A whole ``chat.completion`` (or ``text_completion``) answer, as one delta."""
        if "error" in doc:
            self._error(doc["error"], out)
            return
        choices = doc.get("choices")
        if isinstance(choices, list):
            delta_choices = []
            for choice in choices:
                if isinstance(choice, dict):
                    message = choice.get("message")
                    delta = {"delta": message} if isinstance(message, dict) else {}
                    delta_choices.append({**choice, **delta})
            doc = {**doc, "choices": delta_choices}
        self._fold(doc, out)
        self._done(out)


class EmbedAnswer:
    """``/v1/embeddings`` as Ollama's ``/api/embed`` or legacy ``/api/embeddings`` answer."""

    content_type = JSON_TYPE

    def __init__(
        self, client_model: str, clock: Callable[[], float], *, legacy: bool, limit: int
    ) -> None:
        self._model = client_model
        self._clock = clock
        self._start = clock()
        self._legacy = legacy
        self._buffer = _Buffer(limit)
        self._prompt: int | None = None

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (self._prompt, None)

    def feed(self, data: bytes) -> bytes:
        self._buffer.add(data)
        return b""

    def end(self) -> bytes:
        doc = _parse(self._buffer.bytes(), "the embeddings answer")
        data = doc.get("data")
        if not isinstance(data, list) or not all(
            isinstance(item, dict) and isinstance(item.get("embedding"), list) for item in data
        ):
            raise MalformedAnswer("the embeddings answer has no data list of embeddings")
        ordered = sorted(
            enumerate(data), key=lambda pair: (_number(pair[1].get("index")) or 0, pair[0])
        )
        vectors = [item["embedding"] for _, item in ordered]
        if self._legacy:
            return dump({"embedding": vectors[0] if vectors else []})
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self._prompt = _number(usage.get("prompt_tokens"))
        answer: dict[str, Any] = {
            "model": self._model,
            "embeddings": vectors,
            "total_duration": round((self._clock() - self._start) * _NS),
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
        self._buffer = _Buffer(limit)
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
        doc = _parse(self._buffer.bytes(), "the answer")
        first = self._first if self._first is not None else now
        if "model" in doc:
            doc["model"] = self._model
        usage = doc.get("usage")
        completion = None
        if isinstance(usage, dict):
            completion = _number(usage.get("completion_tokens"))
            self._tokens = (_number(usage.get("prompt_tokens")), completion)
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

    def __init__(self, content_type: bytes | None, *, ollama: bool, limit: int) -> None:
        self._ollama = ollama
        self.content_type = content_type if content_type is not None else JSON_TYPE
        self._buffer = _Buffer(limit)

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
