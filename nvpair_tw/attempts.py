# -*- test-case-name: tests.test_attempts -*-
"""The candidate loop: one pass over the ordered nodes, the outcome table of SPEC §6.1, the commit point.

Each node is tried at most once with the same replayed body. A stall (header deadline, or an enabled
first-body timeout) cools the node; fast failures and the caller's departure never do. Inference commits on
the first body byte (or a clean empty end), other routes on response headers. Nothing reaches the client
before :class:`Committed` is returned; after it this module is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attrs import define, frozen
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.stalls import IStallTracker
from nvpair_tw.upstream import (
    TRANSPORT_FAILURES,
    BodyGate,
    Discard,
    FirstBodyTimeout,
    HeaderTimeout,
    UpstreamClient,
    describe_failure,
    is_cancellation,
    node_url,
)
from nvpair_tw.workloads import AttemptOutcome, status_outcome

__all__ = [
    "Abandoned",
    "AttemptHooks",
    "AttemptPlan",
    "CallerState",
    "Committed",
    "Exhausted",
    "Result",
    "run_attempts",
]

log = LevelledLogger()


@frozen
class AttemptPlan:
    """What every attempt of one request sends, and how it may commit."""

    method: bytes
    target: bytes
    headers: Headers
    body: bytes
    inference: bool
    gated: bool
    header_timeout: float
    first_body_timeout: float


@frozen
class Committed:
    """The client's answer: from ``node``; ``gate`` is None when the body has not been delivered yet."""

    node: Node
    response: IResponse
    gate: BodyGate | None
    first: bytes


@frozen
class Exhausted:
    """Every candidate failed in transport; the client gets a JSON error."""

    status: int
    reason: str


@frozen
class Abandoned:
    """The caller went away (or the workload was cancelled); nothing more is sent."""

    reason: str


Result = Committed | Exhausted | Abandoned


@define
class CallerState:
    """Whether the caller is still there, and what to abort when it leaves."""

    gone: str | None = None
    attempt: Deferred[IResponse] | None = None
    gate: BodyGate | None = None
    on_gone: Callable[[str], None] | None = None

    def abandon(self, reason: str) -> None:
        """Stop whatever is in flight; the first reason wins."""
        if self.gone is not None:
            return
        self.gone = reason
        if self.attempt is not None:
            # ``called`` is already true while the agent's Deferred waits on a chained one;
            # cancel() reaches the chained Deferred and is a no-op once the attempt has ended.
            self.attempt.cancel()
        if self.gate is not None:
            self.gate.stop()
        if self.on_gone is not None:
            self.on_gone(reason)


class AttemptHooks:
    """What the loop reports as it goes (the request record, the workload, the reservation)."""

    def attempt_started(self, node: Node) -> None:
        """An attempt is about to be sent to ``node``."""

    def attempt_ended(self, node: Node, outcome: str) -> None:
        """The attempt to ``node`` ended with ``outcome`` (SPEC §7 outcome names)."""


def retryable_status(code: int, inference: bool) -> bool:
    """408, 429, any 5xx, and 404 on inference routes (stale inventory) move on."""
    return code in (408, 429) or code >= 500 or (inference and code == 404)


async def run_attempts(
    plan: AttemptPlan,
    candidates: Sequence[Node],
    client: UpstreamClient,
    clock: IReactorTime,
    stalls: IStallTracker,
    caller: CallerState,
    hooks: AttemptHooks,
) -> Result:
    """Walk the candidates once; return the committed answer, the final error, or abandonment."""
    last: Failure | None = None
    for index, node in enumerate(candidates):
        if caller.gone is not None:
            return Abandoned(caller.gone)
        is_last = index == len(candidates) - 1
        hooks.attempt_started(node)
        attempt = client.request(
            plan.method,
            node_url(node.url, plan.target),
            plan.headers,
            plan.body,
            plan.header_timeout,
        )
        caller.attempt = attempt
        try:
            response = await attempt
        except Exception:
            failure = Failure()
            caller.attempt = None
            if caller.gone is not None or is_cancellation(failure):
                hooks.attempt_ended(node, AttemptOutcome.CANCELLED.value)
                return Abandoned(caller.gone or "cancelled")
            if not failure.check(*TRANSPORT_FAILURES):
                raise
            last = failure
            if failure.check(HeaderTimeout):
                stalls.cool(node.id, describe_failure(failure))
                hooks.attempt_ended(node, AttemptOutcome.STALL.value)
            elif failure.check(ConnectError, DNSLookupError):
                hooks.attempt_ended(node, AttemptOutcome.CONNECT_ERROR.value)
            else:
                hooks.attempt_ended(node, AttemptOutcome.DROPPED.value)
            log.info("attempt to {node} failed: {why}", node=node.id, why=describe_failure(failure))
            continue
        caller.attempt = None

        if retryable_status(response.code, plan.inference) and not is_last:
            response.deliverBody(Discard())
            hooks.attempt_ended(node, status_outcome(response.code))
            last = None
            continue

        if not plan.gated:
            hooks.attempt_ended(node, AttemptOutcome.COMMITTED.value)
            if 200 <= response.code < 300:
                stalls.clear(node.id)
            return Committed(node, response, None, b"")

        gate = BodyGate(clock, plan.first_body_timeout)
        caller.gate = gate
        response.deliverBody(gate)
        try:
            first = await gate.first
        except Exception:
            failure = Failure()
            caller.gate = None
            if caller.gone is not None:
                hooks.attempt_ended(node, AttemptOutcome.CANCELLED.value)
                return Abandoned(caller.gone)
            last = failure
            if failure.check(FirstBodyTimeout):
                stalls.cool(node.id, describe_failure(failure))
                hooks.attempt_ended(node, AttemptOutcome.FIRST_BODY_TIMEOUT.value)
            else:
                hooks.attempt_ended(node, AttemptOutcome.DROPPED.value)
            log.info(
                "attempt to {node} failed before the first body byte: {why}",
                node=node.id,
                why=describe_failure(failure),
            )
            continue
        if caller.gone is not None:
            gate.stop()
            hooks.attempt_ended(node, AttemptOutcome.CANCELLED.value)
            return Abandoned(caller.gone)
        hooks.attempt_ended(node, AttemptOutcome.COMMITTED.value)
        if 200 <= response.code < 300:
            stalls.clear(node.id)
        return Committed(node, response, gate, first)

    if last is not None and last.check(FirstBodyTimeout):
        return Exhausted(504, f"upstream error: {describe_failure(last)}")
    reason = describe_failure(last) if last is not None else "no candidate answered"
    return Exhausted(502, f"upstream error: {reason}")
