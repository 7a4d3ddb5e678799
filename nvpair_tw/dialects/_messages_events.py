# -*- test-case-name: tests.dialects.test_messages_answer -*-
"""What an Anthropic Messages answer looks like (docs/behaviour.md §17.3): its server-sent events
(https://platform.claude.com/docs/build-with-claude/streaming), the whole message object, the
stop reasons and the error object, built from what an OpenAI-compatible answer said.

- :func:`event`: one named event, ``event: <type>`` then its ``data:`` line.
- :func:`message_start`, :func:`block_start`, :func:`block_stop`, :func:`message_end`: the frame
  of a stream; :func:`text_delta_head` the bytes of a ``text_delta`` event before its text.
- :func:`whole_message`: the one message object of a ``stream: false`` answer.
- :func:`error_object`: ``{"type": "error", "error": {"type", "message"}}``, its ``type`` from
  the status as ``core.error_type`` gives Anthropic's (the proxy's own refusals are shaped by
  ``core.error_body``).

Stop reasons: ``stop`` → ``end_turn``, ``length`` → ``max_tokens``, ``tool_calls`` (and the old
``function_call``) → ``tool_use``, ``content_filter`` → ``refusal``; none (a stream ended by
``[DONE]`` alone) → ``end_turn``. ``stop_sequence`` is always null: an OpenAI answer does not say
which stop sequence matched.
"""

from __future__ import annotations

import json
from typing import Any

from nvpair_tw.core import ErrorShape, error_type
from nvpair_tw.dialects._common import dump

__all__ = [
    "arguments_text",
    "block_start",
    "block_stop",
    "error_object",
    "event",
    "message_end",
    "message_start",
    "stop_reason",
    "text_delta_head",
    "whole_message",
]

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def event(kind: str, document: dict[str, Any]) -> bytes:
    """One server-sent event named ``kind``."""
    return b"event: " + kind.encode("ascii") + b"\ndata: " + dump(document) + b"\n\n"


def stop_reason(reason: Any) -> str:
    """The Messages ``stop_reason`` for an OpenAI ``finish_reason``."""
    return _STOP_REASONS.get(reason, "end_turn") if isinstance(reason, str) else "end_turn"


def _usage(tokens: tuple[int | None, int | None]) -> dict[str, int]:
    prompt, completion = tokens
    return {"input_tokens": prompt or 0, "output_tokens": completion or 0}


def message_start(ident: str, model: str) -> bytes:
    message: dict[str, Any] = {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    return event("message_start", {"type": "message_start", "message": message})


def block_start(index: int, block: dict[str, Any]) -> bytes:
    body = {"type": "content_block_start", "index": index, "content_block": block}
    return event("content_block_start", body)


def block_stop(index: int) -> bytes:
    return event("content_block_stop", {"type": "content_block_stop", "index": index})


def text_delta_head(index: int, delta_type: str, member: str) -> bytes:
    """The bytes of a ``content_block_delta`` event up to its text's JSON literal; the event ends
    with ``}}`` and a blank line after the literal."""
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
        + str(index).encode("ascii")
        + b',"delta":{"type":"'
        + delta_type.encode("ascii")
        + b'","'
        + member.encode("ascii")
        + b'":'
    )


def message_end(reason: Any, tokens: tuple[int | None, int | None]) -> bytes:
    """``message_delta`` (stop reason, usage) and ``message_stop``."""
    delta = {"stop_reason": stop_reason(reason), "stop_sequence": None}
    body = {"type": "message_delta", "delta": delta, "usage": _usage(tokens)}
    return event("message_delta", body) + event("message_stop", {"type": "message_stop"})


def whole_message(
    ident: str,
    model: str,
    texts: dict[str, str],
    calls: list[dict[str, Any]],
    reason: Any,
    tokens: tuple[int | None, int | None],
) -> dict[str, Any]:
    """The message object; ``calls`` as :class:`~nvpair_tw.dialects._ollama_fold.Gathered`
    returns them (arguments parsed; arguments that are not a JSON object give ``{}``)."""
    content: list[dict[str, Any]] = []
    if texts.get("thinking"):
        content.append({"type": "thinking", "thinking": texts["thinking"], "signature": ""})
    if texts.get("text"):
        content.append({"type": "text", "text": texts["text"]})
    for position, call in enumerate(calls):
        function = call["function"]
        arguments = function.get("arguments")
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{position}",
                "name": function.get("name", ""),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reason),
        "stop_sequence": None,
        "usage": _usage(tokens),
    }


def error_object(status: int, message: str) -> dict[str, Any]:
    kind = error_type(ErrorShape.ANTHROPIC, status)
    return {"type": "error", "error": {"type": kind, "message": message}}


def arguments_text(arguments: Any) -> str | None:
    """A streamed tool call's argument fragment as text (an object some servers send whole is
    dumped), None when there is none."""
    if isinstance(arguments, str):
        return arguments or None
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    return None
