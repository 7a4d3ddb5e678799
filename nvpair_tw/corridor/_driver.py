# -*- test-case-name: tests.corridor.test_driver, tests.corridor.test_exchange -*-
"""The driver of one request: it runs the request's :class:`~nvpair_tw.corridor._exchange.Exchange`
and does what each step says, with the one :class:`~nvpair_tw.corridor._writer.Writer` that holds
the request's answer.

The exchange decides and does no I/O; the driver does the I/O and decides nothing. It reads the
body, hands the forward path's steps to :class:`~nvpair_tw.corridor._serving.Serving` (route,
limits, admission, queue, attempts, relay) and the stages that answer by themselves to
:mod:`~nvpair_tw.corridor._answering`, and feeds the exchange what each gave. The client's
departure (its connection lost, a cancelled workload) becomes a
:class:`~nvpair_tw.corridor._exchange.ClientGone` event. At the end it writes what is left to
write, ends the workload, marks the prefix warm, publishes the request's one record
(:func:`publish`, the one place ``proxy/request`` is published from) and lets go of what the
request held. Every phase the exchange enters is published as a ``request/phase`` event
(docs/behaviour.md §7).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from nvpair_tw.core import RouteKind
from nvpair_tw.corridor._answering import Asked, answer
from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._conversation import remember
from nvpair_tw.corridor._exchange import (
    Admit,
    Answer,
    Answered,
    AttemptStarted,
    Begun,
    BodyRead,
    ClientGone,
    Cut,
    Ending,
    Event,
    Exchange,
    Finish,
    Permit,
    Permitted,
    ReadBody,
    Relay,
    Route,
    Stage,
    Step,
    Stop,
    Try,
    Understood,
    Wait,
    WorkloadEnd,
)
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._inbound import Inbound, read_body
from nvpair_tw.corridor._preload import preload_of
from nvpair_tw.corridor._probes import probe_of
from nvpair_tw.corridor._roles import Channel
from nvpair_tw.corridor._serving import Serving
from nvpair_tw.corridor._stages import fan_of, let_go_of
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.events import EventBus, Phase, ProxyRequest, RequestPhase
from nvpair_tw.inbound import Rejection
from nvpair_tw.logs import LevelledLogger

__all__ = ["Driver", "publish", "stage_of"]

log = LevelledLogger(namespace=__name__)


def publish(bus: EventBus, record: ProxyRequest) -> None:
    """Publish a request's one record: the one place ``proxy/request`` is published from."""
    bus.publish(record)


_BEGUN = {stage: Begun(stage) for stage in Stage}
_PERMITTED = Permitted(None)
"""Events with nothing of one request's own: frozen values, made once."""


def _permitted(refused: Rejection | None) -> Permitted:
    return _PERMITTED if refused is None else Permitted(refused)


def stage_of(facade: FacadeState, head: Head) -> Stage:
    """What answers a request once its head passed: a stage of its own, or the body first."""
    if probe_of(facade.engine, head.method, head.path) is not None:
        return Stage.PROBE
    if head.channel is Channel.TUNNEL:
        return Stage.TUNNEL
    if head.kind is RouteKind.MODEL_LIST:
        return Stage.MODEL_LIST
    return Stage.FORWARD


def _tokens(record: ProxyRequest) -> int | None:
    """The request's prompt + completion tokens, None when neither is known."""
    counts = [n for n in (record.prompt_tokens, record.completion_tokens) if n is not None]
    return sum(counts) if counts else None


def _held(record: ProxyRequest) -> int | None:
    """What the engine holds of the conversation after its answer (§5.3.1): its prompt and
    completion tokens, None when it stated no prompt count."""
    prompt = record.prompt_tokens
    return None if prompt is None else prompt + (record.completion_tokens or 0)


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
        self._inbound: Inbound | None = None
        self._shown: tuple[Phase, str | None] = (exchange.phase, None)
        caller = CallerState()
        self._asked = Asked(facade, writer, head, caller)
        self._serving = Serving(facade, writer, caller)

    def run(self) -> Deferred[None]:
        """Drive the request to its end (the Deferred never fails: a bug is answered 500)."""
        self._writer.on_gone(self.gone)
        work = Deferred.fromCoroutine(self._drive())
        return work.addErrback(self._crashed)

    async def _drive(self) -> None:
        step = self.feed(_BEGUN[stage_of(self._facade, self._head)])
        while not isinstance(step, Finish):
            assert step is not None and not isinstance(step, Stop)
            step = self.feed(await _STEPS[type(step)](self, step))
        self._finish(step)

    def feed(self, event: Event) -> Step:
        """Feed ``event`` to the exchange; publish the phase it moved to (or the node it moved
        on to, §6.1); the step it gave."""
        exchange = self._exchange
        step = exchange.feed(event)
        phase = exchange.phase
        shown, node = self._shown
        if phase is shown and type(event) is not AttemptStarted:
            return step  # the phase and the node are as published
        node = exchange.node or exchange.facts.attempts.current or node
        if (phase, node) != self._shown and phase is not Phase.DONE:
            self._shown = (phase, node)
            self._phase_changed(phase, node)
        return step

    def gone(self, reason: str) -> None:
        """The client left (or its workload was cancelled): stop what is in flight."""
        if self._exchange.phase is Phase.DONE:
            return
        step = self.feed(ClientGone(reason))
        if isinstance(step, Stop):
            self._asked.caller.abandon(step.reason)

    def _phase_changed(self, phase: Phase, node: str | None) -> None:
        exchange = self._exchange
        facts, served = exchange.facts, exchange.served
        shared = self._facade.shared
        since = int(shared.clock.seconds() * 1000)
        label = served.route.label if served is not None else None
        shared.bus.publish(
            RequestPhase(
                facts.id,
                facts.engine,
                phase,
                since,
                facts.method,
                facts.path,
                node,
                label,
                facts.key,
            )
        )

    # -- the steps --------------------------------------------------------------------------------

    async def _read_body(self, _: ReadBody) -> Event:
        facade = self._facade
        inbound = await read_body(facade, self._head, self._body, facade.shared.clock)
        if isinstance(inbound, Rejection):
            return BodyRead(inbound)
        self._inbound = inbound
        fan = fan_of(facade, inbound)
        if isinstance(fan, Rejection):
            return BodyRead(fan)
        if fan is not None:
            return BodyRead(Understood(inbound, Stage.FAN_OUT, fan))
        preload = preload_of(facade, inbound)
        if preload is not None:
            return BodyRead(Understood(inbound, Stage.PRELOAD, preload))
        return BodyRead(Understood(inbound, Stage.FORWARD))

    async def _answer(self, step: Answer) -> Event:
        """A stage that asks a node counts against the key's limits first (§12.1)."""
        if step.stage is not Stage.PROBE:  # a probe is the proxy's own answer
            refused = self._serving.counted(self._head.caller, self._head.kind)
            if refused is not None:
                return Answered(refused)
        return Answered(await answer(self._asked, step))

    async def _route(self, step: Route) -> Event:
        return await self._serving.routed(step)

    async def _permit(self, _: Permit) -> Event:
        served = self._exchange.served
        assert served is not None
        return _permitted(self._serving.counted(served.inbound.caller, served.inbound.kind))

    async def _admit(self, step: Admit) -> Event:
        return await self._serving.admitted(step, self.gone)

    async def _wait(self, step: Wait) -> Event:
        served = self._exchange.served
        assert served is not None
        return await self._serving.waited(step, served)

    async def _try(self, step: Try) -> Event:
        return await self._serving.tried(step, self.feed)

    async def _relay(self, step: Relay) -> Event:
        return await self._serving.relayed(step, self._exchange.facts.started)

    # -- the end ----------------------------------------------------------------------------------

    def _finish(self, step: Finish) -> None:
        """Write what is left, then settle (the prefix marked warm where it was answered whole)."""
        shared = self._facade.shared
        answer, record = step.answer, step.record
        if isinstance(answer, Rejection):
            self._writer.refuse(answer)
        elif isinstance(answer, Cut):
            self._writer.cut(shared.clock, shared.settings.write_stall_timeout)
        self._settle(record, step.workload, record.node_id if step.warm else None)

    def _settle(self, record: ProxyRequest, ending: WorkloadEnd | None, warm: str | None) -> None:
        """End the workload, mark the prefix warm on ``warm``, publish the record once, and let
        go of what the request held."""
        serving = self._serving
        serving.end_workload(ending)
        route = serving.route
        if warm and route is not None:
            remember(self._facade, route.key, route.session, warm, _held(record))
        serving.let_go()
        publish(self._facade.shared.bus, record)
        serving.permit.done(_tokens(record))
        inbound = self._inbound
        if inbound is not None and inbound.large:
            let_go_of(self._facade, inbound)

    def _crashed(self, failure: Failure) -> None:
        """A bug of the proxy's: logged with its traceback, answered 500 (or the connection
        reset when the answer had begun), recorded once, and nothing held is kept."""
        log.failure("request handling failed", failure, engine=self._facade.engine)
        exchange = self._exchange
        if exchange.phase is Phase.DONE:
            return
        exchange.phase = Phase.DONE
        self._writer.refuse(Rejection(500, "internal-error", "internal proxy error"))
        now = self._facade.shared.clock.seconds()
        record = exchange.facts.record(now, 500, None, "internal-error")
        self._settle(record, WorkloadEnd(Ending.FAIL, "internal-error"), None)


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
