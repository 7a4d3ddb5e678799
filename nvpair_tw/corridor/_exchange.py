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
import re
from typing import Any

from attrs import evolve, frozen
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure
from twisted.web.server import Request

from nvpair_tw.assembly import Assembly, Dialect, plan_assembly, rewrite_outlined
from nvpair_tw.core import RESPONSES_PATH, Outlined, RouteKind, write_error
from nvpair_tw.corridor._attempts import (
    Abandoned,
    AttemptObserver,
    AttemptPlan,
    CallerState,
    Committed,
    Exhausted,
    run_attempts,
)
from nvpair_tw.corridor._dialect import Reach, Speech, reach
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._relay import RelayEnd, RelayOutcome, cut, relay
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import RequestRecord, Workload
from nvpair_tw.dialects import Usage, UsageMeter, asks_usage
from nvpair_tw.inbound import LOCAL, Permit, Refusal, Rejection, Role
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

__all__ = ["forward", "remember_response"]


@frozen
class _Route:
    """What the facade learnt of a request before the first attempt."""

    plan: AttemptPlan
    model: str | None
    candidates: list[Node]
    key: AffinityKey | None
    warm: str | None
    label: str | None
    """The model as records, usage and metrics name it: the public name the gate resolved, else
    ``other`` (docs/behaviour.md §14.6)."""


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
    facade: FacadeState, request: Request, inbound: Inbound, record: RequestRecord
) -> None:
    """Forward one inference, model-routed or pass-through request and conclude it.

    ``inbound`` is the request understood once (docs/behaviour.md §14.1): its node named by
    ``X-NVPair-Node`` is the only candidate (§2.1), its caller's limits apply (§12.1). ``request``
    is only written to and watched for the client's departure.
    """
    route = _route(facade, inbound, record)
    if isinstance(route, Rejection):
        _refused(facade, request, record, route)
        return
    permit = _permitted(facade, inbound)
    if isinstance(permit, Rejection):
        _refused(facade, request, record, permit)
        return
    try:
        await _admitted(facade, request, record, inbound, route)
    finally:
        if permit is not None:
            permit.done(_tokens(record))


def _refused(
    facade: FacadeState, request: Request, record: RequestRecord, refused: Rejection
) -> None:
    """Answer a refusal of the corridor (no node contacted) and record it."""
    write_error(request, refused.status, refused.message, refused.code, refused.headers)
    record.publish(facade.shared.bus, status=refused.status, node_id=None, error=refused.code)


def _permitted(facade: FacadeState, inbound: Inbound) -> Permit | Rejection | None:
    """The permit of an admitted inference (counted now, §12.1), 429 ``rate-limited``, or None
    for a route the limits do not count."""
    if inbound.kind is not RouteKind.INFERENCE:
        return None
    admitted = facade.shared.limiter.admit(inbound.caller)
    return admitted.rejection if isinstance(admitted, Refusal) else admitted


def _tokens(record: RequestRecord) -> int | None:
    """The request's prompt + completion tokens, None when neither is known."""
    counts = [n for n in (record.prompt_tokens, record.completion_tokens) if n is not None]
    return sum(counts) if counts else None


async def _admitted(
    facade: FacadeState,
    request: Request,
    record: RequestRecord,
    inbound: Inbound,
    route: _Route,
) -> None:
    """Admission (a slot, or the queue), the workload, then the answer."""
    target = inbound.node
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
        key = None if inbound.caller is LOCAL else inbound.caller.name
        release = facade.shared.holdings.hold(key, ticket.bound.cancel) if key else None
        try:
            ticket = await _queue(facade, request, ticket, caller, record, workload)
        finally:
            if release is not None:
                release()
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
        if route.label and result.wire is not None:
            record.served_as(route.label, result.wire.local_model, result.wire.translated)
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


def _route(facade: FacadeState, inbound: Inbound, record: RequestRecord) -> _Route | Rejection:
    """The gate, affinity and candidate order, or the refusal (502/404/400/503).

    A model-routed request (``/api/show``, ``/api/v0/models/{id}``) is gated like inference but
    has no workload, reservation or affinity: its plan moves on past a 404 (``inference``) and
    commits on headers (not ``gated``). A targeted node is the only candidate; a key of role
    ``user`` still has the gate run on it (docs/behaviour.md §14.2).
    """
    inference = inbound.kind is RouteKind.INFERENCE
    gated = inbound.model if inbound.kind in _GATED else None
    parsed = inbound.doc if inference else None
    eligible = _eligible(facade, inbound, gated)
    if isinstance(eligible, Rejection):
        return eligible
    eligible = _speakable(facade, inbound.path, eligible, parsed)
    if isinstance(eligible, Rejection):
        return eligible
    # Affinity, reservations, residency, workloads and events key on the public name (§11.4).
    model = facade.directory.catalogue.public(gated) if gated else None
    target = inbound.node
    label = model
    if model and target is not None and target not in facade.eligible(gated):
        label = OTHER_MODEL  # a targeted node that does not list it (§14.6)
    key: AffinityKey | None = None
    hint: str | None = None
    if model and parsed is not None and target is None and _affine(inbound.body, parsed):
        key = affinity_key(inbound.path, facade.profile.normalise(model.strip()), parsed)
        hint = facade.affinity.lookup(key) if key is not None else None
    if target is not None:
        candidates, promoted = [target], False
    else:
        candidates, promoted = facade.order(
            eligible, head_selection=bool(model), affinity_hint=hint, model=model
        )
        if model and parsed is not None and inbound.path == RESPONSES_PATH:
            candidates = _conversation_first(facade, parsed, candidates)
    plan = _plan(facade, inbound, record, gated, candidates)
    warm = candidates[0].id if promoted else None
    if not inference:
        model = label = None
    return _Route(plan, model, candidates, key, warm, label)


AFFINITY_MAX_BODY = 2 << 20
"""Bytes: a larger body gets no prefix affinity (its digests would hold the reactor, §14.1)."""
AFFINITY_MAX_MESSAGES = 2048
"""Messages: a longer conversation gets no prefix affinity (one digest per message)."""


def _affine(body: bytes, parsed: dict[str, Any]) -> bool:
    """Whether a request is small enough to have its prefix digests made on the reactor: a few
    milliseconds at these bounds, where a 32 MiB body of a million messages took 5.8 s."""
    if len(body) > AFFINITY_MAX_BODY:
        return False
    messages = parsed.get("messages")
    return not isinstance(messages, list) or len(messages) <= AFFINITY_MAX_MESSAGES


_GATED = (RouteKind.INFERENCE, RouteKind.MODEL_ROUTED)
OTHER_MODEL = "other"
"""How records, usage and metrics name a model the gate did not resolve (§14.6)."""


def _eligible(facade: FacadeState, inbound: Inbound, model: str | None) -> list[Node] | Rejection:
    """The capability gate (§4.2): the nodes that may answer, or why none may (404/502/503)."""
    target = inbound.node
    if target is not None:
        if inbound.caller.rules.role is Role.ADMIN or not model:
            return [target]
        if facade.cordons.cordoned(target):
            return Rejection(
                503, "node-cordoned", f"node '{target.id}' is cordoned for maintenance"
            )
        return [target] if target in facade.eligible(model) else _no_owner(inbound, model)
    eligible = facade.eligible(model)
    if eligible:
        return eligible
    if facade.cordoned_owners(model):
        what = f"every node with model '{model}'" if model else "every node"
        return Rejection(503, "node-cordoned", f"{what} is cordoned for maintenance")
    return _no_owner(inbound, model) if model else eligible


def _no_owner(inbound: Inbound, model: str) -> Rejection:
    if inbound.kind is RouteKind.MODEL_ROUTED:
        return Rejection(404, "model-not-found", f"model '{model}' not found")
    return Rejection(502, "no-model-owner", "no available node advertises the requested model")


def _speakable(
    facade: FacadeState, path: str, eligible: list[Node], parsed: dict[str, Any] | None
) -> list[Node] | Rejection:
    """The eligible nodes that can take the route, natively or translated (§11.3), decided once
    per node kind; 400 ``untranslatable`` (no native candidate, and the request cannot be
    translated) or 502 ``no-route-owner`` (no candidate of a kind that serves the route)."""
    by_kind: dict[str, Reach] = {}
    able: list[Node] = []
    for node in eligible:
        kind = node.kind_of(facade.profile).name
        how = by_kind.get(kind)
        if how is None:
            how = by_kind[kind] = reach(facade.profile, node, path, parsed)
        if how.ok:
            able.append(node)
    if able or not eligible:
        return able
    field = next((how.field for how in by_kind.values() if how.field), None)
    if field is not None:
        message = f"the request cannot be translated for the nodes that have it: field '{field}'"
        return Rejection(400, "untranslatable", message)
    return Rejection(502, "no-route-owner", "no node of a kind that serves this route")


def _plan(
    facade: FacadeState,
    inbound: Inbound,
    record: RequestRecord,
    model: str | None,
    candidates: list[Node],
) -> AttemptPlan:
    """What every attempt sends and how it commits, its timers and the assembly of §6.5: the
    checked body and the normalised target of the one parse (docs/behaviour.md §14.1)."""
    path = inbound.path
    settings = facade.shared.settings
    kind = inbound.kind
    inference = kind is RouteKind.INFERENCE
    body = inbound.body
    parsed = inbound.doc if inference else None
    method = inbound.head.method
    assembles = inference and settings.assembles(facade.engine)
    outline = inbound.outline
    assembly = (
        plan_assembly(path, body, parsed, settings.max_body_size, outline) if assembles else None
    )
    target = inbound.head.target.wire
    sent = Outlined(body, outline) if outline is not None else None
    if inference:
        sent, asked = _asking_usage(path, sent, parsed, assembly)
        body = sent.body if sent is not None else body
    else:
        asked = False
    strip_usage = record.usage_noted if asked else None
    speech = None
    if _needs_speech(facade, path, model, candidates):
        speech = Speech(
            facade=facade.profile,
            method=method,
            target=target,
            path=path,
            body=body,
            outline=sent.outline if sent is not None else None,
            parsed=parsed,
            model=model,
            assembly=assembly,
            local_name=facade.inventory.local_name,
            assembles=assembles,
            limit=settings.max_body_size,
            clock=facade.shared.clock.seconds,
        )
    return AttemptPlan(
        method=method,
        target=target,
        headers=inbound.head.headers,
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
    path: str, sent: Outlined | None, parsed: dict[str, Any] | None, assembly: Assembly | None
) -> tuple[Outlined | None, bool]:
    """An OpenAI stream whose client did not ask for ``stream_options.include_usage`` asks for it
    (the counts of §12.2), and its usage chunk is removed before the client sees it. The body is
    edited where its outline says, never read again (docs/behaviour.md §14.1)."""
    dialect = _USAGE_ROUTES.get(path)
    if dialect is None or parsed is None or sent is None or assembly is not None:
        return sent, False
    if parsed.get("stream") is not True or asks_usage(parsed):
        return sent, False
    options = parsed.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return sent, False
    return rewrite_outlined(dialect, sent), True


def _needs_speech(facade: FacadeState, path: str, model: str | None, nodes: list[Node]) -> bool:
    """Whether any candidate is of another kind, or the model has other names (§11.3, §11.4)."""
    if model and facade.directory.catalogue.lookup(model).aliases:
        return True
    return any(not node.speaks(facade.profile, path) for node in nodes)


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
