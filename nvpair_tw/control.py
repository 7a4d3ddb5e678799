# -*- test-case-name: tests.test_control -*-
"""The JSON-RPC 2.0 control channel (SPEC §8): inspect and steer nodes, pins, priorities, workloads.

One JSON object per line in each direction. Methods change the very state the facades route with
(node directories, pins, the process-wide reservation ledger, workloads, the log level), so a change
applies to the next request without a restart. Every connected client also receives the proxy's
events (§7) as notifications through a bounded bus subscription that the transport's flow control
pauses: a client that stops reading is dropped and never slows the proxy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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

from nvpair_tw.events import Event, Subscription
from nvpair_tw.facade import Facade
from nvpair_tw.logs import LevelledLogger, current_level, parse_level, set_level
from nvpair_tw.nodes import Node, validate_url
from nvpair_tw.reactor import IProxyReactor
from nvpair_tw.reservations import make_rank
from nvpair_tw.runtime import Runtime
from nvpair_tw.service import ListenerService

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

log = LevelledLogger()

MAX_LINE_BYTES = 1 << 20
"""A request line longer than this is answered with -32600 and the connection is closed."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

CANCEL_REASON = "cancelled by request"

Params = Mapping[str, Any]
Result = dict[str, Any]


def forwarded(name: str) -> bool:
    """Whether an event is sent to control clients: ``workload:*``, ``proxy/request``, ``node/*``."""
    return name.startswith(("workload:", "node/")) or name == "proxy/request"


class RpcError(Exception):
    """A JSON-RPC error to answer with: a code and a message without secrets."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, f"invalid params: {message}")


def _error(request_id: Any, code: int, message: str) -> Result:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))


def _string(value: object, label: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise _invalid(f"{label} must be a {'' if empty else 'non-empty '}string")
    return value


def _text(params: Params, key: str, where: str = "", *, empty: bool = False) -> str:
    return _string(params.get(key), f"{where}{key}", empty=empty)


def _integer(params: Params, key: str, where: str = "", default: int | None = None) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{where}{key} must be an integer")
    return value


def _array(params: Params, key: str, where: str = "") -> list[Any]:
    value = params.get(key)
    if not isinstance(value, list):
        raise _invalid(f"{where}{key} must be an array")
    return value


def _object(value: object, where: str) -> Params:
    if not isinstance(value, dict):
        raise _invalid(f"{where} must be an object")
    return value


def _node(params: Params, where: str, source: str) -> Node:
    """A node from ``{id, url, models?}``; the URL is validated but never echoed (it may carry a password)."""
    node_id = _text(params, "id", where)
    url = _text(params, "url", where)
    try:
        validate_url(url)
    except ValueError as error:
        raise _invalid(f"{where}url {error}") from None
    models = params.get("models")
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        raise _invalid(f"{where}models must be an array of non-empty strings")
    return Node(node_id, url, None if models is None else tuple(models), source)


class ControlMethods:
    """The method table of SPEC §8 over one runtime; :meth:`handle_line` is the whole protocol logic."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._scoped: dict[str, Callable[[Facade, Params], Result]] = {
            "nodes/list": self._nodes_list,
            "node/add-manual": self._add_manual,
            "node/remove-manual": self._remove_manual,
            "discovery:nodes": self._discovery,
            "node/select": self._select,
            "node/selected": self._select,
            "node/model-owners": self._model_owners,
        }
        self._process: dict[str, Callable[[Params], Result]] = {
            "node/set-priority": self._set_priority,
            "workload/cancel": self._cancel,
            "log/set-level": self._set_level,
        }

    def handle_line(self, line: bytes) -> Result | None:
        """Answer one request line; ``None`` for a blank line or a (valid) notification."""
        text = line.strip()
        if not text:
            return None
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):
            return _error(None, PARSE_ERROR, "parse error: the line is not valid JSON")
        if isinstance(message, list):
            return _error(
                None,
                INVALID_REQUEST,
                "invalid request: batches are not supported; one object per line",
            )
        if not isinstance(message, dict):
            return _error(None, INVALID_REQUEST, "invalid request: expected a JSON object")
        request_id = message.get("id")
        if not _valid_id(request_id):
            return _error(
                None, INVALID_REQUEST, "invalid request: id must be a string, a number or null"
            )
        if message.get("jsonrpc") != "2.0":
            return _error(request_id, INVALID_REQUEST, 'invalid request: jsonrpc must be "2.0"')
        method = message.get("method")
        if not isinstance(method, str) or not method:
            return _error(
                request_id, INVALID_REQUEST, "invalid request: method must be a non-empty string"
            )
        notification = "id" not in message
        try:
            result = self.call(method, message.get("params", {}))
        except RpcError as error:
            log.info(
                "control {method} refused ({code})",
                method=_short(method),
                code=error.code,
                notification=notification,
            )
            return None if notification else _error(request_id, error.code, error.message)
        except Exception:
            log.failure("control {method} failed", method=_short(method))
            return None if notification else _error(request_id, INTERNAL_ERROR, "internal error")
        log.debug("control {method} done", method=_short(method), notification=notification)
        return None if notification else {"jsonrpc": "2.0", "id": request_id, "result": result}

    def call(self, method: str, params: object) -> Result:
        """Run one method (``ENGINE:`` prefix allowed); raise :class:`RpcError` on bad input."""
        name, engine = self._resolve(method)
        if not isinstance(params, dict):
            raise _invalid("params must be an object (by-name)")
        process = self._process.get(name)
        if process is not None:
            return process(params)
        return self._scoped[name](self._facade(name, engine), params)

    def _resolve(self, method: str) -> tuple[str, str | None]:
        if method in self._scoped or method in self._process:
            return method, None
        engine, colon, name = method.partition(":")
        if colon and (name in self._scoped or name in self._process):
            if engine not in self._runtime.facades:
                raise RpcError(
                    METHOD_NOT_FOUND,
                    f"method not found: {_short(method)!r}: this proxy serves no engine "
                    f"{_short(engine)!r} (engines: {', '.join(self._runtime.facades)})",
                )
            return name, engine
        raise RpcError(METHOD_NOT_FOUND, f"method not found: {_short(method)!r}")

    def _facade(self, name: str, engine: str | None) -> Facade:
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

    def _nodes_list(self, facade: Facade, params: Params) -> Result:
        nodes = []
        for node in facade.directory.nodes():
            cooldown = facade.stalls.cooldown(node.id)
            loaded = facade.inventory.loaded(node.id)
            nodes.append(
                {
                    "id": node.id,
                    "url": node.public_url,
                    "models": sorted(facade.inventory.models(node.id)),
                    "loaded": None if loaded is None else sorted(loaded),
                    "source": node.source,
                    "coolingUntil": None if cooldown is None else int(cooldown.until * 1000),
                    "slots": facade.admission.slots(node.id),
                    "slotsInUse": facade.admission.slots_in_use(node.id),
                    "busyWaits": facade.progress.busy_waits(node.id),
                }
            )
        return {"nodes": nodes, "queueDepth": facade.admission.queue_depth}

    def _add_manual(self, facade: Facade, params: Params) -> Result:
        node = _node(params, "", "manual")
        added = facade.directory.add_manual(node)
        log.info("manual node {node} added to {engine}", node=node.id, engine=facade.engine)
        return {"added": added}

    def _remove_manual(self, facade: Facade, params: Params) -> Result:
        node_id = _text(params, "id")
        removed = facade.directory.remove_manual(node_id)
        log.info("manual node {node} removed from {engine}", node=node_id, engine=facade.engine)
        return {"removed": removed}

    def _discovery(self, facade: Facade, params: Params) -> Result:
        nodes = [
            _node(_object(entry, f"nodes[{i}]"), f"nodes[{i}].", "discovery")
            for i, entry in enumerate(_array(params, "nodes"))
        ]
        facade.directory.set_discovered(nodes)
        log.info(
            "discovery snapshot for {engine}: {count} nodes", engine=facade.engine, count=len(nodes)
        )
        return {"count": len(nodes)}

    def _select(self, facade: Facade, params: Params) -> Result:
        node_id = _text(params, "id", empty=True)
        if node_id and facade.directory.get(node_id) is None:
            raise RpcError(INVALID_PARAMS, f'node "{_short(node_id)}" not found')
        facade.pin = node_id or None
        log.info("{engine} selection: {node}", engine=facade.engine, node=node_id or "automatic")
        return {"id": node_id}

    def _model_owners(self, facade: Facade, params: Params) -> Result:
        model = _text(params, "model")
        return {"nodes": [node.id for node in facade.eligible(model)]}

    def _set_priority(self, params: Params) -> Result:
        generation = _integer(params, "generation")
        nodes = [_string(n, f"nodes[{i}]") for i, n in enumerate(_array(params, "nodes"))]
        ranks = []
        for i, entry in enumerate(_array(params, "ranks") if "ranks" in params else []):
            where = f"ranks[{i}]."
            rank = _object(entry, f"ranks[{i}]")
            ranks.append(
                make_rank(
                    _text(rank, "id", where),
                    _integer(rank, "pending", where, 0),
                    _integer(rank, "gpuPressure", where, 0),
                )
            )
        ledger = self._runtime.shared.ledger
        if not ledger.apply(generation, nodes, ranks):
            log.info(
                "stale priority snapshot {generation} ignored (current {current})",
                generation=generation,
                current=ledger.snapshot.generation,
            )
            return {"count": 0}
        count = len(ledger.snapshot.ranks)
        log.debug("priority snapshot {generation} applied", generation=generation, count=count)
        return {"count": count}

    def _cancel(self, params: Params) -> Result:
        workload_id = _integer(params, "id")
        accepted = self._runtime.shared.workloads.cancel(workload_id, CANCEL_REASON)
        log.info("cancel of workload {workload} requested", workload=workload_id, accepted=accepted)
        return {"accepted": accepted}

    def _set_level(self, params: Params) -> Result:
        try:
            level = parse_level(_text(params, "level"))
        except ValueError as error:
            raise _invalid(f"level: {error}") from None
        set_level(level)
        log.info("log level set to {log_level_name}", log_level_name=level.name)
        return {"level": current_level().name}


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
        if response is not None:
            self._send(response)

    def lineLengthExceeded(self, line: bytes) -> None:
        message = f"invalid request: line longer than {self.MAX_LENGTH} bytes; closing"
        self._send(_error(None, INVALID_REQUEST, message))
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
