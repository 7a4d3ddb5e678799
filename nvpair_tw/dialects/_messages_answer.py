# -*- test-case-name: tests.dialects.test_messages_answer -*-
"""An OpenAI-compatible chat answer as an Anthropic Messages answer (docs/behaviour.md §17.3,
§17.4); the shapes are in ``_messages_events``.

- :class:`MessagesStream`: the event stream. ``message_start`` at the node's first event (its
  ``id`` prefixed ``msg_``); each run of content of one kind is one content block, opened by
  ``content_block_start`` and closed by ``content_block_stop`` when another kind begins:
  ``reasoning_content`` (or ``reasoning``) → a ``thinking`` block of ``thinking_delta`` events,
  ``content`` → a ``text`` block of ``text_delta`` events, each streamed tool call → a
  ``tool_use`` block (``id``, ``name``, ``input: {}``) whose argument fragments are
  ``input_json_delta`` events as they come (Messages streams them, so they are not joined). Which
  call a fragment belongs to is the one rule of ``core.CallOrder`` (by ``index``; without one, an
  id starts a call); a fragment of a call whose block another block already followed (fragments
  of two calls interleaved) is a delta of that call's own block, by its index, which is how the
  Anthropic SDKs gather a block's input;
  at ``[DONE]`` the open block is closed, then ``message_delta`` (stop reason, ``usage`` with
  ``input_tokens`` and ``output_tokens`` from the node's usage chunk, 0 when it sent none) and
  ``message_stop``. An error event becomes an ``error`` event and ends the answer.
- :class:`MessagesWhole`: the same answer as one message object at the end; the text, thinking
  and tool calls are gathered by ``_ollama_fold``'s :class:`Gathered` (tool call fragments
  folded by the same rule, ``core.ToolCalls``, arguments parsed).
- :class:`MessagesError`: a non-2xx answer as ``{"type": "error", "error": {"type",
  "message"}}`` with the same status (the message of ``{"error": {"message"}}``, of
  ``{"error": "…"}``, else the body's text).
"""

from __future__ import annotations

import json
import secrets
from enum import Enum
from typing import Any

from nvpair_tw.core import CallOrder
from nvpair_tw.dialects._answers import Buffer, error_message
from nvpair_tw.dialects._common import JSON_TYPE, SSE_TYPE, MalformedAnswer, dump, media_type
from nvpair_tw.dialects._messages_events import (
    arguments_text,
    block_start,
    block_stop,
    error_object,
    event,
    message_end,
    message_start,
    text_delta_head,
    whole_message,
)
from nvpair_tw.dialects._messages_read import Reader
from nvpair_tw.dialects._ollama_fold import Gathered

__all__ = ["MessagesError", "MessagesStream", "MessagesWhole"]


class Block(Enum):
    """The kind of the content block open in a stream."""

    TEXT = "text"
    THINKING = "thinking"
    TOOL = "tool_use"


def _ident(upstream: str | None) -> str:
    return f"msg_{upstream}" if upstream else f"msg_{secrets.token_hex(12)}"


def _whole_body(content_type: bytes | None, limit: int) -> Buffer | None:
    """Where a whole JSON answer (a node that did not stream) is held; None for a stream."""
    return Buffer(limit) if media_type(content_type) == b"application/json" else None


class _Answer:
    """What both transducers share: the reader, the token counts and the end."""

    def __init__(self, client_model: str, reader: Reader) -> None:
        self._model = client_model
        self._reader = reader
        self.status = 200

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (self._reader.prompt, self._reader.completion)

    def feed(self, data: bytes) -> bytes:
        return self._reader.feed(data)

    def end(self) -> bytes:
        return self._reader.end()


class MessagesStream(_Answer):
    """The node's chat stream as Messages events (see the module docstring)."""

    content_type = SSE_TYPE

    def __init__(
        self, client_model: str, content_type: bytes | None, *, limit: int = 8 << 20
    ) -> None:
        super().__init__(client_model, Reader(self, limit, _whole_body(content_type, limit)))
        self._open: tuple[Block, int] | None = None  # the open block: kind, tool call index
        self._index = -1  # the open (or last) block's index
        self._order = CallOrder()  # which call each tool call fragment belongs to (§17.4)
        self._tool_blocks: dict[int, int] = {}  # each call's block index
        self._head = b""  # the open text or thinking block's delta bytes before the literal

    def start(self, ident: str | None) -> bytes:
        return message_start(_ident(ident), self._model)

    def _switch(self, block: Block, key: int, opening: dict[str, Any]) -> bytes:
        out = block_stop(self._index) if self._open is not None else b""
        self._index += 1
        self._open = (block, key)
        if block is Block.TEXT:
            self._head = text_delta_head(self._index, "text_delta", "text")
        elif block is Block.THINKING:
            self._head = text_delta_head(self._index, "thinking_delta", "thinking")
        return out + block_start(self._index, opening)

    def literals(self, bodies: list[bytes]) -> bytes:
        out = b""
        if self._open is None or self._open[0] is not Block.TEXT:
            out = self._switch(Block.TEXT, 0, {"type": "text", "text": ""})
        head, end = self._head + b'"', b'"}}\n\n'
        return out + head + (end + head).join(bodies) + end

    def text(self, text: str) -> bytes:
        literal = json.dumps(text, ensure_ascii=False).encode("utf-8")
        return self.literals([literal[1:-1]])

    def thinking(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open[0] is not Block.THINKING:
            out = self._switch(Block.THINKING, 0, {"type": "thinking", "thinking": ""})
        literal = json.dumps(text, ensure_ascii=False).encode("utf-8")
        return out + self._head + literal + b"}}\n\n"

    def calls(self, fragments: list[Any]) -> bytes:
        out: list[bytes] = []
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise MalformedAnswer("a tool call is not an object")
            key, starts = self._order.place(fragment)
            function = fragment.get("function")
            function = function if isinstance(function, dict) else {}
            if starts:
                ident = fragment.get("id")
                opening: dict[str, Any] = {
                    "type": "tool_use",
                    "id": ident if isinstance(ident, str) and ident else f"toolu_{key}",
                    "name": function.get("name") or "",
                    "input": {},
                }
                out.append(self._switch(Block.TOOL, key, opening))
                self._tool_blocks[key] = self._index
            partial = arguments_text(function.get("arguments"))
            if partial is not None:
                # a call's own block, even when another call's fragment came in between (§17.4)
                delta = {"type": "input_json_delta", "partial_json": partial}
                body = {
                    "type": "content_block_delta",
                    "index": self._tool_blocks[key],
                    "delta": delta,
                }
                out.append(event("content_block_delta", body))
        return b"".join(out)

    def done(self, reason: Any, tokens: tuple[int | None, int | None]) -> bytes:
        out = block_stop(self._index) if self._open is not None else b""
        self._open = None
        return out + message_end(reason, tokens)

    def error(self, message: str) -> bytes:
        return event("error", error_object(500, message))


class MessagesWhole(_Answer):
    """The node's chat stream (or whole answer) as one Messages object at the end."""

    content_type = JSON_TYPE

    def __init__(
        self, client_model: str, content_type: bytes | None, *, limit: int = 8 << 20
    ) -> None:
        super().__init__(client_model, Reader(self, limit, _whole_body(content_type, limit)))
        self._gathered = Gathered(limit)
        self._calls: list[dict[str, Any]] = []
        self._ident = _ident(None)

    def start(self, ident: str | None) -> bytes:
        self._ident = _ident(ident)
        return b""

    def literals(self, bodies: list[bytes]) -> bytes:
        for body in bodies:
            self._gathered.keep("text", json.loads(b'"' + body + b'"'))
        return b""

    def text(self, text: str) -> bytes:
        self._gathered.keep("text", text)
        return b""

    def thinking(self, text: str) -> bytes:
        self._gathered.keep("thinking", text)
        return b""

    def calls(self, fragments: list[Any]) -> bytes:
        self._gathered.gather(fragments)
        return b""

    def done(self, reason: Any, tokens: tuple[int | None, int | None]) -> bytes:
        texts = {key: "".join(parts) for key, parts in self._gathered.texts.items()}
        calls = self._gathered.take_calls()
        return dump(whole_message(self._ident, self._model, texts, calls, reason, tokens))

    def error(self, message: str) -> bytes:
        self.status = 500
        return dump(error_object(500, message))


class MessagesError:
    """A non-2xx answer in Messages' error shape, same status (see the module docstring)."""

    content_type = JSON_TYPE

    def __init__(self, status: int, content_type: bytes | None, limit: int) -> None:
        self._status = status
        self._buffer = Buffer(limit)

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (None, None)

    def feed(self, data: bytes) -> bytes:
        self._buffer.add(data)
        return b""

    def end(self) -> bytes:
        body = self._buffer.bytes()
        text = body.decode("utf-8", "replace").strip()
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict) and doc.get("type") == "error":
            return body  # already Messages' shape (a node that speaks it)
        if isinstance(doc, dict) and "error" in doc:
            text = error_message(doc["error"])
        elif isinstance(doc, dict) and isinstance(doc.get("detail"), str):
            text = doc["detail"]
        return dump(error_object(self._status, text or f"upstream status {self._status}"))
