# -*- test-case-name: tests.test_facade -*-
"""One engine's facade: classify a request, then answer it from the right nodes.

Inference (POST with a ``model``) goes through the capability gate, the candidate order and the attempt
loop with a workload; model lists are answered from every node; everything else is forwarded to the first
node of the default order. The facade owns this engine's per-facade state: the pin, the stall cooldowns
and the affinity table; the reservation ledger, the workloads and the event bus are process-wide.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from attrs import define
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.affinity import AffinityKey, AffinityTable, affinity_key
from nvpair_tw.aggregate import aggregate_model_list
from nvpair_tw.attempts import (
    Abandoned,
    AttemptHooks,
    AttemptPlan,
    CallerState,
    Committed,
    Exhausted,
    run_attempts,
)
from nvpair_tw.engines import EngineProfile, RouteKind
from nvpair_tw.errors import write_error
from nvpair_tw.events import EventBus
from nvpair_tw.headers import forward_headers, upstream_request_headers
from nvpair_tw.ingress import IngressPolicy
from nvpair_tw.inventory import InventoryBook
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node, NodeDirectory
from nvpair_tw.ordering import order_candidates
from nvpair_tw.relay import Progress, StallGuard
from nvpair_tw.reservations import Reservation, ReservationLedger
from nvpair_tw.settings import Settings
from nvpair_tw.stalls import IStallTracker
from nvpair_tw.upstream import BodyGate, UpstreamClient
from nvpair_tw.workloads import RequestRecord, Workload, WorkloadRegistry

__all__ = ["Facade", "FacadeResource", "Shared"]

log = LevelledLogger()


@define
class Shared:
    """What every facade of one process shares: clock, clients, ledger, workloads, events."""

    clock: IReactorTime
    client: UpstreamClient
    http: Any
    ledger: ReservationLedger
    workloads: WorkloadRegistry
    bus: EventBus
    settings: Settings
    ingress: IngressPolicy | None = None
    draining: bool = False


@define
class Facade:
    """The state of one engine's facade."""

    profile: EngineProfile
    shared: Shared
    directory: NodeDirectory
    inventory: InventoryBook
    stalls: IStallTracker
    affinity: AffinityTable
    pin: str | None = None
    first_body_gate: bool = True

    @property
    def engine(self) -> str:
        return self.profile.name

    def eligible(self, model: str | None) -> list[Node]:
        """Nodes allowed for a request: owners of the model (SPEC §4.2), or every node."""
        nodes = list(self.directory.nodes())
        if not model:
            return nodes
        return [n for n in nodes if self.inventory.advertises(n.id, model)]

    def order(
        self, nodes: list[Node], *, head_selection: bool, affinity_hint: str | None = None
    ) -> tuple[list[Node], bool]:
        """Candidate order for ``nodes``: (ordered nodes, whether the warm node was promoted).

        Every inference request with a model reserves its first candidate (see ``_proxy``), so the
        ordering's own ``reserve`` flag is not needed here.
        """
        by_id = {n.id: n for n in nodes}
        ordering = order_candidates(
            [n.id for n in nodes],
            pin=self.pin or None,
            snapshot=self.shared.ledger.snapshot,
            ledger_view=self.shared.ledger,
            affinity_hint=affinity_hint,
            head_selection=head_selection,
            cooling=self.stalls.cooling(),
        )
        return [by_id[i] for i in ordering.nodes], ordering.affinity


class _Hooks(AttemptHooks):
    """Feeds the attempt loop's progress into the record, the workload and the reservation."""

    def __init__(
        self,
        facade: Facade,
        record: RequestRecord,
        workload: Workload | None,
        reservation: Reservation | None,
    ) -> None:
        self._facade = facade
        self._record = record
        self._workload = workload
        self.reservation = reservation

    def attempt_started(self, node: Node) -> None:
        self._record.attempt_started(node.id)
        ledger = self._facade.shared.ledger
        if self.reservation is not None and self.reservation.node_id != node.id:
            self.reservation = ledger.move(self.reservation, node.id)
        if self._workload is not None:
            self._workload.running(node.id)

    def attempt_ended(self, node: Node, outcome: str) -> None:
        self._record.attempt_ended(outcome)

    def release(self) -> None:
        if self.reservation is not None:
            self._facade.shared.ledger.release(self.reservation)
            self.reservation = None


def _model_of(body: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """The top-level string ``model`` of a JSON body; an unparseable body has none (not gated)."""
    if not body.lstrip().startswith(b"{"):
        return None, None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(parsed, dict):
        return None, None
    model = parsed.get("model")
    if isinstance(model, str) and model.strip():
        return model, parsed
    return None, parsed


class FacadeResource(Resource):
    """The whole resource tree of one facade: a leaf that classifies by method and exact path."""

    isLeaf = True

    def __init__(self, facade: Facade) -> None:
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
        if target is None:
            write_error(request, 400, "malformed request target", "bad-request")
            record.publish(shared.bus, status=400, node_id=None, error="bad-request")
            return NOT_DONE_YET
        peer = request.getClientAddress()

        if shared.ingress is not None:
            rejection = shared.ingress.check(peer, request.requestHeaders)
            if rejection is not None:
                write_error(
                    request, rejection.status, rejection.message, rejection.code, rejection.headers
                )
                record.publish(
                    shared.bus, status=rejection.status, node_id=None, error=rejection.code
                )
                return NOT_DONE_YET
            shared.ingress.strip_credentials(peer, request.requestHeaders)

        if shared.draining:
            request.setHeader(b"connection", b"close")
            write_error(request, 503, "the proxy is shutting down", "shutting-down")
            record.publish(shared.bus, status=503, node_id=None, error="shutting-down")
            return NOT_DONE_YET

        kind = facade.profile.classify(request.method, path)
        if kind is RouteKind.MODEL_LIST:
            work = Deferred.fromCoroutine(self._model_list(request, path, record))
        else:
            work = Deferred.fromCoroutine(self._proxy(request, kind, record))
        work.addErrback(self._crashed, request, record)
        return NOT_DONE_YET

    def _crashed(self, failure: Failure, request: Request, record: RequestRecord) -> None:
        log.failure("request handling failed", failure, engine=self._facade.engine)
        if not request.startedWriting and not request.finished:
            write_error(request, 500, "internal proxy error", "internal-error")
        elif request.transport is not None:
            request.transport.abortConnection()  # type: ignore[attr-defined]
        record.publish(self._facade.shared.bus, status=500, node_id=None, error="internal-error")

    async def _model_list(self, request: Request, path: str, record: RequestRecord) -> None:
        facade = self._facade
        fmt = facade.profile.model_lists[path]
        nodes, _ = facade.order(list(facade.directory.nodes()), head_selection=False)
        result = await aggregate_model_list(
            fmt,
            nodes,
            target_of(request.uri).decode("latin-1"),
            facade.shared.http,
            facade.shared.clock,
            timeout=facade.shared.settings.model_list_timeout,
        )
        if not request.finished and _connected(request):
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

    async def _proxy(self, request: Request, kind: RouteKind, record: RequestRecord) -> None:
        facade = self._facade
        shared = facade.shared
        settings = shared.settings
        inference = kind is RouteKind.INFERENCE
        assert request.content is not None
        body = request.content.read()
        model, parsed = _model_of(body) if inference else (None, None)

        eligible = facade.eligible(model)
        if model and not eligible:
            write_error(
                request, 502, "no available node advertises the requested model", "no-model-owner"
            )
            record.publish(shared.bus, status=502, node_id=None, error="no-model-owner")
            return

        key: AffinityKey | None = None
        hint: str | None = None
        if model and parsed is not None:
            path = record.path
            key = affinity_key(path, facade.profile.normalise(model.strip()), parsed)
            if key is not None:
                hint = facade.affinity.lookup(key)
        candidates, promoted = facade.order(
            eligible, head_selection=bool(model), affinity_hint=hint
        )

        workload = shared.workloads.create(facade.engine, model) if model else None
        reservation = shared.ledger.reserve(candidates[0].id) if model else None
        hooks = _Hooks(facade, record, workload, reservation)
        caller = CallerState()

        def client_left(failure: Failure) -> None:
            caller.abandon("client disconnected")

        request.notifyFinish().addErrback(client_left)
        if workload is not None:

            def cancel_requested(reason: str) -> None:
                caller.abandon(reason)
                if request.transport is not None and not request.finished:
                    request.transport.abortConnection()  # type: ignore[attr-defined]

            workload.cancel_hook = cancel_requested

        plan = AttemptPlan(
            method=request.method,
            target=target_of(request.uri),
            headers=upstream_request_headers(request.requestHeaders, _client_host(request)),
            body=body,
            inference=inference,
            gated=inference and facade.first_body_gate,
            header_timeout=settings.response_header_timeout,
            first_body_timeout=settings.first_body_timeout if inference else 0.0,
        )
        try:
            result = await run_attempts(
                plan, candidates, shared.client, shared.clock, facade.stalls, caller, hooks
            )
            if isinstance(result, Abandoned):
                if workload is not None:
                    workload.cancel(result.reason)
                if request.transport is not None and not request.finished and _connected(request):
                    request.transport.abortConnection()  # type: ignore[attr-defined]
                record.publish(shared.bus, status=499, node_id=None, error=result.reason)
                return
            if isinstance(result, Exhausted):
                code = "upstream-timeout" if result.status == 504 else "upstream-error"
                write_error(request, result.status, result.reason, code)
                if workload is not None:
                    workload.fail(result.reason)
                record.publish(shared.bus, status=result.status, node_id=None, error=result.reason)
                return
            warm = candidates[0].id if promoted else None
            await self._relay(request, result, record, workload, caller, key, warm)
        finally:
            hooks.release()

    async def _relay(
        self,
        request: Request,
        committed: Committed,
        record: RequestRecord,
        workload: Workload | None,
        caller: CallerState,
        key: AffinityKey | None,
        warm: str | None,
    ) -> None:
        facade = self._facade
        shared = facade.shared
        response = committed.response
        node = committed.node
        request.setResponseCode(response.code, response.phrase)
        for name, values in forward_headers(response.headers).getAllRawHeaders():
            request.responseHeaders.setRawHeaders(name, list(values))
        request.responseHeaders.setRawHeaders(b"x-nvpair-node", [node.id.encode()])
        if (
            isinstance(response.length, int)
            and request.method != b"HEAD"
            and response.code not in (204, 304)
        ):
            # Twisted's client moves Content-Length into ``response.length``; keep the framing.
            request.setHeader(b"content-length", b"%d" % response.length)
        content_type = response.headers.getRawHeaders(b"content-type", [b""])[0]
        progress = Progress(content_type.decode("latin-1"), response.length)
        sink = progress.wrap(request.write)
        record.first_byte()
        if committed.gate is None:
            request.write(b"")
            gate = BodyGate(shared.clock, 0)
            gate.start_relay(sink)
            caller.gate = gate
            response.deliverBody(gate)
        else:
            gate = committed.gate
            if committed.first:
                sink(committed.first)
            else:
                request.write(b"")

        def write_stalled() -> None:
            caller.abandon("client stopped reading")
            if request.transport is not None:
                request.transport.abortConnection()  # type: ignore[attr-defined]

        guard = StallGuard(
            shared.clock, gate.producer(), shared.settings.write_stall_timeout, write_stalled
        )
        registered = False
        if _connected(request):
            request.registerProducer(guard, True)
            registered = True
        if committed.gate is not None:
            gate.start_relay(sink)
        error: str | None = None
        try:
            await gate.done
        except Exception:
            if caller.gone is None:
                error = "upstream dropped mid-stream"
                caller.gone = error
                if request.transport is not None:
                    request.transport.abortConnection()  # type: ignore[attr-defined]
        finally:
            guard.cancel()
        ok = 200 <= response.code < 300
        if caller.gone is None:
            if registered:
                request.unregisterProducer()
            request.finish()
            if workload is not None:
                if ok:
                    workload.complete()
                else:
                    workload.fail(f"upstream answered {response.code}")
            if (
                ok
                and response.code == 200
                and key is not None
                and (progress.frames.seen or not progress.streaming)
            ):
                facade.affinity.record(key, node.id)
        elif error is not None:
            if workload is not None:
                workload.fail(error)
        elif progress.complete and ok:
            if workload is not None:
                workload.complete()
        elif workload is not None:
            workload.cancel(caller.gone)
        record.publish(
            shared.bus,
            status=response.code,
            node_id=node.id,
            error=error or (caller.gone if caller.gone and not progress.complete else None),
            cache_affinity=warm is not None and node.id == warm,
        )


def _connected(request: Request) -> bool:
    return request.channel is not None


def _client_host(request: Request) -> str | None:
    address = request.getClientAddress()
    host = getattr(address, "host", None)
    return host if isinstance(host, str) else None


def target_of(uri: bytes) -> bytes:
    """The raw path and query of a request target (absolute-form reduced to its path).

    Raises ``ValueError`` for an absolute-form target whose authority does not parse.
    """
    if uri.startswith(b"/"):
        return uri.partition(b"#")[0]
    parts = urlsplit(uri.decode("latin-1"))
    path = (parts.path or "/").encode("latin-1")
    return path + (b"?" + parts.query.encode("latin-1") if parts.query else b"")
