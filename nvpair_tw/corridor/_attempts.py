# -*- test-case-name: tests.corridor.test_attempts -*-
"""The candidate loop: one pass over the ordered nodes, the outcome table, the commit point.

See docs/behaviour.md §6.1 (the outcome table) and §6.2 (the commit point). Each node is tried at
most once with the same replayed body. A stall (header deadline, or an enabled first-body timeout)
cools the node; fast failures and the caller's departure never do. Inference commits on the first
body byte (or a clean empty end), other routes on response headers. Nothing reaches the client
before :class:`Committed` is returned, and every :class:`Committed` carries the gate that holds the
body, so the relay is the only stage that writes to the client.

Busy is not stalled (§6.4): with a :class:`~nvpair_tw.selection._progress.ProgressBook`, every inference
body chunk is recorded per node, and a header deadline that expires on a node that delivered
bytes to another attempt within the last period is re-armed (a busy wait, reported through
:meth:`AttemptObserver.busy_wait`) instead of stalling, up to ``AttemptPlan.busy_max_wait``.
A node known to be cold gets ``AttemptPlan.first_extra[node]`` added to its first deadline.

A node found to lack the route (§17.3): a native attempt whose wire may learn it
(:attr:`~nvpair_tw.corridor._dialect.Wire.lacking`) and whose node answers 404 has the 404's body
read first (:func:`~nvpair_tw.corridor._peek.peek`, within the header deadline); when it says the
route itself is missing (``dialects.route_missing``) the node's gap is learnt and the same node is
asked again at once with the translation, as one more attempt, before anything reaches the client.
Any other 404 goes on as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum

from attrs import evolve, field, frozen
from twisted.internet.error import ConnectError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair_tw.assembly import Assembly, AssemblyGate
from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._dialect import Sends, TranscodedResponse, Wire
from nvpair_tw.corridor._peek import peek
from nvpair_tw.dialects import route_missing
from nvpair_tw.events import AttemptOutcome, Outcome, StatusOutcome
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.selection import Booking, IStallTracker, ProgressBook
from nvpair_tw.upstream import (
    TRANSPORT_FAILURES,
    BodyGate,
    BusyWait,
    Discard,
    FirstBodyTimeout,
    HeaderTimeout,
    UpstreamClient,
    describe_failure,
    is_cancellation,
    node_url,
)

__all__ = [
    "Abandoned",
    "AttemptObserver",
    "AttemptPlan",
    "CallerState",
    "Committed",
    "Exhausted",
    "LastStatus",
    "Result",
    "classify_failure",
    "node_headers",
    "retryable_status",
    "run_attempts",
]

log = LevelledLogger(namespace=__name__)


class LastStatus(Enum):
    """What a status that moves on (§6.1) is when the last candidate answers it."""

    ANSWERS = "answers"
    """The client's answer, whatever its status (docs/behaviour.md §6.1)."""
    FAILS = "fails"
    """A failure like any candidate's: a fallback model may still serve (§16.2)."""


class _OnStatus(Enum):
    """What one attempt does with a status that moves on (§6.1)."""

    RETRY = "retry"
    """Give it up: the next candidate is tried."""
    ANSWER = "answer"
    """Commit it: the last candidate, when its status is the client's answer (LastStatus.ANSWERS)."""


@frozen
class AttemptPlan:
    """How every attempt of one request runs and may commit; ``sends`` is what each sends."""

    headers: Headers
    sends: Sends
    inference: bool
    gated: bool
    header_timeout: float
    first_body_timeout: float
    first_extra: Mapping[str, float] = field(factory=dict)
    """Per node id: seconds added to the first header deadline (a cold-load allowance)."""
    busy_max_wait: float = 0.0
    """How much a header wait may be extended while the node shows progress (0: never)."""
    last_status: LastStatus = LastStatus.ANSWERS
    """Whether the last candidate's retryable status is the answer, or a failure a fallback
    model may still take (docs/behaviour.md §16.2)."""

    def wire(self, node: Node) -> Wire:
        """What the attempt to ``node`` sends (its wire's ``assembly``, when set, folds a 2xx
        stream into one answer that commits only when whole, docs/behaviour.md §6.5)."""
        return self.sends.wire(node)


@frozen
class Committed:
    """The client's answer: ``response`` from ``node``, its body held by ``gate``.

    For a gated commit ``first`` is the first body chunk (``b""`` for a clean empty end) and the gate
    holds the rest; for a commit on headers the gate has seen nothing yet and ``first`` is ``b""``.
    For an assembled answer ``first`` is the whole answer, ``response`` its client-facing status
    and headers, and the gate holds nothing more.
    """

    node: Node
    response: IResponse
    gate: BodyGate | AssemblyGate
    first: bytes
    wire: Wire | None = None
    """What the committed attempt sent (its dialect and the node's name for the model)."""


@frozen
class Exhausted:
    """Every candidate failed; the client gets a JSON error with ``status``."""

    status: int
    reason: str


@frozen
class Abandoned:
    """The caller went away (or the workload was cancelled); nothing more is sent."""

    reason: str


Result = Committed | Exhausted | Abandoned


class AttemptObserver:
    """What the loop reports as it goes (the facade feeds the record and the workload from it)."""

    def attempt_started(self, node: Node) -> None:
        """An attempt is about to be sent to ``node``."""

    def headers_arrived(self, node: Node) -> None:
        """``node`` answered the attempt's head; no body byte yet."""

    def attempt_ended(self, node: Node, outcome: Outcome) -> None:
        """The attempt to ``node`` ended with ``outcome`` (docs/behaviour.md §7)."""

    def busy_wait(self, node: Node) -> None:
        """The attempt to ``node`` waits one more period: the node shows progress elsewhere."""


def retryable_status(code: int, inference: bool) -> bool:
    """408, 429, any 5xx, and 404 on inference routes (stale inventory) move on."""
    return code in (408, 429) or code >= 500 or (inference and code == 404)


def node_headers(headers: Headers, node: Node) -> Headers:
    """The plan's headers as sent to ``node``: its own credential replaces the client's (docs/behaviour.md §3)."""
    authorization = node.authorization
    if authorization is None:
        return headers
    out = headers.copy()
    out.setRawHeaders(b"authorization", [authorization])
    return out


def classify_failure(failure: Failure, caller_gone: str | None) -> AttemptOutcome:
    """The outcome of an attempt that failed before commit (docs/behaviour.md §6.1).

    The caller's departure (or a cancellation) wins over whatever the transport reported. A failure
    that is not a transport failure is a bug and is raised again.
    """
    if caller_gone is not None or is_cancellation(failure):
        return AttemptOutcome.CANCELLED
    if failure.check(HeaderTimeout):
        return AttemptOutcome.STALL
    if failure.check(FirstBodyTimeout):
        return AttemptOutcome.FIRST_BODY_TIMEOUT
    if failure.check(ConnectError, DNSLookupError):
        return AttemptOutcome.CONNECT_ERROR
    if failure.check(*TRANSPORT_FAILURES):
        return AttemptOutcome.DROPPED
    failure.raiseException()
    raise AssertionError("unreachable")  # pragma: no cover


@frozen
class _Watch:
    """One attempt's links to what watches it: the progress record's busy-wait rule and
    per-chunk touch (§6.4), and the observer told when the node answers the head."""

    busy: BusyWait | None
    touch: Callable[[], None] | None
    heard: Callable[[], None]


def _watch_for(
    plan: AttemptPlan, node: Node, book: ProgressBook | None, observer: AttemptObserver
) -> _Watch:
    """Busy waits for every attempt (when enabled); only inference bodies count as progress."""

    def heard() -> None:
        observer.headers_arrived(node)

    if book is None:
        return _Watch(None, None, heard)
    busy: BusyWait | None = None
    if plan.busy_max_wait > 0:

        def working() -> bool:
            return book.delivered_within(node.id, plan.header_timeout)

        def waited() -> None:
            book.busy_waited(node.id)
            observer.busy_wait(node)
            log.debug("{node} shows progress elsewhere: header wait extended", node=node.id)

        busy = BusyWait(working, plan.busy_max_wait, waited)
    return _Watch(busy, book.toucher(node.id) if plan.inference else None, heard)


@frozen
class _Failed:
    """One attempt failed before commit."""

    outcome: AttemptOutcome
    failure: Failure | None


@frozen
class _Lacks:
    """One attempt's node answered that it lacks the route (§17.3); it was learnt, and the node
    is asked again with the translation."""

    @property
    def outcome(self) -> StatusOutcome:
        """The attempt's outcome: ``status-404``."""
        return StatusOutcome(404)


@frozen
class _Retry:
    """One attempt answered a status that moves on (docs/behaviour.md §6.1) and was not the last: the
    next candidate is tried."""

    code: int

    @property
    def outcome(self) -> StatusOutcome:
        """The attempt's outcome, ``status-<code>``."""
        return StatusOutcome(self.code)


async def _attempt(
    plan: AttemptPlan,
    node: Node,
    client: UpstreamClient,
    clock: IReactorTime,
    caller: CallerState,
    on_status: _OnStatus,
    watch: _Watch,
) -> Committed | _Failed | _Retry | _Lacks:
    """One node: a commit, a failure, or a retryable status to retry past."""
    wire = plan.wire(node)
    attempt = client.request(
        wire.method,
        node_url(node.url, wire.target),
        node_headers(plan.headers, node),
        wire.body,
        plan.header_timeout,
        first_extra=plan.first_extra.get(node.id, 0.0),
        busy=watch.busy,
    )
    caller.track(attempt.cancel)
    try:
        response = await attempt
    except Exception:
        failure = Failure()
        caller.track(None)
        return _Failed(classify_failure(failure, caller.gone), failure)
    if response.code == 404 and wire.lacking is not None:
        body, response = await peek(response, clock, plan.header_timeout, caller)
        if caller.gone is not None:
            return _Failed(AttemptOutcome.CANCELLED, None)
        if body is not None and route_missing(body):
            wire.lacking(node)
            return _Lacks()
    if retryable_status(response.code, plan.inference) and on_status is _OnStatus.RETRY:
        caller.track(None)
        response.deliverBody(Discard())
        return _Retry(response.code)
    watch.heard()
    if wire.answer is not None:
        content_type = response.headers.getRawHeaders(b"content-type", [None])[0]
        response = TranscodedResponse(response, wire.answer(response.code, content_type))
    if wire.assembly is not None and _assembles(wire.assembly, response):
        step = await _assembled(
            plan, wire.assembly, node, response, clock, caller, on_status, watch.touch
        )
        return evolve(step, wire=wire) if isinstance(step, Committed) else step
    gate = BodyGate(clock, plan.first_body_timeout if plan.gated else 0.0, watch.touch)
    caller.track(gate.stop)
    response.deliverBody(gate)
    if not plan.gated:
        return Committed(node, response, gate, b"", wire)
    first = await _first(gate, caller)
    return first if isinstance(first, _Failed) else Committed(node, response, gate, first, wire)


async def _first(gate: BodyGate | AssemblyGate, caller: CallerState) -> bytes | _Failed:
    """The gate's first bytes (the whole answer for an assembly gate), or why the attempt failed
    before them (the caller's departure wins)."""
    try:
        first = await gate.first
    except Exception:
        failure = Failure()
        caller.track(None)
        return _Failed(classify_failure(failure, caller.gone), failure)
    if caller.gone is not None:
        gate.stop()
        return _Failed(AttemptOutcome.CANCELLED, None)
    return first


def _assembles(assembly: Assembly, response: IResponse) -> bool:
    """A 2xx stream of the route's kind is assembled; anything else is relayed as it is."""
    content_type = response.headers.getRawHeaders(b"content-type", [b""])[0]
    return 200 <= response.code < 300 and assembly.accepts(content_type)


async def _assembled(
    plan: AttemptPlan,
    assembly: Assembly,
    node: Node,
    response: IResponse,
    clock: IReactorTime,
    caller: CallerState,
    on_status: _OnStatus,
    on_bytes: Callable[[], None] | None,
) -> Committed | _Failed | _Retry:
    """An assembled attempt: commits with the whole answer, or fails like a pre-commit drop."""
    timeout = plan.first_body_timeout if plan.gated else 0.0
    gate = AssemblyGate(clock, timeout, assembly.dialect, assembly.limit, on_bytes)
    caller.track(gate.stop)
    response.deliverBody(gate)
    answer = await _first(gate, caller)
    if isinstance(answer, _Failed):
        return answer
    whole = gate.response(response)
    if retryable_status(whole.code, plan.inference) and on_status is _OnStatus.RETRY:
        caller.track(None)
        return _Retry(whole.code)
    return Committed(node, whole, gate, answer)


async def run_attempts(
    plan: AttemptPlan,
    candidates: Sequence[Node],
    client: UpstreamClient,
    clock: IReactorTime,
    stalls: IStallTracker,
    caller: CallerState,
    booking: Booking,
    observer: AttemptObserver,
    *,
    progress: ProgressBook | None = None,
) -> Result:
    """Walk the candidates once; return the committed answer, the final error, or abandonment.

    With ``progress``, inference body bytes are recorded per node and a silent node that shows
    progress elsewhere is waited for rather than stalled (docs/behaviour.md §6.4).
    """
    last: _Failed | None = None
    for index, node in enumerate(candidates):
        if caller.gone is not None:
            return Abandoned(caller.gone)
        booking.move(node.id)
        on_status = (
            _OnStatus.ANSWER
            if index == len(candidates) - 1 and plan.last_status is LastStatus.ANSWERS
            else _OnStatus.RETRY
        )
        observer.attempt_started(node)
        watch = _watch_for(plan, node, progress, observer)
        step = await _attempt(plan, node, client, clock, caller, on_status, watch)
        if isinstance(step, _Lacks):  # learnt: the same node once more, translated (§17.3)
            observer.attempt_ended(node, step.outcome)
            if caller.gone is not None:
                return Abandoned(caller.gone)
            observer.attempt_started(node)
            watch = _watch_for(plan, node, progress, observer)
            step = await _attempt(plan, node, client, clock, caller, on_status, watch)
        if isinstance(step, Committed):
            observer.attempt_ended(node, AttemptOutcome.COMMITTED)
            if 200 <= step.response.code < 300:
                stalls.clear(node.id)
            return step
        if isinstance(step, _Retry | _Lacks):  # (a translated wire learns nothing: never _Lacks)
            observer.attempt_ended(node, step.outcome)
            last = None
            continue
        observer.attempt_ended(node, step.outcome)
        if step.outcome is AttemptOutcome.CANCELLED or step.failure is None:
            return Abandoned(caller.gone or "cancelled")
        why = describe_failure(step.failure)
        if step.outcome.stalled:
            stalls.cool(node.id, why)
        log.info("attempt to {node} failed: {why}", node=node.id, why=why)
        last = step
    return _exhausted(last)


def _exhausted(last: _Failed | None) -> Exhausted:
    """Every candidate failed: 504 after an opt-in first-body timeout, else 502, naming the last."""
    if last is None or last.failure is None:
        return Exhausted(502, "upstream error: no candidate answered")
    status = 504 if last.outcome is AttemptOutcome.FIRST_BODY_TIMEOUT else 502
    return Exhausted(status, f"upstream error: {describe_failure(last.failure)}")
