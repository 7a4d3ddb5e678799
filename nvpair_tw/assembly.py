# -*- test-case-name: tests.test_assembly -*-
"""Whole answers assembled from streamed work (docs/behaviour.md §6.5).

A non-streaming inference request is sent upstream as a stream, so headers and body bytes arrive with
the first token and the deadlines measure time to first token; the proxy folds the stream back into
the single JSON answer the client asked for. Three parts, the first two pure:

- :func:`plan_assembly` decides whether a request is assembled (route and body) and rewrites its
  body: ``"stream": true`` (and, on the OpenAI routes, ``stream_options.include_usage``) spliced
  into the client's own bytes, every other byte left as the client sent it;
- :class:`Assembler` folds the stream's frames (Ollama NDJSON objects, OpenAI SSE chunks) into the
  answer, keeping only the growing answer and the unfinished last line, capped;
- :class:`AssemblyGate`, the sibling of :class:`~nvpair_tw.upstream.BodyGate` for assembled
  attempts: its ``first`` fires only with the whole answer, so the attempt loop commits then and a
  node that dies before the terminal object has sent the client nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair_tw.upstream import BodyEnd, FirstBodyTimeout, GateStateError

__all__ = [
    "ANSWER_CONTENT_TYPE",
    "AnswerTooLarge",
    "Assembled",
    "AssembledResponse",
    "Assembler",
    "Assembly",
    "AssemblyError",
    "AssemblyGate",
    "AssemblyState",
    "Dialect",
    "MalformedStream",
    "StreamCut",
    "plan_assembly",
    "rewrite_body",
]

ANSWER_CONTENT_TYPE = b"application/json; charset=utf-8"
"""What an assembled answer is sent as (what Ollama sends for its own non-streaming answers)."""


class Dialect(Enum):
    """The four assembled routes, named by their path."""

    OLLAMA_CHAT = "/api/chat"
    OLLAMA_GENERATE = "/api/generate"
    OPENAI_CHAT = "/v1/chat/completions"
    OPENAI_COMPLETIONS = "/v1/completions"

    @property
    def sse(self) -> bool:
        """OpenAI routes stream server-sent events; Ollama's stream NDJSON."""
        return self in (Dialect.OPENAI_CHAT, Dialect.OPENAI_COMPLETIONS)

    @property
    def stream_type(self) -> str:
        """The media type the engine streams this route with."""
        return "text/event-stream" if self.sse else "application/x-ndjson"


_BY_PATH = {d.value: d for d in Dialect}


@frozen
class Assembly:
    """An assembled request: its route's dialect, the body sent upstream, and the answer's cap."""

    dialect: Dialect
    body: bytes
    limit: int

    def accepts(self, content_type: bytes | None) -> bool:
        """Whether an upstream 2xx with ``content_type`` is the stream to assemble.

        An engine that answered with a whole JSON document anyway is relayed as it is.
        """
        media = (content_type or b"").split(b";", 1)[0].strip().lower().decode("latin-1")
        return media == self.dialect.stream_type


def plan_assembly(
    path: str, body: bytes, parsed: Mapping[str, Any] | None, limit: int
) -> Assembly | None:
    """The assembly of a request to ``path`` whose body ``parsed`` to a JSON object, or None.

    Ollama ``/api/chat`` and ``/api/generate`` stream unless ``"stream": false``; the OpenAI routes
    stream only with ``"stream": true`` (absent or null is non-streaming). A ``stream`` of another
    type, an OpenAI ``stream_options`` that is neither an object nor null, or a body that is not
    UTF-8 is left alone: the engine answers it as it would have.
    """
    dialect = _BY_PATH.get(path)
    if dialect is None or parsed is None:
        return None
    stream = parsed.get("stream", None)
    if dialect.sse:
        if stream is not None and stream is not False:
            return None
        options = parsed.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return None
    elif stream is not False:
        return None
    try:
        rewritten = rewrite_body(dialect, body)
    except ValueError:
        return None
    return Assembly(dialect, rewritten, limit)


def rewrite_body(dialect: Dialect, body: bytes) -> bytes:
    """``body`` with ``"stream": true`` (and ``stream_options.include_usage: true`` for OpenAI).

    Only those members' values are replaced (every duplicate of them), or the members inserted
    first; every other byte is the client's. Raises ``ValueError`` for a body that is not one UTF-8
    JSON object.
    """
    text = body.decode("utf-8")
    start = _skip(text, 0)
    members, end = _members(text, start)
    if _skip(text, end) != len(text):
        raise ValueError("trailing data after the JSON object")
    wanted = {"stream": "true"}
    edits: list[tuple[int, int, str]] = []
    if dialect.sse:
        options = [(s, e) for key, s, e in members if key == "stream_options"]
        if not options:
            wanted["stream_options"] = '{"include_usage":true}'
        for value_start, value_end in options:
            if text[value_start] == "{":
                nested, _ = _members(text, value_start)
                edits.extend(_assign(text, value_start, nested, {"include_usage": "true"}))
            else:
                edits.append((value_start, value_end, '{"include_usage":true}'))
    edits.extend(_assign(text, start, members, wanted))
    out = text
    for s, e, replacement in sorted(edits, key=lambda edit: edit[0], reverse=True):
        out = out[:s] + replacement + out[e:]
    return out.encode("utf-8")


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, index: int) -> int:
    """The index of the first non-whitespace character at or after ``index``."""
    match = _WS.match(text, index)
    return match.end() if match is not None else index


def _members(text: str, start: int) -> tuple[list[tuple[str, int, int]], int]:
    """The members of the JSON object at ``start``: (key, value start, value end); and its end."""
    if text[start : start + 1] != "{":
        raise ValueError("not a JSON object")
    members: list[tuple[str, int, int]] = []
    index = _skip(text, start + 1)
    if text[index : index + 1] == "}":
        return members, index + 1
    while True:
        if text[index : index + 1] != '"':
            raise ValueError("expected a member name")
        key, index = json.decoder.scanstring(text, index + 1)  # type: ignore[attr-defined]
        index = _skip(text, index)
        if text[index : index + 1] != ":":
            raise ValueError("expected ':'")
        value_start = _skip(text, index + 1)
        try:
            _, value_end = _DECODER.raw_decode(text, value_start)
        except (json.JSONDecodeError, RecursionError) as error:
            raise ValueError("bad member value") from error
        members.append((key, value_start, value_end))
        index = _skip(text, value_end)
        separator = text[index : index + 1]
        if separator == "}":
            return members, index + 1
        if separator != ",":
            raise ValueError("expected ',' or '}'")
        index = _skip(text, index + 1)


def _assign(
    text: str, start: int, members: list[tuple[str, int, int]], values: dict[str, str]
) -> list[tuple[int, int, str]]:
    """Edits giving the object at ``start`` each member of ``values`` (raw JSON texts)."""
    edits: list[tuple[int, int, str]] = []
    missing: list[str] = []
    for key, value in values.items():
        spans = [(s, e) for k, s, e in members if k == key]
        edits.extend((s, e, value) for s, e in spans)
        if not spans:
            missing.append(json.dumps(key) + ":" + value)
    if missing:
        inserted = ",".join(missing)
        if members:
            edits.append((start + 1, start + 1, inserted + ","))
        else:
            edits.append((start + 1, text.index("}", start), inserted))
    return edits


# --- folding the stream ---------------------------------------------------------------------------


class AssemblyError(Exception):
    """The stream cannot become an answer (the attempt fails as a drop, before any commit)."""


class StreamCut(AssemblyError):
    """The stream ended before its terminal object."""


class MalformedStream(AssemblyError):
    """A frame of the stream is not what the route streams (a JSON object)."""


class AnswerTooLarge(AssemblyError):
    """The answer (or one unfinished line) grew past the cap."""


@frozen
class Assembled:
    """The client's whole answer: 200, or 500 when the engine reported an error in the stream
    (what the engine answers a non-streaming request that fails that way)."""

    status: int
    body: bytes


def _dump(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _insert_after(mapping: dict[str, Any], after: str, key: str, value: Any) -> dict[str, Any]:
    """``mapping`` with ``key`` set: in place if present, else right after ``after`` (or last)."""
    if key in mapping or after not in mapping:
        return {**mapping, key: value}
    out: dict[str, Any] = {}
    for name, item in mapping.items():
        out[name] = item
        if name == after:
            out[key] = value
    return out


@define
class _Text:
    """A growing text: fragments joined in blocks, so a long answer is a few strings, not one
    string object per token."""

    blocks: list[str] = field(factory=list)
    recent: list[str] = field(factory=list)

    def add(self, fragment: str) -> None:
        self.recent.append(fragment)
        if len(self.recent) >= 256:
            self.blocks.append("".join(self.recent))
            self.recent.clear()

    def text(self) -> str:
        return "".join([*self.blocks, *self.recent])


@define
class _Choice:
    """One OpenAI choice being assembled (by ``index``)."""

    template: dict[str, Any]
    texts: dict[str, _Text] = field(factory=dict)
    nulls: set[str] = field(factory=set)
    others: dict[str, Any] = field(factory=dict)
    tools: dict[int, dict[str, Any]] = field(factory=dict)
    finish_reason: Any = None
    logprobs: Any = None
    logprobs_seen: bool = False


@define
class Assembler:
    """Folds one stream into the answer; fed every body chunk in order, boundaries anywhere.

    :meth:`feed` returns the :class:`Assembled` answer once the terminal frame has arrived (Ollama
    ``"done": true``, an error object, or SSE ``data: [DONE]``), None before; later bytes are
    ignored. :meth:`finish` is called at a clean end of body: a last line without a newline is
    examined, and a stream with no terminal frame raises :class:`StreamCut`. What is kept is the
    answer (its text fragments, tool calls, the last object's fields) and the unfinished last
    line; past ``limit`` characters in all, :class:`AnswerTooLarge` is raised.
    """

    dialect: Dialect
    limit: int
    answer: Assembled | None = field(default=None, init=False)
    _tail: bytearray = field(factory=bytearray, init=False, repr=False)
    _held: int = field(default=0, init=False, repr=False)
    _data: list[str] = field(factory=list, init=False, repr=False)
    _data_size: int = field(default=0, init=False, repr=False)
    # Ollama
    _texts: dict[str, _Text] = field(factory=dict, init=False, repr=False)
    _tool_calls: list[Any] = field(factory=list, init=False, repr=False)
    # OpenAI
    _top: dict[str, Any] = field(factory=dict, init=False, repr=False)
    _choices: dict[int, _Choice] = field(factory=dict, init=False, repr=False)
    _usage: Any = field(default=None, init=False, repr=False)

    @property
    def held(self) -> int:
        """Characters kept: the answer's text so far and the unfinished last line."""
        return self._held + self._data_size + len(self._tail)

    def feed(self, chunk: bytes) -> Assembled | None:
        """Fold one body chunk; the answer once the terminal frame has arrived."""
        if self.answer is not None:
            return self.answer
        start = 0
        while self.answer is None:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self._tail:
                self._tail += chunk[start:end]
                line = bytes(self._tail)
                self._tail.clear()
            else:
                line = chunk[start:end]
            self._line(line)
            start = end + 1
        if self.answer is None and start < len(chunk):
            self._tail += chunk[start:]
            self._check()
        return self.answer

    def finish(self) -> Assembled:
        """At a clean end of body: the answer, or :class:`StreamCut`."""
        if self.answer is None and self._tail:
            line = bytes(self._tail)
            self._tail.clear()
            self._line(line)
            if self.answer is None and self.dialect.sse:
                self._line(b"")  # an event not followed by its blank line
        if self.answer is None:
            raise StreamCut("the stream ended before its terminal object")
        return self.answer

    def _check(self) -> None:
        if self.held > self.limit:
            raise AnswerTooLarge(f"the assembled answer passed {self.limit} characters")

    def _line(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not self.dialect.sse:
            if line.strip():
                self._ollama(_object(line))
            return
        if not line:
            if self._data:
                data, self._data, self._data_size = "\n".join(self._data), [], 0
                self._event(data)
            return
        name, _, value = line.partition(b":")
        if name == b"data":
            text = value[1:] if value.startswith(b" ") else value
            try:
                self._data.append(text.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise MalformedStream("an event is not UTF-8") from error
            self._data_size += len(text)
            self._check()

    def _event(self, data: str) -> None:
        if data.strip() == "[DONE]":
            self._openai_done()
            return
        self._openai(_object(data.encode("utf-8")))

    def _grow(self, store: dict[str, _Text], key: str, value: Any) -> None:
        if isinstance(value, str) and value:
            store.setdefault(key, _Text()).add(value)
            self._held += len(value)
            self._check()

    # -- Ollama

    def _ollama(self, obj: dict[str, Any]) -> None:
        if "error" in obj and obj.get("done") is not True:
            self.answer = Assembled(500, _dump({"error": obj["error"]}))
            return
        if self.dialect is Dialect.OLLAMA_CHAT:
            message = obj.get("message")
            if isinstance(message, dict):
                self._grow(self._texts, "content", message.get("content"))
                self._grow(self._texts, "thinking", message.get("thinking"))
                calls = message.get("tool_calls")
                if isinstance(calls, list) and calls:
                    self._tool_calls.extend(calls)
                    self._held += len(_dump(calls))
                    self._check()
        else:
            self._grow(self._texts, "response", obj.get("response"))
            self._grow(self._texts, "thinking", obj.get("thinking"))
        if obj.get("done") is True:
            self.answer = Assembled(200, _dump(self._ollama_answer(obj)))

    def _ollama_answer(self, final: dict[str, Any]) -> dict[str, Any]:
        texts = {key: parts.text() for key, parts in self._texts.items()}
        if self.dialect is Dialect.OLLAMA_GENERATE:
            answer = {**final, "response": texts.get("response", "")}
            if texts.get("thinking"):
                answer = _insert_after(answer, "response", "thinking", texts["thinking"])
            return answer
        message = final.get("message")
        message = dict(message) if isinstance(message, dict) else {"role": "assistant"}
        message["content"] = texts.get("content", "")
        if texts.get("thinking"):
            message = _insert_after(message, "content", "thinking", texts["thinking"])
        if self._tool_calls:
            message["tool_calls"] = self._tool_calls
        return {**final, "message": message}

    # -- OpenAI

    def _openai(self, obj: dict[str, Any]) -> None:
        if "error" in obj:
            self.answer = Assembled(500, _dump({"error": obj["error"]}))
            return
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
            return
        for position, fragment in enumerate(choices):
            if not isinstance(fragment, dict):
                raise MalformedStream("a choice is not an object")
            index = fragment.get("index", position)
            if not isinstance(index, int):
                raise MalformedStream("a choice index is not an integer")
            choice = self._choices.get(index)
            if choice is None:
                choice = self._choices[index] = _Choice(fragment)
            self._fold_choice(choice, fragment)

    def _fold_choice(self, choice: _Choice, fragment: dict[str, Any]) -> None:
        if fragment.get("finish_reason") is not None:
            choice.finish_reason = fragment["finish_reason"]
        if "logprobs" in fragment:
            choice.logprobs_seen = True
            self._logprobs(choice, fragment["logprobs"])
        if self.dialect is Dialect.OPENAI_COMPLETIONS:
            self._grow(choice.texts, "text", fragment.get("text"))
            return
        delta = fragment.get("delta")
        if not isinstance(delta, dict):
            return
        for key, value in delta.items():
            if key == "tool_calls":
                if isinstance(value, list):
                    self._tool_fragments(choice, value)
            elif key == "role":
                if value:
                    choice.others["role"] = value
            elif isinstance(value, str):
                self._grow(choice.texts, key, value)
                choice.texts.setdefault(key, _Text())
            elif value is None:
                choice.nulls.add(key)
            else:
                choice.others[key] = value

    def _logprobs(self, choice: _Choice, value: Any) -> None:
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
                self._held += len(_dump(item))
                self._check()
            else:
                choice.logprobs[key] = item

    def _tool_fragments(self, choice: _Choice, fragments: list[Any]) -> None:
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise MalformedStream("a tool call is not an object")
            index = fragment.get("index")
            if not isinstance(index, int):
                # no index: a fragment with an id starts a call, one without continues the last
                fresh = bool(fragment.get("id")) or not choice.tools
                index = len(choice.tools) if fresh else max(choice.tools)
            call = choice.tools.setdefault(index, {})
            for key, value in fragment.items():
                if key == "function" and isinstance(value, dict):
                    function = call.setdefault("function", {})
                    for name, part in value.items():
                        if isinstance(part, str) and isinstance(function.get(name), str):
                            function[name] += part
                        elif name not in function or part is not None:
                            function[name] = part
                        if isinstance(part, str):
                            self._held += len(part)
                elif key not in call or (value is not None and value != ""):
                    call[key] = value
            self._check()

    def _openai_done(self) -> None:
        chat = self.dialect is Dialect.OPENAI_CHAT
        choices = [self._openai_choice(c, chat) for _, c in sorted(self._choices.items())]
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
        self.answer = Assembled(200, _dump(answer))

    def _openai_choice(self, choice: _Choice, chat: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in choice.template:
            if key == "delta":
                out["message"] = self._message(choice)
            elif key == "text":
                out["text"] = choice.texts.get("text", _Text()).text()
            elif key == "finish_reason":
                out[key] = choice.finish_reason
            elif key == "logprobs":
                out[key] = choice.logprobs
            else:
                out[key] = choice.template[key]
        if chat and "message" not in out:
            out["message"] = self._message(choice)
        if not chat and "text" not in out:
            out["text"] = choice.texts.get("text", _Text()).text()
        out.setdefault("finish_reason", choice.finish_reason)
        if choice.logprobs_seen:
            out.setdefault("logprobs", choice.logprobs)
        return out

    @staticmethod
    def _message(choice: _Choice) -> dict[str, Any]:
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
            message["tool_calls"] = [call for _, call in sorted(choice.tools.items())]
        return message


def _object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise MalformedStream("a frame is not JSON") from error
    if not isinstance(value, dict):
        raise MalformedStream("a frame is not a JSON object")
    return value


# --- the gate -------------------------------------------------------------------------------------


@implementer(IPushProducer)
class _Still:
    """The relay's flow control for an answer already in memory: nothing to pause upstream."""

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class AssemblyState(Enum):
    """Where an :class:`AssemblyGate` is in its life (see the class docstring)."""

    AWAITING_FIRST = "awaiting-first"
    ASSEMBLING = "assembling"
    HOLDING = "holding"
    DRAINING = "draining"
    ENDED = "ended"


def _failed(error: AssemblyError) -> Failure:
    """An assembly failure as a transport failure: the attempt loop classifies it ``dropped``."""
    return Failure(ResponseFailed([Failure(error)]))


class AssemblyGate(Protocol):
    """Folds a streamed upstream body into one answer and commits only when it is whole.

    The sibling of :class:`~nvpair_tw.upstream.BodyGate` for assembled attempts (docs/behaviour.md
    §6.5): the node is chosen at the first token (the first-body timer stops there), but
    ``first`` fires only with the complete answer, so nothing reaches the client before the
    terminal object and a node that fails earlier is a pre-commit drop.

    @ivar _state: One of L{AssemblyState}:
        - C{AWAITING_FIRST}: no body byte yet. The first-body timer runs when enabled. A chunk
          moves to C{ASSEMBLING} (or straight on, as below); the timer or any end fails ``first``
          and moves to C{ENDED}.
        - C{ASSEMBLING}: chunks are folded by the L{Assembler}. The terminal frame fires ``first``
          with the answer and moves to C{HOLDING}; a cut, a clean end before the terminal frame,
          a malformed frame or an answer past the cap fails ``first`` (a
          C{ResponseFailed} wrapping the L{AssemblyError}, or the transport's reason) and moves
          to C{ENDED}, stopping the upstream body.
        - C{HOLDING}: ``first`` has fired; later upstream bytes are ignored and the body's end
          is noted. :meth:`start_relay` moves to C{ENDED} and fires ``done`` if the upstream body
          has ended, else to C{DRAINING}.
        - C{DRAINING}: committed, the answer written; the upstream body's end (clean or not: the
          answer is whole either way) fires ``done`` with C{BodyEnd.COMPLETE} and moves to
          C{ENDED}, so the exchange concludes (and the node's booking is released) only once the
          engine is done with the request.
        - C{ENDED}: nothing more happens; :meth:`start_relay` here raises L{GateStateError}.
    @ivar first: Fires with the whole answer's bytes, or fails (L{FirstBodyTimeout} when the
        enabled timer expired, a C{ResponseFailed} otherwise).
    @ivar done: After :meth:`start_relay`: fires with C{BodyEnd.COMPLETE} at the upstream body's
        end.
    @ivar answer: The L{Assembled} answer once ``first`` has fired.
    @ivar _on_bytes: Called for every non-empty chunk, in every state (the progress record), as
        for L{BodyGate}: a generation being assembled is progress.
    """

    def __init__(
        self,
        clock: IReactorTime,
        first_body_timeout: float,
        dialect: Dialect,
        limit: int,
        on_bytes: Callable[[], None] | None = None,
    ) -> None:
        self.first: Deferred[bytes] = Deferred()
        self._on_bytes = on_bytes
        self.done: Deferred[BodyEnd] = Deferred()
        self.answer: Assembled | None = None
        self._state = AssemblyState.AWAITING_FIRST
        self._upstream_ended = False
        self._assembler = Assembler(dialect, limit)
        self._timed_out = False
        self._timeout = first_body_timeout
        self._timer: IDelayedCall | None = None
        if first_body_timeout > 0:
            self._timer = clock.callLater(first_body_timeout, self._no_first_body)

    @property
    def state(self) -> AssemblyState:
        """The current state (read-only; transitions happen through the methods)."""
        return self._state

    @property
    def held(self) -> int:
        """Characters the assembler keeps now."""
        return self._assembler.held

    def _no_first_body(self) -> None:
        self._timer = None
        self._timed_out = True
        self.stop()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stop(self) -> None:
        """Close the upstream body (caller gone, timer expired, assembly failed); always legal."""
        self._disarm()
        if self.transport is not None:
            IPushProducer(self.transport).stopProducing()

    def producer(self) -> IPushProducer:
        """Flow control for the relay: the answer is in memory, so there is nothing to pause."""
        return _Still()

    def dataReceived(self, data: bytes) -> None:
        if data and self._on_bytes is not None:
            self._on_bytes()  # the node is working (busy waits of its other attempts, §6.4)
        if not data or self._state not in (
            AssemblyState.AWAITING_FIRST,
            AssemblyState.ASSEMBLING,
        ):
            return
        if self._state is AssemblyState.AWAITING_FIRST:
            self._disarm()
            self._state = AssemblyState.ASSEMBLING
        try:
            answer = self._assembler.feed(data)
        except AssemblyError as error:
            self._fail(_failed(error))
            self.stop()
            return
        if answer is not None:
            self._hold(answer)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        state = self._state
        self._upstream_ended = True
        if state is AssemblyState.DRAINING:
            self._state = AssemblyState.ENDED
            self.done.callback(BodyEnd.COMPLETE)
            return
        if state in (AssemblyState.HOLDING, AssemblyState.ENDED):
            return
        if self._timed_out:
            self._fail(Failure(FirstBodyTimeout(f"no response body within {self._timeout:g}s")))
        elif reason.check(ResponseDone, PotentialDataLoss):
            try:
                answer = self._assembler.finish()
            except AssemblyError as error:
                self._fail(_failed(error))
            else:
                self._hold(answer)
        else:
            self._fail(reason)

    def _hold(self, answer: Assembled) -> None:
        self._state = AssemblyState.HOLDING
        self.answer = answer
        self.first.callback(answer.body)

    def _fail(self, reason: Failure) -> None:
        self._state = AssemblyState.ENDED
        self.first.errback(reason)

    def response(self, upstream: IResponse) -> AssembledResponse:
        """The client-facing response for the held answer: its status, JSON type and length."""
        if self.answer is None:
            raise GateStateError(f"response in state {self._state.value}")
        headers = Headers()
        for name, values in upstream.headers.getAllRawHeaders():
            if name.lower() not in (b"content-type", b"content-length", b"transfer-encoding"):
                headers.setRawHeaders(name, list(values))
        headers.setRawHeaders(b"content-type", [ANSWER_CONTENT_TYPE])
        code = self.answer.status
        phrase = b"OK" if code == 200 else b"Internal Server Error"
        return AssembledResponse(upstream.version, code, phrase, headers, self.answer.body)

    def start_relay(self, sink: Callable[[bytes], None]) -> None:
        """Commit: the answer went out as ``first``; nothing more is relayed, ``done`` fires at
        the upstream body's end."""
        if self._state is not AssemblyState.HOLDING:
            raise GateStateError(f"start_relay in state {self._state.value}")
        if self._upstream_ended:
            self._state = AssemblyState.ENDED
            self.done.callback(BodyEnd.COMPLETE)
        else:
            self._state = AssemblyState.DRAINING


@implementer(IResponse)
class AssembledResponse:
    """The response the client gets for an assembled answer (status, headers, whole body)."""

    def __init__(
        self,
        version: tuple[bytes, int, int],
        code: int,
        phrase: bytes,
        headers: Headers,
        body: bytes,
    ) -> None:
        self.version = version
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = len(body)
        self.request = None
        self.previousResponse: IResponse | None = None
        self._body = body

    def deliverBody(self, protocol: Protocol) -> None:
        protocol.makeConnection(None)  # type: ignore[arg-type]
        protocol.dataReceived(self._body)
        protocol.connectionLost(Failure(ResponseDone()))

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response
