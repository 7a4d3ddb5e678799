# -*- test-case-name: tests.simulated.test_machine -*-
"""One machine shared by the requests it runs, the way an engine with parallel slots shares its
GPU (the benchmarks of docs/behaviour.md §15.4 and the tests of §15.2).

A :class:`Machine` works at its :class:`~nvpair_tw.simulated._pace.Pace`: a request's prompt is
``load + prompt / prefill`` seconds of the machine's work, each answer token ``1 / decode``. The
requests it runs at once (at most ``parallel``; 0: every one) share it equally, so ``k`` of them
each go at ``1 / k`` of the pace (processor sharing); the others wait their turn, first come first
served, as llama.cpp's and Ollama's queues do. :meth:`Machine.run` takes a request and calls its
``tick`` at each answer token with the token's index, and at the last one with the
:class:`~nvpair_tw.simulated._pace.Timing` the request was served at (what an engine states:
its prompt's and its answer's own durations, sharing included). Every timer is on the clock it is
given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from attrs import define, field
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nvpair_tw.simulated._pace import Pace, Timing

__all__ = ["Job", "Machine", "Tick"]

Tick = Callable[[int, Timing | None], None]
"""``tick(index, timing)``: answer token ``index`` is made; ``timing`` with the last one."""

_DONE = 1e-9
"""Machine-seconds of work small enough to be done (floating point)."""


@define(eq=False)
class Job:
    """One request on a machine: the work left in its current step (the prompt, then a token)."""

    tokens: int
    tick: Tick
    left: float
    arrived: float
    started: float | None = None
    """When the machine began it (after its wait for a turn)."""
    decoding: float | None = None
    """When its prompt was read and its answer begun."""
    made: int = 0


@define(eq=False)
class Machine:
    """A machine's pace, shared by the requests it runs (see the module docstring)."""

    clock: IReactorTime
    pace: Pace
    parallel: int = 0
    """How many requests it runs at once; 0: every one it is given."""
    _running: list[Job] = field(factory=list, init=False)
    _waiting: deque[Job] = field(factory=deque, init=False)
    _timer: IDelayedCall | None = field(default=None, init=False)
    _at: float = field(default=0.0, init=False)

    @property
    def running(self) -> int:
        """Requests being worked on now."""
        return len(self._running)

    def work_left(self) -> list[float]:
        """Seconds of the whole machine each request it holds still needs: those it runs, then
        those waiting their turn, in order (what an oracle that knows every length weighs)."""
        self._advance()
        decode = 1 / self.pace.decode
        return [
            job.left + (job.tokens - job.made - (0 if job.decoding is None else 1)) * decode
            for job in (*self._running, *self._waiting)
        ]

    def run(self, prompt_tokens: int, tokens: int, tick: Tick) -> Job:
        """Take a request of ``prompt_tokens`` whose answer is ``tokens`` tokens (at least one)."""
        self._advance()
        now = self.clock.seconds()
        work = self.pace.load + prompt_tokens / self.pace.prefill
        job = Job(max(1, tokens), tick, work, now)
        self._waiting.append(job)
        self._start_waiting()
        self._schedule()
        return job

    def drop(self, job: Job) -> None:
        """Forget a request whose client left (its tick is not called again)."""
        self._advance()
        if job in self._running:
            self._running.remove(job)
        elif job in self._waiting:
            self._waiting.remove(job)
        self._start_waiting()
        self._schedule()

    def stop(self) -> None:
        """Forget every request and cancel the timer."""
        self._running.clear()
        self._waiting.clear()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _advance(self) -> None:
        """Move every running request's work on to now, each by its share of the time passed."""
        now = self.clock.seconds()
        if self._running:
            share = (now - self._at) / len(self._running)
            for job in self._running:
                job.left -= share
        self._at = now

    def _start_waiting(self) -> None:
        while self._waiting and (self.parallel == 0 or len(self._running) < self.parallel):
            job = self._waiting.popleft()
            job.started = self.clock.seconds()
            self._running.append(job)

    def _schedule(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._running:
            soonest = min(job.left for job in self._running) * len(self._running)
            self._timer = self.clock.callLater(max(0.0, soonest), self._step)

    def _step(self) -> None:
        self._timer = None
        self._advance()
        for job in [j for j in self._running if j.left <= _DONE]:
            self._stepped(job)
        self._start_waiting()
        self._schedule()

    def _stepped(self, job: Job) -> None:
        """``job`` finished its current step: its prompt, or one more token (one token's time
        after the prompt comes the first, as :class:`~nvpair_tw.simulated._pace.Timing` says)."""
        now = self.clock.seconds()
        job.left = 1 / self.pace.decode
        if job.decoding is None:
            job.decoding = now
            return
        job.made += 1
        if job.made < job.tokens:
            job.tick(job.made - 1, None)
            return
        self._running.remove(job)
        started = job.arrived if job.started is None else job.started
        prompt = max(0.0, job.decoding - started - self.pace.load)
        job.tick(job.made - 1, Timing(self.pace.load, prompt, now - job.decoding, job.tokens))
