# -*- test-case-name: tests.ops.test_control -*-
"""The JSON-RPC 2.0 control channel (docs/behaviour.md §8): inspect and steer nodes, pins, priorities, workloads.

One JSON object per line in each direction. Methods change the very state the facades route with
(node directories, pins, the process-wide reservation ledger, workloads, the log level), so a change
applies to the next request without a restart. Every connected client also receives the proxy's
events (§7) as notifications through a bounded bus subscription that the transport's flow control
pauses: a client that stops reading is dropped and never slows the proxy.

No web page can drive it (docs/behaviour.md §14.3): on a channel with a token a connection's first
call must be ``auth`` with it, and nothing (not one notification) is sent before; a line that is
not JSON-RPC (an HTTP request line or header included) is answered -32700 and the connection closes
at once, with nothing after it in the same read acted on. A source that keeps failing ``auth`` is
slowed down (:class:`~nvpair_tw.ops._token.AuthThrottle`): each compared failure is logged, the
calls refused unchecked are counted and told once.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, cast

from twisted.application import service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IAddress, IConsumer, IPushProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.stdio import PipeAddress, StandardIO
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair_tw.core import IProxyReactor, abort
from nvpair_tw.events import EVENT_KINDS, Event, FanOutProgress, RequestPhase, Subscription
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.ops._answers import PendingAnswers
from nvpair_tw.ops._dispatch import ControlMethods, InOrder
from nvpair_tw.ops._lines import LineBuffer, TooLong
from nvpair_tw.ops._rpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNAUTHORIZED,
    BadRequest,
    NotJsonRpc,
    Request,
    Result,
    RpcError,
    read_request,
)
from nvpair_tw.ops._rpc import error as rpc_error
from nvpair_tw.ops._token import AuthThrottle, ControlToken, admit_auth, auth_source, needs_token
from nvpair_tw.runtime import ListenerService, Runtime

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_LINE_BYTES",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "UNAUTHORIZED",
    "ControlFactory",
    "ControlMethods",
    "ControlProtocol",
    "RpcError",
    "StdioControlService",
    "control_service",
    "forwarded",
]

NOTIFIED = tuple(kind for kind in EVENT_KINDS if kind not in (RequestPhase, FanOutProgress))
"""What a control client is sent: every event but a request's phases and a fan-out's progress
(the status page's)."""

log = LevelledLogger(namespace=__name__)

MAX_LINE_BYTES = 1 << 20
"""A request line longer than this is answered with -32600 and the connection is closed."""
_TOO_LONG = rpc_error(
    None, INVALID_REQUEST, f"invalid request: line longer than {MAX_LINE_BYTES} bytes; closing"
)


def forwarded(name: str) -> bool:
    """Whether an event is sent to control clients: ``workload:*``, ``proxy/request``, ``node/*``."""
    return name.startswith(("workload:", "node/")) or name == "proxy/request"


def notification(event: Event) -> bytes | None:
    """The JSON-RPC notification line for a forwarded event; ``None`` when it is not sent."""
    if not forwarded(event.name):
        return None
    try:
        payload = json.dumps(
            {"jsonrpc": "2.0", "method": event.name, "params": event.payload},
            separators=(",", ":"),
            default=str,
        )
    except ValueError:
        log.warn("event {name} is not serialisable; not forwarded", name=event.name)
        return None
    return payload.encode()


class _Flow(Enum):
    """Where a connection stands."""

    OPENING = "opening"  # built, not yet connected
    AUTHENTICATING = "authenticating"  # connected; only an ``auth`` call is taken, nothing is sent
    LIVE = "live"  # events are written as they happen
    PAUSED = (
        "paused"  # the transport's buffer is full: events queue (bounded), requests are not read
    )
    CLOSED = "closed"  # dropped, refused, over-long line, or disconnected: nothing more is written


@implementer(IPushProducer)
class ControlProtocol(Protocol):
    """One control connection: answers request lines and forwards events as notifications.

    It is its transport's streaming producer, so a full send buffer pauses its bus subscription.
    While an :class:`~nvpair_tw.ops._dispatch.InOrder` answer is pending, later lines wait.
    """

    def __init__(self, control: ControlFactory, peer: str, source: str = "local") -> None:
        self._control = control
        self.peer = peer
        self.source = source
        """Whose failed ``auth`` calls this connection's count with (docs/behaviour.md §14.3)."""
        self.state = _Flow.OPENING
        self._lines = LineBuffer(MAX_LINE_BYTES)
        self._answers = PendingAnswers(self._send)  # cancelled if the client leaves
        self._subscription: Subscription | None = None
        self.disconnected: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        cast(IConsumer, self.transport).registerProducer(self, True)
        self._control.connections.add(self)
        log.info("control client {peer} connected", peer=self.peer)
        if self._control.token is None:
            self._open()
        else:
            self.state = _Flow.AUTHENTICATING

    def _open(self) -> None:
        """Start the event feed: the connection may now be sent notifications."""
        self.state = _Flow.LIVE
        self._subscription = self._control.runtime.shared.bus.subscribe(
            self._deliver,
            name=f"control {self.peer}",
            on_dropped=self._dropped,
            max_pending=self._control.max_pending,
            kinds=NOTIFIED,
        )

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop()
        self._answers.cancel_all()  # nobody to answer: a node/drain stops waiting
        self._control.connections.discard(self)
        log.info("control client {peer} disconnected", peer=self.peer)
        if not self.disconnected.called:
            self.disconnected.callback(None)

    def dataReceived(self, data: bytes) -> None:
        if self.state is _Flow.CLOSED:
            return
        self._lines.feed(data)
        if self._answers.waiting is not None and self._lines.size > MAX_LINE_BYTES:
            self._refuse(_TOO_LONG, "requests piled up behind an in-order answer")
            return
        self._serve()

    def _serve(self) -> None:
        """Answer the buffered lines, one at a time, until none is left, the connection closes or
        an in-order answer is pending."""
        while self.state is not _Flow.CLOSED and self._answers.waiting is None:
            line = self._lines.next_line()
            if line is None:
                return
            if isinstance(line, TooLong):
                self._refuse(_TOO_LONG, "request line too long")
                return
            self.lineReceived(line)

    def lineReceived(self, line: bytes) -> None:
        request = read_request(line)
        if request is None:
            return
        if isinstance(request, NotJsonRpc):
            self._refuse(request.response, "not JSON-RPC")
            return
        if self.state is _Flow.AUTHENTICATING:
            self._authenticate(request)
            return
        answer = (
            request.response
            if isinstance(request, BadRequest)
            else self._control.methods.answer(request)
        )
        if isinstance(answer, InOrder):
            self._answers.in_order(answer.answer, self._serve)
        elif isinstance(answer, Deferred):
            self._answers.later(answer)
        elif answer is not None:
            self._send(answer)

    def _authenticate(self, request: Request | BadRequest) -> None:
        """The first call on a channel with a token: ``auth`` opens the connection, anything
        else is -32001 and closes it (docs/behaviour.md §14.3)."""
        token = self._control.token
        assert token is not None
        admitted = admit_auth(request, token, self._control.throttle, self.source, self.peer)
        if not isinstance(admitted, Request):
            self._send(admitted)
            self._close()
            return
        self._open()
        log.info("control client {peer} authenticated", peer=self.peer)
        if not admitted.notification:
            self._send({"jsonrpc": "2.0", "id": admitted.id, "result": {"authenticated": True}})

    def _refuse(self, response: Result, why: str) -> None:
        """Answer, then close at once: nothing after this line is read or acted on."""
        self._send(response)
        log.warn("control client {peer} closed: {why}", peer=self.peer, why=why)
        self._close()

    def pauseProducing(self) -> None:
        if self.state is _Flow.LIVE and self._subscription is not None:
            self.state = _Flow.PAUSED
            self._subscription.pause()
            cast(IPushProducer, self.transport).pauseProducing()

    def resumeProducing(self) -> None:
        if self.state is _Flow.PAUSED and self._subscription is not None:
            self.state = _Flow.LIVE
            cast(IPushProducer, self.transport).resumeProducing()
            self._subscription.resume()

    def stopProducing(self) -> None:
        self._close()

    def _deliver(self, event: Event) -> None:
        self._write(notification(event))

    def _dropped(self, reason: str) -> None:
        """The client stopped reading: unsent bytes are discarded (RST)."""
        log.warn("control client {peer} dropped: {reason}", peer=self.peer, reason=reason)
        if self._stop():
            abort(self.transport)

    def _send(self, message: Result) -> None:
        self._write(json.dumps(message, separators=(",", ":"), default=str).encode())

    def _write(self, line: bytes | None) -> None:
        if line is not None and self.state is not _Flow.CLOSED and self.transport is not None:
            self.transport.write(line + b"\n")

    def _stop(self) -> bool:
        """Write and read nothing more, unsubscribe; ``False`` when already stopped."""
        if self.state is _Flow.CLOSED:
            return False
        self.state = _Flow.CLOSED
        if self._subscription is not None:
            self._subscription.close()
        return True

    def _close(self) -> None:
        """Stop now; what was written is still delivered, then the connection closes."""
        if self._stop() and self.transport is not None:
            self.transport.loseConnection()


class ControlFactory(Factory):
    """Builds a :class:`ControlProtocol` per connection; holds the runtime and the method table.

    ``max_pending`` bounds each paused connection's event queue (default: the bus's bound).
    ``token``, when given, must open every connection with ``auth`` (docs/behaviour.md §14.3).
    """

    noisy = False

    def __init__(
        self,
        runtime: Runtime,
        *,
        max_pending: int | None = None,
        token: ControlToken | None = None,
    ) -> None:
        self.runtime = runtime
        self.methods = ControlMethods(runtime)
        self.max_pending = max_pending
        self.token = token
        self.throttle = AuthThrottle(runtime.shared.clock)
        """Failed ``auth`` calls per source (docs/behaviour.md §14.3)."""
        self.connections: set[ControlProtocol] = set()
        self._serial = 0

    def buildProtocol(self, addr: IAddress | None) -> ControlProtocol:
        self._serial += 1
        host = getattr(addr, "host", None)
        if host is not None:
            peer = f"#{self._serial} {host}:{getattr(addr, 'port', '')}"
        else:
            peer = f"#{self._serial} {'stdio' if isinstance(addr, PipeAddress) else 'unix'}"
        protocol = ControlProtocol(self, peer, auth_source(addr))
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


def control_service(
    reactor: IProxyReactor,
    runtime: Runtime,
    description: str,
    *,
    token: ControlToken | None = None,
) -> service.IService:
    """The ``--control`` service: a listener on a Twisted server endpoint string, or ``stdio``.

    A description the endpoint parser rejects, or one that needs a token (every endpoint but
    ``stdio`` and a filesystem ``unix:`` socket, docs/behaviour.md §14.3) given none, raises
    :class:`ValueError` with a one-line message. With a ``token`` every connection must open with
    ``auth``, on every endpoint.
    """
    if token is None and needs_token(description):
        raise ValueError(
            f"--control {description!r}: a control endpoint other than stdio or a unix socket"
            " needs --control-token FILE"
        )
    factory = ControlFactory(runtime, token=token)
    if description.strip() == "stdio":
        return StdioControlService(reactor, factory)
    try:
        serverFromString(reactor, description)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--control {description!r}: not a server endpoint: {error}") from None
    return ListenerService(reactor, description, factory, "control channel")
