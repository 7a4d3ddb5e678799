# -*- test-case-name: tests.bench.test_kvcache -*-
"""An engine double with a per-slot prefix cache, for ``bench/agents.py`` (issue 39).

:class:`CachingEngine` is a Twisted ``Resource`` that imitates one llama.cpp ``llama-server``
(node kind ``openai``: ``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses``) or one
Ollama (kind ``ollama``: ``/api/chat``) with ``slots`` slots, each with the prefix cache of
``bench/kvcache.py`` (and llama-server's host-memory prompt cache when ``host_tokens`` is set).
A request reads its prompt into tokens (``bench/kvtemplate.py``), waits first come first served
while no slot is idle, takes one, reads only the part of its prompt the slot does not hold at
``prefill`` tokens a second (after copying back a prompt restored from host memory at ``restore``
tokens a second), then writes its answer at ``decode`` tokens a second, one streamed event a
token, stating its counts as the engine it imitates does (``bench/kvdialects.py``). Slots work
independently, each at the full rates. Every timer runs on the clock it is given. Every request
served is kept as a :class:`Served` (what it read and found cached): the benchmark counts cache
hits from these, not from what reaches the client.

It streams only (a request with ``"stream": false`` gets a 400). ``GET`` routes (the model list,
llama.cpp's ``/props`` with ``total_slots``) are answered by a
:class:`nvpair_tw.simulated.SimulatedEngine` of the same kind.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any

from attrs import define, field, frozen
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from bench.kvcache import HostCache, PrefixCache, Taken
from bench.kvdialects import (
    Answer,
    Frames,
    Reply,
    chat_frames,
    messages_frames,
    ollama_frames,
    responses_frames,
)
from bench.kvtemplate import READERS, Conversation, render, reply_to, reply_tokens
from nvpair_tw.simulated import SimulatedEngine

__all__ = ["ROUTES", "CachingEngine", "Kind", "Route", "Served"]


class Kind(Enum):
    """The engine a :class:`CachingEngine` imitates (its node kind, docs/behaviour.md §11.1)."""

    LLAMACPP = "openai"
    OLLAMA = "ollama"


@frozen
class Served:
    """One request an engine served: where, its prompt tokens, how many it found cached, how
    many were restored from host memory first, and when it arrived, started and ended."""

    node: str
    path: str
    prompt: int
    cached: int
    restored: int
    slot: int
    arrived: float
    started: float
    ended: float


@frozen
class _Job:
    request: Request
    path: str
    body: dict[str, Any]
    prompt: list[str]
    reply: Reply
    arrived: float


@frozen
class Route:
    """One route an engine serves: how it reads a request, writes its answer, and the answer's
    content type."""

    read: Callable[[dict[str, Any]], Conversation]
    frames: Frames
    content_type: bytes


@define(eq=False)
class CachingEngine(Resource):
    """One engine with ``slots`` slots and a prefix cache in each (see the module docstring).

    :param clock: the only clock it uses.
    :param name: the node id it is known by (in :attr:`served`).
    :param kind: the engine it imitates.
    :param prefill: prompt tokens read per second and slot.
    :param decode: answer tokens written per second and slot.
    :param host_tokens: the capacity of llama-server's host-memory prompt cache, in tokens
        (0: none).
    :param restore: tokens a second a prompt is copied back from host memory at.
    """

    clock: IReactorTime
    name: str
    kind: Kind = Kind.LLAMACPP
    model: str = "qwen3-coder:30b"
    slots: int = 2
    prefill: float = 2000.0
    decode: float = 100.0
    host_tokens: int = 0
    restore: float = 100_000.0
    cache: PrefixCache = field(init=False)
    served: list[Served] = field(factory=list, init=False)
    _waiting: deque[_Job] = field(factory=deque, init=False)
    _timers: list[IDelayedCall] = field(factory=list, init=False)
    _gets: SimulatedEngine = field(init=False)
    _count: int = field(default=0, init=False)

    isLeaf = True

    def __attrs_post_init__(self) -> None:
        Resource.__init__(self)
        host = HostCache(self.host_tokens) if self.host_tokens else None
        self.cache = PrefixCache.of(self.slots, host)
        self._gets = SimulatedEngine(
            self.clock,
            models=(self.model,),
            kind=self.kind.value,
            slots=self.slots,
            context_length=262_144,
        )

    @property
    def routes(self) -> dict[bytes, Route]:
        """The inference routes this engine serves."""
        return ROUTES[self.kind]

    def stop(self) -> None:
        """Cancel every timer (open requests are left to their connections)."""
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        self._timers.clear()

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        route = self.routes.get(request.path) if request.method == b"POST" else None
        if route is None:
            return self._gets.render(request)
        assert request.content is not None
        body = json.loads(request.content.read() or b"{}")
        if body.get("stream") is not True:
            request.setResponseCode(400)
            return b'{"error": "this engine double streams only"}'
        self._count += 1
        conversation = route.read(body)
        reply = reply_to(conversation, f"call_{self.name}_{self._count}")
        now = self.clock.seconds()
        prompt = render(conversation)
        self._waiting.append(_Job(request, request.path.decode(), body, prompt, reply, now))
        self._start_waiting()
        return NOT_DONE_YET

    def _start_waiting(self) -> None:
        """Start the waiting requests that can start, first come first served; one that names
        a busy slot lets the others pass (llama-server defers it)."""
        for job in list(self._waiting):
            if not any(not s.busy for s in self.cache.slots):
                return
            taken = self.cache.take(
                job.prompt, self.clock.seconds(), _slot_named(job.body, self.slots)
            )
            if taken is not None:
                self._waiting.remove(job)
                self._run(job, taken)

    def _run(self, job: _Job, taken: Taken) -> None:
        now = self.clock.seconds()
        route = self.routes[job.path.encode()]
        slot, cached = taken.index, taken.cached
        prefill = taken.restored / self.restore + (len(job.prompt) - cached) / self.prefill
        tokens = reply_tokens(job.reply)
        answer = Answer(
            self.model, job.reply, len(tokens), len(job.prompt), cached, prefill,
            len(tokens) / self.decode, now, self._count, job.body,
        )  # fmt: skip
        job.request.setHeader(b"content-type", route.content_type)
        frames = route.frames(answer)
        for index in sorted({k for k, _ in frames}):
            at = prefill + (index + 1) / self.decode
            batch = b"".join(b for k, b in frames if k == index)
            self._timers.append(self.clock.callLater(at, self._write, job.request, batch))
        end = prefill + len(tokens) / self.decode
        done = Served(
            self.name, job.path, len(job.prompt), cached, taken.restored, slot,
            job.arrived, now, now + end,
        )  # fmt: skip
        self._timers.append(self.clock.callLater(end, self._end, job, slot, done))

    def _write(self, request: Request, data: bytes) -> None:
        if request.channel is not None:
            request.write(data)

    def _end(self, job: _Job, slot: int, done: Served) -> None:
        self._timers = [t for t in self._timers if t.active()]
        if job.request.channel is not None:
            job.request.finish()
        self.served.append(done)
        self.cache.release(slot, job.prompt + reply_tokens(job.reply), self.clock.seconds())
        self._start_waiting()


def _slot_named(body: dict[str, Any], slots: int) -> int | None:
    """llama-server's ``id_slot``: the slot a request asks for (modulo the slots, as
    ``get_slot_by_id`` wraps it), or None (-1, or none given)."""
    wanted = body.get("id_slot")
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0:
        return wanted % slots
    return None


_SSE = b"text/event-stream"
ROUTES: dict[Kind, dict[bytes, Route]] = {
    Kind.LLAMACPP: {
        path.encode(): Route(READERS[path], frames, _SSE)
        for path, frames in (
            ("/v1/chat/completions", chat_frames),
            ("/v1/messages", messages_frames),
            ("/v1/responses", responses_frames),
        )
    },
    Kind.OLLAMA: {
        b"/api/chat": Route(READERS["/api/chat"], ollama_frames, b"application/x-ndjson")
    },
}
"""What each kind serves (the routes of bench/agents.py's clients)."""
