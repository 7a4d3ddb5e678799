# -*- test-case-name: tests.ops.test_drain -*-
"""Graceful shutdown (docs/behaviour.md §10): stop accepting, let in-flight workloads finish, then cancel them.

twistd's ``MultiService`` calls every child's ``stopService`` at once (in reverse order, without
waiting), so "stops last" means nothing there. The drain service is therefore also a container: the
rest of the process is put under it, and on stop it first stops the facade listeners (accepted
connections stay open), waits up to ``grace`` seconds for the live workloads, cancels each survivor
with reason ``"proxy shutdown"`` (its cancel hook ends the request, docs/behaviour.md §6.2), then stops its
children one at a time in reverse insertion order: admin and control still run while the workloads
end (so every terminal event reaches them), and the runtime service, added first, closes the pool
last.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from twisted.application import service
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from nvpair_tw.logs import LevelledLogger
from nvpair_tw.ops._idle import until_idle
from nvpair_tw.runtime import Runtime

__all__ = [
    "SHUTDOWN_REASON",
    "DrainService",
    "DrainState",
    "adopt_all",
    "drain_service",
]

log = LevelledLogger(namespace=__name__)

SHUTDOWN_REASON = "proxy shutdown"

ABORT_WAIT = 1.0
"""After cancelling, how long aborted requests get to end their workloads themselves."""


class DrainState(Enum):
    """Where the drain is."""

    IDLE = "idle"  # not started, or running normally
    CLOSING = "closing"  # stopping the listeners
    DRAINING = "draining"  # waiting for in-flight workloads, up to the grace period
    CANCELLING = "cancelling"  # grace over: survivors cancelled, waiting for their ends
    STOPPED = "stopped"


class DrainService(service.MultiService):
    """On stop: listeners first, then a grace period for live workloads, then cancel the rest;
    then its children, one at a time, last added first."""

    def __init__(
        self,
        reactor: IReactorTime,
        runtime: Runtime,
        listeners: Sequence[service.IService],
        grace: float,
        *,
        abort_wait: float = ABORT_WAIT,
    ) -> None:
        super().__init__()
        self._clock = reactor
        self._runtime = runtime
        self._listeners = list(listeners)
        self._grace = max(0.0, grace)
        self._abort_wait = abort_wait
        self.state = DrainState.IDLE

    def stopService(self) -> Deferred[None]:
        service.Service.stopService(self)  # not MultiService's: children stop after the drain
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        try:
            await self._drain()
        except Exception:
            log.failure("graceful shutdown failed")
        self.state = DrainState.STOPPED
        for child in reversed(list(self)):
            try:
                await maybeDeferred(child.stopService)
            except Exception:
                log.failure("{service} failed to stop", service=repr(child))

    async def _drain(self) -> None:
        workloads = self._runtime.shared.workloads
        self.state = DrainState.CLOSING
        self._runtime.shared.draining = True
        await gatherResults(
            [
                maybeDeferred(listener.stopService).addErrback(self._listener_failed)
                for listener in self._listeners
            ]
        )
        self.state = DrainState.DRAINING
        if workloads.live():
            log.info(
                "shutting down: {count} in-flight workload(s) get {grace}s to finish",
                count=len(workloads.live()),
                grace=self._grace,
            )
            if not await self._until_idle(self._grace):
                self.state = DrainState.CANCELLING
                survivors = workloads.live()
                log.warn(
                    "shutdown grace over: cancelling {count} workload(s)", count=len(survivors)
                )
                for workload in survivors:
                    workloads.cancel(workload.id, SHUTDOWN_REASON)
                if not await self._until_idle(self._abort_wait):
                    for workload in workloads.live():
                        workload.cancel(SHUTDOWN_REASON)

    def _until_idle(self, timeout: float) -> Deferred[bool]:
        """Fires ``True`` once no workload is live, or ``False`` after ``timeout`` seconds."""
        workloads = self._runtime.shared.workloads
        bus = self._runtime.shared.bus
        return until_idle(self._clock, bus, lambda: not workloads.live(), timeout, "drain")

    def _listener_failed(self, failure: Failure) -> None:
        log.failure("a listener failed to stop", failure, level=LogLevel.error)


def drain_service(
    reactor: IReactorTime, runtime: Runtime, listeners: Sequence[service.IService]
) -> DrainService:
    """The drain service with the configured grace (``--shutdown-grace``)."""
    return DrainService(reactor, runtime, listeners, runtime.settings.shutdown_grace)


def adopt_all(parent: service.MultiService, drain: DrainService) -> None:
    """Move every child of ``parent`` under ``drain`` (order kept), then make ``drain`` its child."""
    for child in list(parent):
        child.disownServiceParent()
        child.setServiceParent(drain)
    drain.setServiceParent(parent)
