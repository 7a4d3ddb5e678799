# -*- test-case-name: tests.corridor.test_driver, tests.corridor.test_exchange, tests.corridor.test_cached_tokens -*-
"""The forward path's steps for one request (docs/behaviour.md §5, §6, §15, §16): route the model
or a fallback, count the key's limits, ask admission for a slot, wait in the queue, run the
attempts, relay the committed answer and learn from it.

:class:`Serving` does what the exchange's steps say and hands back the events they lead to; it
holds what the request holds while it is served (its fallbacks, its permit, its workload, its
booking and trip) and lets go of them once. It never sees the ``Request``: the answer goes
through the driver's writer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import define, evolve, field
from twisted.internet.defer import CancelledError

from nvpair_tw.core import EngineProfile, ProxyBug, RouteKind
from nvpair_tw.corridor._attempts import AttemptObserver, AttemptPlan, run_attempts
from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._conversation import judge, place
from nvpair_tw.corridor._dialect import UsageCell
from nvpair_tw.corridor._exchange import (
    Admit,
    Admitted,
    AttemptEnded,
    AttemptsEnded,
    AttemptStarted,
    BusyWaited,
    Ending,
    Event,
    HeadersArrived,
    Relay,
    Relayed,
    Route,
    Routed,
    Step,
    Try,
    Wait,
    Waited,
    WorkloadEnd,
)
from nvpair_tw.corridor._fallback import MODEL_HEADER, Fallbacks, Served
from nvpair_tw.corridor._record import elapsed_ms
from nvpair_tw.corridor._relay import RelayEnd, RelayOutcome, relay
from nvpair_tw.corridor._responses import remember_response
from nvpair_tw.corridor._route import Route as RouteValue
from nvpair_tw.corridor._route import route as choose_route
from nvpair_tw.corridor._scheduling import learn
from nvpair_tw.corridor._scheduling import trip as start_trip
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import Workload
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.dialects import Usage, UsageMeter
from nvpair_tw.inbound import LOCAL, NOT_COUNTED, Caller, Permit, Refusal, Rejection
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    Answer,
    Booking,
    Cordons,
    Landing,
    Place,
    QueueTimeout,
    Slot,
    Trip,
    Waiter,
)

__all__ = ["Feed", "Serving"]

log = LevelledLogger(namespace=__name__)


Feed = Callable[[Event], Step]
"""The driver's: an event to the exchange (whose phase it publishes)."""


class _Observer(AttemptObserver):
    """The attempt loop's progress, fed to the exchange (and the workload and the trip)."""

    def __init__(self, serving: Serving, feed: Feed, plan: AttemptPlan) -> None:
        self._serving = serving
        self._feed = feed
        self._plan = plan

    def attempt_started(self, node: Node) -> None:
        self._serving.attempt_started(node)
        self._feed(AttemptStarted(node.id))

    def headers_arrived(self, node: Node) -> None:
        if self._plan.gated:  # only a gated answer reads the prompt after its head (§6.2)
            self._feed(HeadersArrived(node.id))

    def attempt_ended(self, node: Node, outcome: Any) -> None:
        self._feed(AttemptEnded(node.id, outcome))

    def busy_wait(self, node: Node) -> None:
        self._feed(BusyWaited(node.id))


def _bound(route: RouteValue, slot: Slot) -> RouteValue:
    """The route with the slot's node first, the rest in their order (the failover order)."""
    candidates = route.candidates
    if candidates and candidates[0].id == slot.node_id:
        return route  # already first: the route as it is
    head = [n for n in route.candidates if n.id == slot.node_id]
    rest = [n for n in route.candidates if n.id != slot.node_id]
    return evolve(route, candidates=head + rest)


@define(eq=False)
class Serving:
    """One request on the forward path: the steps, and what they hold."""

    facade: FacadeState
    writer: Writer
    caller: CallerState
    fallbacks: Fallbacks | None = None
    permit: Permit = NOT_COUNTED
    workload: Workload | None = None
    route: RouteValue | None = None
    booking: Booking = field(factory=Booking.nothing)
    trip: Trip | None = None
    dispatched_at: float | None = None
    cached_at: Place | None = None
    """Where the conversation stood in the prompt cache of the node last attempted (§5.3.1)."""

    async def routed(self, step: Route) -> Event:
        self.end_workload(step.ends)
        if step.inbound is not None:
            self.fallbacks = Fallbacks.of(self.facade, step.inbound, choose_route)
            return Routed(self.fallbacks.first())
        return Routed(self.fallbacks.next() if self.fallbacks is not None else None)

    def counted(self, caller: Caller, kind: RouteKind) -> Rejection | None:
        """The request counted once against its key's limits (§12.1): the refusal, or None
        with the permit held."""
        admitted = self.facade.shared.limiter.admit(caller, kind)
        if isinstance(admitted, Refusal):
            return admitted.rejection
        self.permit = admitted
        return None

    async def admitted(self, step: Admit, gone: Callable[[str], None]) -> Event:
        """Admission's answer; the workload made for it, whose cancellation (``workload/cancel``,
        the drain) leaves like a client (``gone``) and cuts the answer."""
        self.end_workload(step.ends)
        self.let_go()
        facade, route, inbound = self.facade, step.served.route, step.served.inbound
        if not route.model:
            return Admitted(None, None)
        ticket = facade.admission.admit(
            route.candidates,
            cordons=Cordons.APPLY if inbound.node is None else Cordons.WAIVED,
            patience=route.patience,
            priority=inbound.priority,
        )
        if not isinstance(ticket, Slot | Waiter):
            return Admitted(ticket, None)
        self.workload = workload = facade.shared.workloads.create(facade.engine, route.model)
        writer, shared = self.writer, facade.shared

        def cancel_requested(reason: str) -> None:
            gone(reason)
            writer.cut(shared.clock, shared.settings.write_stall_timeout)

        workload.cancel_hook = cancel_requested
        return Admitted(ticket, workload.id)

    async def waited(self, step: Wait, served: Served) -> Event:
        facade, waiter, caller = self.facade, step.waiter, self.caller
        clock = facade.shared.clock
        if self.workload is not None:
            self.workload.queued()
        caller_of = served.inbound.caller
        key = None if caller_of is LOCAL else caller_of.name
        assert self.fallbacks is not None
        bound = self.fallbacks.waited(waiter, clock)
        release = facade.shared.holdings.hold(key, bound.cancel) if key else None
        caller.track(bound.cancel)
        result: Slot | Served | QueueTimeout | str
        try:
            result = await bound
        except QueueTimeout as timeout:
            result = timeout
        except CancelledError:
            result = caller.gone or "cancelled"
        finally:
            caller.track(None)
            if release is not None:
                release()
        return Waited(result, round((clock.seconds() - waiter.since) * 1000))

    async def tried(self, step: Try, feed: Feed) -> Event:
        facade, route = self.facade, step.served.route
        shared = facade.shared
        if step.slot is not None:
            route = _bound(route, step.slot)
            self.booking = Booking.take(shared.ledger, route.candidates[0].id, step.slot)
        self.route = route
        self.trip = start_trip(
            facade, route.model, route.predicted, route.warm, route.patience, route.reloads
        )
        try:
            result = await run_attempts(
                route.plan,
                route.candidates,
                shared.client,
                shared.clock,
                facade.stalls,
                self.caller,
                self.booking,
                _Observer(self, feed, route.plan),
                progress=facade.progress,
            )
        except ProxyBug as bug:
            log.error(
                "the proxy failed on an answer before commit: {error_type}",
                error_type=type(bug.error).__name__,
            )
            return AttemptsEnded(bug)
        return AttemptsEnded(result)

    def attempt_started(self, node: Node) -> None:
        self.dispatched_at = self.facade.shared.clock.seconds()
        self.cached_at = place(self.facade, self.route.key if self.route else None, node.id)
        if self.trip is not None:
            self.trip.attempt(node.id)
        if self.workload is not None:
            self.workload.running(node.id)

    async def relayed(self, step: Relay, started: float) -> Event:
        facade, committed, served = self.facade, step.committed, step.served
        shared = facade.shared
        route = self.route or served.route
        if served.serving is not None:
            self.writer.mark(MODEL_HEADER, served.serving.encode())
        remember_response(facade, served.inbound, committed)
        clock = shared.clock
        meter = (lambda framing: UsageMeter(framing, clock.seconds)) if route.model else None
        budget = shared.settings.write_stall_timeout
        outcome = await relay(self.writer, committed, self.caller, clock, budget, meter)
        usage = _said(outcome.usage, route.usage, committed.node.kind_of(facade.profile))
        judge(facade, route.key, committed.node.id, self.cached_at, usage)  # §5.3.1
        first_at = getattr(committed.gate, "first_at", None)
        landing = self.trip.land() if self.trip is not None else None
        answer = _answer_of(usage, self.dispatched_at, first_at)
        predicted = _learnt(facade, landing, route, outcome, answer, started)
        return Relayed(outcome, usage, first_at, predicted, self.caller.gone)

    def end_workload(self, ending: WorkloadEnd | None) -> None:
        """End the workload as ``ending`` says (None: as it is)."""
        if self.workload is not None:
            _end(self.workload, ending)

    def let_go(self) -> None:
        """The booking (and its slot) and the trip end: the request is done with its node."""
        self.booking.release()
        self.booking = Booking.nothing()
        if self.trip is not None:
            self.trip.land()
            self.trip = None


def _end(workload: Workload, ending: WorkloadEnd | None) -> None:
    """End ``workload`` as ``ending`` says (None: as it is); once ended it lets go of the request
    (its cancel hook: :meth:`Workload.complete`, ``fail`` and ``cancel`` drop it)."""
    if ending is None:
        return
    if ending.how is Ending.COMPLETE:
        workload.complete()
    elif ending.how is Ending.FAIL:
        workload.fail(ending.reason or "failed")
    else:
        workload.cancel(ending.reason or "cancelled")


def _said(usage: Usage | None, cell: UsageCell | None, kind: EngineProfile) -> Usage | None:
    """The answer's counts, completed by the usage chunk removed on the way (§12.2), without the
    cached count of a node kind whose cached count is none (Ollama's, §12.2)."""
    if usage is None:
        return None
    if cell is not None and cell.frame is not None:
        usage = usage.noted(cell.frame)
    if kind.counts_cache or usage.cached_tokens is None:
        return usage
    return evolve(usage, cached_tokens=None)


def _answer_of(
    usage: Usage | None, dispatched_at: float | None, first_at: float | None
) -> Answer | None:
    """What an answer's counts and times teach (§15.1); None when it stated none."""
    if usage is None:
        return None
    first = first_at if first_at is not None else usage.first_content_at
    return Answer(
        usage.prompt_tokens,
        usage.completion_tokens,
        dispatched_at,
        first,
        usage.last_at,
        usage.engine_rate,
        usage.engine_prefill,
        usage.engine_load,
        usage.paced or first_at is not None,  # a stream, or one the proxy assembled (§6.5)
        usage.cached_tokens,
    )


def _learnt(
    facade: FacadeState,
    landing: Landing | None,
    route: RouteValue,
    outcome: RelayOutcome,
    answer: Answer | None,
    started: float,
) -> tuple[int, int | None] | None:
    """A complete answer teaches its node's rates (§15.1), under a model name the gate resolved
    only (§14.6: a targeted node's unlisted model is ``other``, never a label); the prediction
    made for the node that served and the time it took (§15.2), in ms."""
    if answer is None or landing is None or route.model is None or route.label != route.model:
        return None
    if outcome.status != 200 or not (outcome.end is RelayEnd.FINISHED or outcome.complete):
        return None  # a whole answer its client closed on at once still teaches (§15.1)
    learn(facade, landing, route.model, answer, route.size.prompt_bytes)
    if landing.node_id not in route.predicted:
        return None
    measured = None if answer.last_at is None else elapsed_ms(started, answer.last_at)
    return round(landing.predicted * 1000), measured
