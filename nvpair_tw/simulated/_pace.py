# -*- test-case-name: tests.simulated.test_pace -*-
"""How fast a simulated engine works, the way a real machine does (``--demo``'s nodes).

A :class:`Pace` says what a machine does per second: it reaches a resident model in ``load``
seconds, reads the prompt at ``prefill`` tokens/s and writes the answer at ``decode`` tokens/s.
:meth:`Pace.timing` turns one request's token counts into a :class:`Timing`: the durations the
engine states (Ollama's ``load_duration``, ``prompt_eval_duration``, ``eval_duration``) and when it
sends: a stream's headers and first token after the load, the prompt and one token's time
(:attr:`Timing.first_token`), then one token every ``1 / decode`` seconds; a whole answer once
every token is written (:attr:`Timing.total`). So the counts and durations an answer states are the pace it was produced
at, and what the proxy measures from the stream agrees with them (docs/behaviour.md §15.1).

A paced engine answers in words, not numbered chunks: :func:`answer_tokens` is one short text,
split the way a tokenizer streams it (a word and its leading space a token), cut at the request's
own limit (``options.num_predict``, ``max_tokens``, ``max_completion_tokens``) when it has one.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen, validators

__all__ = ["ANSWER", "Pace", "Timing", "answer_tokens", "token_limit"]

ANSWER = (
    "This answer comes from a simulated engine of the nvpair-tw demo. It writes one word at a "
    "time, at its own machine's pace, so the status page can show which node is the fastest."
)
"""What a paced engine answers (34 tokens)."""

_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@frozen
class Timing:
    """The durations one answer states, in seconds, for ``tokens`` completion tokens."""

    load: float
    prompt_eval: float
    eval: float
    tokens: int

    @property
    def total(self) -> float:
        """From the request to the last token."""
        return self.load + self.prompt_eval + self.eval

    @property
    def per_token(self) -> float:
        """Seconds between two tokens."""
        return self.eval / self.tokens if self.tokens else 0.0

    @property
    def first_token(self) -> float:
        """From the request to the first token (a stream's headers and first frame)."""
        return self.load + self.prompt_eval + self.per_token


@frozen
class Pace:
    """A machine's speed.

    :ivar decode: completion tokens per second.
    :ivar prefill: prompt tokens per second.
    :ivar load: seconds to reach a resident model (Ollama's ``load_duration`` for a loaded one).
    """

    decode: float = field(validator=validators.gt(0))
    prefill: float = field(validator=validators.gt(0))
    load: float = field(default=0.02, validator=validators.ge(0))

    def timing(self, prompt_tokens: int, completion_tokens: int) -> Timing:
        """The durations of an answer of ``completion_tokens`` to ``prompt_tokens``."""
        return Timing(
            self.load,
            prompt_tokens / self.prefill,
            completion_tokens / self.decode,
            completion_tokens,
        )


def token_limit(body: dict[str, Any]) -> int | None:
    """The most completion tokens a request allows (``options.num_predict``, ``max_tokens``,
    ``max_completion_tokens``, ``max_output_tokens``); None when it sets none (or a negative
    ``num_predict``, Ollama's "no limit")."""
    options = body.get("options")
    found: list[int] = []
    if isinstance(options, dict) and isinstance(options.get("num_predict"), int):
        found.append(options["num_predict"])
    found += [body[k] for k in _LIMITS if isinstance(body.get(k), int)]
    found = [n for n in found if n >= 0 and not isinstance(n, bool)]
    return min(found) if found else None


def answer_tokens(limit: int | None) -> tuple[tuple[str, ...], str]:
    """The answer's tokens, at most ``limit`` of them (at least one), and why it ended:
    ``"stop"``, or ``"length"`` when the limit cut it."""
    words = ANSWER.split(" ")
    tokens = tuple(w if i == 0 else f" {w}" for i, w in enumerate(words))
    if limit is None or limit >= len(tokens):
        return tokens, "stop"
    return tokens[: max(1, limit)], "length"
