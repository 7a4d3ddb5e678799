# -*- test-case-name: tests.corridor.test_exchange -*-
"""One forwarded request, walked down the corridor: route, admission, attempts, relay, conclusion.

Each stage hands the next a value: :func:`~nvpair_tw.corridor._route.route` gives the candidates
and the plan, :func:`~nvpair_tw.corridor._attempts.run_attempts` returns ``Committed | Exhausted |
Abandoned``, :func:`~nvpair_tw.corridor._relay.relay` returns a
:class:`~nvpair_tw.corridor._relay.RelayOutcome`. Only this module turns those values into the
request record, the workload's end and the affinity table (docs/behaviour.md §5.3, §6, §7).
"""

from __future__ import annotations

from attrs import evolve
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure
from twisted.web.server import Request

from nvpair_tw.core import ProxyBug, RouteKind, write_error
from nvpair_tw.corridor._attempts import (
    Abandoned,
    AttemptObserver,
    CallerState,
    Committed,
    Exhausted,
    run_attempts,
)
from nvpair_tw.corridor._fallback import Fallbacks, Served
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._refusal import refuse
from nvpair_tw.corridor._relay import PROXY_ERROR, RelayEnd, RelayOutcome, cut, relay
from nvpair_tw.corridor._responses import remember_response
from nvpair_tw.corridor._route import Route
from nvpair_tw.corridor._route import route as choose_route
from nvpair_tw.corridor._scheduling import learn
from nvpair_tw.corridor._scheduling import trip as start_trip
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import RequestRecord, Workload
from nvpair_tw.dialects import Usage, UsageMeter
from nvpair_tw.inbound import LOCAL, NOT_COUNTED, Permit, Refusal, Rejection
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    RETRY_AFTER_SECONDS,
    Answer,
    Booking,
    Cordons,
    QueueFull,
    QueueTimeout,
    Slot,
    Trip,
    Waiter,
)

__all__ = ["forward"]

log = LevelledLogger(namespace=__name__)


class _Observer(AttemptObserver):
    """Feeds the attempt loop's progress into this request's record and workload."""

    def __init__(self, record: RequestRecord, workload: Workload | None, trip: Trip) -> None:
        self._record = record
        self._workload = workload
        self._trip = trip

    def attempt_started(self, node: Node) -> None:
        self._record.attempt_started(node.id)
        self._trip.attempt(node.id)
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
    fallbacks = Fallbacks.of(facade, inbound, record, choose_route)  # §16.1, §16.2
    served = fallbacks.first()
    if isinstance(served, Rejection):
        refuse(facade, request, record, served)
        return
    permit = _permitted(facade, inbound)
    if isinstance(permit, Rejection):
        refuse(facade, request, record, permit)
        return
    try:
        then: Served | None = served
        while then is not None:  # a fallback, before commit (docs/behaviour.md §16.2)
            then = await _admitted(facade, request, record, then.inbound, then.route, fallbacks)
    finally:
        permit.done(_tokens(record))


def _permitted(facade: FacadeState, inbound: Inbound) -> Permit | Rejection:
    """The permit of an admitted inference (counted now, §12.1), 429 ``rate-limited``, or
    :data:`~nvpair_tw.inbound.NOT_COUNTED` for a route the limits do not count."""
    if inbound.kind is not RouteKind.INFERENCE:
        return NOT_COUNTED
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
    route: Route,
    fallbacks: Fallbacks,
) -> Served | None:
    """Admission (a slot, or the queue), the workload, then the answer; or the fallback that
    takes the request instead (§16.2)."""
    target = inbound.node
    ticket = (
        facade.admission.admit(
            route.candidates,
            cordons=Cordons.APPLY if target is None else Cordons.WAIVED,
            patience=route.patience,
            priority=inbound.priority,
        )
        if route.model
        else None
    )
    if isinstance(ticket, QueueFull):
        _busy(facade, request, record, "every node is busy and the queue is full", "queue-full")
        return None
    workload = facade.shared.workloads.create(facade.engine, route.model) if route.model else None
    if workload is not None:
        record.workload_id = workload.id
    caller = _watch(request, workload, facade)
    if isinstance(ticket, Waiter):
        key = None if inbound.caller is LOCAL else inbound.caller.name
        release = facade.shared.holdings.hold(key, ticket.bound.cancel) if key else None
        try:
            waited = await _queue(facade, request, ticket, caller, record, workload, fallbacks)
        finally:
            if release is not None:
                release()
        if waited is None or isinstance(waited, Served):
            return waited
        ticket = waited
    booking = Booking.nothing()
    if ticket is not None:
        route = _bound(route, ticket)
        booking = Booking.take(facade.shared.ledger, route.candidates[0].id, ticket)
    trip = start_trip(
        facade, route.model, route.predicted, route.warm, route.patience, route.reloads
    )
    try:
        return await _answer(
            facade, request, route, caller, booking, record, workload, trip, fallbacks
        )
    finally:
        booking.release()
        trip.land()


async def _answer(
    facade: FacadeState,
    request: Request,
    route: Route,
    caller: CallerState,
    booking: Booking,
    record: RequestRecord,
    workload: Workload | None,
    trip: Trip,
    fallbacks: Fallbacks,
) -> Served | None:
    """The attempts, then the relay of the committed answer (or the refusal, or the fallback
    that takes the request after every owner failed, §16.2), then the end."""
    shared = facade.shared
    try:
        result = await run_attempts(
            route.plan,
            route.candidates,
            shared.client,
            shared.clock,
            facade.stalls,
            caller,
            booking,
            _Observer(record, workload, trip),
            progress=facade.progress,
        )
    except ProxyBug as bug:  # the proxy's own, before commit: no node is blamed (§6.1)
        _proxy_bug(facade, request, record, workload, bug)
        return None
    if isinstance(result, Committed):
        if route.label and result.wire is not None:
            record.served_as(route.label, result.wire.local_model, result.wire.translated)
        record.first_byte()
        fallbacks.mark(request)
        remember_response(facade, record.path, result)
        clock = shared.clock
        outcome = await relay(
            request,
            result,
            caller,
            clock,
            shared.settings.write_stall_timeout,
            (lambda framing: UsageMeter(framing, clock.seconds)) if route.model else None,
        )
        usage = outcome.usage
        if usage is not None and record.removed_usage is not None:
            usage = usage.noted(record.removed_usage)
        if usage is not None:
            first_at = getattr(result.gate, "first_at", None)
            _measured(record, usage, first_at)
            _learnt(facade, route, outcome, _answer_of(usage, record, first_at), trip, record)
        _conclude(facade, route, result.node, outcome, caller, record, workload)
        return None
    fallback = fallbacks.next() if isinstance(result, Exhausted) else None
    if fallback is not None:
        if workload is not None:
            workload.fail(result.reason)
        return fallback
    _refuse(facade, request, result, record, workload)
    return None


def _proxy_bug(
    facade: FacadeState,
    request: Request,
    record: RequestRecord,
    workload: Workload | None,
    bug: ProxyBug,
) -> None:
    """500 ``proxy-error``: what the proxy did with a node's answer raised before anything was
    committed. Logged once with its type; the node is neither cooled nor failed over from."""
    log.error(
        "the proxy failed on an answer before commit: {error_type}",
        error_type=type(bug.error).__name__,
    )
    if workload is not None:
        workload.fail(PROXY_ERROR)
    refuse(facade, request, record, Rejection(500, PROXY_ERROR, "the proxy failed on the answer"))


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


def _answer_of(usage: Usage, record: RequestRecord, first_at: float | None) -> Answer:
    first = first_at if first_at is not None else usage.first_content_at
    return Answer(
        usage.prompt_tokens,
        usage.completion_tokens,
        record.dispatched_at,
        first,
        usage.last_at,
        usage.engine_rate,
        usage.engine_prefill,
        usage.engine_load,
    )


def _learnt(
    facade: FacadeState,
    route: Route,
    outcome: RelayOutcome,
    answer: Answer,
    trip: Trip,
    record: RequestRecord,
) -> None:
    """A complete answer teaches its node's rates (§15.1); the record gets the prediction made
    for the node that served and the time it took (§15.2)."""
    landing = trip.land()
    if landing is None or route.model is None or outcome.end is not RelayEnd.FINISHED:
        return
    if outcome.status == 200:
        learn(facade, landing, route.model, answer, route.size.prompt_bytes)
        if landing.node_id in route.predicted:
            record.predicted(landing.predicted, answer.last_at)


async def _queue(
    facade: FacadeState,
    request: Request,
    waiter: Waiter,
    caller: CallerState,
    record: RequestRecord,
    workload: Workload | None,
    fallbacks: Fallbacks,
) -> Slot | Served | None:
    """Wait in the facade's queue for a slot (§6.4), or past ``fallback_after`` for a fallback
    (§16.2); None when the request ended here instead."""
    if workload is not None:
        workload.queued()
    bound = fallbacks.waited(waiter, facade.shared.clock)
    caller.track(bound.cancel)
    try:
        slot = await bound
    except (QueueTimeout, CancelledError) as error:
        stopped: Exception | None = error
    else:
        stopped = None
    caller.track(None)
    record.queued_for(facade.shared.clock.seconds() - waiter.since)
    if stopped is None:
        if isinstance(slot, Served) and workload is not None:
            workload.cancel("served by a fallback after waiting fallback_after")
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


def _bound(route: Route, slot: Slot) -> Route:
    """The route with the slot's node first, the rest in their order (the failover order)."""
    head = [n for n in route.candidates if n.id == slot.node_id]
    rest = [n for n in route.candidates if n.id != slot.node_id]
    return evolve(route, candidates=head + rest)


def _busy(
    facade: FacadeState, request: Request, record: RequestRecord, message: str, code: str
) -> None:
    """503 ``queue-full`` / ``queue-timeout`` with ``Retry-After``, and its record."""
    retry = (b"Retry-After", b"%d" % RETRY_AFTER_SECONDS)
    refuse(facade, request, record, Rejection(503, code, message, (retry,)))


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
    route: Route,
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
