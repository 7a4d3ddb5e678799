# -*- test-case-name: tests.e2e.test_real_sessions -*-
"""Coding-agent sessions against real engines, counted by what the engines report cached (issue
39; not a test module).

A run sends S sessions at once, each T turns in order, every turn the whole conversation so far
(``bench/agentclients.py``'s :class:`~bench.agentclients.Session`: a system prompt shared by the
sessions, a task, then per turn the model's reply and a tool's result). Each turn goes where a
:data:`Placement` says: the proxy, or straight to one engine. A :class:`Speaker` renders a turn
in one API and reads back what the engine answered and counted:

- :data:`CLAUDE_CODE` (``llama-server``'s ``/v1/messages``): the request as Claude Code 2.1.37
  sends it (``bench.agentclients.claude_code_request``: the billing block with a new ``cch``
  every request, ``cache_control`` markers that move, the session in ``metadata.user_id`` and
  ``X-Claude-Code-Session-Id``), or without its billing block (``clean_claude_code``, what the
  pinned runs send), streamed; the counts are the engine's own ``message_start`` usage:
  ``input_tokens`` (read) and ``cache_read_input_tokens`` (found cached).
- :data:`OLLAMA_CHAT` (Ollama's ``/api/chat``): system, task and each reply and result as plain
  chat messages (SmolLM2's Ollama template takes no tools). Ollama 0.9.3's
  ``prompt_eval_count`` is the whole prompt, cached or not (see :func:`ollama_cache_lines`);
  the cached part is read from the runner's own debug log instead.

Each reply is the model's text and a tool call the script makes up (the 135M model calls no
tools), so every later turn carries ``tool_use`` and ``tool_result`` blocks as an agent's do. The
engines' sampling is fixed (temperature 0, a few tokens), so both contenders of a comparison
send the same conversations.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from attrs import frozen

from bench.agentclients import (
    Reply,
    Result,
    Session,
    claude_code_request,
    clean_claude_code,
    words,
)

__all__ = [
    "CLAUDE_CODE",
    "OLLAMA_CHAT",
    "Counted",
    "Pacing",
    "Run",
    "Served",
    "Speaker",
    "ollama_cache_lines",
    "pinned",
    "run_sessions",
    "sessions",
    "through",
]


@frozen
class Counted:
    """What an engine answered one turn: its text, and the prompt tokens it counted as read
    (``read``) and as found cached (``cached``; None where the answer does not say), and how
    long it says reading them took (``reading``, seconds; None where it does not say)."""

    text: str
    read: int
    cached: int | None
    reading: float | None = None


@frozen
class Served:
    """One turn of one session: which node served it and what its engine counted."""

    session: int
    turn: int
    node: str
    counted: Counted


@frozen
class Run:
    """Every turn of a run, in the order they ended, and the run's wall time."""

    served: tuple[Served, ...]
    seconds: float

    @property
    def read(self) -> int:
        return sum(s.counted.read for s in self.served)

    @property
    def cached(self) -> int:
        return sum(s.counted.cached or 0 for s in self.served)

    @property
    def cached_share(self) -> float:
        """Of the prompt tokens the engines took in, the share they found cached."""
        whole = self.read + self.cached
        return self.cached / whole if whole else 0.0

    @property
    def moved(self) -> int:
        """Turns served on another node than their session's previous turn."""
        last: dict[int, str] = {}
        count = 0
        for served in sorted(self.served, key=lambda s: (s.session, s.turn)):
            count += served.session in last and last[served.session] != served.node
            last[served.session] = served.node
        return count


Build = Callable[[Session], tuple[str, dict[str, Any], dict[str, str]]]
"""A speaker's request for a session's next turn: (path, body, headers)."""


@frozen
class Speaker:
    """One API as an agent speaks it: ``build`` a turn's request (``clean``: without what a
    proxy removes), ``read`` its answer."""

    model: str
    build: Build
    clean: Build
    read: Callable[[httpx.Response], Counted]


ANSWER_TOKENS = 6
"""Tokens an engine writes a turn: enough to be a reply, few enough for the CI budget."""


def _claude(render: Callable[[Session], tuple[dict[str, Any], dict[str, str]]]) -> Build:
    def build(session: Session) -> tuple[str, dict[str, Any], dict[str, str]]:
        body, headers = render(session)
        body.update(model=CLAUDE_MODEL, max_tokens=ANSWER_TOKENS, temperature=0)
        return "/v1/messages", body, headers

    return build


def _read_messages(answer: httpx.Response) -> Counted:
    """The text and ``message_start`` usage of a Messages stream."""
    events = [
        json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")
    ]
    [start] = [e["message"]["usage"] for e in events if e.get("type") == "message_start"]
    text = "".join(
        e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta"
    )
    return Counted(text, int(start["input_tokens"]), int(start["cache_read_input_tokens"]))


CLAUDE_MODEL = "smollm2-llamacpp"
CLAUDE_CODE = Speaker(
    CLAUDE_MODEL, _claude(claude_code_request), _claude(clean_claude_code), _read_messages
)
"""Claude Code 2.1.37 on ``llama-server``'s ``/v1/messages``."""


def _ollama_chat(session: Session) -> tuple[str, dict[str, Any], dict[str, str]]:
    messages = [
        {"role": "system", "content": session.system},
        {"role": "user", "content": session.task},
    ]
    for reply, result in session.steps:
        messages.append({"role": "assistant", "content": reply.text})
        messages.append({"role": "user", "content": result.text})
    options = {"num_predict": ANSWER_TOKENS, "temperature": 0, "seed": 42}
    body = {"model": "smollm2", "messages": messages, "stream": True, "options": options}
    return "/api/chat", body, {"user-agent": "ollama-python/0.5.1"}


def _read_ollama(answer: httpx.Response) -> Counted:
    """The text and ``prompt_eval_count`` of an ``/api/chat`` NDJSON stream: Ollama 0.9.3 counts
    the whole prompt there, so nothing says what was cached (None)."""
    lines = [json.loads(line) for line in answer.text.splitlines() if line.strip()]
    text = "".join((line.get("message") or {}).get("content") or "" for line in lines)
    return Counted(text, int(lines[-1]["prompt_eval_count"]), None)


OLLAMA_CHAT = Speaker("smollm2", _ollama_chat, _ollama_chat, _read_ollama)
"""An agent on Ollama's ``/api/chat``."""


def sessions(count: int, system_words: int, turn_words: int, seed: int = 39) -> list[Session]:
    """``count`` sessions on one system prompt of ``system_words`` pseudo-words (about six
    tokens each), each with a task of ``turn_words``."""
    system = words(random.Random(f"{seed}/system"), system_words)
    made = [Session.new(i, system, seed) for i in range(count)]
    for session in made:
        session.task = words(random.Random(f"{session.seed}/task"), turn_words)
    return made


Placement = Callable[[Session, random.Random], str]
"""Where a session's next turn is sent: a base URL."""


def through(url: str) -> Placement:
    """Every turn to ``url`` (the proxy)."""
    return lambda session, rng: url


def pinned(urls: Sequence[str]) -> Placement:
    """Session ``i``'s every turn to ``urls[i % len(urls)]`` (the oracle)."""
    return lambda session, rng: urls[session.index % len(urls)]


def _answered(session: Session, text: str, turn_words: int) -> None:
    """The turn's reply (the model's text and a made-up ``Read`` call) and its tool's result."""
    call = f"toolu_{session.index:02d}{len(session.steps):02d}"
    reply = Reply(text, call, "Read", {"file_path": f"src/m{len(session.steps)}.py"})
    rng = random.Random(f"{session.seed}/result/{len(session.steps)}")
    session.steps.append((reply, Result(call, words(rng, turn_words))))


@frozen
class Pacing:
    """How a run's sessions take their turns: in waves, every session's turn ``k`` once every
    session has its answer to turn ``k - 1``, sent ``stagger`` seconds apart in an order drawn
    anew for each wave (seeded). So the requests of a wave meet the nodes in another order
    each time, as agents' turns do, and a placement that does not know where a conversation
    lives sends it elsewhere about half the time."""

    turns: int
    turn_words: int
    stagger: float = 0.25
    seed: int = 39

    def delay(self, session: Session, turn: int, count: int) -> float:
        order = random.Random(f"{self.seed}/wave/{turn}").sample(range(count), count)
        return order.index(session.index) * self.stagger


@frozen
class _Context:
    send: Build
    read: Callable[[httpx.Response], Counted]
    pacing: Pacing
    names: dict[str, str]
    timeout: float
    wave: threading.Barrier
    served: list[Served]
    lock: threading.Lock


def _turn(session: Session, turn: int, context: _Context, base: str) -> None:
    path, body, headers = context.send(session)
    with httpx.Client(timeout=context.timeout) as client:  # llama-server closes idle ones
        answer = client.post(f"{base}{path}", json=body, headers=headers)
    if answer.status_code != 200:
        raise AssertionError(f"{path} on {base}: {answer.status_code} {answer.text[:300]}")
    counted = context.read(answer)
    node = answer.headers.get("x-nvpair-node") or context.names.get(base, base)
    with context.lock:
        context.served.append(Served(session.index, turn, node, counted))
    _answered(session, counted.text, context.pacing.turn_words)


def _drive(session: Session, context: _Context, placement: Placement) -> None:
    rng = random.Random(f"{session.seed}/placement")
    for turn in range(context.pacing.turns):
        context.wave.wait()
        time.sleep(context.pacing.delay(session, turn, context.wave.parties))
        _turn(session, turn, context, placement(session, rng))


def run_sessions(
    send: Build,
    read: Callable[[httpx.Response], Counted],
    made: Sequence[Session],
    placement: Placement,
    pacing: Pacing,
    names: dict[str, str],
    timeout: float = 300.0,
) -> Run:
    """The sessions ``made``, a thread each, paced by ``pacing``; each turn's request made by
    ``send``, placed by ``placement`` and its answer read by ``read``. ``names`` gives a
    direct node's base URL its id (the proxy names the node that answered in
    ``X-NVPair-Node``). A failed turn fails the run (AssertionError)."""
    wave = threading.Barrier(len(made), timeout=timeout)
    context = _Context(send, read, pacing, names, timeout, wave, [], threading.Lock())
    failures: list[BaseException] = []

    def drive(session: Session) -> None:
        try:
            _drive(session, context, placement)
        except Exception as error:  # reported by the caller's thread
            failures.append(error)
            wave.abort()

    started = time.monotonic()
    threads = [threading.Thread(target=drive, args=(s,)) for s in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        first = next((f for f in failures if not isinstance(f, threading.BrokenBarrierError)), None)
        raise AssertionError(f"{len(failures)} session(s) failed: {first or failures[0]!r}")
    return Run(tuple(context.served), time.monotonic() - started)


_CACHE_SLOT = re.compile(rb'msg="loading cache slot" id=\d+ cache=\d+ prompt=(\d+) used=(\d+)')


def ollama_cache_lines(log: Path) -> list[tuple[int, int]]:
    """Every ``(prompt, used)`` the Ollama runner's debug log (``OLLAMA_DEBUG=1``) states when it
    loads a cache slot for a request: the prompt's tokens, and how many of them the slot already
    held (the rest, ``remaining``, is what it evaluates). This is where Ollama 0.9.3 says what
    it found cached; its ``prompt_eval_count`` is the whole ``prompt``."""
    return [(int(p), int(u)) for p, u in _CACHE_SLOT.findall(log.read_bytes())]
