# -*- test-case-name: tests.corridor.test_workloads -*-
"""Workloads (docs/behaviour.md §7).

A workload is one inference request with a model, whatever the number of attempts. Its one terminal
guard makes sure exactly one terminal event is published however many exit paths race to end it.
(The request's record is :mod:`~nvpair_tw.corridor._record`'s.)
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from attrs import define, field, setters
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel

from nvpair_tw.events import (
    BusEvent,
    EventBus,
    WorkloadCompleted,
    WorkloadErrored,
    WorkloadInfo,
    WorkloadQueued,
    WorkloadStarted,
    WorkloadState,
)
from nvpair_tw.logs import LevelledLogger

__all__ = ["Workload", "WorkloadRegistry", "WorkloadState"]


_TERMINAL = frozenset({WorkloadState.COMPLETED, WorkloadState.FAILED, WorkloadState.CANCELLED})


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
        state = self.state
        if state in _TERMINAL or (state is not None and node_id == self.scheduled_on):
            return
        self.state = WorkloadState.RUNNING
        self.scheduled_on = node_id
        if self.started_at is None:
            self.started_at = int(self._clock.seconds() * 1000)  # ms since the epoch
        self.seq += 1
        self._bus.publish(WorkloadStarted(self.snapshot()))

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
        if self.state in _TERMINAL:
            return False
        self.state = state
        self.error = error
        self.completed_at = int(self._clock.seconds() * 1000)  # ms since the epoch
        self.cancel_hook = None  # ended, it lets go of its request
        self._on_terminal(self)
        ended = WorkloadCompleted if state is WorkloadState.COMPLETED else WorkloadErrored
        self.seq += 1
        self._bus.publish(ended(self.snapshot()))
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
            int(self._clock.seconds() * 1000),  # ms since the epoch
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
