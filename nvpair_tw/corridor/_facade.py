# -*- test-case-name: tests.corridor.test_facade -*-
"""One engine's facade: the resource that reads a request once and hands it on.

The head is checked at its end (:meth:`FacadeResource.head_gate`, docs/behaviour.md §14.1): the
source, the key, the path, the route, the role and the limits that need no body, into a
:class:`~nvpair_tw.corridor._head.Head`. Then the body is parsed once and the model scope-checked
into an :class:`~nvpair_tw.corridor._inbound.Inbound`, and the route decides (§2): model lists are
answered from every node here, fan-outs run on several nodes, tunnels are spliced, everything else
is handed to :func:`nvpair_tw.corridor._exchange.forward` (order → attempts → relay → conclusion).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.core import RouteKind, abort, write_error
from nvpair_tw.corridor._exchange import forward
from nvpair_tw.corridor._fanout import fan_out
from nvpair_tw.corridor._head import Head, Refused, read_head
from nvpair_tw.corridor._inbound import read_body
from nvpair_tw.corridor._preload import preload_of, serve_preload
from nvpair_tw.corridor._probes import probe_of, serve_probe
from nvpair_tw.corridor._refusal import refuse
from nvpair_tw.corridor._roles import Channel
from nvpair_tw.corridor._stages import fan_of, let_go_of, serve_model_list, serve_tunnel
from nvpair_tw.corridor._state import FacadeState, Shared
from nvpair_tw.corridor._workloads import RequestRecord
from nvpair_tw.inbound import LimitedRequest, Rejection, allow_origin
from nvpair_tw.logs import LevelledLogger

__all__ = ["FacadeResource", "FacadeState", "Shared"]

log = LevelledLogger(namespace=__name__)

_HEAD = "nvpair_head"
"""The attribute of a request where the head gate leaves its :class:`Head` and record."""


class FacadeResource(Resource):
    """The whole resource tree of one facade: a leaf that classifies by method and normalised
    path (docs/behaviour.md §2, §14.1)."""

    isLeaf = True

    def __init__(self, facade: FacadeState) -> None:
        super().__init__()
        self._facade = facade

    def head_gate(self, request: Request) -> Rejection | None:
        """The site's head gate: the checks that need no body, when the head is complete and
        before ``100 Continue``; a refusal is answered by the channel, which then closes."""
        if self._is_preflight(request):
            return None
        record = self._record(request)  # first: the tracer rewrites traceparent (§12.5)
        head = read_head(self._facade, request)
        if isinstance(head, Refused):
            record.key = head.key
            refused = head.rejection
            record.publish(
                self._facade.shared.bus, status=refused.status, node_id=None, error=refused.code
            )
            if isinstance(request, LimitedRequest):
                request.recorded = True
            return refused
        setattr(request, _HEAD, (head, record))
        return None

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        request.defaultContentType = None
        passed = getattr(request, _HEAD, None)
        if passed is not None:
            head, record = passed
        else:  # a preflight, or a site without the head gate (the head is read here instead)
            record = self._record(request)
            if self._preflight(request, record):
                return NOT_DONE_YET
            head = read_head(self._facade, request)
        if isinstance(head, Refused):
            record.key = head.key
            refuse(self._facade, request, record, head.rejection)
            return NOT_DONE_YET
        request.responseHeaders.setRawHeaders(b"x-nvpair-request-id", [record.id.encode()])
        record.path = head.path
        record.key = head.caller.name  # §12.1
        work = Deferred.fromCoroutine(self._serve(request, head, record))
        work.addErrback(self._crashed, request, record)
        return NOT_DONE_YET

    def _record(self, request: Request) -> RequestRecord:
        shared = self._facade.shared
        request_id = shared.workloads.next_request_id()
        path = request.uri.partition(b"?")[0].decode("latin-1")[:256]
        method = request.method.decode("latin-1")
        record = RequestRecord.begin(shared.clock, request_id, self._facade.engine, method, path)
        if shared.tracer is not None:
            shared.tracer.begin(record, request.requestHeaders)
        return record

    async def _serve(self, request: Request, head: Head, record: RequestRecord) -> None:
        """Hand the request to its stage: a tunnel, a model list, or (with its body read once) a
        fan-out or the corridor."""
        probe = probe_of(self._facade.engine, head.method, head.path)
        if probe is not None:  # "is the engine there?" (docs/behaviour.md §17.6)
            await serve_probe(self._facade, request, record, probe)
            return
        if head.channel is Channel.TUNNEL:
            await serve_tunnel(self._facade, request, record, head)
            return
        if head.kind is RouteKind.MODEL_LIST:
            await serve_model_list(self._facade, request, record, head)
            return
        assert request.content is not None
        body = request.content.read()
        inbound = await read_body(self._facade, head, body, self._facade.shared.clock)
        if isinstance(inbound, Rejection):
            refuse(self._facade, request, record, inbound)
            return
        try:
            fan = fan_of(self._facade, inbound)
            if isinstance(fan, Rejection):
                refuse(self._facade, request, record, fan)
            elif fan is not None:
                await fan_out(self._facade, request, fan, record)
            elif (preload := preload_of(self._facade, inbound)) is not None:
                await serve_preload(self._facade, request, record, preload)  # §17.6
            else:
                await forward(self._facade, request, inbound, record)
        finally:
            if inbound.large:
                let_go_of(self._facade, inbound)

    def _is_preflight(self, request: Request) -> bool:
        """A CORS preflight of an allowed origin (§13.4): answered here, before any key check."""
        cors = self._facade.shared.cors
        return cors is not None and cors.origin(request) is not None and cors.is_preflight(request)

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

    def _crashed(self, failure: Failure, request: Request, record: RequestRecord) -> None:
        log.failure("request handling failed", failure, engine=self._facade.engine)
        if not request.startedWriting and not request.finished:
            write_error(request, 500, "internal proxy error", "internal-error")
        else:
            abort(request.transport)
        record.publish(self._facade.shared.bus, status=500, node_id=None, error="internal-error")
