# -*- test-case-name: tests.corridor.test_workloads -*-
"""Workloads (docs/behaviour.md §7) and the per-request record.

A workload is one inference request with a model, whatever the number of attempts. Its one terminal
guard makes sure exactly one terminal event is published however many exit paths race to end it.
The request record gathers the metadata of one request (rejections included) for ``proxy/request``
(its attempts in an :class:`AttemptLog`, its event built by :func:`request_event`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from enum import Enum
from typing import Any

from attrs import define, field, setters
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel

from nvpair_tw.events import (
    Attempt,
    BusEvent,
    EventBus,
    ProxyRequest,
    WorkloadCompleted,
    WorkloadErrored,
    WorkloadInfo,
    WorkloadQueued,
    WorkloadStarted,
    WorkloadState,
)
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "Attempt",
    "AttemptLog",
    "AttemptOutcome",
    "RequestRecord",
    "Workload",
    "WorkloadRegistry",
    "WorkloadState",
    "request_event",
    "status_outcome",
]

# An attempt still open when the next one starts or the record is published.
UNFINISHED = "unfinished"


_TERMINAL = frozenset({WorkloadState.COMPLETED, WorkloadState.FAILED, WorkloadState.CANCELLED})


def _ms(clock: IReactorTime) -> int:
    return int(clock.seconds() * 1000)


@define(eq=False)
class Workload:
    """One workload; made by `WorkloadRegistry.create`, ended exactly once."""

    id: int
    engine: str
    model: str
    _run_id: str
    _clock: IReactorTime
    _bus: EventBus
    _on_terminal: Callable[[Workload], None]
    created_at: int
    state: WorkloadState | None = field(init=False, default=None)
    scheduled_on: str | None = field(init=False, default=None)
    started_at: int | None = field(init=False, default=None)
    completed_at: int | None = field(init=False, default=None)
    error: str | None = field(init=False, default=None)
    seq: int = field(init=False, default=0)
    cancel_hook: Callable[[str], None] | None = field(init=False, default=None)

    @property
    def terminal(self) -> bool:
        """Whether the workload has ended (its terminal event is published)."""
        return self.state in _TERMINAL

    def queued(self) -> None:
        """Waiting for a slot in the proxy (§6.4): publish ``workload:queued`` (before any dispatch)."""
        if self.state is not None:
            return
        self.state = WorkloadState.QUEUED
        self._publish(WorkloadQueued)

    def running(self, node_id: str) -> None:
        """Dispatched to ``node_id``: publish ``workload:started`` if that is a new node."""
        if self.terminal or (self.state is not None and node_id == self.scheduled_on):
            return
        self.state = WorkloadState.RUNNING
        self.scheduled_on = node_id
        if self.started_at is None:
            self.started_at = _ms(self._clock)
        self._publish(WorkloadStarted)

    def complete(self) -> bool:
        """End as completed; ``True`` if this call ended the workload."""
        return self._end(WorkloadState.COMPLETED, None)

    def fail(self, error: str) -> bool:
        """End as failed with ``error``; ``True`` if this call ended the workload."""
        return self._end(WorkloadState.FAILED, error)

    def cancel(self, error: str) -> bool:
        """End as cancelled with ``error``; ``True`` if this call ended the workload."""
        return self._end(WorkloadState.CANCELLED, error)

    def info(self) -> dict[str, Any]:
        """The ``workloadInfo`` of docs/behaviour.md §7."""
        return self.snapshot().to_json()

    def snapshot(self) -> WorkloadInfo:
        """The workload as it is now, typed."""
        return WorkloadInfo(
            self.id,
            self._run_id,
            self.engine,
            self.model,
            self.state,
            self.scheduled_on,
            self.created_at,
            self.started_at,
            self.completed_at,
            self.error,
            self.seq,
        )

    def _end(self, state: WorkloadState, error: str | None) -> bool:
        if self.terminal:
            return False
        self.state = state
        self.error = error
        self.completed_at = _ms(self._clock)
        self._on_terminal(self)
        self._publish(WorkloadCompleted if state is WorkloadState.COMPLETED else WorkloadErrored)
        return True

    def _publish(self, kind: Callable[[WorkloadInfo], BusEvent]) -> None:
        self.seq += 1
        self._bus.publish(kind(self.snapshot()))


def _run_id_or_new(value: str | None) -> str:
    return secrets.token_hex(8) if value is None else value


@define(eq=False, on_setattr=setters.NO_OP)
class WorkloadRegistry:
    """Per process: the workload id counter, a random ``run_id`` and the live workloads."""

    log = LevelledLogger(namespace=__name__)

    _clock: IReactorTime
    _bus: EventBus
    run_id: str = field(default=None, converter=_run_id_or_new)
    _live: dict[int, Workload] = field(init=False, factory=dict)
    _last_workload_id: int = field(init=False, default=0)
    _last_request: int = field(init=False, default=0)

    def create(self, engine: str, model: str) -> Workload:
        """A new live workload; no event until its first dispatch (`Workload.running`)."""
        self._last_workload_id += 1
        workload = Workload(
            self._last_workload_id,
            engine,
            model,
            self.run_id,
            self._clock,
            self._bus,
            self._forget,
            _ms(self._clock),
        )
        self._live[workload.id] = workload
        return workload

    def get(self, workload_id: int) -> Workload | None:
        """The live workload with this id, or ``None``."""
        return self._live.get(workload_id)

    def live(self) -> list[Workload]:
        """The workloads not yet terminal, oldest first."""
        return list(self._live.values())

    def cancel(self, workload_id: int, reason: str = "cancelled by request") -> bool:
        """Ask a live workload to stop; ``False`` if no live workload has this id.

        The workload's ``cancel_hook`` aborts its request, whose path then ends the workload; with
        no hook (or a hook that raises) the workload is cancelled here.
        """
        workload = self._live.get(workload_id)
        if workload is None:
            return False
        hook = workload.cancel_hook
        if hook is None:
            workload.cancel(reason)
            return True
        try:
            hook(reason)
        except Exception:
            self.log.failure(
                "cancel hook of workload {workload_id} failed",
                level=LogLevel.error,
                workload_id=workload_id,
            )
            workload.cancel(reason)
        return True

    def next_request_id(self) -> str:
        """A request id unique in this process: ``<run_id>-<n>``."""
        self._last_request += 1
        return f"{self.run_id}-{self._last_request}"

    def _forget(self, workload: Workload) -> None:
        self._live.pop(workload.id, None)


class AttemptOutcome(Enum):
    """How one attempt ended; status outcomes are `status_outcome` strings."""

    CONNECT_ERROR = "connect-error"
    STALL = "stall"
    DROPPED = "dropped"
    FIRST_BODY_TIMEOUT = "first-body-timeout"
    COMMITTED = "committed"
    CANCELLED = "cancelled"


def status_outcome(code: int) -> str:
    """The outcome of an attempt answered with HTTP status ``code``: ``status-<code>``."""
    return f"status-{code}"


def _strip_query(path: str) -> str:
    return path.split("?", 1)[0]


def _elapsed_ms(start: float, end: float) -> int:
    return round((end - start) * 1000)


@define(eq=False)
class AttemptLog:
    """The attempts of one request: those closed, in order, and the one open now (its node, its
    start and the deadline periods it waited, §6.4)."""

    _clock: IReactorTime
    closed: list[Attempt] = field(init=False, factory=list)
    _current: tuple[str, float] | None = field(init=False, default=None)
    _busy_waits: int = field(init=False, default=0)

    def start(self, node_id: str) -> float:
        """An attempt to ``node_id`` starts now (one still open is closed ``unfinished``); the
        clock seconds it starts at."""
        self.close(UNFINISHED)
        now = self._clock.seconds()
        self._current = (node_id, now)
        self._busy_waits = 0
        return now

    def busy_wait(self) -> None:
        """The open attempt waits one more deadline period; a no-op if none is open."""
        if self._current is not None:
            self._busy_waits += 1

    def close(self, outcome: str) -> None:
        """Close the open attempt with ``outcome``; a no-op if none is open."""
        if self._current is None:
            return
        node_id, start = self._current
        self._current = None
        elapsed = _elapsed_ms(start, self._clock.seconds())
        self.closed.append(Attempt(node_id, outcome, elapsed, self._busy_waits))

    def part(self, node_id: str, outcome: str, since: float) -> None:
        """One node's part of a fan-out, started at clock time ``since``, ended now."""
        self.closed.append(Attempt(node_id, outcome, _elapsed_ms(since, self._clock.seconds())))


@define(eq=False, on_setattr=setters.NO_OP)
class RequestRecord:
    """One per request (rejections included); published once as ``proxy/request``.

    ``started`` and ``first_byte_at`` are clock seconds; ``path`` never carries the query string.
    """

    _clock: IReactorTime
    id: str
    engine: str
    method: str
    path: str = field(converter=_strip_query)
    started: float
    node_id: str | None = field(init=False, default=None)
    status: int | None = field(init=False, default=None)
    error: str | None = field(init=False, default=None)
    cache_affinity: bool = field(init=False, default=False)
    first_byte_at: float | None = field(init=False, default=None)
    queued_ms: int = field(init=False, default=0)
    ended: float | None = field(init=False, default=None)
    fan_out: tuple[str, ...] | None = field(init=False, default=None)
    """The nodes a fan-out (docs/behaviour.md §13.2) ran on, in order; None for other requests."""
    model: str | None = field(init=False, default=None)
    """The public name of the model asked for (§11.4); None for a request naming none."""
    model_local: str | None = field(init=False, default=None)
    """The name the serving node knows the model by, and whether its attempt was translated."""
    translated: bool = field(init=False, default=False)
    key: str | None = field(init=False, default=None)
    """The name of the key the caller presented (``local`` for a loopback caller without one,
    docs/behaviour.md §12.1); None when no key was asked for."""
    prompt_tokens: int | None = field(init=False, default=None)
    """The engine's own counts (§12.2); None when unknown (never zero for unknown)."""
    completion_tokens: int | None = field(init=False, default=None)
    ttft_ms: int | None = field(init=False, default=None)
    """Dispatch of the committed attempt to its first content-bearing chunk (§12.3)."""
    tokens_per_s: float | None = field(init=False, default=None)
    """Completion tokens per second: the engine's own figure where given, else measured."""
    removed_usage: dict[str, Any] | None = field(init=False, default=None)
    """The usage chunk removed from the answer (the client did not ask for it, §12.2)."""
    dispatched_at: float | None = field(init=False, default=None)
    """Clock seconds the latest attempt was sent: time to first token counts from here."""
    context_fit: bool = field(init=False, default=True)
    """False when no candidate's known context held the request (§15.3)."""
    predicted_ms: int | None = field(init=False, default=None)
    """The time to the last token predicted for the node that served (§15.2); None: none made."""
    measured_ms: int | None = field(init=False, default=None)
    """Arrival (queue included) to the last token, beside ``predicted_ms``."""
    workload_id: int | None = field(init=False, default=None)
    """The id of the request's workload (§7); None for a request without one. Not in the
    payload (``proxy/request`` carries none): traces read it (§12.5)."""
    fallback_from: str | None = field(init=False, default=None)
    """The public name the client asked for when a fallback served (docs/behaviour.md §16.2)."""
    _attempts: AttemptLog = field(init=False)

    def __attrs_post_init__(self) -> None:
        self._attempts = AttemptLog(self._clock)

    @classmethod
    def begin(
        cls, clock: IReactorTime, request_id: str, engine: str, method: str, path: str
    ) -> RequestRecord:
        """Start the record of a request now."""
        return cls(clock, request_id, engine, method, path, clock.seconds())

    @property
    def published(self) -> bool:
        """Whether `publish` has run."""
        return self.ended is not None

    @property
    def attempts(self) -> list[Attempt]:
        """The attempts closed so far, in order."""
        return self._attempts.closed

    def attempt_started(self, node_id: str) -> None:
        """An attempt to ``node_id`` starts now (an attempt still open is closed ``unfinished``)."""
        self.dispatched_at = self._attempts.start(node_id)

    def busy_wait(self) -> None:
        """The current attempt waits one more deadline period (its node shows progress)."""
        self._attempts.busy_wait()

    def attempt_ended(self, outcome: str) -> None:
        """Close the current attempt with ``outcome``; a no-op if none is open."""
        self._attempts.close(outcome)

    def fanned_out(self, node_ids: list[str]) -> None:
        """The request runs on every one of ``node_ids`` at once (docs/behaviour.md §13.2)."""
        self.fan_out = tuple(node_ids)

    def part_ended(self, node_id: str, outcome: str, since: float) -> None:
        """One node's part of a fan-out, started at clock time ``since``, ended with ``outcome``
        (parts run at once, so they are closed here rather than one after another)."""
        self._attempts.part(node_id, outcome, since)

    def queued_for(self, seconds: float) -> None:
        """The request waited ``seconds`` for a slot before its dispatch (or its 503)."""
        self.queued_ms = round(seconds * 1000)

    def served_as(self, model: str | None, local: str | None, translated: bool) -> None:
        """The committed attempt asked its node for ``model`` as ``local`` (§11.3, §11.4)."""
        self.model, self.model_local, self.translated = model, local, translated

    def usage_noted(self, frame: dict[str, Any]) -> None:
        """The answer's usage chunk, removed before the client saw it, keeps its counts here."""
        self.removed_usage = frame

    def predicted(self, seconds: float, last_at: float | None) -> None:
        """The serving node was predicted to answer in ``seconds``; its last token came at clock
        time ``last_at`` (docs/behaviour.md §15.2)."""
        self.predicted_ms = round(seconds * 1000)
        if last_at is not None:
            self.measured_ms = _elapsed_ms(self.started, last_at)

    def first_byte(self) -> None:
        """The first response byte went to the client now; later calls are no-ops."""
        if self.first_byte_at is None:
            self.first_byte_at = self._clock.seconds()

    def publish(
        self,
        bus: EventBus,
        *,
        status: int,
        node_id: str | None,
        error: str | None,
        cache_affinity: bool = False,
    ) -> bool:
        """Finish the record and publish ``proxy/request`` once; ``False`` on repeat calls."""
        if self.published:
            return False
        self._attempts.close(UNFINISHED)
        self.ended = self._clock.seconds()
        self.status = status
        self.node_id = node_id
        self.error = error
        self.cache_affinity = cache_affinity
        bus.publish(self.to_event())
        return True

    def to_payload(self) -> dict[str, Any]:
        """The ``proxy/request`` payload (durations in ms; up to now if not yet published)."""
        return self.to_event().to_json()

    def to_event(self) -> ProxyRequest:
        """The ``proxy/request`` event (durations in ms; up to now if not yet published)."""
        return request_event(self, self._clock.seconds() if self.ended is None else self.ended)


def request_event(record: RequestRecord, end: float) -> ProxyRequest:
    """The ``proxy/request`` event of ``record`` ended at clock seconds ``end`` (durations in ms):
    the one place it is built."""
    ttfb = record.first_byte_at
    return ProxyRequest(
        record.id,
        record.engine,
        record.node_id,
        record.method,
        record.path,
        record.status,
        _elapsed_ms(record.started, end),
        None if ttfb is None else _elapsed_ms(record.started, ttfb),
        record.error,
        tuple(record.attempts),
        record.cache_affinity,
        record.queued_ms,
        record.fan_out,
        record.fallback_from,
        record.key,
        record.model,
        record.model_local,
        record.translated,
        record.prompt_tokens,
        record.completion_tokens,
        record.ttft_ms,
        record.tokens_per_s,
        record.context_fit,
        record.predicted_ms,
        record.measured_ms,
    )
