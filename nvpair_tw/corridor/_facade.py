# -*- test-case-name: tests.corridor.test_facade -*-
"""One engine's facade: the door where a request's Twisted ``Request`` stops.

The head is checked at its end (:meth:`FacadeResource.head_gate`, run by the facade's
:meth:`FacadeResource.site` before any body byte, docs/behaviour.md §14.1): the source, the key,
the path, the route, the role and the limits that need no body, into a
:class:`~nvpair_tw.corridor._head.Head`, and the request's facts begin. When the body is in,
:meth:`FacadeResource.render` hands what passed, with the body, to the request's
:class:`~nvpair_tw.corridor._driver.Driver` and the one :class:`~nvpair_tw.corridor._writer.Writer`
that holds the ``Request`` from then on. Nothing past this module and the writer receives the
``Request``.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.core import ErrorShape, IllegalCall, shape_of
from nvpair_tw.corridor._driver import Driver, publish
from nvpair_tw.corridor._exchange import Exchange
from nvpair_tw.corridor._head import Arrival, Head, Refused, read_head
from nvpair_tw.corridor._record import Facts
from nvpair_tw.corridor._state import FacadeState, Shared
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.events import ProxyRequest
from nvpair_tw.inbound import LimitedRequest, LimitedSite, Rejection, make_site

__all__ = ["FacadeResource", "FacadeState", "Shared"]

_PATH_CHARS = 256
"""A record's raw path (before the head is understood) is cut to this many characters."""


@frozen
class _Passed:
    """What the head gate passes on to ``render``: the checked head and what is known so far."""

    head: Head
    facts: Facts


@frozen
class _Preflight:
    """An allowed origin's CORS preflight (§13.4), answered in ``render`` without a key: its
    grants, and its record (made when its head was read)."""

    grants: tuple[tuple[bytes, bytes], ...]
    record: ProxyRequest


class FacadeResource(Resource):
    """The whole resource tree of one facade: a leaf that classifies by method and normalised
    path (docs/behaviour.md §2, §14.1). It is served through :meth:`site`, whose head gate reads
    every head first."""

    isLeaf = True

    def __init__(self, facade: FacadeState) -> None:
        super().__init__()
        self._facade = facade

    def site(self, *, clock: IReactorTime, **limits: Any) -> LimitedSite:
        """The facade's limited site (``inbound.make_site``'s ``limits``, the process's CORS
        policy), with this resource's head gate and its record of refusals made below it."""
        site = make_site(self, clock=clock, cors=self._facade.shared.cors, **limits)
        site.head_gate = self.head_gate
        site.on_reject = self.rejected
        return site

    def head_gate(self, request: LimitedRequest) -> Rejection | None:
        """The site's head gate: the checks that need no body, when the head is complete and
        before ``100 Continue``; a refusal is answered by the channel, which then closes."""
        facts = self._facts(request)
        if request.uri == b"*":  # OPTIONS * (the only method the channel lets through with it)
            now = self._facade.shared.clock.seconds()  # Twisted answers it: 200, Allow: OPTIONS
            publish(self._facade.shared.bus, facts.record(now, 200, None, None))
            return None
        cors = self._facade.shared.cors
        origin = cors.preflight_origin(request.method, request.requestHeaders) if cors else None
        if cors is not None and origin is not None:  # before the key check (§13.4)
            now = self._facade.shared.clock.seconds()
            record = facts.record(now, 204, None, None)
            request.passed = _Preflight(cors.preflight_grants(origin), record)
            return None
        arrival = Arrival(
            request.method, request.uri, request.requestHeaders, request.getClientAddress()
        )
        head = read_head(self._facade, arrival)
        if isinstance(head, Refused):
            request.recorded = True
            facts.key = head.key
            refused = head.rejection
            now = self._facade.shared.clock.seconds()
            publish(self._facade.shared.bus, facts.record(now, refused.status, None, refused.code))
            return refused
        facts.path = head.path
        facts.key = head.caller.name  # §12.1
        request.passed = _Passed(head, facts)
        return None

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        """Hand what the head gate passed, with the body, to the request's driver."""
        request.defaultContentType = None
        passed = getattr(request, "passed", None)
        if isinstance(passed, _Preflight):
            Writer(request, ErrorShape.PROXY).preflight(passed.grants)
            publish(self._facade.shared.bus, passed.record)
            return NOT_DONE_YET
        if not isinstance(passed, _Passed):
            raise IllegalCall("a facade is served through FacadeResource.site (its head gate)")
        writer = Writer(request, shape_of(passed.head.path))
        writer.mark(b"x-nvpair-request-id", passed.facts.id.encode())
        content = request.content
        body = content.read() if content is not None else b""
        exchange = Exchange(passed.facts, self._facade.shared.clock.seconds)
        Driver(self._facade, writer, exchange, passed.head, body).run()
        return NOT_DONE_YET

    def rejected(self, status: int, code: str, method: str, path: str) -> None:
        """A refusal made below the facade (413, 408, 414, 431, ...) gets its record too."""
        shared = self._facade.shared
        request_id = shared.workloads.next_request_id()
        now = shared.clock.seconds()
        facts = Facts(request_id, self._facade.engine, method, path[:_PATH_CHARS], now)
        publish(shared.bus, facts.record(now, status, None, code))

    def _facts(self, request: Request) -> Facts:
        shared = self._facade.shared
        request_id = shared.workloads.next_request_id()
        path = request.uri.partition(b"?")[0].decode("latin-1")[:_PATH_CHARS]
        method = request.method.decode("latin-1")
        started = shared.clock.seconds()
        if shared.tracer is not None:  # before the head is read: it rewrites traceparent (§12.5)
            shared.tracer.begin(request_id, f"{method} {path}", started, request.requestHeaders)
        return Facts(request_id, self._facade.engine, method, path, started)
