# -*- test-case-name: tests.e2e.test_real_sessions -*-
"""Does choosing the slot (``id_slot``) beat ``llama-server``'s own choice? A measurement on the
real engine (issue 39; not a test module): ``python -m tests.e2e.idslot``.

One real ``llama-server`` with two slots, prompt caching on (its default), and agent sessions
(``tests/e2e/realsessions.py``: a shared system prompt, a task, then per turn a reply and a
tool's result) on ``/v1/chat/completions``, whole answers, whose ``timings`` say what the engine
found cached (``cache_n``), read (``prompt_n``) and how long reading took (``prompt_ms``).
Each run starts a fresh server and sends the same sessions in the same waves, once with each
contender:

- **engine**: no ``id_slot``; the server picks the idle slot whose prompt is most like the
  request's (``--slot-prompt-similarity``, 0.1 by default), else the least recently used one;
- **id_slot**: session ``i`` always asks for slot ``i % 2`` (what a proxy that chose slots
  would send: a conversation's slot fixed, sessions spread evenly).

Loads: two sessions (no more than the slots) and four (twice the slots); each with the
server's host-memory prompt cache (``--cache-ram``, 8 GiB by default: a prompt pushed out of a
slot is kept in RAM and restored) and without it (``--cache-ram 0``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import httpx
from attrs import frozen

from bench.agentclients import Session
from tests.e2e.realnodes import RealLlamaServer
from tests.e2e.realsessions import (
    ANSWER_TOKENS,
    Counted,
    Pacing,
    Run,
    pinned,
    run_sessions,
    sessions,
)
from tests.engines import llamacpp

__all__ = ["CONTENDERS", "Figures", "main", "measure"]

PACING = Pacing(turns=6, turn_words=12)
SYSTEM_WORDS = 30
SLOTS = 2


def _messages(session: Session) -> list[dict[str, str]]:
    messages = [
        {"role": "system", "content": session.system},
        {"role": "user", "content": session.task},
    ]
    for reply, result in session.steps:
        messages.append({"role": "assistant", "content": reply.text})
        messages.append({"role": "user", "content": result.text})
    return messages


def _engine(session: Session) -> tuple[str, dict[str, Any], dict[str, str]]:
    body = {
        "model": llamacpp.ALIAS,
        "messages": _messages(session),
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
    }
    return "/v1/chat/completions", body, {}


def _slotted(session: Session) -> tuple[str, dict[str, Any], dict[str, str]]:
    path, body, headers = _engine(session)
    return path, {**body, "id_slot": session.index % SLOTS}, headers


def _read(answer: httpx.Response) -> Counted:
    document = answer.json()
    timings = document["timings"]
    text = document["choices"][0]["message"]["content"] or ""
    return Counted(
        text, int(timings["prompt_n"]), int(timings["cache_n"]), timings["prompt_ms"] / 1000
    )


CONTENDERS = {"engine": _engine, "id_slot": _slotted}


@frozen
class Figures:
    """One run: its load, contender and what the engine counted."""

    sessions: int
    host_cache: str
    contender: str
    run: Run

    @property
    def reading(self) -> float:
        return sum(s.counted.reading or 0.0 for s in self.run.served)

    def row(self) -> str:
        run = self.run
        return (
            f"| {self.sessions} | {self.host_cache} | {self.contender} | "
            f"{run.cached} / {run.cached + run.read} ({run.cached_share:.1%}) | "
            f"{run.read} | {self.reading:.1f} | {run.seconds:.1f} |"
        )


def measure(count: int, extra: Sequence[str], contender: str) -> Figures:
    """``count`` sessions on a fresh two-slot server started with ``extra``, sent by
    ``contender``."""
    server = RealLlamaServer.start(slots=SLOTS, extra=extra)
    try:
        made = sessions(count, SYSTEM_WORDS, PACING.turn_words)
        names = {server.url: "l"}
        build = CONTENDERS[contender]
        run = run_sessions(build, _read, made, pinned([server.url]), PACING, names)
    finally:
        server.stop()
    return Figures(count, "off" if extra else "on (default)", contender, run)


HEAD = (
    "| sessions | host cache | slot chosen by | cached / prompt tokens | read | "
    "prompt read (s, engine's) | wall (s) |\n|---|---|---|---|---|---|---|"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.idslot", description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON line per run as well")
    args = parser.parse_args(argv)
    print(HEAD)
    for count in (SLOTS, 2 * SLOTS):
        for extra in ((), ("--cache-ram", "0")):
            for contender in CONTENDERS:
                figures = measure(count, extra, contender)
                print(figures.row(), flush=True)
                if args.json:
                    served = [(s.session, s.turn, s.counted.read, s.counted.cached) for s in
                              figures.run.served]  # fmt: skip
                    print(json.dumps({"row": figures.row(), "served": served}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
