# -*- test-case-name: tests.corridor.test_facade -*-
"""One engine's facade: the door where a request's Twisted ``Request`` stops.

The head is checked at its end (:meth:`FacadeResource.head_gate`, docs/behaviour.md §14.1): the
source, the key, the path, the route, the role and the limits that need no body, into a
:class:`~nvpair_tw.corridor._head.Head`. When the body is in, :meth:`FacadeResource.render` hands
the request to its :class:`~nvpair_tw.corridor._driver.Driver`, with the one
:class:`~nvpair_tw.corridor._writer.Writer` that holds the ``Request`` from then on. Nothing past
this module and the writer receives the ``Request``.
"""

from __future__ import annotations

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.core import shape_of
from nvpair_tw.corridor._driver import Driver, publish
from nvpair_tw.corridor._exchange import Exchange
from nvpair_tw.corridor._head import Arrival, Head, Refused, read_head
from nvpair_tw.corridor._record import Facts
from nvpair_tw.corridor._state import FacadeState, Shared
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.inbound import LimitedRequest, Rejection, allow_origin

__all__ = ["FacadeResource", "FacadeState", "Shared"]

_PATH_CHARS = 256
"""A record's raw path (before the head is understood) is cut to this many characters."""


class FacadeResource(Resource):
    """The whole resource tree of one facade: a leaf that classifies by method and normalised
    path (docs/behaviour.md §2, §14.1)."""

    isLeaf = True

    def __init__(self, facade: FacadeState) -> None:
        super().__init__()
        self._facade = facade

    def head_gate(self, request: LimitedRequest) -> Rejection | None:
        """The site's head gate: the checks that need no body, when the head is complete and
        before ``100 Continue``; a refusal is answered by the channel, which then closes."""
        cors = self._facade.shared.cors
        if cors is not None and cors.preflight_origin(request.method, request.requestHeaders):
            return None  # an allowed origin's preflight is answered in render, keyless (§13.4)
        facts = self._facts(request)
        head = read_head(self._facade, _arrival(request))
        if isinstance(head, Refused):
            request.recorded = True
            self._refused(facts, head)
            return head.rejection
        request.passed = (head, facts)
        return None

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        request.defaultContentType = None
        passed = getattr(request, "passed", None)
        if passed is not None:
            head, facts = passed
        else:  # a preflight, or a site without the head gate (the head is read here instead)
            facts = self._facts(request)
            if self._preflight(request, facts):
                return NOT_DONE_YET
            head = read_head(self._facade, _arrival(request))
        if isinstance(head, Refused):
            Writer(request, shape_of(facts.path)).refuse(head.rejection)
            self._refused(facts, head)
            return NOT_DONE_YET
        self._drive(request, head, facts)
        return NOT_DONE_YET

    def rejected(self, status: int, code: str, method: str, path: str) -> None:
        """A refusal made below the facade (413, 408, 414, 431, ...) gets its record too."""
        shared = self._facade.shared
        request_id = shared.workloads.next_request_id()
        now = shared.clock.seconds()
        facts = Facts(request_id, self._facade.engine, method, path[:_PATH_CHARS], now)
        publish(shared.bus, facts.record(now, status, None, code))

    def _drive(self, request: Request, head: Head, facts: Facts) -> None:
        writer = Writer(request, shape_of(head.path))
        writer.mark(b"x-nvpair-request-id", facts.id.encode())
        facts.path = head.path
        facts.key = head.caller.name  # §12.1
        content = request.content
        body = content.read() if content is not None else b""
        clock = self._facade.shared.clock
        Driver(self._facade, writer, Exchange(facts, clock.seconds), head, body).run()

    def _facts(self, request: Request) -> Facts:
        shared = self._facade.shared
        request_id = shared.workloads.next_request_id()
        path = request.uri.partition(b"?")[0].decode("latin-1")[:_PATH_CHARS]
        method = request.method.decode("latin-1")
        started = shared.clock.seconds()
        if shared.tracer is not None:  # before the head is read: it rewrites traceparent (§12.5)
            shared.tracer.begin(request_id, f"{method} {path}", started, request.requestHeaders)
        return Facts(request_id, self._facade.engine, method, path, started)

    def _refused(self, facts: Facts, refused: Refused) -> None:
        facts.key = refused.key
        rejection = refused.rejection
        shared = self._facade.shared
        now = shared.clock.seconds()
        publish(shared.bus, facts.record(now, rejection.status, None, rejection.code))

    def _preflight(self, request: Request, facts: Facts) -> bool:
        """CORS (§13.4): an allowed origin's preflight is answered here, before the key check."""
        shared = self._facade.shared
        cors = shared.cors
        origin = cors.allowed(request.requestHeaders) if cors is not None else None
        if cors is None or origin is None:
            return False
        if cors.preflight_origin(request.method, request.requestHeaders) is None:
            allow_origin(request, origin)  # a site that does not own CORS itself (§14.5)
            return False
        Writer(request, shape_of(facts.path)).preflight(cors.preflight_grants(origin))
        now = shared.clock.seconds()
        publish(shared.bus, facts.record(now, 204, None, None))
        return True


def _arrival(request: Request) -> Arrival:
    return Arrival(request.method, request.uri, request.requestHeaders, request.getClientAddress())
