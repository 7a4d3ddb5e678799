# -*- test-case-name: tests.corridor.test_exchange_machine -*-
"""One request's exchange as a machine: events in, steps out, no I/O.

An :class:`Exchange` is made per request when its head has passed (docs/behaviour.md §14.1). It
knows nothing of sockets, the reactor or the Twisted ``Request``: the driver
(:mod:`~nvpair_tw.corridor._driver`) feeds it what happened (the body read, the route decided, a
slot granted, an attempt started or ended, the answer relayed, the client gone), each event with
the clock time it happened at, and performs the step it returns (read the body, route, admit, wait,
attempt, relay, answer, stop, finish). Its states are the request's :class:`~nvpair_tw.events.Phase`
(received, answering, queued, waiting for headers, reading the prompt, streaming, done), and
:data:`TRANSITIONS` is every legal move: an event that is not legal in the current phase raises
:class:`~nvpair_tw.core.IllegalCall`.

It also keeps what the stages found (:class:`~nvpair_tw.corridor._record.Facts`), and its last
step, :class:`Finish`, carries the request's one record, made once, with what is still to be done:
the refusal or the cut to write, how the workload ends, whether the conversation's prefix is now
warm on the node that served.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, TypeAlias

from attrs import define, frozen

from nvpair_tw.core import IllegalCall, ProxyBug
from nvpair_tw.corridor._attempts import Abandoned, Committed, Exhausted
from nvpair_tw.corridor._fallback import Served
from nvpair_tw.corridor._fanout import FanOutRequest
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._preload import Preload
from nvpair_tw.corridor._record import Facts
from nvpair_tw.corridor._relay import PROXY_ERROR, RelayEnd, RelayOutcome
from nvpair_tw.dialects import Usage
from nvpair_tw.events import Attempt, Choice, Outcome, Phase, ProxyRequest
from nvpair_tw.inbound import Rejection
from nvpair_tw.selection import RETRY_AFTER_SECONDS, QueueFull, QueueTimeout, Slot, Waiter

__all__ = [
    "TRANSITIONS",
    "Admit",
    "Admitted",
    "Answer",
    "Answered",
    "AttemptEnded",
    "AttemptStarted",
    "AttemptsEnded",
    "Begun",
    "BodyRead",
    "BusyWaited",
    "ClientGone",
    "Cut",
    "Ended",
    "Ending",
    "Event",
    "Exchange",
    "Finish",
    "HeadersArrived",
    "Permit",
    "Permitted",
    "ReadBody",
    "Relay",
    "Relayed",
    "Route",
    "Routed",
    "Stage",
    "Step",
    "Stop",
    "Try",
    "Understood",
    "Wait",
    "Waited",
    "WorkloadEnd",
]


class Stage(Enum):
    """What answers a request once its head (and, for some, its body) is known."""

    PROBE = "probe"
    """The proxy answers "is the engine there?" itself (§17.6)."""
    TUNNEL = "tunnel"
    """LM Studio's WebSocket channel (§2.1)."""
    MODEL_LIST = "model-list"
    """A model list from every node (§4.3)."""
    FAN_OUT = "fan-out"
    """Model management on several nodes at once (§13.2)."""
    PRELOAD = "preload"
    """Ollama's prompt-less generate for a node of another kind (§17.6)."""
    FORWARD = "forward"
    """The corridor: route, admission, attempts, relay."""


# -- events: what happened ------------------------------------------------------------------------


@frozen
class Begun:
    """The head passed: ``stage`` answers it, or (:attr:`Stage.FORWARD`) its body is needed."""

    stage: Stage


@frozen
class Understood:
    """The body, understood once (§14.1), and the stage that answers it (with the work it was
    found to be: a fan-out's nodes, a preload's)."""

    inbound: Inbound
    stage: Stage
    work: FanOutRequest | Preload | None = None


@frozen
class BodyRead:
    """The body was read: understood, or refused (400, 403, 413, 415)."""

    result: Understood | Rejection


@frozen
class Routed:
    """The route of the asked model or of a fallback (§16.2); None: no fallback is left."""

    result: Served | Rejection | None


@frozen
class Permitted:
    """The key's limits counted the request (None), or refused it (429, §12.1)."""

    refused: Rejection | None


@frozen
class Admitted:
    """Admission's answer (§6.4): a slot, a place in the queue, a full queue, or nothing to admit
    (a request naming no model); the workload made for it, if any."""

    ticket: Slot | Waiter | QueueFull | None
    workload_id: int | None


@frozen
class Waited:
    """The queue's answer: a slot, a fallback that took the request (§16.2), the queue's
    deadline, or the wait cancelled (the client left: its reason)."""

    result: Slot | Served | QueueTimeout | str
    queued_ms: int


@frozen
class AttemptStarted:
    node_id: str


@frozen
class HeadersArrived:
    """The node answered its head; no body byte yet."""

    node_id: str


@frozen
class AttemptEnded:
    node_id: str
    outcome: Outcome


@frozen
class BusyWaited:
    """The attempt waits one more deadline period: its node shows progress (§6.4)."""

    node_id: str


@frozen
class AttemptsEnded:
    """The attempts' result, or the proxy's own failure before commit (:class:`ProxyBug`)."""

    result: Committed | Exhausted | Abandoned | ProxyBug


@frozen
class Relayed:
    """The relay's outcome; the answer's counts (§12.2), what the prediction said (§15.2)."""

    outcome: RelayOutcome
    usage: Usage | None
    first_token_at: float | None
    predicted: tuple[int, int | None] | None
    gone: str | None = None
    """Why the caller left, when it did (a client that stopped reading, say)."""


@frozen
class Ended:
    """What a stage that answers by itself did (a list, a probe, a fan-out, a tunnel)."""

    status: int | None
    node_id: str | None = None
    error: str | None = None
    attempts: tuple[Attempt, ...] = ()
    fan_out: tuple[str, ...] | None = None
    first_byte_at: float | None = None


@frozen
class Answered:
    ended: Ended | Rejection


@frozen
class ClientGone:
    """The client left (or stopped reading, or its workload was cancelled)."""

    reason: str


Event: TypeAlias = (
    Begun
    | BodyRead
    | Routed
    | Permitted
    | Admitted
    | Waited
    | AttemptStarted
    | HeadersArrived
    | AttemptEnded
    | BusyWaited
    | AttemptsEnded
    | Relayed
    | Answered
    | ClientGone
)


# -- steps: what the driver does next ---------------------------------------------------------------


class Ending(Enum):
    """How a workload ends (docs/behaviour.md §7)."""

    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"


@frozen
class WorkloadEnd:
    how: Ending
    reason: str | None = None


@frozen
class ReadBody:
    """Read and understand the body (§14.1)."""


@frozen
class Answer:
    """Run ``stage``, which answers by itself (``inbound`` and its ``work`` when it needed the
    body)."""

    stage: Stage
    inbound: Inbound | None = None
    work: FanOutRequest | Preload | None = None


@frozen
class Route:
    """Route the asked model (``inbound``), or the next fallback (None); the current workload
    ends first as ``ends`` says."""

    inbound: Inbound | None
    ends: WorkloadEnd | None = None


@frozen
class Permit:
    """Count the request against its key's limits (§12.1)."""


@frozen
class Admit:
    """Ask admission for a slot for ``served``; the current workload ends first as ``ends``."""

    served: Served
    ends: WorkloadEnd | None = None


@frozen
class Wait:
    """Wait in the queue for ``waiter``'s slot (or the fallback's turn)."""

    waiter: Waiter


@frozen
class Try:
    """Run the attempts of ``served`` (bound to ``slot`` when admission gave one)."""

    served: Served
    slot: Slot | None


@frozen
class Relay:
    """Relay the committed answer to the client."""

    committed: Committed
    served: Served


@frozen
class Stop:
    """The client left: stop what is in flight for it."""

    reason: str


@frozen
class Cut:
    """End the client's answer without its framing's end (§6.2); nothing when none began."""


@frozen
class Finish:
    """The end: the record to publish, what the writer still does (a refusal, a cut, or nothing),
    how the workload ends and whether the served node now holds the conversation's prefix."""

    record: ProxyRequest
    answer: Rejection | Cut | None = None
    workload: WorkloadEnd | None = None
    warm: bool = False


Step: TypeAlias = (
    ReadBody | Answer | Route | Permit | Admit | Wait | Try | Relay | Stop | Finish | None
)
"""None: nothing to do for this event (progress inside a step)."""


# -- the machine ----------------------------------------------------------------------------------

_UPSTREAM = {502: "upstream-error", 504: "upstream-timeout"}

# The steps and endings every forwarded request takes, with nothing of its own: frozen values,
# made once (not for every request).
_READ_BODY = ReadBody()
_PERMIT = Permit()
_COMPLETE = WorkloadEnd(Ending.COMPLETE)


@define
class Exchange:
    """One request's exchange: its phase, what is known of it, what it is being served as.

    Its fields other than ``facts`` and ``phase`` belong to the handlers of :data:`TRANSITIONS`.
    ``now`` is the clock's ``seconds``: when an event is fed is when it happened.
    """

    facts: Facts
    now: Callable[[], float]
    phase: Phase = Phase.RECEIVED
    served: Served | None = None
    """What the request is being served as now (the asked model's route, or a fallback's)."""
    workload: int | None = None
    permitted: bool = False
    gone: str | None = None
    exhausted: Exhausted | None = None
    node: str | None = None
    """The node whose answer was committed."""

    def feed(self, event: Event) -> Step:
        """Take ``event``; the step it leads to (see :data:`TRANSITIONS`)."""
        handler = TRANSITIONS.get((self.phase, type(event)))
        if handler is None:
            raise IllegalCall(f"{type(event).__name__} in phase {self.phase.value}")
        return handler(self, event)

    @property
    def gated(self) -> bool:
        """Whether the answer commits on its first body byte (inference, §6.2)."""
        served = self.served
        return served is not None and served.route.plan.gated

    def finish(
        self,
        status: int | None,
        *,
        node_id: str | None = None,
        error: str | None = None,
        answer: Rejection | Cut | None = None,
        workload: WorkloadEnd | None = None,
        warm: bool = False,
    ) -> Finish:
        """Done: the one record, and what is left to do."""
        self.phase = Phase.DONE
        if self.workload is None:
            workload = None
        record = self.facts.record(self.now(), status, node_id, error)
        return Finish(record, answer, workload, warm)

    def refuse(self, refused: Rejection, workload: WorkloadEnd | None = None) -> Finish:
        """Done with ``refused`` to write."""
        return self.finish(refused.status, error=refused.code, answer=refused, workload=workload)


Handler = Callable[[Exchange, Any], Step]


def _begun(ex: Exchange, event: Begun) -> Step:
    if event.stage is Stage.FORWARD:
        return _READ_BODY
    ex.phase = Phase.ANSWERING
    return Answer(event.stage)


def _body_read(ex: Exchange, event: BodyRead) -> Step:
    parsed = event.result
    if isinstance(parsed, Rejection):
        return ex.refuse(parsed)
    if parsed.stage is not Stage.FORWARD:
        ex.phase = Phase.ANSWERING
        return Answer(parsed.stage, parsed.inbound, parsed.work)
    return Route(parsed.inbound)


def _routed(ex: Exchange, event: Routed) -> Step:
    result = event.result
    if isinstance(result, Rejection):
        return ex.refuse(result)
    if result is None:  # every owner failed and no fallback is left (docs/behaviour.md §6.1)
        refused = _exhausted_rejection(ex)
        return ex.finish(refused.status, error=refused.message, answer=refused)
    ex.served = result
    facts = ex.facts
    facts.context_fit = result.route.context_fit
    if result.fallback_from is not None:
        facts.fallback_from = result.fallback_from
    if not ex.permitted:  # every request that reaches a node counts once (§12.1)
        return _PERMIT
    return Admit(result)


def _permit(ex: Exchange, event: Permitted) -> Step:
    if event.refused is not None:
        return ex.refuse(event.refused)
    ex.permitted = True
    assert ex.served is not None
    return Admit(ex.served)


_QUEUE_FULL = Rejection(
    503,
    "queue-full",
    "every node is busy and the queue is full",
    ((b"Retry-After", b"%d" % RETRY_AFTER_SECONDS),),
)


def _admitted(ex: Exchange, event: Admitted) -> Step:
    ticket = event.ticket
    if isinstance(ticket, QueueFull):
        return ex.refuse(_QUEUE_FULL)
    ex.workload = event.workload_id
    if event.workload_id is not None:
        ex.facts.workload_id = event.workload_id
    assert ex.served is not None
    if isinstance(ticket, Waiter):
        ex.phase = Phase.QUEUED
        return Wait(ticket)
    return Try(ex.served, ticket)


def _waited(ex: Exchange, event: Waited) -> Step:
    ex.facts.queued_ms = event.queued_ms
    result = event.result
    assert ex.served is not None
    if isinstance(result, Slot):
        return Try(ex.served, result)
    if isinstance(result, Served):  # a fallback took it after fallback_after (§16.2)
        ex.phase = Phase.RECEIVED
        ex.served = result
        if result.fallback_from is not None:
            ex.facts.fallback_from = result.fallback_from
        reason = "served by a fallback after waiting fallback_after"
        return Admit(result, WorkloadEnd(Ending.CANCEL, reason))
    if isinstance(result, QueueTimeout):
        why = f"queue timeout: {result}"
        retry = ((b"Retry-After", b"%d" % RETRY_AFTER_SECONDS),)
        refused = Rejection(503, "queue-timeout", why, retry)
        return ex.refuse(refused, WorkloadEnd(Ending.FAIL, why))
    reason = result
    ending = WorkloadEnd(Ending.CANCEL, reason)
    return ex.finish(499, error=reason, answer=Cut(), workload=ending)


def _attempt_started(ex: Exchange, event: AttemptStarted) -> Step:
    ex.phase = Phase.WAITING_HEADERS
    now = ex.now()
    ex.facts.attempts.start(event.node_id, now)
    ex.facts.dispatched_at = now
    return None


def _headers(ex: Exchange, event: HeadersArrived) -> Step:
    if ex.gated:
        ex.phase = Phase.READING_PROMPT
    return None


def _attempt_ended(ex: Exchange, event: AttemptEnded) -> Step:
    ex.facts.attempts.close(event.outcome, ex.now())
    return None


def _busy(ex: Exchange, event: BusyWaited) -> Step:
    ex.facts.attempts.busy_wait()
    return None


def _attempts_ended(ex: Exchange, event: AttemptsEnded) -> Step:
    result = event.result
    served = ex.served
    assert served is not None
    if isinstance(result, Committed):
        ex.phase = Phase.STREAMING
        _committed(ex, served, result, ex.now())
        return Relay(result, served)
    if isinstance(result, ProxyBug):  # the proxy's own, before commit: no node is blamed (§6.1)
        refused = Rejection(500, PROXY_ERROR, "the proxy failed on the answer")
        return ex.refuse(refused, WorkloadEnd(Ending.FAIL, PROXY_ERROR))
    if isinstance(result, Abandoned):
        reason = result.reason
        ending = WorkloadEnd(Ending.CANCEL, reason)
        return ex.finish(499, error=reason, answer=Cut(), workload=ending)
    ex.exhausted = result
    ex.phase = Phase.RECEIVED
    return Route(None, WorkloadEnd(Ending.FAIL, result.reason))


def _committed(ex: Exchange, served: Served, result: Committed, at: float) -> None:
    facts, route = ex.facts, served.route
    wire = result.wire
    if route.label and wire is not None:
        facts.model, facts.model_local = route.label, wire.local_model
        facts.translated = wire.translated
    if facts.first_byte_at is None:
        facts.first_byte_at = at
    first = route.candidates[0].id if route.candidates else None
    if served.fallback_from is not None:
        facts.chosen_by = Choice.FALLBACK
    elif result.node.id != first:
        facts.chosen_by = Choice.FAILOVER
    else:
        facts.chosen_by = route.chosen
    ex.node = result.node.id


def _relayed(ex: Exchange, event: Relayed) -> Step:
    outcome = event.outcome
    served = ex.served
    assert served is not None
    facts = ex.facts
    usage = event.usage
    if usage is not None:
        _measured(facts, usage, event.first_token_at)
    if event.predicted is not None:
        facts.predicted_ms, facts.measured_ms = event.predicted
    node_id = ex.node
    route = served.route
    facts.warm_node = route.warm
    facts.cache_affinity = route.warm is not None and node_id == route.warm
    warm = (
        outcome.end is RelayEnd.FINISHED
        and outcome.status == 200
        and (route.key is not None or route.session is not None)
        and (outcome.terminal_seen or not outcome.streaming)
    )
    workload = _relay_ending(outcome, event.gone or ex.gone)
    return ex.finish(
        outcome.status, node_id=node_id, error=outcome.error, workload=workload, warm=warm
    )


def _relay_ending(outcome: RelayOutcome, gone: str | None) -> WorkloadEnd:
    """How the workload ends after its relay (docs/behaviour.md §7)."""
    ok = 200 <= outcome.status < 300
    if outcome.end is RelayEnd.FINISHED:
        if ok:
            return _COMPLETE
        return WorkloadEnd(Ending.FAIL, f"upstream answered {outcome.status}")
    if outcome.end is RelayEnd.TRUNCATED:
        return WorkloadEnd(Ending.FAIL, outcome.error or "upstream dropped mid-stream")
    if outcome.complete and ok:
        return _COMPLETE
    return WorkloadEnd(Ending.CANCEL, gone or "cancelled")


def _measured(facts: Facts, usage: Usage, first_token_at: float | None) -> None:
    """The engine's counts (its cached ones too), the time to first token and the rate of §12.2
    and §12.3.

    An assembled answer's first token is when its stream began (``first_token_at``), not when the
    whole answer was relayed."""
    facts.prompt_tokens = usage.prompt_tokens
    facts.completion_tokens = usage.completion_tokens
    facts.cached_tokens = usage.cached_tokens
    first = first_token_at if first_token_at is not None else usage.first_content_at
    if first is not None and facts.dispatched_at is not None:
        facts.ttft_ms = max(0, round((first - facts.dispatched_at) * 1000))
    rate = usage.engine_rate
    paced = usage.paced or first_token_at is not None  # a stream, or one assembled (§6.5)
    tokens, last = usage.completion_tokens, usage.last_at
    if rate is None and paced and tokens and first is not None and last is not None:
        rate = tokens / (last - first) if last > first else None
    facts.tokens_per_s = None if rate is None else round(rate, 2)


def _answered(ex: Exchange, event: Answered) -> Step:
    ended = event.ended
    if isinstance(ended, Rejection):
        return ex.refuse(ended)
    facts = ex.facts
    for attempt in ended.attempts:
        facts.attempts.closed.append(attempt)
    facts.fan_out = ended.fan_out
    if ended.first_byte_at is not None:
        facts.first_byte_at = ended.first_byte_at
    return ex.finish(ended.status, node_id=ended.node_id, error=ended.error)


def _client_gone(ex: Exchange, event: ClientGone) -> Step:
    if ex.gone is None:
        ex.gone = event.reason
    return Stop(ex.gone)


def _exhausted_rejection(ex: Exchange) -> Rejection:
    """Every owner failed and no fallback took the request: 502, or 504 after the opt-in
    first-body timeout (docs/behaviour.md §6.1)."""
    exhausted = ex.exhausted
    if exhausted is None:
        return Rejection(502, "upstream-error", "upstream error: no candidate answered")
    code = _UPSTREAM.get(exhausted.status, "upstream-error")
    return Rejection(exhausted.status, code, exhausted.reason)


_ROUTING = Phase.RECEIVED
_ATTEMPTING = (Phase.WAITING_HEADERS, Phase.READING_PROMPT)
_TRYING = (Phase.RECEIVED, Phase.QUEUED, *_ATTEMPTING)
"""Where the attempts may start (from the route or the queue) and end (before any attempt when
the caller left first)."""
_LIVE = (
    Phase.RECEIVED,
    Phase.ANSWERING,
    Phase.QUEUED,
    Phase.WAITING_HEADERS,
    Phase.READING_PROMPT,
    Phase.STREAMING,
)

TRANSITIONS: dict[tuple[Phase, type[Any]], Handler] = {
    (_ROUTING, Begun): _begun,
    (_ROUTING, BodyRead): _body_read,
    (_ROUTING, Routed): _routed,
    (_ROUTING, Permitted): _permit,
    (_ROUTING, Admitted): _admitted,
    (Phase.QUEUED, Waited): _waited,
    **{(phase, AttemptStarted): _attempt_started for phase in _TRYING},
    **{(phase, HeadersArrived): _headers for phase in _ATTEMPTING},
    **{(phase, AttemptEnded): _attempt_ended for phase in _ATTEMPTING},
    **{(phase, BusyWaited): _busy for phase in _ATTEMPTING},
    **{(phase, AttemptsEnded): _attempts_ended for phase in _TRYING},
    (Phase.STREAMING, Relayed): _relayed,
    (Phase.ANSWERING, Answered): _answered,
    **{(phase, ClientGone): _client_gone for phase in _LIVE},
}
"""Every legal move: (phase, event) → what it does. Anything else is an
:class:`~nvpair_tw.core.IllegalCall`."""
