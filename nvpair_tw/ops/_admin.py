# -*- test-case-name: tests.ops.test_admin -*-
"""The admin listener (docs/behaviour.md §10): metrics, health, readiness, the live status page and its events.

A separate ``Site`` (``--admin``, loopback by default) so operators never share a port with clients.
It serves ``local`` callers only (docs/behaviour.md §14.2, §14.4): every request passes the same
test as a facade's (loopback peer, a local ``Host``, no foreign ``Origin``), else 403
``host-not-allowed``, so a web page cannot read it through DNS rebinding. It has the facades' header
timeout and a 1 MiB body cap (413). Everything it shows is derived from the runtime's state and the event bus, which carry metadata only:
no prompt, body or credential can reach the page, the JSON or the event stream. What the page
shows beyond live state is the status board's (:mod:`~nvpair_tw.ops._board`; ``StatusBoard`` is
named here too, where the admin listener's users have always found it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from enum import Enum
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from twisted.application import service
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from nvpair_tw.core import IProxyReactor
from nvpair_tw.events import Event, EventBus, Subscription
from nvpair_tw.inbound import LimitedSite, Locality, LocalNames, locality, make_site
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.ops._board import Listening, StatusBoard
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.ops._usage import read_report, report_of
from nvpair_tw.runtime import ListenerService, Runtime

__all__ = [
    "AdminService",
    "EventStream",
    "LocalOnly",
    "StatusBoard",
    "StreamState",
    "admin_resource",
    "admin_service",
    "admin_site",
    "facade_header_timeout",
    "readiness",
]

log = LevelledLogger(namespace=__name__)

KEEPALIVE_INTERVAL = 15.0
SSE_MAX_PENDING = 256
MAX_BODY_SIZE = 1024 * 1024
"""The admin listener's body cap (§14.4): it reads no body, so anything larger is 413."""
HEADER_TIMEOUT = 10.0
"""The facades' header timeout when the runtime has no facade site to read it from."""


def site_listening(runtime: Runtime) -> Listening:
    """Whether a facade's ``Site`` has a listening port (``Factory.numPorts`` counts them)."""

    def listening(engine: str) -> bool:
        site = runtime.sites.get(engine)
        return site is not None and site.numPorts > 0

    return listening


def readiness(runtime: Runtime, listening: Listening) -> str | None:
    """``None`` when ready; else why not (a facade not listening, or no inventory known anywhere)."""
    for engine in runtime.facades:
        if not listening(engine):
            return f"{engine} facade is not listening"
    for facade in runtime.facades.values():
        if any(facade.inventory.known(node.id) for node in facade.directory.nodes()):
            return None
    return "no node has a known inventory yet"


class StreamState(Enum):
    """An ``/events`` stream is open until the client leaves, falls behind, or the admin stops."""

    OPEN = "open"
    CLOSED = "closed"


def sse_frame(event: Event) -> bytes:
    """One server-sent-events frame; JSON never contains a raw newline, so one ``data:`` line."""
    data = json.dumps(event.payload, separators=(",", ":"), default=str)
    return f"event: {event.name}\ndata: {data}\n\n".encode()


@implementer(IPushProducer)
class EventStream:
    """One ``/events`` client: every bus event as an SSE frame, paced by the client's transport.

    The HTTP channel pauses and resumes this producer as the socket buffer fills and drains; the bus
    subscription follows, queueing up to ``max_pending`` events, past which the bus drops it and the
    client is disconnected (it fell behind). A comment line every ``keepalive`` seconds keeps
    intermediaries from timing the stream out.
    """

    def __init__(
        self,
        request: Request,
        bus: EventBus,
        clock: IReactorTime,
        *,
        keepalive: float = KEEPALIVE_INTERVAL,
        max_pending: int = SSE_MAX_PENDING,
        on_closed: Callable[[EventStream], None] = lambda _stream: None,
    ) -> None:
        self._request = request
        self._bus = bus
        self._clock = clock
        self._keepalive = keepalive
        self._max_pending = max_pending
        self._on_closed = on_closed
        self.state = StreamState.OPEN
        self._subscription: Subscription | None = None
        self._timer: IDelayedCall | None = None

    def start(self) -> None:
        """Send the headers, subscribe, register as the request's producer, start keep-alives."""
        request = self._request
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-accel-buffering", b"no")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.notifyFinish().addBoth(self._gone)
        request.write(b"retry: 3000\n\n")
        if self.state is not StreamState.OPEN:
            return
        self._subscription = self._bus.subscribe(
            self._deliver,
            name="sse",
            on_dropped=self._fell_behind,
            max_pending=self._max_pending,
        )
        request.registerProducer(self, True)
        self._schedule()

    def close(self) -> None:
        """End the stream cleanly (the admin listener is stopping)."""
        if self.state is not StreamState.OPEN:
            return
        self._shut()
        self._request.unregisterProducer()
        self._request.finish()

    def pauseProducing(self) -> None:
        if self._subscription is not None:
            self._subscription.pause()

    def resumeProducing(self) -> None:
        if self._subscription is not None:
            self._subscription.resume()

    def stopProducing(self) -> None:
        self._shut()

    def _deliver(self, event: Event) -> None:
        self._request.write(sse_frame(event))

    def _schedule(self) -> None:
        self._timer = self._clock.callLater(self._keepalive, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.state is StreamState.OPEN:
            self._request.write(b": keep-alive\n\n")
            self._schedule()

    def _fell_behind(self, reason: str) -> None:
        log.warn("status event stream dropped: {reason}", reason=reason)
        self._shut()
        transport = getattr(self._request, "transport", None)
        if transport is not None:
            transport.abortConnection()

    def _gone(self, result: object) -> None:
        self._shut()  # a failure here is the client leaving: expected, nothing to report

    def _shut(self) -> None:
        if self.state is StreamState.CLOSED:
            return
        self.state = StreamState.CLOSED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        self._on_closed(self)


def _json(request: Request, status: int, document: Mapping[str, Any]) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(document, separators=(",", ":"), default=str).encode()


class _Get(Resource):
    """A leaf answering GET (and HEAD) only, with JSON errors otherwise."""

    isLeaf = True

    def __init__(self, handler: Callable[[Request], bytes | int]) -> None:
        super().__init__()
        self._handler = handler

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        if request.method not in (b"GET", b"HEAD"):
            request.setHeader(b"allow", b"GET, HEAD")
            return _json(
                request, 405, {"error": "method not allowed", "code": "method-not-allowed"}
            )
        return self._handler(request)


class _Root(Resource):
    def getChild(self, path: bytes, request: Request) -> IResource:  # type: ignore[override]
        return _Get(lambda r: _json(r, 404, {"error": "not found", "code": "not-found"}))


def _static(name: str) -> bytes:
    return resources.files("nvpair_tw").joinpath("static", name).read_bytes()


_PAGE_POLICY = (
    b"default-src 'none'; script-src 'self'; connect-src 'self'; "
    b"style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'"
)


def _file(body: bytes, content_type: bytes) -> Callable[[Request], bytes]:
    def serve(request: Request) -> bytes:
        request.setHeader(b"content-type", content_type)
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"content-security-policy", _PAGE_POLICY)
        request.setHeader(b"cache-control", b"no-cache")
        return body

    return serve


def admin_resource(
    runtime: Runtime,
    metrics: ProxyMetrics,
    board: StatusBoard,
    listening: Listening,
    open_stream: Callable[[Request], None],
) -> Resource:
    """The admin resource tree: ``/``, ``/status.js``, ``/metrics``, ``/healthz``, ``/readyz``,
    ``/api/state``, ``/api/usage`` and ``/events``."""

    def serve_metrics(request: Request) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return metrics.exposition()

    def serve_ready(request: Request) -> bytes:
        reason = readiness(runtime, listening)
        if reason is None:
            ready: dict[str, Any] = {"status": "ready"}
            if runtime.fleet is not None:
                # The store is an optimisation, never a dependency: ready either way (docs/behaviour.md §6.6).
                ready["state"] = runtime.fleet.status()
            return _json(request, 200, ready)
        return _json(request, 503, {"error": reason, "code": "not-ready"})

    def serve_events(request: Request) -> int:
        open_stream(request)
        return NOT_DONE_YET

    root = _Root()
    root.putChild(b"", _Get(_file(_static("status.html"), b"text/html; charset=utf-8")))
    root.putChild(
        b"status.js", _Get(_file(_static("status.js"), b"text/javascript; charset=utf-8"))
    )
    root.putChild(b"metrics", _Get(serve_metrics))
    root.putChild(b"healthz", _Get(lambda r: _json(r, 200, {"status": "ok"})))
    root.putChild(b"readyz", _Get(serve_ready))
    root.putChild(b"events", _Get(serve_events))
    api = _Root()
    api.putChild(b"state", _Get(lambda r: _json(r, 200, board.state(listening))))
    api.putChild(b"usage", _Get(lambda r: serve_usage(runtime, r)))
    root.putChild(b"api", api)
    return root


def _query(request: Request, name: str) -> str | None:
    values = (request.args or {}).get(name.encode())
    return None if not values else values[-1].decode("utf-8", "replace")


def serve_usage(runtime: Runtime, request: Request) -> bytes | int:
    """``GET /api/usage?since=24h&until=…&by=key,model``: the usage report as JSON (400 with
    ``{"error", "code": "invalid-params"}`` for bad parameters, 503 when it cannot be read)."""
    try:
        report = read_report(
            runtime, _query(request, "since"), _query(request, "until"), _query(request, "by")
        )
    except ValueError as error:
        return _json(request, 400, {"error": str(error), "code": "invalid-params"})
    gone: list[object] = []
    request.notifyFinish().addErrback(gone.append)

    def answer(document: dict[str, Any]) -> None:
        if not gone:
            request.write(_json(request, 200, document))
            request.finish()

    def failed(failure: Failure) -> None:
        log.failure("usage report failed", failure)
        if not gone:
            error = {"error": "usage could not be read", "code": "usage-unavailable"}
            request.write(_json(request, 503, error))
            request.finish()

    report_of(runtime, report).addCallbacks(answer, failed)
    return NOT_DONE_YET


class LocalOnly(Resource):
    """The admin listener's gate (§14.2, §14.4): ``root`` for a ``local`` caller; else 403
    ``host-not-allowed`` (400 ``bad-request`` for two ``Host`` headers), nothing else read."""

    def __init__(self, root: Resource, names: LocalNames) -> None:
        super().__init__()
        self._root = root
        self._names = names

    def _refusal(self, request: Request) -> _Refusal | None:
        where = locality(request.getClientAddress(), request.requestHeaders, self._names)
        if where is Locality.LOCAL:
            return None
        if where is Locality.AMBIGUOUS:
            return _Refusal(400, "bad-request", "more than one Host header")
        return _Refusal(403, "host-not-allowed", "the admin listener serves local callers only")

    def getChildWithDefault(self, path: bytes, request: Request) -> IResource:  # type: ignore[override]
        refused = self._refusal(request)
        if refused is not None:
            return refused
        child: IResource = self._root.getChildWithDefault(path, request)
        return child

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        refused = self._refusal(request)
        if refused is not None:
            return refused.render(request)
        rendered: bytes | int = self._root.render(request)
        return rendered


class _Refusal(Resource):
    """A JSON error to every method; the connection closes after it."""

    isLeaf = True

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__()
        self._status, self._code, self._message = status, code, message

    def render(self, request: Request) -> bytes:  # type: ignore[override]
        request.setHeader(b"connection", b"close")
        return _json(request, self._status, {"error": self._message, "code": self._code})


def facade_header_timeout(runtime: Runtime) -> float:
    """The facades' header timeout (§14.4): what their sites' limits say."""
    sites = [runtime.site_for(engine) for engine in runtime.facades]
    return min((site.limits.header_timeout for site in sites), default=HEADER_TIMEOUT)


def admin_site(reactor: IProxyReactor, runtime: Runtime, root: Resource) -> LimitedSite:
    """The admin ``Site``: ``root`` behind the ``local`` gate, with the facades' header timeout
    and a 1 MiB body cap (§14.4)."""
    ingress = runtime.shared.ingress
    names = ingress.names if ingress is not None else LocalNames.of()
    return make_site(
        LocalOnly(root, names),
        clock=reactor,
        max_body_size=MAX_BODY_SIZE,
        header_timeout=facade_header_timeout(runtime),
    )


class AdminService(service.MultiService):
    """The admin listener with its metrics, status board and open event streams."""

    def __init__(
        self,
        reactor: IProxyReactor,
        runtime: Runtime,
        description: str,
        *,
        listening: Listening | None = None,
        keepalive: float = KEEPALIVE_INTERVAL,
    ) -> None:
        super().__init__()
        self._reactor = reactor
        self._runtime = runtime
        self._keepalive = keepalive
        self.metrics = ProxyMetrics(runtime)
        self.board = StatusBoard(runtime)
        self.streams: set[EventStream] = set()
        self.listening = listening if listening is not None else site_listening(runtime)
        root = admin_resource(runtime, self.metrics, self.board, self.listening, self._open)
        self.site = admin_site(reactor, runtime, root)
        self.listener = ListenerService(reactor, description, self.site, "admin")
        self.listener.setServiceParent(self)

    def _open(self, request: Request) -> None:
        stream = EventStream(
            request,
            self._runtime.shared.bus,
            self._reactor,
            keepalive=self._keepalive,
            on_closed=self.streams.discard,
        )
        self.streams.add(stream)
        stream.start()

    def stopService(self) -> Any:
        stopped = super().stopService()
        for stream in list(self.streams):
            stream.close()
        self.metrics.close()
        self.board.close()
        return stopped


def admin_service(reactor: IProxyReactor, runtime: Runtime, description: str) -> AdminService:
    """The ``--admin`` listener on ``description`` (a Twisted server endpoint string)."""
    return AdminService(reactor, runtime, description)
