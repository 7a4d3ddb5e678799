# -*- test-case-name: tests.ops.test_control -*-
"""The JSON-RPC 2.0 control channel (docs/behaviour.md §8): inspect and steer nodes, pins, priorities, workloads.

One JSON object per line in each direction. Methods change the very state the facades route with
(node directories, pins, the process-wide reservation ledger, workloads, the log level), so a change
applies to the next request without a restart. Every connected client also receives the proxy's
events (§7) as notifications through a bounded bus subscription that the transport's flow control
pauses: a client that stops reading is dropped and never slows the proxy.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, cast

from twisted.application import service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IAddress, IConsumer, IPushProducer
from twisted.internet.protocol import Factory, connectionDone
from twisted.internet.stdio import PipeAddress, StandardIO
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair_tw.core import IProxyReactor
from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import Event, Subscription
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.ops._rpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Request,
    Result,
    RpcError,
    invalid,
    read_request,
    short,
)
from nvpair_tw.ops._rpc import error as rpc_error
from nvpair_tw.ops._steering import PROCESS, SCOPED
from nvpair_tw.runtime import ListenerService, Runtime

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_LINE_BYTES",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "ControlFactory",
    "ControlMethods",
    "ControlProtocol",
    "RpcError",
    "StdioControlService",
    "control_service",
    "forwarded",
]

log = LevelledLogger(namespace="nvpair_tw.control")

MAX_LINE_BYTES = 1 << 20
"""A request line longer than this is answered with -32600 and the connection is closed."""


def forwarded(name: str) -> bool:
    """Whether an event is sent to control clients: ``workload:*``, ``proxy/request``, ``node/*``."""
    return name.startswith(("workload:", "node/")) or name == "proxy/request"


def _failed_later(
    failure: Failure, method: str, request_id: object, notification: bool
) -> Result | None:
    """A method that answers later failed: -32603 like a method that fails at once, logged."""
    log.failure("control {method} failed", failure, method=short(method))
    return None if notification else rpc_error(request_id, INTERNAL_ERROR, "internal error")


class ControlMethods:
    """The method table of docs/behaviour.md §8 over one runtime; :meth:`handle_line` is the whole protocol logic.

    The methods themselves are in :mod:`nvpair_tw.ops._steering`, the JSON-RPC plumbing in
    :mod:`nvpair_tw.ops._rpc`; this class reads a line, dispatches it and answers.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._scoped = SCOPED
        self._process = PROCESS

    def handle_line(self, line: bytes) -> Result | Deferred[Result | None] | None:
        """Answer one request line; ``None`` for a blank line or a (valid) notification. A method
        that answers later (``node/drain``) gives a Deferred of the answer."""
        request = read_request(line)
        if not isinstance(request, Request):
            return request
        method, notification = request.method, request.notification
        try:
            result = self.call(method, request.params)
            if isinstance(result, Deferred):
                return result.addCallbacks(
                    lambda later: (
                        None
                        if notification
                        else {"jsonrpc": "2.0", "id": request.id, "result": later}
                    ),
                    lambda failure: _failed_later(failure, method, request.id, notification),
                )
        except RpcError as error:
            log.info(
                "control {method} refused ({code})",
                method=short(method),
                code=error.code,
                notification=notification,
            )
            return None if notification else rpc_error(request.id, error.code, error.message)
        except Exception:
            log.failure("control {method} failed", method=short(method))
            return None if notification else rpc_error(request.id, INTERNAL_ERROR, "internal error")
        log.debug("control {method} done", method=short(method), notification=notification)
        return None if notification else {"jsonrpc": "2.0", "id": request.id, "result": result}

    def call(self, method: str, params: object) -> Result | Deferred[Result]:
        """Run one method (``ENGINE:`` prefix allowed); raise :class:`RpcError` on bad input."""
        name, engine = self._resolve(method)
        if not isinstance(params, dict):
            raise invalid("params must be an object (by-name)")
        process = self._process.get(name)
        if process is not None:
            return process(self._runtime, params)
        return self._scoped[name](self._facade(name, engine), params)

    def _resolve(self, method: str) -> tuple[str, str | None]:
        if method in self._scoped or method in self._process:
            return method, None
        engine, colon, name = method.partition(":")
        if colon and (name in self._scoped or name in self._process):
            if engine not in self._runtime.facades:
                raise RpcError(
                    METHOD_NOT_FOUND,
                    f"method not found: {short(method)!r}: this proxy serves no engine "
                    f"{short(engine)!r} (engines: {', '.join(self._runtime.facades)})",
                )
            return name, engine
        raise RpcError(METHOD_NOT_FOUND, f"method not found: {short(method)!r}")

    def _facade(self, name: str, engine: str | None) -> FacadeState:
        facades = self._runtime.facades
        if engine is not None:
            return facades[engine]
        if len(facades) == 1:
            return next(iter(facades.values()))
        first = next(iter(facades))
        raise RpcError(
            INVALID_PARAMS,
            f"several engines are served ({', '.join(facades)}); "
            f"address one as ENGINE:{name}, e.g. {first}:{name}",
        )


class _Flow(Enum):
    """Where a connection's event stream stands."""

    OPENING = "opening"  # built, not yet connected
    LIVE = "live"  # events are written as they happen
    PAUSED = (
        "paused"  # the transport's buffer is full: events queue (bounded), requests are not read
    )
    CLOSED = "closed"  # dropped, over-long line, or disconnected: nothing more is written


@implementer(IPushProducer)
class ControlProtocol(LineOnlyReceiver):
    """One control connection: answers request lines and forwards events as notifications.

    It is its transport's streaming producer, so a full send buffer pauses its bus subscription.
    """

    delimiter = b"\n"
    MAX_LENGTH = MAX_LINE_BYTES

    def __init__(self, control: ControlFactory, peer: str) -> None:
        self._control = control
        self.peer = peer
        self.state = _Flow.OPENING
        self._subscription: Subscription | None = None
        self.disconnected: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.state = _Flow.LIVE
        self._subscription = self._control.runtime.shared.bus.subscribe(
            self._deliver,
            name=f"control {self.peer}",
            on_dropped=self._dropped,
            max_pending=self._control.max_pending,
        )
        cast(IConsumer, self.transport).registerProducer(self, True)
        self._control.connections.add(self)
        log.info("control client {peer} connected", peer=self.peer)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.state = _Flow.CLOSED
        if self._subscription is not None:
            self._subscription.close()
        self._control.connections.discard(self)
        log.info("control client {peer} disconnected", peer=self.peer)
        if not self.disconnected.called:
            self.disconnected.callback(None)

    def dataReceived(self, data: bytes) -> None:
        if self.state is not _Flow.CLOSED:
            super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        response = self._control.methods.handle_line(line)
        if isinstance(response, Deferred):
            response.addCallback(self._send_later)
        elif response is not None:
            self._send(response)

    def _send_later(self, response: Result | None) -> None:
        """A late answer, sent if the connection is still there to take it."""
        if response is not None and self.state is not _Flow.CLOSED:
            self._send(response)

    def lineLengthExceeded(self, line: bytes) -> None:
        message = f"invalid request: line longer than {self.MAX_LENGTH} bytes; closing"
        self._send(rpc_error(None, INVALID_REQUEST, message))
        log.warn("control client {peer} closed: request line too long", peer=self.peer)
        self._close(abort=False)

    def pauseProducing(self) -> None:
        if self.state is _Flow.LIVE and self._subscription is not None:
            assert self.transport is not None
            self.state = _Flow.PAUSED
            self._subscription.pause()
            cast(IPushProducer, self.transport).pauseProducing()

    def resumeProducing(self) -> None:
        if self.state is _Flow.PAUSED and self._subscription is not None:
            assert self.transport is not None
            self.state = _Flow.LIVE
            cast(IPushProducer, self.transport).resumeProducing()
            self._subscription.resume()

    def stopProducing(self) -> None:
        self._close(abort=False)

    def _deliver(self, event: Event) -> None:
        if not forwarded(event.name):
            return
        try:
            payload = json.dumps(
                {"jsonrpc": "2.0", "method": event.name, "params": event.payload},
                separators=(",", ":"),
                default=str,
            )
        except ValueError:
            log.warn("event {name} is not serialisable; not forwarded", name=event.name)
            return
        self._write(payload.encode())

    def _dropped(self, reason: str) -> None:
        log.warn("control client {peer} dropped: {reason}", peer=self.peer, reason=reason)
        self._close(abort=True)

    def _send(self, message: Result) -> None:
        self._write(json.dumps(message, separators=(",", ":"), default=str).encode())

    def _write(self, line: bytes) -> None:
        if self.state is not _Flow.CLOSED:
            self.sendLine(line)

    def _close(self, *, abort: bool) -> None:
        """Stop everything now; ``abort`` discards unsent bytes (for a client that does not read)."""
        if self.state is _Flow.CLOSED:
            return
        self.state = _Flow.CLOSED
        if self._subscription is not None:
            self._subscription.close()
        if self.transport is not None:
            abort_connection = getattr(self.transport, "abortConnection", None)
            if abort and abort_connection is not None:
                abort_connection()
            else:
                self.transport.loseConnection()


class ControlFactory(Factory):
    """Builds a :class:`ControlProtocol` per connection; holds the runtime and the method table.

    ``max_pending`` bounds each paused connection's event queue (default: the bus's bound).
    """

    noisy = False

    def __init__(self, runtime: Runtime, *, max_pending: int | None = None) -> None:
        self.runtime = runtime
        self.methods = ControlMethods(runtime)
        self.max_pending = max_pending
        self.connections: set[ControlProtocol] = set()
        self._serial = 0

    def buildProtocol(self, addr: IAddress | None) -> ControlProtocol:
        self._serial += 1
        host = getattr(addr, "host", None)
        if host is not None:
            peer = f"#{self._serial} {host}:{getattr(addr, 'port', '')}"
        else:
            peer = f"#{self._serial} {'stdio' if isinstance(addr, PipeAddress) else 'unix'}"
        protocol = ControlProtocol(self, peer)
        protocol.factory = self
        return protocol


class StdioControlService(service.Service):
    """Serves one control session on standard input and output (``--control stdio``)."""

    def __init__(
        self, reactor: IProxyReactor, factory: ControlFactory, *, stdin: int = 0, stdout: int = 1
    ) -> None:
        self._reactor = reactor
        self._factory = factory
        self._fds = (stdin, stdout)
        self.transport: Any = None
        self.protocol: ControlProtocol | None = None

    def startService(self) -> None:
        super().startService()
        self.protocol = self._factory.buildProtocol(PipeAddress())
        stdin, stdout = self._fds
        self.transport = cast(Any, StandardIO)(
            self.protocol, stdin=stdin, stdout=stdout, reactor=self._reactor
        )
        log.info("control channel serving one session on stdio")

    def stopService(self) -> Deferred[None]:
        """End the session; fires once it is closed (the descriptors stay open, as stdio's do)."""
        super().stopService()
        if self.transport is None or self.protocol is None:
            return succeed(None)
        transport, self.transport = self.transport, None
        transport.loseConnection()
        return self.protocol.disconnected


def control_service(reactor: IProxyReactor, runtime: Runtime, description: str) -> service.IService:
    """The ``--control`` service: a listener on a Twisted server endpoint string, or ``stdio``.

    A description the endpoint parser rejects raises :class:`ValueError` with a one-line message.
    """
    factory = ControlFactory(runtime)
    if description.strip() == "stdio":
        return StdioControlService(reactor, factory)
    try:
        serverFromString(reactor, description)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--control {description!r}: not a server endpoint: {error}") from None
    return ListenerService(reactor, description, factory, "control channel")
