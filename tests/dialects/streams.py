"""Real-looking OpenAI streams (as Ollama's ``/v1`` sends them) for the dialect tests, and a
controllable clock."""

from __future__ import annotations

import json
from typing import Any

BASE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "smollm2",
    "system_fingerprint": "fp_ollama",
}


def event(document: Any) -> bytes:
    """One SSE event for ``document``."""
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


def delta(**fields: Any) -> bytes:
    return event({**BASE, "choices": [{"index": 0, "delta": fields, "finish_reason": None}]})


def finish(reason: str = "stop") -> bytes:
    return event(
        {
            **BASE,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": reason}
            ],
        }
    )


def usage(prompt: int = 5, completion: int = 3) -> bytes:
    return event(
        {
            **BASE,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )


DONE = b"data: [DONE]\n\n"


def chat_stream(*words: str, reason: str = "stop") -> bytes:
    """A chat stream of ``words`` as content deltas, the finish chunk, usage and ``[DONE]``."""
    body = b"".join(delta(role="assistant", content=w) for w in words)
    return body + finish(reason) + usage(5, len(words)) + DONE


class Ticks:
    """A clock (seconds since the epoch) that advances a quarter second at every reading."""

    def __init__(self, start: float = 1_796_000_000.0, step: float = 0.25) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now
