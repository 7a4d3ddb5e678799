# -*- test-case-name: tests.runtime.test_service -*-
"""twistd services: the runtime's start/stop, and listeners that remember their port."""

from __future__ import annotations

from twisted.application import service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IProtocolFactory
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.runtime._eager import eager_endpoint
from nvpair_tw.runtime._process import Runtime

__all__ = ["ListenerService", "RuntimeService"]

log = LevelledLogger(namespace=__name__)


class RuntimeService(service.Service):
    """Starts polling and watching; on stop cancels timers and closes the pool (added first, stopped last)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def startService(self) -> None:
        super().startService()
        self.runtime.start()

    def stopService(self) -> Deferred[None]:
        super().stopService()
        return self.runtime.stop()


class ListenerService(service.Service):
    """Listens on an endpoint description and keeps the port (so port 0 can be reported)."""

    def __init__(
        self, reactor: IProxyReactor, description: str, factory: IProtocolFactory, label: str
    ) -> None:
        self._reactor = reactor
        self.description = description
        self._factory = factory
        self.label = label
        self.port: IListeningPort | None = None
        self.ready: Deferred[IListeningPort] = Deferred()

    def startService(self) -> None:
        super().startService()
        endpoint = eager_endpoint(self._reactor, self.description)
        if endpoint is None:
            endpoint = serverFromString(self._reactor, self.description)
        listening = endpoint.listen(self._factory)

        def listened(port: IListeningPort) -> IListeningPort:
            self.port = port
            log.info(
                "{label} listening on {address}", label=self.label, address=str(port.getHost())
            )
            self.ready.callback(port)
            return port

        def failed(failure: Failure) -> None:
            log.failure(
                "{label} could not listen on {description}",
                failure,
                label=self.label,
                description=self.description,
            )
            self.ready.errback(failure)
            self._reactor.callWhenRunning(self._reactor.stop)

        listening.addCallbacks(listened, failed)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self.port is None:
            return succeed(None)
        port, self.port = self.port, None
        stopped = port.stopListening()
        return stopped if stopped is not None else succeed(None)
