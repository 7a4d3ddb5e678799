# -*- test-case-name: tests.simulated.test_kinds -*-
"""One inference request as a simulated engine of a kind answers it: what was asked, how many
tokens it holds, the vector an input embeds to, and the time on the engine's clock."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from attrs import frozen

from nvpair_tw.simulated._pace import Timing

__all__ = ["Asked", "embedding_of", "inputs_of"]

EMBEDDING_SIZE = 4
"""How many floats a simulated embedding has."""


@frozen
class Asked:
    """An inference request and how the engine answers it.

    :ivar path: the request path, without its query.
    :ivar body: the request body as a JSON object (``{}`` for anything else).
    :ivar streaming: whether the answer streams.
    :ivar chunks: how many content chunks a streamed answer has (at least one).
    :ivar text: the answer's text; chunk ``i`` says ``f"{text}{i}"``.
    :ivar now: the engine clock's time, in seconds.
    :ivar number: the engine's inference count, for answer ids.
    :ivar tokens: a paced engine's answer, token by token (then ``chunks`` and ``text`` are not
        used); empty for the numbered chunks.
    :ivar timing: a paced engine's durations for this answer (:mod:`~nvpair_tw.simulated._pace`);
        None for the fixed ones.
    :ivar finish: why the answer ended (``stop``, or ``length`` when a limit cut it).
    """

    path: bytes
    body: dict[str, Any]
    streaming: bool
    chunks: int
    text: str
    now: float
    number: int
    tokens: tuple[str, ...] = ()
    timing: Timing | None = None
    finish: str = "stop"

    @classmethod
    def of(
        cls,
        path: bytes,
        raw: bytes,
        streaming: bool,
        chunks: int,
        text: str,
        now: float,
        number: int,
    ) -> Asked:
        """The request to ``path`` whose body was ``raw``."""
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {}
        body = parsed if isinstance(parsed, dict) else {}
        return cls(path, body, streaming, max(1, chunks), text, now, number)

    @property
    def model(self) -> str:
        """The model the request names (``""`` when it names none)."""
        model = self.body.get("model")
        return model if isinstance(model, str) else ""

    @property
    def created(self) -> int:
        """The time as OpenAI's ``created`` (whole seconds)."""
        return int(self.now)

    @property
    def created_at(self) -> str:
        """The time as Ollama's ``created_at`` (RFC 3339, UTC)."""
        stamp = datetime.fromtimestamp(self.now, UTC).isoformat(timespec="microseconds")
        return stamp.replace("+00:00", "Z")

    @property
    def prompt_tokens(self) -> int:
        """The prompt's token count: its words (at least one)."""
        return max(1, sum(len(text.split()) for text in _texts(self.body)))

    def prompt_texts(self) -> list[str]:
        """Every prompt text of the request (message contents, ``prompt``, ``system``, ...)."""
        return _texts(self.body)

    @property
    def completion_tokens(self) -> int:
        """The answer's token count: one a chunk."""
        return len(self.pieces())

    @property
    def answer(self) -> str:
        """The whole answer's text."""
        return "".join(self.tokens) if self.tokens else self.text

    def pieces(self) -> list[str]:
        """The content of each streamed chunk: the tokens, else ``f"{text}{i}"``."""
        if self.tokens:
            return list(self.tokens)
        return [f"{self.text}{i}" for i in range(self.chunks)]


def _texts(body: dict[str, Any]) -> list[str]:
    """Every prompt text of a request: message contents (text parts too), ``prompt``, ``system``,
    ``input``."""
    texts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p["text"] for p in content if isinstance(p, dict) and "text" in p]
    for key in ("prompt", "system", "system_prompt"):
        if isinstance(body.get(key), str):
            texts.append(body[key])
    texts += inputs_of(body)
    return [t for t in texts if isinstance(t, str)]


def inputs_of(body: dict[str, Any]) -> list[str]:
    """What an embedding request embeds: its ``input`` as a list of strings (``[]`` for none)."""
    given = body.get("input")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list):
        return [item for item in given if isinstance(item, str)]
    return []


def embedding_of(text: str) -> list[float]:
    """A deterministic vector for ``text``: :data:`EMBEDDING_SIZE` floats in [-0.5, 0.5]."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(digest[i] / 255 - 0.5, 6) for i in range(EMBEDDING_SIZE)]
