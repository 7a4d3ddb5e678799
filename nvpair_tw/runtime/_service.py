# -*- test-case-name: tests.runtime.test_service -*-
"""twistd services: the runtime's start/stop, and listeners that bind before anything starts.

A listener binds in ``privilegedStartService``, which twistd calls before it sheds privileges and
before any service starts; one that cannot bind ends the start with one line naming the endpoint
and the error (:class:`CannotListen`), on the terminal and with a non-zero exit status, in daemon
mode too.
"""

from __future__ import annotations

import sys

from twisted.application import service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IProtocolFactory
from twisted.python.failure import Failure

from nvpair_tw.core import IProxyReactor
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.runtime._eager import eager_endpoint
from nvpair_tw.runtime._process import Runtime

__all__ = ["CannotListen", "ListenerService", "RuntimeService"]

log = LevelledLogger(namespace=__name__)


class CannotListen(SystemExit, Exception):
    """A listener that could not bind, as one line: ``nvpair: cannot listen on ENDPOINT (LABEL):
    ERROR``.

    It is an ``Exception``, so twistd's daemon runner catches it and writes the last line of
    ``traceback.format_exception_only`` — the note added here — to its start-up pipe, and the
    terminal that started the daemon prints it (twistd keeps its first 100 bytes). It is a
    ``SystemExit`` of status 1, so when it leaves twistd in the foreground (``-n``) the process
    ends without a traceback (the line was written to the terminal before it was raised: twistd
    has sent ``sys.stderr`` to its log by then).
    """

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.code = 1
        self.add_note(line)


def reason_of(error: BaseException | None) -> str:
    """The error a bind failed with, in a few lower-case words (``address already in use``)."""
    cause: object = error.socketError if isinstance(error, CannotListenError) else error
    text = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
    return text[:1].lower() + text[1:] if text else type(error).__name__


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
    """Listens on an endpoint description and keeps the port (so port 0 can be reported).

    It binds in ``privilegedStartService`` (raising :class:`CannotListen` when it cannot), or in
    ``startService`` when it was started without that step; ``ready`` fires with the port once it
    listens. A failure that arrives later (an endpoint that binds asynchronously), or in
    ``startService``, is logged in one line, errbacks ``ready`` and stops the reactor.
    """

    def __init__(
        self, reactor: IProxyReactor, description: str, factory: IProtocolFactory, label: str
    ) -> None:
        self._reactor = reactor
        self.description = description
        self._factory = factory
        self.label = label
        self.port: IListeningPort | None = None
        self.ready: Deferred[IListeningPort] = Deferred()
        self._listening: Deferred[None] | None = None

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        failed = self._listen()
        if failed is not None:
            log.error("{line}", line=self._failure_line(failed))
            line = f"nvpair: {self._failure_line(failed)}"
            # The terminal (in daemon mode /dev/null: the start-up pipe carries it there).
            print(line, file=sys.__stderr__, flush=True)
            raise CannotListen(line)

    def startService(self) -> None:
        super().startService()
        if self._listening is None:
            failed = self._listen()
            if failed is not None:
                self._give_up(failed)

    def _listen(self) -> Failure | None:
        """Start listening; the failure when it failed at once (tcp, unix, ssl and systemd
        endpoints all bind at once), else None (a later failure goes to ``_give_up``)."""
        endpoint = eager_endpoint(self._reactor, self.description)
        if endpoint is None:
            endpoint = serverFromString(self._reactor, self.description)
        at_once: list[Failure] = []
        starting = [True]

        def failed(failure: Failure) -> None:
            if starting:
                at_once.append(failure)
            else:
                self._give_up(failure)

        self._listening = endpoint.listen(self._factory).addCallbacks(self._listened, failed)
        starting.clear()
        return at_once[0] if at_once else None

    def _listened(self, port: IListeningPort) -> None:
        self.port = port
        log.info("{label} listening on {address}", label=self.label, address=str(port.getHost()))
        self.ready.callback(port)

    def _failure_line(self, failure: Failure) -> str:
        return f"cannot listen on {self.description} ({self.label}): {reason_of(failure.value)}"

    def _give_up(self, failure: Failure) -> None:
        log.error("{line}", line=self._failure_line(failure))
        self.ready.errback(failure)
        self._reactor.callWhenRunning(self._reactor.stop)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self.port is None:
            return succeed(None)
        port, self.port = self.port, None
        stopped = port.stopListening()
        return stopped if stopped is not None else succeed(None)
