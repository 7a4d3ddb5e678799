# -*- test-case-name: tests.corridor.test_driver -*-
"""The driver of one request: it runs the request's :class:`~nvpair_tw.corridor._exchange.Exchange`
and does what each step says, with the one :class:`~nvpair_tw.corridor._writer.Writer` that holds
the request's answer.

The exchange decides and does no I/O; the driver does the I/O and decides nothing: it reads the
body, routes, counts the key's limits, asks admission, waits in the queue, runs the attempts and the
relay, runs the stages that answer by themselves (a probe, a model list, a tunnel, a fan-out, a
preload), and feeds the exchange what each gave. The client's departure (its connection lost, a
cancelled workload) becomes a :class:`~nvpair_tw.corridor._exchange.ClientGone` event. At the end it
writes what is left to write, ends the workload, marks the prefix warm, publishes the request's one
record and lets go of what the request held. Every phase the exchange enters is published as a
``request/phase`` event (docs/behaviour.md §7).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from attrs import define, evolve, field
from twisted.internet.defer import CancelledError, Deferred

from nvpair_tw.core import ProxyBug, RouteKind
from nvpair_tw.corridor._attempts import AttemptObserver, run_attempts
from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._exchange import (
    Admit,
    Admitted,
    Answer,
    Answered,
    AttemptEnded,
    AttemptsEnded,
    AttemptStarted,
    Begun,
    BodyRead,
    BusyWaited,
    ClientGone,
    Cut,
    Ended,
    Ending,
    Event,
    Exchange,
    Finish,
    HeadersArrived,
    Permit,
    Permitted,
    ReadBody,
    Relay,
    Relayed,
    Route,
    Routed,
    Stage,
    Step,
    Stop,
    Try,
    Understood,
    Wait,
    Waited,
    WorkloadEnd,
)
from nvpair_tw.corridor._fallback import MODEL_HEADER, Fallbacks, Served
from nvpair_tw.corridor._fanout import FanOutRequest, fan_out
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._inbound import Inbound, read_body
from nvpair_tw.corridor._preload import Preload, preload_answer, preload_of
from nvpair_tw.corridor._probes import probe_answer, probe_of
from nvpair_tw.corridor._record import elapsed_ms
from nvpair_tw.corridor._relay import RelayEnd, RelayOutcome, relay
from nvpair_tw.corridor._responses import remember_response
from nvpair_tw.corridor._roles import Channel
from nvpair_tw.corridor._route import Route as RouteValue
from nvpair_tw.corridor._route import route as choose_route
from nvpair_tw.corridor._scheduling import learn
from nvpair_tw.corridor._scheduling import trip as start_trip
from nvpair_tw.corridor._stages import fan_of, let_go_of, list_answer, tunnel_nodes
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._tunnel import Upgrade, open_tunnel
from nvpair_tw.corridor._workloads import Workload
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.dialects import Usage, UsageMeter
from nvpair_tw.events import EventBus, Phase, ProxyRequest, RequestPhase
from nvpair_tw.inbound import LOCAL, NOT_COUNTED, Refusal, Rejection
from nvpair_tw.inbound import Permit as KeyPermit
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.selection import Answer as SpeedAnswer
from nvpair_tw.selection import Booking, Cordons, QueueTimeout, Slot, Trip, Waiter

__all__ = ["Driver", "publish", "stage_of"]

log = LevelledLogger(namespace=__name__)


def publish(bus: EventBus, record: ProxyRequest) -> None:
    """Publish a request's one record: the one place ``proxy/request`` is published from."""
    bus.publish(record)


def stage_of(facade: FacadeState, head: Head) -> Stage:
    """What answers a request once its head passed: a stage of its own, or the body first."""
    if probe_of(facade.engine, head.method, head.path) is not None:
        return Stage.PROBE
    if head.channel is Channel.TUNNEL:
        return Stage.TUNNEL
    if head.kind is RouteKind.MODEL_LIST:
        return Stage.MODEL_LIST
    return Stage.FORWARD


class _Observer(AttemptObserver):
    """The attempt loop's progress, fed to the exchange (and the workload and the trip)."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def attempt_started(self, node: Node) -> None:
        self._driver.attempt_started(node)

    def headers_arrived(self, node: Node) -> None:
        self._driver.feed(HeadersArrived(node.id))

    def attempt_ended(self, node: Node, outcome: Any) -> None:
        self._driver.feed(AttemptEnded(node.id, outcome))

    def busy_wait(self, node: Node) -> None:
        self._driver.feed(BusyWaited(node.id))


@define
class _Held:
    """What one request holds while it runs, let go of once it ends (or moves to a fallback)."""

    inbound: Inbound | None = None
    fan: FanOutRequest | None = None
    preload: Preload | None = None
    fallbacks: Fallbacks | None = None
    permit: KeyPermit = NOT_COUNTED
    workload: Workload | None = None
    route: RouteValue | None = None
    booking: Booking = field(factory=Booking.nothing)
    trip: Trip | None = None
    dispatched_at: float | None = None

    def let_go(self) -> None:
        """The booking (and its slot) and the trip end: the request is done with its node."""
        self.booking.release()
        self.booking = Booking.nothing()
        if self.trip is not None:
            self.trip.land()
            self.trip = None


def _bound(route: RouteValue, slot: Slot) -> RouteValue:
    """The route with the slot's node first, the rest in their order (the failover order)."""
    head = [n for n in route.candidates if n.id == slot.node_id]
    rest = [n for n in route.candidates if n.id != slot.node_id]
    return evolve(route, candidates=head + rest)


def _tokens(record: ProxyRequest) -> int | None:
    """The request's prompt + completion tokens, None when neither is known."""
    counts = [n for n in (record.prompt_tokens, record.completion_tokens) if n is not None]
    return sum(counts) if counts else None


class Driver:
    """One request's driver (see the module docstring)."""

    def __init__(
        self, facade: FacadeState, writer: Writer, exchange: Exchange, head: Head, body: bytes
    ) -> None:
        self._facade = facade
        self._writer = writer
        self._exchange = exchange
        self._head = head
        self._body = body
        self._caller = CallerState()
        self._held = _Held()

    def run(self) -> Deferred[None]:
        """Drive the request to its end (the Deferred never fails: a bug is answered 500)."""
        self._writer.on_gone(self.gone)
        work = Deferred.fromCoroutine(self._drive())
        return work.addErrback(self._crashed)

    async def _drive(self) -> None:
        step = self.feed(Begun(stage_of(self._facade, self._head)))
        while not isinstance(step, Finish):
            assert step is not None and not isinstance(step, Stop)
            step = self.feed(await _STEPS[type(step)](self, step))
        self._finish(step)

    def feed(self, event: Event) -> Step:
        """Feed ``event`` to the exchange; publish the phase it moved to; the step it gave."""
        exchange = self._exchange
        before = exchange.phase
        step = exchange.feed(event)
        if exchange.phase is not before and exchange.phase is not Phase.DONE:
            self._phase_changed(exchange.phase)
        return step

    def gone(self, reason: str) -> None:
        """The client left (or its workload was cancelled): stop what is in flight."""
        if self._exchange.phase is Phase.DONE:
            return
        step = self.feed(ClientGone(reason))
        if isinstance(step, Stop):
            self._caller.abandon(step.reason)

    def attempt_started(self, node: Node) -> None:
        self._held.dispatched_at = self._facade.shared.clock.seconds()
        if self._held.trip is not None:
            self._held.trip.attempt(node.id)
        workload = self._held.workload
        if workload is not None:
            workload.running(node.id)
        self.feed(AttemptStarted(node.id))

    def _phase_changed(self, phase: Phase) -> None:
        facts = self._exchange.facts
        shared = self._facade.shared
        served = self._exchange.served
        self._facade.shared.bus.publish(
            RequestPhase(
                facts.id,
                facts.engine,
                phase,
                int(shared.clock.seconds() * 1000),
                facts.method,
                facts.path,
                self._exchange.facts.attempts.current,
                served.route.label if served is not None else None,
                facts.key,
            )
        )

    # -- the steps --------------------------------------------------------------------------------

    async def _read_body(self, _: ReadBody) -> Event:
        facade = self._facade
        inbound = await read_body(facade, self._head, self._body, facade.shared.clock)
        if isinstance(inbound, Rejection):
            return BodyRead(inbound)
        self._held.inbound = inbound
        fan = fan_of(facade, inbound)
        if isinstance(fan, Rejection):
            return BodyRead(fan)
        if fan is not None:
            self._held.fan = fan
            return BodyRead(Understood(inbound, Stage.FAN_OUT))
        preload = preload_of(facade, inbound)
        if preload is not None:
            self._held.preload = preload
            return BodyRead(Understood(inbound, Stage.PRELOAD))
        return BodyRead(Understood(inbound, Stage.FORWARD))

    async def _answer(self, step: Answer) -> Event:
        refused = _counted(self, step.stage)
        return Answered(refused if refused is not None else await _STAGES[step.stage](self))

    async def _route(self, step: Route) -> Event:
        self._end_workload(step.ends)
        if step.inbound is not None:
            self._held.fallbacks = Fallbacks.of(self._facade, step.inbound, choose_route)
            return Routed(self._held.fallbacks.first())
        fallbacks = self._held.fallbacks
        return Routed(fallbacks.next() if fallbacks is not None else None)

    async def _permit(self, _: Permit) -> Event:
        served = self._exchange.served
        assert served is not None
        inbound = served.inbound
        admitted = self._facade.shared.limiter.admit(inbound.caller, inbound.kind)
        if isinstance(admitted, Refusal):
            return Permitted(admitted.rejection)
        self._held.permit = admitted
        return Permitted(None)

    async def _admit(self, step: Admit) -> Event:
        self._end_workload(step.ends)
        self._held.let_go()
        facade, route, inbound = self._facade, step.served.route, step.served.inbound
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
        workload = facade.shared.workloads.create(facade.engine, route.model)
        self._held.workload = workload
        writer, shared = self._writer, facade.shared

        def cancel_requested(reason: str) -> None:
            self.gone(reason)
            writer.cut(shared.clock, shared.settings.write_stall_timeout)

        workload.cancel_hook = cancel_requested
        return Admitted(ticket, workload.id)

    async def _wait(self, step: Wait) -> Event:
        facade, waiter = self._facade, step.waiter
        clock = facade.shared.clock
        if self._held.workload is not None:
            self._held.workload.queued()
        caller = self._caller
        inbound = self._exchange.served.inbound if self._exchange.served else None
        key = None if inbound is None or inbound.caller is LOCAL else inbound.caller.name
        fallbacks = self._held.fallbacks
        assert fallbacks is not None
        bound = fallbacks.waited(waiter, clock)
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

    async def _try(self, step: Try) -> Event:
        facade, held = self._facade, self._held
        route = step.served.route
        if step.slot is not None:
            route = _bound(route, step.slot)
            held.booking = Booking.take(facade.shared.ledger, route.candidates[0].id, step.slot)
        held.route = route
        held.trip = start_trip(
            facade, route.model, route.predicted, route.warm, route.patience, route.reloads
        )
        shared = facade.shared
        try:
            result = await run_attempts(
                route.plan,
                route.candidates,
                shared.client,
                shared.clock,
                facade.stalls,
                self._caller,
                held.booking,
                _Observer(self),
                progress=facade.progress,
            )
        except ProxyBug as bug:
            log.error(
                "the proxy failed on an answer before commit: {error_type}",
                error_type=type(bug.error).__name__,
            )
            return AttemptsEnded(bug)
        return AttemptsEnded(result)

    async def _relay(self, step: Relay) -> Event:
        facade, committed, served = self._facade, step.committed, step.served
        shared = facade.shared
        route = self._held.route or served.route
        if served.serving is not None:
            self._writer.mark(MODEL_HEADER, served.serving.encode())
        remember_response(facade, served.inbound, committed)
        clock = shared.clock
        meter = (lambda framing: UsageMeter(framing, clock.seconds)) if route.model else None
        outcome = await relay(
            self._writer,
            committed,
            self._caller,
            clock,
            shared.settings.write_stall_timeout,
            meter,
        )
        usage = outcome.usage
        cell = route.usage
        if usage is not None and cell is not None and cell.frame is not None:
            usage = usage.noted(cell.frame)
        first_at = getattr(committed.gate, "first_at", None)
        predicted = self._learnt(route, outcome, usage, first_at)
        return Relayed(outcome, usage, first_at, predicted, self._caller.gone)

    def _learnt(
        self,
        route: RouteValue,
        outcome: RelayOutcome,
        usage: Usage | None,
        first_at: float | None,
    ) -> tuple[int, int | None] | None:
        """A complete answer teaches its node's rates (§15.1), under a model name the gate
        resolved only (§14.6: a targeted node's unlisted model is ``other``, never a label); the
        prediction made for the node that served and the time it took (§15.2), in ms."""
        trip = self._held.trip
        landing = trip.land() if trip is not None else None
        if usage is None or landing is None or route.model is None or route.label != route.model:
            return None
        if outcome.end is not RelayEnd.FINISHED or outcome.status != 200:
            return None
        first = first_at if first_at is not None else usage.first_content_at
        answer = SpeedAnswer(
            usage.prompt_tokens,
            usage.completion_tokens,
            self._held.dispatched_at,
            first,
            usage.last_at,
            usage.engine_rate,
            usage.engine_prefill,
            usage.engine_load,
        )
        learn(self._facade, landing, route.model, answer, route.size.prompt_bytes)
        if landing.node_id not in route.predicted:
            return None
        started = self._exchange.facts.started
        measured = None if answer.last_at is None else elapsed_ms(started, answer.last_at)
        return round(landing.predicted * 1000), measured

    # -- the end ----------------------------------------------------------------------------------

    def _finish(self, step: Finish) -> None:
        """Write what is left, end the workload, mark the prefix warm, publish the record once,
        and let go of what the request held."""
        shared = self._facade.shared
        answer = step.answer
        if isinstance(answer, Rejection):
            self._writer.refuse(answer)
        elif isinstance(answer, Cut):
            self._writer.cut(shared.clock, shared.settings.write_stall_timeout)
        self._end_workload(step.workload)
        route = self._held.route
        record = step.record
        if step.warm and route is not None and route.key is not None and record.node_id:
            self._facade.affinity.record(route.key, record.node_id)
        self._held.let_go()
        publish(shared.bus, record)
        self._held.permit.done(_tokens(record))
        inbound = self._held.inbound
        if inbound is not None and inbound.large:
            let_go_of(self._facade, inbound)

    def _end_workload(self, ending: WorkloadEnd | None) -> None:
        """End the workload as ``ending`` says (None: as it is); once ended it lets go of the
        driver (its cancel hook)."""
        workload = self._held.workload
        if workload is None:
            return
        if ending is None:
            pass
        elif ending.how is Ending.COMPLETE:
            workload.complete()
        elif ending.how is Ending.FAIL:
            workload.fail(ending.reason or "failed")
        else:
            workload.cancel(ending.reason or "cancelled")
        if workload.terminal:
            workload.cancel_hook = None

    def _crashed(self, failure: Any) -> None:
        """A bug of the proxy's: logged with its traceback, answered 500 (or the connection
        reset when the answer had begun), recorded once, and nothing held is kept."""
        log.failure("request handling failed", failure, engine=self._facade.engine)
        if self._exchange.phase is Phase.DONE:
            return
        self._exchange.phase = Phase.DONE
        self._writer.refuse(Rejection(500, "internal-error", "internal proxy error"))
        self._end_workload(WorkloadEnd(Ending.FAIL, "internal-error"))
        self._held.let_go()
        self._held.permit.done(None)
        facts = self._exchange.facts
        now = self._facade.shared.clock.seconds()
        publish(self._facade.shared.bus, facts.record(now, 500, None, "internal-error"))


def _counted(driver: Driver, stage: Stage) -> Rejection | None:
    """A stage that asks a node counts once against the key's limits (§12.1): its refusal, or
    None with the permit held."""
    if stage is Stage.PROBE:
        return None
    head = driver._head
    admitted = driver._facade.shared.limiter.admit(head.caller, head.kind)
    if isinstance(admitted, Refusal):
        return admitted.rejection
    driver._held.permit = admitted
    return None


async def _probe(driver: Driver) -> Ended | Rejection:
    facade, head = driver._facade, driver._head
    probe = probe_of(facade.engine, head.method, head.path)
    assert probe is not None
    answer = await probe_answer(facade, probe)
    if isinstance(answer, Rejection):
        return answer
    driver._writer.whole(answer)
    return Ended(answer.status, first_byte_at=facade.shared.clock.seconds())


async def _model_list(driver: Driver) -> Ended | Rejection:
    facade = driver._facade
    answer, error = await list_answer(facade, driver._head)
    driver._writer.whole(answer)
    return Ended(answer.status, error=error, first_byte_at=facade.shared.clock.seconds())


async def _tunnel(driver: Driver) -> Ended | Rejection:
    facade, head = driver._facade, driver._head
    shared = facade.shared
    nodes = tunnel_nodes(facade, head)
    if isinstance(nodes, Rejection):
        return nodes
    caller = head.caller
    assert shared.endpoints is not None
    end = await open_tunnel(
        driver._writer,
        nodes,
        Upgrade(head.target.wire, head.headers, list(head.upgrade)),
        driver._caller,
        key=None if caller is LOCAL else (caller.name, caller.rules.max_tunnels),
        engine=facade.engine,
        book=shared.tunnels,
        endpoints=shared.endpoints,
        clock=shared.clock,
        timeout=shared.settings.response_header_timeout,
    )
    if end.refused is not None:
        driver._writer.refuse(end.refused)
    return Ended(end.status, end.node_id, end.error, end.attempts, None, end.first_byte_at)


async def _fan_out(driver: Driver) -> Ended | Rejection:
    fan = driver._held.fan
    assert fan is not None
    end = await fan_out(driver._facade, driver._writer, fan, driver._caller)
    return Ended(end.status, None, end.error, end.parts, end.nodes, end.first_byte_at)


async def _preload(driver: Driver) -> Ended | Rejection:
    preload = driver._held.preload
    assert preload is not None
    answer = await preload_answer(driver._facade, preload)
    if isinstance(answer, Rejection):
        return answer
    whole, node_id = answer
    driver._writer.whole(whole)
    now = driver._facade.shared.clock.seconds()
    return Ended(200, node_id, first_byte_at=now)


_STEPS: dict[type[Any], Callable[[Driver, Any], Awaitable[Event]]] = {
    ReadBody: Driver._read_body,
    Answer: Driver._answer,
    Route: Driver._route,
    Permit: Driver._permit,
    Admit: Driver._admit,
    Wait: Driver._wait,
    Try: Driver._try,
    Relay: Driver._relay,
}
"""What the driver does for each step of the exchange."""

_STAGES: dict[Stage, Callable[[Driver], Awaitable[Ended | Rejection]]] = {
    Stage.PROBE: _probe,
    Stage.MODEL_LIST: _model_list,
    Stage.TUNNEL: _tunnel,
    Stage.FAN_OUT: _fan_out,
    Stage.PRELOAD: _preload,
}
