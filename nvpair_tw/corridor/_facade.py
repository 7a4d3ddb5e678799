# -*- test-case-name: tests.corridor.test_facade -*-
"""One engine's facade: the resource that classifies a request and hands it on.

Every request gets an id and a record; the ingress policy and the drain come first; then the route
kind decides (docs/behaviour.md §2): model lists are answered from every node here, everything else
is handed to :func:`nvpair_tw.corridor._exchange.forward`, which walks the corridor (order → attempts →
relay) and concludes it.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.core import RouteKind, abort, write_error
from nvpair_tw.corridor._aggregate import aggregate_model_list
from nvpair_tw.corridor._exchange import forward, model_of, target_of
from nvpair_tw.corridor._fanout import FanOutRequest, fan_out
from nvpair_tw.corridor._state import FacadeState, Shared
from nvpair_tw.corridor._targets import choose
from nvpair_tw.corridor._tunnel import TUNNEL_ENGINES, is_upgrade, open_tunnel
from nvpair_tw.corridor._workloads import RequestRecord
from nvpair_tw.inbound import Caller, Rejection, allow_origin
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node

__all__ = ["FacadeResource", "FacadeState", "Shared", "model_of", "target_of"]

log = LevelledLogger(namespace="nvpair_tw.facade")

_BAD_TARGET = Rejection(400, "bad-request", "malformed request target")
_SHUTTING_DOWN = Rejection(503, "shutting-down", "the proxy is shutting down")
_NOT_SERVED = Rejection(404, "not-found", "this facade does not serve this route")


class FacadeResource(Resource):
    """The whole resource tree of one facade: a leaf that classifies by method and exact path."""

    isLeaf = True

    def __init__(self, facade: FacadeState) -> None:
        super().__init__()
        self._facade = facade

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        request.defaultContentType = None
        facade = self._facade
        shared = facade.shared
        request_id = shared.workloads.next_request_id()
        request.responseHeaders.setRawHeaders(b"x-nvpair-request-id", [request_id.encode()])
        try:
            target: bytes | None = target_of(request.uri)
        except ValueError:
            target = None
        path = (target or request.uri).partition(b"?")[0].decode("latin-1")
        method = request.method.decode("latin-1")
        record = RequestRecord.begin(shared.clock, request_id, facade.engine, method, path)
        if shared.tracer is not None:
            shared.tracer.begin(record, request.requestHeaders)
        if self._preflight(request, record):
            return NOT_DONE_YET
        rejection, caller = self._rejection(request, target)
        record.key = caller.name if caller is not None else None  # §12.1
        chosen = choose(facade, request, path, target or b"") if rejection is None else rejection
        if isinstance(chosen, Rejection):
            write_error(request, chosen.status, chosen.message, chosen.code, chosen.headers)
            record.publish(shared.bus, status=chosen.status, node_id=None, error=chosen.code)
            return NOT_DONE_YET
        if isinstance(chosen, FanOutRequest):
            return self._fan_out(request, record, chosen)
        kind = facade.profile.classify(request.method, path)
        if kind is RouteKind.PASS_THROUGH and not facade.profile.passes_through:
            write_error(request, 404, _NOT_SERVED.message, _NOT_SERVED.code)
            record.publish(shared.bus, status=404, node_id=None, error=_NOT_SERVED.code)
            return NOT_DONE_YET
        if facade.engine in TUNNEL_ENGINES and is_upgrade(request):
            work = Deferred.fromCoroutine(self._tunnel(request, record, chosen))
        elif kind is RouteKind.MODEL_LIST:
            work = Deferred.fromCoroutine(self._model_list(request, path, record, chosen, caller))
        else:
            work = Deferred.fromCoroutine(
                forward(facade, request, kind, record, chosen, caller=caller)
            )
        work.addErrback(self._crashed, request, record)
        return NOT_DONE_YET

    def _preflight(self, request: Request, record: RequestRecord) -> bool:
        """CORS (§13.4): grant an allowed origin; answer its preflight here, before the key check."""
        shared = self._facade.shared
        cors = shared.cors
        origin = cors.origin(request) if cors is not None else None
        if cors is None or origin is None:
            return False
        allow_origin(request, origin)
        if not cors.is_preflight(request):
            return False
        cors.answer_preflight(request, origin)
        record.publish(shared.bus, status=204, node_id=None, error=None)
        return True

    def _fan_out(self, request: Request, record: RequestRecord, fan: FanOutRequest) -> int:
        """Run a model-management call on several nodes at once (docs/behaviour.md §13.2)."""
        if not fan.body:
            assert request.content is not None
            fan.body = request.content.read()
        work = Deferred.fromCoroutine(fan_out(self._facade, request, fan, record))
        work.addErrback(self._crashed, request, record)
        return NOT_DONE_YET

    def _rejection(
        self, request: Request, target: bytes | None
    ) -> tuple[Rejection | None, Caller | None]:
        """Why this request is answered here at once (a bad target, ingress, or the drain), and
        who is calling (the key's name and rules, §12.1; None without an ingress policy)."""
        shared = self._facade.shared
        if target is None:
            return _BAD_TARGET, None
        caller = None
        if shared.ingress is not None:
            peer = request.getClientAddress()
            refused = shared.ingress.check(peer, request.requestHeaders)
            if refused is not None:
                return refused, None
            caller = shared.ingress.identify(peer, request.requestHeaders)
            shared.ingress.strip_credentials(peer, request.requestHeaders)
        if shared.draining:
            request.setHeader(b"connection", b"close")
            return _SHUTTING_DOWN, caller
        return None, caller

    def _crashed(self, failure: Failure, request: Request, record: RequestRecord) -> None:
        log.failure("request handling failed", failure, engine=self._facade.engine)
        if not request.startedWriting and not request.finished:
            write_error(request, 500, "internal proxy error", "internal-error")
        else:
            abort(request.transport)
        record.publish(self._facade.shared.bus, status=500, node_id=None, error="internal-error")

    async def _tunnel(self, request: Request, record: RequestRecord, target: Node | None) -> None:
        """A WebSocket upgrade (§2.1): the base order with demotion, no reservation; or the
        targeted node alone."""
        facade = self._facade
        shared = facade.shared
        if target is not None:
            nodes = [target]
            if target.kind_of(facade.profile).name not in TUNNEL_ENGINES:
                write_error(
                    request, 502, "no node of a kind that serves this route", "no-route-owner"
                )
                record.publish(shared.bus, status=502, node_id=None, error="no-route-owner")
                return
        else:
            # Only a node of a kind that speaks the SDK channel itself can carry it (§11.3).
            speaking = [
                n for n in facade.serving() if n.kind_of(facade.profile).name in TUNNEL_ENGINES
            ]
            nodes, _ = facade.order(speaking, head_selection=False)
        assert shared.endpoints is not None
        await open_tunnel(
            request,
            nodes,
            target_of(request.uri),
            engine=facade.engine,
            book=shared.tunnels,
            endpoints=shared.endpoints,
            clock=shared.clock,
            timeout=shared.settings.response_header_timeout,
            record=record,
            bus=shared.bus,
        )

    async def _model_list(
        self,
        request: Request,
        path: str,
        record: RequestRecord,
        target: Node | None,
        caller: Caller | None = None,
    ) -> None:
        """Answer a model list from every node at once (docs/behaviour.md §4.3), or from the
        targeted node alone; a key with a model scope sees only its models (§12.1)."""
        facade = self._facade
        fmt = facade.profile.model_lists[path]
        if target is not None:
            nodes = [target]
        else:
            nodes, _ = facade.order(facade.serving(), head_selection=False)
        result = await aggregate_model_list(
            fmt,
            nodes,
            target_of(request.uri).decode("latin-1"),
            facade.shared.http,
            facade.shared.clock,
            timeout=facade.shared.settings.model_list_timeout,
            facade=facade.profile,
            catalogue=facade.directory.catalogue,
            allows=(
                caller.rules.allows
                if caller is not None and caller.rules.models is not None
                else None
            ),
        )
        if not request.finished and request.channel is not None:
            request.setResponseCode(result.status)
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"x-content-type-options", b"nosniff")
            request.setHeader(b"content-length", b"%d" % len(result.body))
            request.write(result.body)
            request.finish()
        record.publish(
            facade.shared.bus,
            status=result.status,
            node_id=None,
            error=None if result.status == 200 else "inventory-unavailable",
        )
