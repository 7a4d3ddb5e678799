# -*- test-case-name: tests.corridor.test_exchange -*-
"""One forwarded request, walked down the corridor: gate, order, attempts, relay, conclusion.

Each stage hands the next a value: the capability gate and :meth:`FacadeState.order` give the candidates,
:func:`~nvpair_tw.corridor._attempts.run_attempts` returns ``Committed | Exhausted | Abandoned``,
:func:`~nvpair_tw.corridor._relay.relay` returns a :class:`~nvpair_tw.corridor._relay.RelayOutcome`. Only this module
turns those values into the request record, the workload's end and the affinity table
(docs/behaviour.md §5.3, §6, §7).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from attrs import evolve, frozen
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure
from twisted.web.server import Request

from nvpair_tw.assembly import Assembly, Dialect, plan_assembly, rewrite_body
from nvpair_tw.core import RESPONSES_PATH, RouteKind, upstream_request_headers, write_error
from nvpair_tw.corridor._attempts import (
    Abandoned,
    AttemptObserver,
    AttemptPlan,
    CallerState,
    Committed,
    Exhausted,
    run_attempts,
)
from nvpair_tw.corridor._dialect import Speech, reach
from nvpair_tw.corridor._relay import RelayEnd, RelayOutcome, cut, relay
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import RequestRecord, Workload
from nvpair_tw.dialects import Usage, UsageMeter, asks_usage
from nvpair_tw.inbound import Caller, Permit, Refusal, model_not_allowed
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    RETRY_AFTER_SECONDS,
    AffinityKey,
    Booking,
    QueueFull,
    QueueTimeout,
    Slot,
    Waiter,
    affinity_key,
)

__all__ = ["forward", "model_of", "remember_response", "target_of"]


@frozen
class _Route:
    """What the facade learnt of a request before the first attempt."""

    plan: AttemptPlan
    model: str | None
    candidates: list[Node]
    key: AffinityKey | None
    warm: str | None


class _Observer(AttemptObserver):
    """Feeds the attempt loop's progress into this request's record and workload."""

    def __init__(self, record: RequestRecord, workload: Workload | None) -> None:
        self._record = record
        self._workload = workload

    def attempt_started(self, node: Node) -> None:
        self._record.attempt_started(node.id)
        if self._workload is not None:
            self._workload.running(node.id)

    def attempt_ended(self, node: Node, outcome: str) -> None:
        self._record.attempt_ended(outcome)

    def busy_wait(self, node: Node) -> None:
        self._record.busy_wait()


async def forward(
    facade: FacadeState,
    request: Request,
    kind: RouteKind,
    record: RequestRecord,
    target: Node | None = None,
    *,
    caller: Caller | None = None,
) -> None:
    """Forward one inference, model-routed or pass-through request and conclude it.

    ``target`` is the node an ``X-NVPair-Node`` header chose: the only candidate (§2.1).
    ``caller`` is who the ingress said is calling: its key's model scope and limits apply (§12.1).
    """
    if caller is not None and _out_of_scope(facade, request, kind, record, caller):
        return
    route = _route(facade, request, kind, record, target)
    if route is None:
        return
    permit = _permitted(facade, request, kind, record, caller)
    if permit is None:
        return
    try:
        await _admitted(facade, request, record, target, route)
    finally:
        if permit is not True:
            permit.done(_tokens(record))


# --- named keys (§12.1): the model scope, then the limits; nothing reaches a node when refused --


def _out_of_scope(
    facade: FacadeState, request: Request, kind: RouteKind, record: RequestRecord, caller: Caller
) -> bool:
    """403 ``model-not-allowed`` for a model outside the key's scope, answered before anything
    else looks at the model (so the answer never says whether the fleet has it); True then."""
    assert request.content is not None
    body = request.content.read()
    request.content.seek(0)
    if kind is RouteKind.INFERENCE:
        named, _ = model_of(body)
    elif kind is RouteKind.MODEL_ROUTED:
        named = _routed_model(facade, request.method, record.path, body)
    else:
        return False
    scoped = facade.directory.catalogue.public(named) if named else None
    if not scoped or caller.rules.allows(scoped):
        return False
    refused = model_not_allowed(scoped)
    write_error(request, refused.status, refused.message, refused.code, refused.headers)
    record.publish(facade.shared.bus, status=refused.status, node_id=None, error=refused.code)
    return True


def _permitted(
    facade: FacadeState,
    request: Request,
    kind: RouteKind,
    record: RequestRecord,
    caller: Caller | None,
) -> Permit | Literal[True] | None:
    """429 ``rate-limited`` (None, answered here), else the permit of a limited inference (True:
    nothing to count)."""
    if caller is None:
        return True
    bus = facade.shared.bus
    if kind is not RouteKind.INFERENCE:
        return True
    admitted = facade.shared.limiter.admit(caller)
    if isinstance(admitted, Refusal):
        limited = admitted.rejection
        write_error(request, limited.status, limited.message, limited.code, limited.headers)
        record.publish(bus, status=limited.status, node_id=None, error=limited.code)
        return None
    return admitted


def _tokens(record: RequestRecord) -> int | None:
    """The request's prompt + completion tokens, None when neither is known."""
    counts = [n for n in (record.prompt_tokens, record.completion_tokens) if n is not None]
    return sum(counts) if counts else None


async def _admitted(
    facade: FacadeState,
    request: Request,
    record: RequestRecord,
    target: Node | None,
    route: _Route,
) -> None:
    """Admission (a slot, or the queue), the workload, then the answer."""
    ticket = (
        facade.admission.admit(route.candidates, targeted=target is not None)
        if route.model
        else None
    )
    if isinstance(ticket, QueueFull):
        _busy(facade, request, record, "every node is busy and the queue is full", "queue-full")
        return
    workload = facade.shared.workloads.create(facade.engine, route.model) if route.model else None
    if workload is not None:
        record.workload_id = workload.id
    caller = _watch(request, workload, facade)
    if isinstance(ticket, Waiter):
        ticket = await _queue(facade, request, ticket, caller, record, workload)
        if ticket is None:
            return
    booking = Booking.nothing()
    if ticket is not None:
        route = _bound(route, ticket)
        booking = Booking.take(facade.shared.ledger, route.candidates[0].id, ticket)
    try:
        await _answer(facade, request, route, caller, booking, record, workload)
    finally:
        booking.release()


async def _answer(
    facade: FacadeState,
    request: Request,
    route: _Route,
    caller: CallerState,
    booking: Booking,
    record: RequestRecord,
    workload: Workload | None,
) -> None:
    """The attempts, then the relay of the committed answer (or the refusal), then the end."""
    shared = facade.shared
    result = await run_attempts(
        route.plan,
        route.candidates,
        shared.client,
        shared.clock,
        facade.stalls,
        caller,
        booking,
        _Observer(record, workload),
        progress=facade.progress,
    )
    if isinstance(result, Committed):
        if route.model and result.wire is not None:
            record.served_as(route.model, result.wire.local_model, result.wire.translated)
        record.first_byte()
        remember_response(facade, record.path, result)
        clock = shared.clock
        outcome = await relay(
            request,
            result,
            caller,
            clock,
            shared.settings.write_stall_timeout,
            (lambda streams: UsageMeter(streams, clock.seconds)) if route.model else None,
        )
        usage = outcome.usage
        if usage is not None and record.removed_usage is not None:
            usage = usage.noted(record.removed_usage)
        if usage is not None:
            _measured(record, usage, getattr(result.gate, "first_at", None))
        _conclude(facade, route, result.node, outcome, caller, record, workload)
    else:
        _refuse(facade, request, result, record, workload)


def _measured(record: RequestRecord, usage: Usage, first_token_at: float | None) -> None:
    """The engine's counts, the time to first token and the rate of §12.2 and §12.3 on the record.

    An assembled answer's first token is when its stream began (``first_token_at``), not when the
    whole answer was relayed."""
    record.prompt_tokens = usage.prompt_tokens
    record.completion_tokens = usage.completion_tokens
    first = first_token_at if first_token_at is not None else usage.first_content_at
    if first is not None and record.dispatched_at is not None:
        record.ttft_ms = max(0, round((first - record.dispatched_at) * 1000))
    rate = usage.engine_rate
    if rate is None and usage.completion_tokens and first is not None and usage.last_at is not None:
        span = usage.last_at - first
        rate = usage.completion_tokens / span if span > 0 else None
    record.tokens_per_s = None if rate is None else round(rate, 2)


async def _queue(
    facade: FacadeState,
    request: Request,
    waiter: Waiter,
    caller: CallerState,
    record: RequestRecord,
    workload: Workload | None,
) -> Slot | None:
    """Wait in the facade's queue for a slot (§6.4); None when the request ended here instead."""
    if workload is not None:
        workload.queued()
    caller.track(waiter.bound.cancel)
    try:
        slot = await waiter.bound
    except (QueueTimeout, CancelledError) as error:
        stopped: Exception | None = error
    else:
        stopped = None
    caller.track(None)
    record.queued_for(facade.shared.clock.seconds() - waiter.since)
    if stopped is None:
        return slot
    if isinstance(stopped, QueueTimeout):
        if workload is not None:
            workload.fail(f"queue timeout: {stopped}")
        _busy(facade, request, record, f"queue timeout: {stopped}", "queue-timeout")
        return None
    reason = caller.gone or "cancelled"
    if workload is not None:
        workload.cancel(reason)
    if not request.finished:
        cut(request, facade.shared.clock, facade.shared.settings.write_stall_timeout)
    record.publish(facade.shared.bus, status=499, node_id=None, error=reason)
    return None


def _bound(route: _Route, slot: Slot) -> _Route:
    """The route with the slot's node first, the rest in their order (the failover order)."""
    head = [n for n in route.candidates if n.id == slot.node_id]
    rest = [n for n in route.candidates if n.id != slot.node_id]
    return evolve(route, candidates=head + rest)


def _busy(
    facade: FacadeState, request: Request, record: RequestRecord, message: str, code: str
) -> None:
    """503 ``queue-full`` / ``queue-timeout`` with ``Retry-After``, and its record."""
    retry = (b"Retry-After", b"%d" % RETRY_AFTER_SECONDS)
    write_error(request, 503, message, code, [retry])
    record.publish(facade.shared.bus, status=503, node_id=None, error=code)


def _route(
    facade: FacadeState,
    request: Request,
    kind: RouteKind,
    record: RequestRecord,
    target: Node | None = None,
) -> _Route | None:
    """The gate, affinity and candidate order; None when the request was answered here (502/404).

    A model-routed request (``/api/show``, ``/api/v0/models/{id}``) is gated like inference but
    has no workload, reservation or affinity: its plan moves on past a 404 (``inference``) and
    commits on headers (not ``gated``). A ``target`` is the only candidate, ungated.
    """
    inference = kind is RouteKind.INFERENCE
    assert request.content is not None
    body = request.content.read()
    sent, parsed = model_of(body) if inference else (None, None)
    eligible = _eligible(facade, request, kind, record, body, sent, target)
    if eligible is None:
        return None
    eligible = _speakable(facade, request, record, eligible, parsed)
    if eligible is None:
        return None
    # Affinity, reservations, residency, workloads and events key on the public name (§11.4).
    model = facade.directory.catalogue.public(sent) if sent else sent
    key: AffinityKey | None = None
    hint: str | None = None
    if model and parsed is not None and target is None:
        key = affinity_key(record.path, facade.profile.normalise(model.strip()), parsed)
        hint = facade.affinity.lookup(key) if key is not None else None
    if target is not None:
        candidates, promoted = [target], False
    else:
        candidates, promoted = facade.order(
            eligible, head_selection=bool(model), affinity_hint=hint, model=model
        )
        if model and parsed is not None and record.path == RESPONSES_PATH:
            candidates = _conversation_first(facade, parsed, candidates)
    named = sent
    if kind is RouteKind.MODEL_ROUTED:
        named = _routed_model(facade, request.method, record.path, body)
    plan = _plan(facade, request, kind, record, body, parsed, named, candidates)
    warm = candidates[0].id if promoted else None
    return _Route(plan, model, candidates, key, warm)


def _eligible(
    facade: FacadeState,
    request: Request,
    kind: RouteKind,
    record: RequestRecord,
    body: bytes,
    model: str | None,
    target: Node | None,
) -> list[Node] | None:
    """The capability gate (§4.2): the nodes that may answer, or None after answering 404/502."""
    bus = facade.shared.bus
    if kind is RouteKind.MODEL_ROUTED:
        route_model = _routed_model(facade, request.method, record.path, body)
        eligible = facade.eligible(route_model)
        if route_model and not eligible and target is None:
            if _all_cordoned(facade, request, record, route_model):
                return None
            write_error(request, 404, f"model '{route_model}' not found", "model-not-found")
            record.publish(bus, status=404, node_id=None, error="model-not-found")
            return None
        return eligible
    eligible = facade.eligible(model) if target is None else [target]
    if not eligible and target is None and _all_cordoned(facade, request, record, model):
        return None
    if model and not eligible:
        message = "no available node advertises the requested model"
        write_error(request, 502, message, "no-model-owner")
        record.publish(bus, status=502, node_id=None, error="no-model-owner")
        return None
    return eligible


def _speakable(
    facade: FacadeState,
    request: Request,
    record: RequestRecord,
    eligible: list[Node],
    parsed: dict[str, Any] | None,
) -> list[Node] | None:
    """The eligible nodes that can take the route, natively or translated (§11.3); None after
    answering 400 ``untranslatable`` (no native candidate, and the request cannot be translated)
    or 502 ``no-route-owner`` (no candidate of a kind that serves the route)."""
    reaches = [(node, reach(facade.profile, node, record.path, parsed)) for node in eligible]
    able = [node for node, how in reaches if how.ok]
    if able or not eligible:
        return able
    bus = facade.shared.bus
    field = next((how.field for _, how in reaches if how.field), None)
    if field is not None:
        message = f"the request cannot be translated for the nodes that have it: field '{field}'"
        write_error(request, 400, message, "untranslatable")
        record.publish(bus, status=400, node_id=None, error="untranslatable")
        return None
    message = "no node of a kind that serves this route"
    write_error(request, 502, message, "no-route-owner")
    record.publish(bus, status=502, node_id=None, error="no-route-owner")
    return None


def _all_cordoned(
    facade: FacadeState, request: Request, record: RequestRecord, model: str | None
) -> bool:
    """Every node that could answer is cordoned (§13.1): 503 ``node-cordoned``, and True."""
    if not facade.cordoned_owners(model):
        return False
    what = f"every node with model '{model}'" if model else "every node"
    write_error(request, 503, f"{what} is cordoned for maintenance", "node-cordoned")
    record.publish(facade.shared.bus, status=503, node_id=None, error="node-cordoned")
    return True


def _plan(
    facade: FacadeState,
    request: Request,
    kind: RouteKind,
    record: RequestRecord,
    body: bytes,
    parsed: dict[str, Any] | None,
    model: str | None,
    candidates: list[Node],
) -> AttemptPlan:
    """What every attempt sends and how it commits, its timers and the assembly of §6.5."""
    path = record.path
    settings = facade.shared.settings
    inference = kind is RouteKind.INFERENCE
    assembles = inference and settings.assembles(facade.engine)
    assembly = plan_assembly(path, body, parsed, settings.max_body_size) if assembles else None
    target = target_of(request.uri)
    body, asked = _asking_usage(path, body, parsed, assembly) if inference else (body, False)
    strip_usage = record.usage_noted if asked else None
    speech = None
    if _needs_speech(facade, path, model, candidates):
        speech = Speech(
            facade=facade.profile,
            method=request.method,
            target=target,
            path=path,
            body=body,
            parsed=parsed,
            model=model,
            assembly=assembly,
            local_name=facade.inventory.local_name,
            assembles=assembles,
            limit=settings.max_body_size,
            clock=facade.shared.clock.seconds,
        )
    return AttemptPlan(
        method=request.method,
        target=target,
        headers=upstream_request_headers(request.requestHeaders, _client_host(request)),
        body=assembly.body if assembly is not None else body,
        inference=inference or kind is RouteKind.MODEL_ROUTED,
        gated=inference and facade.first_body_gate,
        header_timeout=settings.response_header_timeout,
        first_body_timeout=settings.first_body_timeout if inference else 0.0,
        assembly=assembly,
        first_extra=_cold_allowances(facade, model, candidates) if inference else {},
        busy_max_wait=settings.busy_max_wait,
        speech=speech,
        strip_usage=strip_usage,
    )


_USAGE_ROUTES = {
    "/v1/chat/completions": Dialect.OPENAI_CHAT,
    "/v1/completions": Dialect.OPENAI_COMPLETIONS,
}


def _asking_usage(
    path: str, body: bytes, parsed: dict[str, Any] | None, assembly: Assembly | None
) -> tuple[bytes, bool]:
    """An OpenAI stream whose client did not ask for ``stream_options.include_usage`` asks for it
    (the counts of §12.2), and its usage chunk is removed before the client sees it."""
    dialect = _USAGE_ROUTES.get(path)
    if dialect is None or parsed is None or assembly is not None:
        return body, False
    if parsed.get("stream") is not True or asks_usage(parsed):
        return body, False
    options = parsed.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return body, False
    try:
        return rewrite_body(dialect, body), True
    except ValueError:
        return body, False


def _needs_speech(facade: FacadeState, path: str, model: str | None, nodes: list[Node]) -> bool:
    """Whether any candidate is of another kind, or the model has other names (§11.3, §11.4)."""
    if model and facade.directory.catalogue.lookup(model).aliases:
        return True
    return any(not node.speaks(facade.profile, path) for node in nodes)


def _routed_model(facade: FacadeState, method: bytes, path: str, body: bytes) -> str | None:
    """The model a model-routed request names (None: it names none, so every node may answer)."""
    route = facade.profile.model_route(method, path)
    if route is None:
        return None
    _, parsed = model_of(body)
    return route.model(path, parsed)


# --- /v1/responses: the conversation's stored state lives on the node that produced it ---------

_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')
_RESPONSE_ID_SCAN = 64 << 10


def _response_key(response_id: str) -> AffinityKey:
    """The affinity-table slot of a response id (same LRU and TTL as prefix affinity)."""
    digest = hashlib.sha256(response_id.encode()).digest()
    return AffinityKey(_RESPONSES_SLOT, digest, (digest,))


_RESPONSES_SLOT = "\0responses"


def remember_response(facade: FacadeState, path: str, committed: Committed) -> None:
    """Remember which node produced a ``/v1/responses`` answer, from its first body chunk: the
    first ``"id"`` of the JSON object, or of the first SSE event (``response.created``).

    Nothing is buffered: an id not in the first chunk is not remembered.
    """
    if path != RESPONSES_PATH or committed.response.code != 200:
        return
    found = _RESPONSE_ID.search(committed.first, 0, _RESPONSE_ID_SCAN)
    if found is not None:
        response_id = found.group(1).decode("utf-8", "replace")
        facade.affinity.record(_response_key(response_id), committed.node.id)


def _conversation_first(
    facade: FacadeState, parsed: dict[str, Any], nodes: list[Node]
) -> list[Node]:
    """``previous_response_id``'s node first, when it is a candidate and not cooling (§2.1)."""
    previous = parsed.get("previous_response_id")
    if not isinstance(previous, str) or not previous:
        return nodes
    owner = facade.affinity.lookup(_response_key(previous))
    cooling = facade.stalls.cooling()
    if owner is None or owner in cooling:
        return nodes
    first = [n for n in nodes if n.id == owner]
    return first + [n for n in nodes if n.id != owner]


def _cold_allowances(facade: FacadeState, model: str | None, nodes: list[Node]) -> dict[str, float]:
    """The cold-load allowance for each candidate known not to have ``model`` loaded (§6.4).

    Unknown residency (None) adds nothing.
    """
    if not model:
        return {}
    allowance = facade.shared.settings.cold_load_allowance
    return {n.id: allowance for n in nodes if facade.inventory.resident(n.id, model) is False}


def _watch(request: Request, workload: Workload | None, facade: FacadeState) -> CallerState:
    """The caller's state, abandoned when the client leaves or the workload is cancelled.

    A cancelled workload (``workload/cancel``, the drain's deadline) ends the client's answer the
    way a dying node does: what was sent stays, the framing is left unfinished (§6.2).
    """
    caller = CallerState()

    def client_left(failure: Failure) -> None:
        caller.abandon("client disconnected")

    request.notifyFinish().addErrback(client_left)
    if workload is not None:
        shared = facade.shared

        def cancel_requested(reason: str) -> None:
            caller.abandon(reason)
            if not request.finished:
                cut(request, shared.clock, shared.settings.write_stall_timeout)

        workload.cancel_hook = cancel_requested
    return caller


def _refuse(
    facade: FacadeState,
    request: Request,
    result: Exhausted | Abandoned,
    record: RequestRecord,
    workload: Workload | None,
) -> None:
    """No commit: the caller left (499 in the record), or every candidate failed (502/504)."""
    bus = facade.shared.bus
    if isinstance(result, Abandoned):
        if workload is not None:
            workload.cancel(result.reason)
        if not request.finished:
            cut(request, facade.shared.clock, facade.shared.settings.write_stall_timeout)
        record.publish(bus, status=499, node_id=None, error=result.reason)
        return
    code = "upstream-timeout" if result.status == 504 else "upstream-error"
    write_error(request, result.status, result.reason, code)
    if workload is not None:
        workload.fail(result.reason)
    record.publish(bus, status=result.status, node_id=None, error=result.reason)


def _conclude(
    facade: FacadeState,
    route: _Route,
    node: Node,
    outcome: RelayOutcome,
    caller: CallerState,
    record: RequestRecord,
    workload: Workload | None,
) -> None:
    """The workload's end, the affinity entry and the request record, from the relay's outcome."""
    ok = 200 <= outcome.status < 300
    if workload is not None:
        if outcome.end is RelayEnd.FINISHED:
            if ok:
                workload.complete()
            else:
                workload.fail(f"upstream answered {outcome.status}")
        elif outcome.end is RelayEnd.TRUNCATED:
            workload.fail(outcome.error or "upstream dropped mid-stream")
        elif outcome.complete and ok:
            workload.complete()
        else:
            workload.cancel(caller.gone or "cancelled")
    if (
        outcome.end is RelayEnd.FINISHED
        and outcome.status == 200
        and route.key is not None
        and (outcome.terminal_seen or not outcome.streaming)
    ):
        facade.affinity.record(route.key, node.id)
    record.publish(
        facade.shared.bus,
        status=outcome.status,
        node_id=node.id,
        error=outcome.error,
        cache_affinity=route.warm is not None and node.id == route.warm,
    )


def model_of(body: bytes) -> tuple[str | None, dict[str, Any] | None]:
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


def _client_host(request: Request) -> str | None:
    host = getattr(request.getClientAddress(), "host", None)
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
