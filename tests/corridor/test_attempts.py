"""Failover past stalled nodes over real loopback sockets (the stall issue's acceptance checks).

Each scenario runs three times in a row to flush out flakiness. The header timeout is shortened; the
assertions never time the proxy: "does not wait" is shown by which nodes saw the request.
The last section drives ``run_attempts`` itself on a ``task.Clock`` with in-memory engines.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
import treq
from attrs import evolve
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.error import (
    ConnectionClosed,
    ConnectionLost,
    ConnectionRefusedError,
    DNSLookupError,
    TCPTimedOutError,
)
from twisted.internet.interfaces import IProtocol, IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgent, IBodyProducer, IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from nvpair_tw.assembly import Assembly, AssemblyGate
from nvpair_tw.assembly._frames import Dialect
from nvpair_tw.assembly._gate import ANSWER_CONTENT_TYPE
from nvpair_tw.core._resolved import Settings, resolve_first_body_timeout
from nvpair_tw.corridor._attempts import (
    Abandoned,
    AttemptObserver,
    AttemptPlan,
    CallerState,
    Committed,
    Exhausted,
    Result,
    classify_failure,
    retryable_status,
    run_attempts,
)
from nvpair_tw.corridor._dialect import AsIs
from nvpair_tw.events import AttemptOutcome, Outcome
from nvpair_tw.logs import current_level, set_level
from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._progress import ProgressBook
from nvpair_tw.selection._reservations import Booking, ReservationLedger
from nvpair_tw.selection._stalls import Cooldown, NeverCools, StallTracker
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    ProxyCluster,
    SimulatedEngine,
    always,
    http_client,
    start_engine,
    start_proxy,
)
from nvpair_tw.upstream._attempt import (
    BodyGate,
    FirstBodyTimeout,
    GateState,
    HeaderTimeout,
    ReplayBodyProducer,
    UpstreamClient,
)
from tests.helpers import eventually

ROUNDS = [pytest.param(i, id=f"round{i}") for i in range(3)]
MODEL = ("llama3:latest",)
HEADER_TIMEOUT = 0.4


def body(n: int) -> bytes:
    """A distinct request body per request (so a truncated or mixed-up replay shows)."""
    return json.dumps(
        {
            "model": "llama3",
            "stream": True,
            "messages": [{"role": "user", "content": f"q{n} " * 500}],
        }
    ).encode()


@pytest.fixture
def scenario(clusters: Clusters) -> ProxyCluster:
    """Engines behind a proxy, stopped (proxy, then engines) after the test."""
    return clusters(ProxyCluster)


def healthy(reactor: Any, **kw: Any) -> SimulatedEngine:
    return SimulatedEngine(reactor, MODEL, always(Behaviour.HEALTHY), **kw)


def broken(reactor: Any, behaviour: Behaviour, **kw: Any) -> SimulatedEngine:
    return SimulatedEngine(reactor, MODEL, always(behaviour), **kw)


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_frozen_node_costs_one_deadline_then_is_skipped(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """Request 1 waits out one header deadline and is served by the healthy node; request 2 goes
    straight to the healthy node; the healthy node gets the complete original body both times."""
    await scenario.start(
        [broken(reactor, Behaviour.FROZEN), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    first, second = body(1), body(2)
    code1, _, response1 = await scenario.post(first)
    code2, _, response2 = await scenario.post(second)
    assert (code1, code2) == (200, 200)
    assert response1.headers.getRawHeaders(b"x-nvpair-node") == [b"n1"]
    assert response2.headers.getRawHeaders(b"x-nvpair-node") == [b"n1"]
    assert scenario.received(0) == [first]
    assert scenario.received(1) == [first, second]
    records = scenario.named("proxy/request")
    assert [[a["outcome"] for a in r["attempts"]] for r in records] == [
        ["stall", "committed"],
        ["committed"],
    ]
    assert [c["node_id"] for c in scenario.named("node/cooldown")] == ["n0"]


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_without_cooldown_the_frozen_node_is_paid_twice(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """Negative control: a tracker that never cools makes request 2 wait on the frozen node again."""
    await scenario.start(
        [broken(reactor, Behaviour.FROZEN), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
        stall_tracker=lambda engine, announce: NeverCools(),
    )
    await scenario.post(body(1))
    await scenario.post(body(2))
    assert len(scenario.received(0)) == 2
    records = scenario.named("proxy/request")
    assert [[a["outcome"] for a in r["attempts"]] for r in records] == [
        ["stall", "committed"],
        ["stall", "committed"],
    ]


@pytest.mark.parametrize("how", ["flag", "environment"])
@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_headers_without_body_opted_in_costs_one_wait(
    reactor: Any, scenario: ProxyCluster, round_: int, how: str
) -> None:
    """With the first-body timeout opted in (flag or environment), a node that sends headers and
    then nothing is abandoned once and skipped afterwards."""
    environ = {"NVPAIR_PROXY_FIRST_BODY_TIMEOUT": "300ms"} if how == "environment" else {}
    resolved = resolve_first_body_timeout("300ms" if how == "flag" else None, environ)
    assert resolved.seconds == pytest.approx(0.3)
    await scenario.start(
        [broken(reactor, Behaviour.HEADERS_ONLY), healthy(reactor)],
        Settings(response_header_timeout=2.0, first_body_timeout=resolved.seconds),
    )
    first, second = body(1), body(2)
    assert (await scenario.post(first))[0] == 200
    assert (await scenario.post(second))[0] == 200
    assert scenario.received(0) == [first]
    assert scenario.received(1) == [first, second]
    outcomes = [[a["outcome"] for a in r["attempts"]] for r in scenario.named("proxy/request")]
    assert outcomes == [["first-body-timeout", "committed"], ["committed"]]


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_default_first_body_wait_is_unbounded(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """A node silent after its headers for three header timeouts still completes: no failover,
    no cooldown, and the second node never sees the request."""
    await scenario.start(
        [
            broken(reactor, Behaviour.SLOW_BODY, body_delay=3 * HEADER_TIMEOUT),
            healthy(reactor),
        ],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    code, content, response = await scenario.post(body(1))
    assert code == 200 and content.endswith(b'"done_reason": "stop"}\n')
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n0"]
    assert scenario.received(1) == []
    assert scenario.named("node/cooldown") == []


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_drop_before_first_body_byte_fails_over(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """Headers then a closed connection is not a commit: the next node serves, with the timer off."""
    await scenario.start(
        [broken(reactor, Behaviour.DROP_AFTER_HEADERS), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    code, content, response = await scenario.post(body(1))
    assert code == 200 and b'"done": true' in content
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n1"]
    outcomes = [a["outcome"] for a in scenario.named("proxy/request")[0]["attempts"]]
    assert outcomes == ["dropped", "committed"]
    assert scenario.named("node/cooldown") == []


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_commit_on_headers_breaks_pre_commit_failover(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """Negative control: with the first-body gate replaced by commit-on-headers, the same drop
    reaches the client as a failed answer and the healthy node is never tried."""
    await scenario.start(
        [broken(reactor, Behaviour.DROP_AFTER_HEADERS), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    assert scenario.proxy is not None
    scenario.proxy.runtime.facades["ollama"].first_body_gate = False
    with pytest.raises(ResponseFailed) as raised:  # the truncated answer
        await scenario.post(body(1))
    assert raised.value.reasons[0].check(ConnectionClosed)  # closed or aborted mid-answer
    assert scenario.received(1) == []


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_silent_last_candidate_with_timer_enabled_ends_in_504(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """With the first-body timeout enabled and every node silent after headers, the client gets 504 JSON."""
    await scenario.start(
        [broken(reactor, Behaviour.HEADERS_ONLY), broken(reactor, Behaviour.HEADERS_ONLY)],
        Settings(response_header_timeout=2.0, first_body_timeout=0.2),
    )
    code, content, response = await scenario.post(body(1))
    assert code == 504
    assert json.loads(content)["code"] == "upstream-timeout"
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_running_event_names_serving_node_before_terminal(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """One workload id: started(n0), started(n1), completed(n1), in that order."""
    await scenario.start(
        [broken(reactor, Behaviour.FROZEN), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    await scenario.post(body(1))
    workload = [
        (e.name, e.payload["workload"]["scheduledOn"], e.payload["workload"]["id"])
        for e in scenario.events
        if e.name.startswith("workload:")
    ]
    ident = workload[0][2]
    assert workload == [
        ("workload:started", "n0", ident),
        ("workload:started", "n1", ident),
        ("workload:completed", "n1", ident),
    ]


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_sole_cooling_node_is_still_served(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """A cooling node that is the only candidate is used as is (never excluded)."""
    await scenario.start([healthy(reactor)], Settings(response_header_timeout=HEADER_TIMEOUT))
    assert scenario.proxy is not None
    scenario.proxy.runtime.facades["ollama"].stalls.cool("n0", "test")
    code, _, _ = await scenario.post(body(1))
    assert code == 200
    assert scenario.named("node/cooldown-ended")[0]["why"] == "success"


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_success_restores_a_cooling_node_early(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """All cooling: the order stays as is, and a success from the head ends its cooldown."""
    await scenario.start(
        [healthy(reactor), healthy(reactor)], Settings(response_header_timeout=HEADER_TIMEOUT)
    )
    assert scenario.proxy is not None
    stalls = scenario.proxy.runtime.facades["ollama"].stalls
    stalls.cool("n0", "test")
    stalls.cool("n1", "test")
    code, _, response = await scenario.post(body(1))
    assert code == 200 and response.headers.getRawHeaders(b"x-nvpair-node") == [b"n0"]
    assert stalls.cooling() == frozenset({"n1"})


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_pinned_cooling_node_goes_behind_a_ready_peer(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """A manual pin cannot put a cooling node ahead of a ready one."""
    await scenario.start(
        [healthy(reactor), healthy(reactor)], Settings(response_header_timeout=HEADER_TIMEOUT)
    )
    assert scenario.proxy is not None
    facade = scenario.proxy.runtime.facades["ollama"]
    facade.pin = "n0"
    _, _, response = await scenario.post(body(1))
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n0"]
    facade.stalls.cool("n0", "test")
    _, _, response = await scenario.post(body(2))
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n1"]


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_two_facades_keep_independent_cooldowns(reactor: Any, round_: int) -> None:
    """A stall seen by the ollama facade does not demote the same node on the lmstudio facade."""
    frozen = await start_engine(reactor, broken(reactor, Behaviour.FROZEN))
    good = await start_engine(reactor, healthy(reactor))
    nodes = [Node("n0", frozen.url, MODEL), Node("n1", good.url, MODEL)]
    proxy = await start_proxy(
        reactor,
        {"ollama": nodes, "lmstudio": nodes},
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    try:
        response = await http_client(reactor).post(proxy.url("ollama") + "/api/chat", data=body(1))
        await treq.content(response)
        assert proxy.runtime.facades["ollama"].stalls.cooling() == frozenset({"n0"})
        assert proxy.runtime.facades["lmstudio"].stalls.cooling() == frozenset()
    finally:
        await proxy.stop()
        await frozen.stop()
        await good.stop()


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_caller_leaving_during_header_wait_creates_no_cooldown(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """A client that hangs up while the node is still silent aborts the attempt: no cooldown,
    the workload ends cancelled, the next node is never tried."""
    await scenario.start(
        [broken(reactor, Behaviour.FROZEN), healthy(reactor)],
        Settings(response_header_timeout=5.0),
    )
    assert scenario.proxy is not None
    pending: Deferred[Any] = http_client(reactor).post(
        scenario.proxy.url() + "/api/chat", data=body(1)
    )
    await eventually(reactor, lambda: scenario.received(0), what="the request at n0")
    pending.cancel()
    with pytest.raises(ResponseNeverReceived) as raised:  # the cancelled client request
        await pending
    assert raised.value.reasons[0].check(CancelledError)
    await eventually(reactor, lambda: scenario.named("workload:errored"), what="workload:errored")
    errored = scenario.named("workload:errored")[0]["workload"]
    assert errored["state"] == "cancelled"
    assert scenario.named("node/cooldown") == []
    assert scenario.received(1) == []


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_empty_200_commits_without_trying_the_next_node(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """A valid empty body (Content-Length: 0) is a commit."""
    await scenario.start(
        [broken(reactor, Behaviour.EMPTY_200), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    code, content, response = await scenario.post(body(1))
    assert (code, content) == (200, b"")
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n0"]
    assert scenario.received(1) == []


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_committed_stream_that_dies_is_not_retried(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """After the first body byte, an upstream death aborts the client; no other node sees the request."""
    await scenario.start(
        [broken(reactor, Behaviour.DROP_MID_STREAM, chunks=6), healthy(reactor)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    with pytest.raises(ResponseFailed) as raised:  # the aborted, truncated answer
        await scenario.post(body(1))
    assert raised.value.reasons[0].check(ConnectionClosed)  # closed or aborted mid-answer
    await eventually(reactor, lambda: scenario.named("workload:errored"), what="workload:errored")
    assert scenario.received(1) == []
    assert scenario.named("workload:errored")[0]["workload"]["state"] == "failed"


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_retryable_status_moves_on_and_last_answer_is_relayed(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """A 503 moves on without cooling; when every node answers 503 the last one's answer is the client's."""
    await scenario.start(
        [broken(reactor, Behaviour.STATUS_503), broken(reactor, Behaviour.STATUS_503)],
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    code, content, response = await scenario.post(body(1))
    assert code == 503 and json.loads(content) == {"error": "simulated 503"}
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n1"]
    assert scenario.named("node/cooldown") == []
    outcomes = [a["outcome"] for a in scenario.named("proxy/request")[0]["attempts"]]
    assert outcomes == ["status-503", "committed"]


# --- Deterministic attempt loop: an injected task.Clock and in-memory engines --------------------
#
# ``run_attempts`` over ``UpstreamClient.from_agent(RequestTraversalAgent(engines), clock)``: the
# engines leaf keeps every request open (NOT_DONE_YET) so each test decides when, or whether, a node
# answers; every deadline is on ``clock`` and is moved with ``clock.advance``.

TIMEOUT = 30.0
EPSILON = 2**-10  # exact in binary, so clock sums land on the deadline itself
PAYLOAD = b'{"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}'


class Engines(Resource):
    """Every in-memory node: records ``(request, body)`` by port and leaves the request open."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, list[tuple[Request, bytes]]] = defaultdict(list)

    def render(self, request: Request) -> int:  # type: ignore[override]
        assert request.content is not None
        self.pending[request.getHost().port].append((request, request.content.read()))
        return NOT_DONE_YET


class Hooks(AttemptObserver):
    """Records ``(node id, outcome)`` per ended attempt, and each busy wait's node and time."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.started: list[str] = []
        self.ended: list[tuple[str, str]] = []
        self.busy: list[tuple[str, float]] = []
        self._clock = clock

    def busy_wait(self, node: Node) -> None:
        self.busy.append((node.id, self._clock.seconds() if self._clock is not None else -1.0))

    def attempt_started(self, node: Node) -> None:
        self.started.append(node.id)

    def attempt_ended(self, node: Node, outcome: Outcome) -> None:
        self.ended.append((node.id, outcome.value))


class Loop:
    """One ``run_attempts`` call against two in-memory nodes (ports 1001, 1002) on a task.Clock."""

    def __init__(
        self,
        *,
        gated: bool = False,
        first_body_timeout: float = 0.0,
        inference: bool = True,
        busy_max_wait: float = 0.0,
        first_extra: dict[str, float] | None = None,
        progress: bool = False,
    ) -> None:
        self.clock = Clock()
        self.engines = Engines()
        self.agent = RequestTraversalAgent(self.engines)
        self.client = UpstreamClient.from_agent(self.agent, self.clock)
        self.cooldowns: list[tuple[str, Cooldown | None, str]] = []
        self.stalls = StallTracker(
            self.clock, TIMEOUT, lambda *change: self.cooldowns.append(change)
        )
        self.caller = CallerState()
        self.ledger = ReservationLedger()
        self.booking = Booking.take(self.ledger, "a")
        self.hooks = Hooks(self.clock)
        self.progress = ProgressBook(self.clock) if progress else None
        self.plan = AttemptPlan(
            headers=Headers({b"content-type": [b"application/json"]}),
            sends=AsIs.of(b"POST", b"/api/chat", PAYLOAD),
            inference=inference,
            gated=gated,
            header_timeout=TIMEOUT,
            first_body_timeout=first_body_timeout,
            first_extra=first_extra or {},
            busy_max_wait=busy_max_wait,
        )
        self.nodes = [Node("a", "http://127.0.0.1:1001"), Node("b", "http://127.0.0.1:1002")]

    def run(self) -> Deferred[Result]:
        """Start the loop and deliver the first request to node ``a``."""
        result = Deferred.fromCoroutine(
            run_attempts(
                self.plan,
                self.nodes,
                self.client,
                self.clock,
                self.stalls,
                self.caller,
                self.booking,
                self.hooks,
                progress=self.progress,
            )
        )
        self.agent.flush()
        return result

    def advance(self, seconds: float) -> None:
        """Move the clock, then every byte between the loop and the engines."""
        self.clock.advance(seconds)
        self.pump()

    def pump(self) -> None:
        for _ in range(3):
            self.agent.flush()

    def requests(self, port: int) -> list[Request]:
        return [request for request, _ in self.engines.pending[port]]

    def bodies(self, port: int) -> list[bytes]:
        return [body for _, body in self.engines.pending[port]]


def _result(d: Deferred[Result]) -> Result:
    """The loop's result, which must be there already."""
    results: list[Result | Failure] = []
    d.addBoth(results.append)
    assert results, "run_attempts has not finished"
    [result] = results
    assert not isinstance(result, Failure), result
    return result


def test_header_deadline_fires_exactly_at_the_timeout_after_the_write() -> None:
    """Node a is still awaited at timeout - ε and abandoned at the timeout; node b gets the same body."""
    loop = Loop()
    result = loop.run()
    assert loop.bodies(1001) == [PAYLOAD]
    [deadline] = loop.clock.getDelayedCalls()
    assert deadline.getTime() == TIMEOUT
    loop.advance(TIMEOUT - EPSILON)
    assert not result.called and loop.bodies(1002) == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall")]
    assert loop.bodies(1002) == [PAYLOAD]
    assert not result.called
    answer = loop.requests(1002)[0]
    answer.write(b"{}")
    answer.finish()
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "b"
    assert loop.hooks.ended == [("a", "stall"), ("b", "committed")]
    [cooldown_timer] = loop.clock.getDelayedCalls()  # only a's cooldown is left
    assert cooldown_timer.getTime() == 2 * TIMEOUT
    loop.stalls.stop()
    assert loop.clock.getDelayedCalls() == []


def test_header_stall_cools_the_node_for_exactly_one_period() -> None:
    """The stalled node cools from the deadline for one header timeout, then the cooldown expires."""
    loop = Loop()
    result = loop.run()
    loop.advance(TIMEOUT)
    assert loop.stalls.cooling() == frozenset({"a"})
    cooldown = loop.stalls.cooldown("a")
    assert cooldown is not None and cooldown.until == 2 * TIMEOUT
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    loop.advance(TIMEOUT - EPSILON)
    assert loop.stalls.cooling() == frozenset({"a"})
    loop.advance(EPSILON)
    assert loop.stalls.cooling() == frozenset()
    assert [(node, until is None, why) for node, until, why in loop.cooldowns] == [
        ("a", False, "no response headers within 30s"),
        ("a", True, "expired"),
    ]
    assert loop.clock.getDelayedCalls() == []


def test_silent_last_candidate_ends_in_502_and_both_cool() -> None:
    """Both nodes silent: each costs one deadline, both cool, the client gets a 502."""
    loop = Loop()
    result = loop.run()
    loop.advance(TIMEOUT)
    assert not result.called
    loop.advance(TIMEOUT)
    assert _result(result) == Exhausted(502, "upstream error: no response headers within 30s")
    assert loop.hooks.ended == [("a", "stall"), ("b", "stall")]
    assert [node for node, cooldown, _ in loop.cooldowns if cooldown is not None] == ["a", "b"]
    assert "b" in loop.stalls.cooling()
    loop.stalls.stop()
    assert loop.clock.getDelayedCalls() == []


def test_503_moves_on_at_once_without_cooling() -> None:
    """A 503 from node a moves to node b with no clock movement and no cooldown."""
    loop = Loop()
    result = loop.run()
    refused = loop.requests(1001)[0]
    refused.setResponseCode(503)
    refused.write(b'{"error": "busy"}')
    refused.finish()
    loop.pump()
    assert loop.bodies(1002) == [PAYLOAD]
    assert loop.hooks.ended == [("a", "status-503")]
    assert loop.stalls.cooling() == frozenset() and loop.cooldowns == []
    loop.requests(1002)[0].finish()
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "b"
    assert loop.clock.seconds() == 0
    assert loop.clock.getDelayedCalls() == []


def test_enabled_first_body_timeout_fires_at_its_budget() -> None:
    """Headers then silence: the gate fails at exactly the first-body budget and the node cools."""
    loop = Loop(gated=True, first_body_timeout=5.0)
    result = loop.run()
    loop.requests(1001)[0].write(b"")  # headers only
    loop.pump()
    [gate_timer] = loop.clock.getDelayedCalls()
    assert gate_timer.getTime() == 5.0
    loop.advance(5.0 - EPSILON)
    assert loop.hooks.ended == [] and loop.bodies(1002) == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "first-body-timeout")]
    assert loop.stalls.cooling() == frozenset({"a"})
    assert loop.bodies(1002) == [PAYLOAD]
    assert not result.called
    loop.requests(1002)[0].write(b"")
    loop.pump()
    loop.advance(5.0)
    assert _result(result) == Exhausted(504, "upstream error: no response body within 5s")
    assert loop.hooks.ended == [("a", "first-body-timeout"), ("b", "first-body-timeout")]
    loop.stalls.stop()
    assert loop.clock.getDelayedCalls() == []


def test_disabled_first_body_timer_arms_nothing() -> None:
    """With the first-body timeout at 0, headers without a body leave no timer: the wait is unbounded."""
    loop = Loop(gated=True, first_body_timeout=0.0)
    result = loop.run()
    answer = loop.requests(1001)[0]
    answer.write(b"")
    loop.pump()
    assert loop.clock.getDelayedCalls() == []
    loop.advance(10 * TIMEOUT)
    assert not result.called and loop.bodies(1002) == []
    answer.write(b'{"done": true}')
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed)
    assert (committed.node.id, committed.first) == ("a", b'{"done": true}')
    assert committed.gate is not None
    committed.gate.stop()
    assert loop.clock.getDelayedCalls() == []


def test_caller_leaving_during_header_wait_is_abandoned_without_cooldown() -> None:
    """Abandoning mid-wait returns Abandoned, cancels the deadline, cools nothing, tries nobody else."""
    loop = Loop()
    result = loop.run()
    loop.advance(TIMEOUT / 2)
    loop.caller.abandon("client gone")
    loop.pump()
    assert _result(result) == Abandoned("client gone")
    assert loop.hooks.ended == [("a", "cancelled")]
    assert loop.stalls.cooling() == frozenset() and loop.cooldowns == []
    loop.advance(TIMEOUT)
    assert loop.bodies(1002) == []
    assert loop.clock.getDelayedCalls() == []


# --- Fast failures in front of a healthy node, told apart from stalls ---------------------------


@implementer(IAgent)
class FrontFails:
    """An agent whose requests to node a (port 1001) fail as ``failure_for`` says, at ``after``
    seconds on ``clock``; every other request goes to the in-memory engines."""

    def __init__(
        self,
        inner: RequestTraversalAgent,
        clock: Clock,
        failure_for: Callable[[], Failure],
        after: float = 0.0,
    ) -> None:
        self._inner = inner
        self._clock = clock
        self._failure_for = failure_for
        self._after = after

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        if b":1001/" not in uri:
            passed: Deferred[IResponse] = self._inner.request(method, uri, headers, bodyProducer)
            return passed
        failing: Deferred[IResponse] = Deferred(lambda d: timer.cancel())
        timer = self._clock.callLater(self._after, lambda: failing.errback(self._failure_for()))
        return failing


FAST_FAILURES = {
    "refused": (lambda: Failure(ConnectionRefusedError()), 0.0, "connect-error"),
    "connect-timeout": (lambda: Failure(TCPTimedOutError()), 10.0, "connect-error"),
    "reset-before-headers": (
        lambda: Failure(ResponseNeverReceived([Failure(ConnectionLost())])),
        0.0,
        "dropped",
    ),
}


@pytest.mark.parametrize("how", sorted(FAST_FAILURES))
def test_fast_failure_in_front_of_a_healthy_node_never_cools_it(how: str) -> None:
    """A refused, timed-out or reset connection to node a moves on to b at once: a is not cooled,
    no header deadline was armed for a, and the outcome names the failure (never ``stall``)."""
    failure_for, after, outcome = FAST_FAILURES[how]
    loop = Loop()
    loop.client = UpstreamClient.from_agent(
        FrontFails(loop.agent, loop.clock, failure_for, after), loop.clock
    )
    result = loop.run()
    assert [c.getTime() for c in loop.clock.getDelayedCalls()] == [after]
    loop.advance(after)
    assert loop.hooks.ended == [("a", outcome)]
    assert loop.bodies(1002) == [PAYLOAD]
    loop.requests(1002)[0].finish()
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "b"
    assert loop.stalls.cooling() == frozenset() and loop.cooldowns == []
    assert loop.clock.getDelayedCalls() == []


def test_connect_timeout_and_header_timeout_are_told_apart() -> None:
    """The same node, once timing out its connect and once silent after the write: only the silence
    is a stall that cools it; the connect timeout is a fast failure."""
    loop = Loop()
    loop.client = UpstreamClient.from_agent(
        FrontFails(loop.agent, loop.clock, lambda: Failure(TCPTimedOutError()), TIMEOUT),
        loop.clock,
    )
    loop.nodes = [loop.nodes[0]]
    result = loop.run()
    loop.advance(TIMEOUT)
    assert _result(result) == Exhausted(
        502, "upstream error: TCPTimedOutError: TCP connection timed out."
    )
    assert loop.hooks.ended == [("a", "connect-error")] and loop.cooldowns == []
    silent = Loop()
    silent.nodes = [silent.nodes[0]]
    result = silent.run()
    silent.advance(TIMEOUT)
    assert _result(result) == Exhausted(502, "upstream error: no response headers within 30s")
    assert silent.hooks.ended == [("a", "stall")]
    assert [node for node, cooldown, _ in silent.cooldowns if cooldown] == ["a"]
    silent.stalls.stop()


# --- The header deadline starts when the last body byte has been written ------------------------


class SlowSocket:
    """A consumer standing in for a socket whose buffer fills after the first 64 KiB write: it
    pauses its producer then, and resumes it when the test drains it."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.producer: ReplayBodyProducer | None = None

    def write(self, data: bytes) -> None:
        self.written.append(data)
        if len(self.written) == 1 and self.producer is not None:
            self.producer.pauseProducing()

    def drain(self) -> None:
        assert self.producer is not None
        self.producer.resumeProducing()


@implementer(IAgent)
class WritingAgent:
    """Writes the body into a :class:`SlowSocket` like a real connection would, then waits for an
    answer that never comes (until cancelled)."""

    def __init__(self) -> None:
        self.socket = SlowSocket()

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        assert isinstance(bodyProducer, ReplayBodyProducer)
        self.socket.producer = bodyProducer
        bodyProducer.startProducing(self.socket)  # type: ignore[arg-type]
        return Deferred(lambda d: None)


def test_header_deadline_starts_after_a_late_last_write() -> None:
    """A 100 KiB body whose second half reaches the socket only at t=5: the header deadline is
    armed at t=5, not when the request started, and fires at exactly 5 + timeout."""
    clock = Clock()
    agent = WritingAgent()
    client = UpstreamClient.from_agent(agent, clock)
    body = b"x" * (100 * 1024)
    attempt = client.request(b"POST", b"http://127.0.0.1:1001/api/chat", Headers(), body, TIMEOUT)
    failures: list[Failure] = []
    attempt.addErrback(failures.append)
    assert len(agent.socket.written) == 1 and clock.getDelayedCalls() == []
    clock.advance(5)
    agent.socket.drain()
    assert b"".join(agent.socket.written) == body
    [deadline] = clock.getDelayedCalls()
    assert deadline.getTime() == 5 + TIMEOUT
    clock.advance(TIMEOUT - EPSILON)
    assert failures == []
    clock.advance(EPSILON)
    [failure] = failures
    assert failure.check(HeaderTimeout)


# --- A cooling node is demoted, never excluded --------------------------------------------------


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_cooling_node_is_still_tried_when_its_ready_peer_fails(
    reactor: Any, scenario: ProxyCluster, round_: int
) -> None:
    """n0 is cooling and n1 is ready: n1 goes first, answers 503, and the cooling n0 still gets the
    request and serves it (demotion reorders; it never removes a node)."""
    await scenario.start([healthy(reactor), broken(reactor, Behaviour.STATUS_503)])
    scenario.facade.stalls.cool("n0", "test")
    code, _, response = await scenario.post(body(1))
    assert code == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"n0"]
    outcomes = [a["outcome"] for a in scenario.named("proxy/request")[0]["attempts"]]
    assert outcomes == ["status-503", "committed"]
    assert scenario.received(1) == [body(1)] and scenario.received(0) == [body(1)]


class ResetsOnRequest(Protocol):
    """Accepts a connection and resets it as soon as request bytes arrive (before any header)."""

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.abortConnection()  # type: ignore[attr-defined]


@pytest.mark.parametrize("round_", ROUNDS)
@pytest_twisted.ensureDeferred
async def test_reset_before_headers_over_a_socket_moves_on_without_cooling(
    reactor: Any, scenario: ProxyCluster, listen: Callable[[Any], int], round_: int
) -> None:
    """A real node that resets the connection before any header: the next node serves at once,
    the attempt is ``dropped`` and nothing cools."""
    resetting = Node("a", f"http://127.0.0.1:{listen(Factory.forProtocol(ResetsOnRequest))}", MODEL)
    healthy_node = await scenario.add_engine("b", healthy(reactor))
    await scenario.start_proxy([resetting, healthy_node])
    code, _, response = await scenario.post(body(1))
    assert code == 200
    assert response.headers.getRawHeaders(b"x-nvpair-node") == [b"b"]
    outcomes = [a["outcome"] for a in scenario.named("proxy/request")[0]["attempts"]]
    assert outcomes == ["dropped", "committed"]
    assert scenario.named("node/cooldown") == []


# --- Busy is not stalled: progress elsewhere extends the header wait (docs/behaviour.md §6.4) ----
#
# ``elsewhere`` is the toucher another attempt's body gate calls for every chunk node a delivers;
# calling it at a clock time stands for "node a delivered body bytes to another attempt then".


def test_deadline_on_a_node_delivering_elsewhere_rearms_and_counts_without_cooling() -> None:
    """Node a delivers bytes to another attempt within each period: the deadline re-arms at T and
    2T (busy waits 1, 2), nothing cools, node b is never tried, and a's late answer commits."""
    loop = Loop(progress=True, busy_max_wait=10 * TIMEOUT)
    assert loop.progress is not None
    elsewhere = loop.progress.toucher("a")
    result = loop.run()
    loop.advance(TIMEOUT - 1)
    elsewhere()
    loop.advance(1)
    assert loop.hooks.busy == [("a", TIMEOUT)]
    assert [call.getTime() for call in loop.clock.getDelayedCalls()] == [2 * TIMEOUT]
    loop.advance(TIMEOUT - 1)
    elsewhere()
    loop.advance(1)
    assert loop.hooks.busy == [("a", TIMEOUT), ("a", 2 * TIMEOUT)]
    assert loop.hooks.ended == [] and loop.bodies(1002) == []
    assert loop.stalls.cooling() == frozenset() and loop.cooldowns == []
    answer = loop.requests(1001)[0]
    answer.write(b"{}")
    answer.finish()
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "a"
    assert loop.hooks.ended == [("a", "committed")]
    assert loop.progress.busy_waits("a") == 2
    assert loop.clock.getDelayedCalls() == []


def test_no_progress_on_the_node_stalls_and_cools_at_exactly_the_deadline() -> None:
    """Busy waits enabled, but node a delivered nothing (only node b did): a stalls at exactly T
    and cools, with no busy wait counted."""
    loop = Loop(progress=True, busy_max_wait=10 * TIMEOUT)
    assert loop.progress is not None
    result = loop.run()
    loop.advance(TIMEOUT - 1)
    loop.progress.toucher("b")()
    loop.advance(1 - EPSILON)
    assert loop.hooks.ended == [] and loop.bodies(1002) == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall")] and loop.hooks.busy == []
    cooldown = loop.stalls.cooldown("a")
    assert cooldown is not None and cooldown.until == 2 * TIMEOUT
    assert loop.bodies(1002) == [PAYLOAD]
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    assert loop.progress.busy_waits("a") == 0
    loop.stalls.stop()
    assert loop.clock.getDelayedCalls() == []


def test_progress_older_than_one_period_is_a_stall() -> None:
    """A chunk from node a one period and a hair before the expiry is not progress: a stalls at
    the deadline and cools."""
    loop = Loop(progress=True, busy_max_wait=10 * TIMEOUT)
    assert loop.progress is not None
    loop.progress.toucher("a")()
    loop.clock.advance(EPSILON)
    result = loop.run()
    loop.advance(TIMEOUT)
    assert loop.hooks.ended == [("a", "stall")] and loop.hooks.busy == []
    assert loop.stalls.cooling() == frozenset({"a"})
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    loop.stalls.stop()


def test_progress_that_stops_ends_the_wait_at_the_next_expiry() -> None:
    """One busy wait at T; node a then delivers nothing more, so the expiry at 2T is a stall that
    cools it and names the whole wait."""
    loop = Loop(progress=True, busy_max_wait=10 * TIMEOUT)
    assert loop.progress is not None
    result = loop.run()
    loop.advance(TIMEOUT - 1)
    loop.progress.toucher("a")()
    loop.advance(1)
    assert loop.hooks.busy == [("a", TIMEOUT)]
    loop.advance(TIMEOUT - EPSILON)
    assert loop.hooks.ended == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall")]
    assert [(node, why) for node, cooldown, why in loop.cooldowns if cooldown] == [
        ("a", "no response headers within 60s")
    ]
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    loop.stalls.stop()


def test_busy_waits_stop_at_busy_max_wait_then_the_next_expiry_stalls() -> None:
    """Node a keeps delivering elsewhere, but busy_max_wait is 2.5 periods: waits at T, 2T and 3T
    (the last one shortened to the half period left), then a stall at exactly 3.5T."""
    loop = Loop(progress=True, busy_max_wait=2.5 * TIMEOUT)
    assert loop.progress is not None
    elsewhere = loop.progress.toucher("a")
    result = loop.run()
    for _ in range(3):
        loop.advance(TIMEOUT / 2)
        elsewhere()
        loop.advance(TIMEOUT / 2)
    assert loop.hooks.busy == [("a", TIMEOUT), ("a", 2 * TIMEOUT), ("a", 3 * TIMEOUT)]
    loop.advance(TIMEOUT / 4)
    elsewhere()
    loop.advance(TIMEOUT / 4 - EPSILON)
    assert loop.hooks.ended == [] and loop.cooldowns == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall")]
    assert len(loop.hooks.busy) == 3 and loop.progress.busy_waits("a") == 3
    assert [(node, why) for node, cooldown, why in loop.cooldowns if cooldown] == [
        ("a", "no response headers within 105s")
    ]
    assert loop.bodies(1002) == [PAYLOAD]
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    loop.stalls.stop()


def test_cold_node_first_deadline_is_timeout_plus_allowance_and_others_just_the_timeout() -> None:
    """first_extra gives node a 45 s more on its first deadline (T + 45 exactly); node b, with no
    allowance, stalls one plain T later."""
    loop = Loop(first_extra={"a": 45.0})
    result = loop.run()
    [deadline] = loop.clock.getDelayedCalls()
    assert deadline.getTime() == TIMEOUT + 45
    loop.advance(TIMEOUT + 45 - EPSILON)
    assert loop.hooks.ended == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall")]
    loop.advance(TIMEOUT - EPSILON)
    assert loop.hooks.ended == [("a", "stall")]
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall"), ("b", "stall")]
    assert _result(result) == Exhausted(502, "upstream error: no response headers within 30s")
    assert [why for _, cooldown, why in loop.cooldowns if cooldown] == [
        "no response headers within 75s",
        "no response headers within 30s",
    ]
    loop.stalls.stop()


def test_a_busy_wait_after_a_cold_first_deadline_rearms_for_one_period() -> None:
    """The allowance lengthens only the first deadline: the busy re-arm is one plain period."""
    loop = Loop(progress=True, busy_max_wait=10 * TIMEOUT, first_extra={"a": 45.0})
    assert loop.progress is not None
    result = loop.run()
    loop.advance(TIMEOUT + 44)
    loop.progress.toucher("a")()
    loop.advance(1)
    assert loop.hooks.busy == [("a", TIMEOUT + 45)]
    [deadline] = loop.clock.getDelayedCalls()
    assert deadline.getTime() == 2 * TIMEOUT + 45
    loop.caller.abandon("client gone")
    loop.pump()
    assert _result(result) == Abandoned("client gone")
    assert loop.clock.getDelayedCalls() == []


def test_inference_body_bytes_touch_the_progress_record_before_and_after_commit() -> None:
    """The gate records node a's progress for the first chunk (before commit) and for every
    relayed chunk after it."""
    loop = Loop(progress=True, gated=True)
    assert loop.progress is not None
    result = loop.run()
    answer = loop.requests(1001)[0]
    loop.clock.advance(5)
    answer.write(b'{"message": {"content": "a"}}\n')
    loop.pump()
    assert loop.progress.last("a") == 5
    committed = _result(result)
    assert isinstance(committed, Committed)
    relayed: list[bytes] = []
    committed.gate.start_relay(relayed.append)
    loop.clock.advance(7)
    answer.write(b'{"done": true}\n')
    loop.pump()
    assert relayed == [b'{"done": true}\n'] and loop.progress.last("a") == 12
    committed.gate.stop()


def test_pass_through_body_bytes_are_not_progress() -> None:
    """A non-inference answer's body leaves the progress record untouched."""
    loop = Loop(progress=True, inference=False)
    assert loop.progress is not None
    result = loop.run()
    answer = loop.requests(1001)[0]
    answer.write(b'{"models": []}')
    answer.finish()
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed)
    committed.gate.start_relay(lambda chunk: None)
    loop.pump()
    assert loop.progress.last("a") is None


# --- The outcome table, pinned value by value (mutation testing: docs/testing.md) ---------------


@pytest.mark.parametrize(
    ("code", "inference", "retryable"),
    [
        (408, False, True),
        (429, False, True),
        (500, False, True),
        (501, False, True),
        (599, False, True),
        (404, True, True),
        (404, False, False),
        (405, True, False),
        (409, False, False),
        (430, False, False),
        (499, False, False),
        (400, True, False),
        (300, True, False),
        (200, True, False),
    ],
)
def test_retryable_statuses_are_408_429_5xx_and_404_on_inference(
    code: int, inference: bool, retryable: bool
) -> None:
    """The statuses that move on to the next node, exactly (docs/behaviour.md §6.1)."""
    assert retryable_status(code, inference) is retryable


@pytest.mark.parametrize(
    ("failure", "gone", "outcome"),
    [
        (Failure(HeaderTimeout("x")), "client gone", AttemptOutcome.CANCELLED),
        (Failure(ConnectionRefusedError()), "client gone", AttemptOutcome.CANCELLED),
        (Failure(CancelledError()), None, AttemptOutcome.CANCELLED),
        (Failure(HeaderTimeout("x")), None, AttemptOutcome.STALL),
        (Failure(FirstBodyTimeout("x")), None, AttemptOutcome.FIRST_BODY_TIMEOUT),
        (Failure(ConnectionRefusedError()), None, AttemptOutcome.CONNECT_ERROR),
        (Failure(DNSLookupError("nowhere")), None, AttemptOutcome.CONNECT_ERROR),
        (Failure(ResponseNeverReceived([Failure(ConnectionLost())])), None, AttemptOutcome.DROPPED),
    ],
    ids=[
        "gone-wins-over-stall",
        "gone-wins-over-refusal",
        "cancellation",
        "header-timeout",
        "first-body-timeout",
        "refused",
        "dns",
        "reset",
    ],
)
def test_classify_failure_outcomes(
    failure: Failure, gone: str | None, outcome: AttemptOutcome
) -> None:
    """The caller's departure wins over any transport failure; a DNS failure is a connect error."""
    assert classify_failure(failure, gone) is outcome


def test_classify_failure_raises_a_bug_again() -> None:
    """A failure that is not a transport failure is not swallowed as an outcome."""
    with pytest.raises(ZeroDivisionError):
        classify_failure(Failure(ZeroDivisionError()), None)


def test_the_plan_headers_reach_the_node() -> None:
    """Every attempt sends the plan's headers (here its Content-Type) with the body."""
    loop = Loop()
    result = loop.run()
    [request] = loop.requests(1001)
    assert request.requestHeaders.getRawHeaders(b"content-type") == [b"application/json"]
    request.finish()
    loop.pump()
    assert isinstance(_result(result), Committed)


def test_404_moves_on_for_inference_and_commits_otherwise() -> None:
    """Inference: a 404 (stale inventory) is ``status-404`` and node b serves. Other routes: the
    404 is the answer."""
    loop = Loop()
    result = loop.run()
    missing = loop.requests(1001)[0]
    missing.setResponseCode(404)
    missing.finish()
    loop.pump()
    assert loop.hooks.ended == [("a", "status-404")]
    loop.requests(1002)[0].finish()
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "b"

    listing = Loop()
    listing.plan = evolve(listing.plan, inference=False)
    result = listing.run()
    missing = listing.requests(1001)[0]
    missing.setResponseCode(404)
    missing.finish()
    listing.pump()
    committed = _result(result)
    assert isinstance(committed, Committed)
    assert (committed.node.id, committed.response.code) == ("a", 404)
    assert listing.bodies(1002) == []


def test_commit_on_headers_hands_over_an_unarmed_gate_with_nothing_held() -> None:
    """Ungated (commit on headers): even with a first-body timeout configured, the gate arms no
    timer, has seen nothing, and ``first`` is empty; the gate is what the caller's departure stops."""
    loop = Loop(gated=False, first_body_timeout=5.0)
    result = loop.run()
    answer = loop.requests(1001)[0]
    answer.write(b"")  # headers only
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed)
    assert committed.first == b""
    assert isinstance(committed.gate, BodyGate)
    assert committed.gate.state is GateState.AWAITING_FIRST
    assert loop.clock.getDelayedCalls() == []
    committed.gate.stop()


def test_caller_leaving_while_the_first_body_byte_is_awaited_stops_the_gate() -> None:
    """Gated, headers in, no body yet: the caller's departure closes the upstream body at once and
    the attempt ends ``cancelled`` (not ``dropped``); node b is never tried."""
    loop = Loop(gated=True)
    result = loop.run()
    loop.requests(1001)[0].write(b"")  # headers only
    loop.pump()
    assert not result.called
    loop.caller.abandon("client gone")
    loop.pump()
    assert _result(result) == Abandoned("client gone")
    assert loop.hooks.ended == [("a", "cancelled")]
    assert loop.bodies(1002) == [] and loop.cooldowns == []
    assert loop.clock.getDelayedCalls() == []


def test_sole_candidate_abandoned_during_header_wait_is_abandoned_not_exhausted() -> None:
    """With no node left after it, a cancelled attempt still ends in Abandoned (never a 502)."""
    loop = Loop()
    loop.nodes = [loop.nodes[0]]
    result = loop.run()
    loop.caller.abandon("client gone")
    loop.pump()
    assert _result(result) == Abandoned("client gone")
    assert loop.hooks.ended == [("a", "cancelled")]
    assert loop.clock.getDelayedCalls() == []


def test_cancellation_without_a_departure_is_abandoned_as_cancelled() -> None:
    """A cancellation the caller did not ask for (e.g. the pool shutting down) ends the loop with
    ``Abandoned("cancelled")``; node b is not tried and nothing cools."""
    loop = Loop()
    loop.client = UpstreamClient.from_agent(
        FrontFails(loop.agent, loop.clock, lambda: Failure(CancelledError())), loop.clock
    )
    result = loop.run()
    loop.advance(0)
    assert _result(result) == Abandoned("cancelled")
    assert loop.hooks.ended == [("a", "cancelled")]
    assert loop.bodies(1002) == [] and loop.cooldowns == []


@implementer(IAgent)
class ResetOnCancel:
    """Node a never answers; cancelling its attempt fails it as a connection reset (the race where
    the transport reports its own fault as the caller leaves)."""

    def __init__(self, inner: RequestTraversalAgent) -> None:
        self._inner = inner

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        if b":1001/" not in uri:
            passed: Deferred[IResponse] = self._inner.request(method, uri, headers, bodyProducer)
            return passed
        return Deferred(
            lambda d: d.errback(Failure(ResponseNeverReceived([Failure(ConnectionLost())])))
        )


def test_departure_wins_over_a_reset_reported_on_cancel() -> None:
    """The caller leaves during the header wait and the cancelled attempt fails as a reset: the
    outcome is still ``cancelled`` and the loop is abandoned with the caller's reason."""
    loop = Loop()
    loop.client = UpstreamClient.from_agent(ResetOnCancel(loop.agent), loop.clock)
    result = loop.run()
    loop.caller.abandon("client gone")
    loop.pump()
    assert _result(result) == Abandoned("client gone")
    assert loop.hooks.ended == [("a", "cancelled")]
    assert loop.bodies(1002) == []


@implementer(IPushProducer)
class _CutLooksClean:
    """A response body transport whose ``stopProducing`` ends the body as a clean close would
    (``PotentialDataLoss``: a close-delimited body cut by us is indistinguishable from its end)."""

    def __init__(self) -> None:
        self.protocol: Protocol | None = None

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        if self.protocol is not None:  # a second stop, after the end, does nothing
            protocol, self.protocol = self.protocol, None
            protocol.connectionLost(Failure(PotentialDataLoss()))


@implementer(IResponse)
class _CloseDelimited:
    """A 200 with a close-delimited body that never sends a byte until it is stopped."""

    version = (b"HTTP", 1, 0)
    code = 200
    phrase = b"OK"
    headers = Headers()
    length = UNKNOWN_LENGTH
    request = None
    previousResponse = None

    def __init__(self) -> None:
        self.transport = _CutLooksClean()

    def deliverBody(self, protocol: IProtocol) -> None:
        assert isinstance(protocol, Protocol)
        self.transport.protocol = protocol
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]

    def setPreviousResponse(self, response: IResponse) -> None:
        pass


@implementer(IAgent)
class AnswersCloseDelimited:
    """Every request is answered at once with a :class:`_CloseDelimited` response."""

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        return succeed(_CloseDelimited())


def test_a_departure_that_makes_the_body_look_cleanly_empty_is_no_commit() -> None:
    """The caller leaves while the first body byte is awaited, and stopping the close-delimited
    body looks like a clean empty end: that is no commit, the loop is abandoned."""
    loop = Loop(gated=True)
    loop.client = UpstreamClient.from_agent(AnswersCloseDelimited(), loop.clock)
    result = loop.run()
    assert not result.called
    loop.caller.abandon("client gone")
    assert _result(result) == Abandoned("client gone")
    assert loop.hooks.ended == [("a", "cancelled")]


def test_no_candidates_is_a_502() -> None:
    """An empty candidate list ends at once in 502 without touching anything."""
    loop = Loop()
    loop.nodes = []
    assert _result(loop.run()) == Exhausted(502, "upstream error: no candidate answered")
    assert loop.hooks.started == [] and loop.hooks.ended == []


def test_caller_gone_before_the_loop_starts_tries_nobody() -> None:
    """A caller that left before the first attempt: Abandoned with its reason, no node contacted,
    the booking left where it was."""
    loop = Loop()
    loop.nodes = [loop.nodes[1], loop.nodes[0]]
    loop.caller.abandon("client gone")
    assert _result(loop.run()) == Abandoned("client gone")
    assert loop.hooks.started == []
    assert loop.bodies(1001) == [] and loop.bodies(1002) == []
    assert loop.booking.node_id == "a"


def test_the_booking_follows_each_attempt() -> None:
    """The reservation moves to the node each attempt targets: a while a waits, then b."""
    loop = Loop()
    loop.ledger = ReservationLedger()
    loop.booking = Booking.take(loop.ledger, "elsewhere")
    result = loop.run()
    assert loop.booking.node_id == "a"
    assert (loop.ledger.reservations("a"), loop.ledger.reservations("elsewhere")) == (1, 0)
    refused = loop.requests(1001)[0]
    refused.setResponseCode(503)
    refused.finish()
    loop.pump()
    assert loop.booking.node_id == "b"
    assert (loop.ledger.reservations("a"), loop.ledger.reservations("b")) == (0, 1)
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)


@pytest.mark.parametrize(("code", "clears"), [(200, True), (299, True), (300, False), (400, False)])
def test_only_a_2xx_commit_ends_a_cooldown(code: int, clears: bool) -> None:
    """A cooling node that commits a 2xx answer is restored; any other committed status leaves
    its cooldown running."""
    loop = Loop()
    loop.nodes = [loop.nodes[0]]
    loop.stalls.cool("a", "test")
    result = loop.run()
    answer = loop.requests(1001)[0]
    answer.setResponseCode(code)
    answer.finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    assert ("a" in loop.stalls.cooling()) is not clears
    loop.stalls.stop()


def test_a_failed_attempt_is_logged_with_node_and_reason() -> None:
    """Each pre-commit failure logs one info line naming the node and the reason."""
    with capturedLogs() as events:
        loop = Loop()
        result = loop.run()
        loop.advance(TIMEOUT)
        loop.requests(1002)[0].finish()
        loop.pump()
        assert isinstance(_result(result), Committed)
        loop.stalls.stop()
    mine = [e for e in events if e.get("log_namespace") == "nvpair_tw.corridor._attempts"]
    assert [formatEvent(e) for e in mine] == ["attempt to a failed: no response headers within 30s"]
    assert (mine[0]["node"], mine[0]["why"]) == ("a", "no response headers within 30s")


def test_a_node_credential_replaces_the_clients_and_a_node_without_one_gets_the_plans() -> None:
    """Node a has an API key: its request carries ``Bearer`` for it instead of the client's
    Authorization, and the plan's headers are left as they were; node b, without a credential,
    gets the plan's headers unchanged."""
    loop = Loop()
    client_headers = Headers(
        {b"content-type": [b"application/json"], b"authorization": [b"Basic client"]}
    )
    loop.plan = evolve(loop.plan, headers=client_headers)
    loop.nodes = [Node("a", "http://127.0.0.1:1001", api_key="k"), loop.nodes[1]]
    result = loop.run()
    [refused] = loop.requests(1001)
    assert refused.requestHeaders.getRawHeaders(b"authorization") == [b"Bearer k"]
    assert refused.requestHeaders.getRawHeaders(b"content-type") == [b"application/json"]
    assert client_headers.getRawHeaders(b"authorization") == [b"Basic client"]
    refused.setResponseCode(503)
    refused.finish()
    loop.pump()
    [served] = loop.requests(1002)
    assert served.requestHeaders.getRawHeaders(b"authorization") == [b"Basic client"]
    served.finish()
    loop.pump()
    assert isinstance(_result(result), Committed)


def test_with_busy_waits_off_progress_elsewhere_does_not_extend_the_deadline() -> None:
    """A progress record but ``busy_max_wait`` 0: node a delivering elsewhere just before its
    deadline still stalls at exactly T, with no busy wait."""
    loop = Loop(progress=True)
    assert loop.progress is not None
    result = loop.run()
    loop.advance(TIMEOUT - 1)
    loop.progress.toucher("a")()
    loop.advance(1 - EPSILON)
    assert loop.hooks.ended == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "stall")] and loop.hooks.busy == []
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    loop.stalls.stop()


def test_a_sub_second_busy_max_wait_rearms_once_for_what_it_allows() -> None:
    """``busy_max_wait`` of half a second: one busy wait at T, re-armed for 0.5 s, then a stall at
    exactly T + 0.5."""
    loop = Loop(progress=True, busy_max_wait=0.5)
    assert loop.progress is not None
    elsewhere = loop.progress.toucher("a")
    result = loop.run()
    loop.advance(TIMEOUT - 1)
    elsewhere()
    loop.advance(1)
    assert loop.hooks.busy == [("a", TIMEOUT)]
    [deadline] = loop.clock.getDelayedCalls()
    assert deadline.getTime() == TIMEOUT + 0.5
    loop.advance(0.5)
    assert loop.hooks.ended == [("a", "stall")]
    loop.requests(1002)[0].finish()
    loop.pump()
    assert isinstance(_result(result), Committed)
    loop.stalls.stop()


def test_a_busy_wait_is_logged_at_debug_naming_the_node() -> None:
    """Each busy wait logs one debug line naming the node (seen with the level at debug)."""
    previous = current_level()
    set_level(LogLevel.debug)
    try:
        with capturedLogs() as events:
            loop = Loop(progress=True, busy_max_wait=TIMEOUT)
            assert loop.progress is not None
            result = loop.run()
            loop.advance(TIMEOUT - 1)
            loop.progress.toucher("a")()
            loop.advance(1)
            loop.caller.abandon("client gone")
            loop.pump()
            assert _result(result) == Abandoned("client gone")
    finally:
        set_level(previous)
    mine = [e for e in events if e.get("log_namespace") == "nvpair_tw.corridor._attempts"]
    assert [formatEvent(e) for e in mine] == ["a shows progress elsewhere: header wait extended"]
    assert [(e["log_level"], e["node"]) for e in mine] == [(LogLevel.debug, "a")]


# --- Assembled attempts: a non-streaming request sent as a stream (docs/behaviour.md §6.5) ------

NDJSON = b"application/x-ndjson"
PIECE = b'{"message": {"role": "assistant", "content": "Hel"}, "done": false}\n'
FINAL = b'{"message": {"role": "assistant", "content": "lo"}, "done": true}\n'
ANSWER = {"message": {"role": "assistant", "content": "Hello"}, "done": True}


def assembling(loop: Loop) -> Loop:
    """``loop`` with its plan assembled as Ollama ``/api/chat``."""
    assembly = Assembly(Dialect.OLLAMA_CHAT, PAYLOAD, 1 << 20)
    loop.plan = evolve(loop.plan, sends=AsIs.of(b"POST", b"/api/chat", PAYLOAD, assembly))
    return loop


def stream_head(request: Request, code: int = 200, content_type: bytes | None = NDJSON) -> None:
    """Send ``request``'s status and headers (``content_type`` None: no Content-Type at all)."""
    request.setResponseCode(code)
    if content_type is None:
        request.defaultContentType = None
    else:
        request.setHeader(b"content-type", content_type)
    request.write(b"")


def test_an_assembled_attempt_commits_only_with_the_whole_answer() -> None:
    """Gated, with a 5 s first-body timeout and a progress record: the first token stops the timer,
    nothing commits before the terminal object, every chunk is progress, and the commit carries the
    whole answer as ``first``, its client-facing response, and the assembly gate."""
    loop = assembling(Loop(gated=True, first_body_timeout=5.0, progress=True))
    assert loop.progress is not None
    result = loop.run()
    answer = loop.requests(1001)[0]
    stream_head(answer)
    loop.clock.advance(2)
    answer.write(PIECE)
    loop.pump()
    assert loop.progress.last("a") == 2
    assert loop.clock.getDelayedCalls() == []
    loop.advance(10)
    assert not result.called and loop.hooks.ended == []
    answer.write(FINAL)
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed)
    assert isinstance(committed.gate, AssemblyGate)
    assert committed.node.id == "a"
    assert json.loads(committed.first) == ANSWER
    assert committed.response.code == 200
    assert committed.response.headers.getRawHeaders(b"content-type") == [ANSWER_CONTENT_TYPE]
    assert committed.response.length == len(committed.first)
    assert loop.progress.last("a") == 12
    assert loop.hooks.ended == [("a", "committed")] and loop.bodies(1002) == []
    answer.finish()
    loop.pump()


def test_an_error_in_an_assembled_stream_moves_on_like_a_500_and_the_last_one_is_the_answer() -> (
    None
):
    """Node a streams an error: its attempt ends ``status-500`` and node b is tried; b, the last
    candidate, streams the same error, and that 500 answer is committed."""
    loop = assembling(Loop(gated=True))
    result = loop.run()
    for port in (1001, 1002):
        failing = loop.requests(port)[0]
        stream_head(failing)
        failing.write(b'{"error": "runner died"}\n')
        loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "b"
    assert committed.response.code == 500
    assert json.loads(committed.first) == {"error": "runner died"}
    assert loop.hooks.ended == [("a", "status-500"), ("b", "committed")]


def test_an_assembled_stream_cut_before_its_terminal_object_is_a_drop_that_fails_over() -> None:
    """Node a ends its stream cleanly before the terminal object: ``dropped`` (no cooldown), and
    node b's whole answer is committed."""
    loop = assembling(Loop(gated=True))
    result = loop.run()
    cut = loop.requests(1001)[0]
    stream_head(cut)
    cut.write(PIECE)
    cut.finish()
    loop.pump()
    assert loop.hooks.ended == [("a", "dropped")] and loop.cooldowns == []
    served = loop.requests(1002)[0]
    stream_head(served)
    served.write(PIECE + FINAL)
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and committed.node.id == "b"
    assert json.loads(committed.first) == ANSWER


def test_an_assembled_attempt_times_out_at_the_first_body_budget_only_when_gated() -> None:
    """Gated: headers then silence fail at exactly the 5 s budget (``first-body-timeout``, the
    node cools). Ungated, the same budget arms nothing and the whole answer still commits."""
    loop = assembling(Loop(gated=True, first_body_timeout=5.0))
    result = loop.run()
    stream_head(loop.requests(1001)[0])
    loop.pump()
    [timer] = loop.clock.getDelayedCalls()
    assert timer.getTime() == 5.0
    loop.advance(5.0 - EPSILON)
    assert loop.hooks.ended == []
    loop.advance(EPSILON)
    assert loop.hooks.ended == [("a", "first-body-timeout")]
    assert loop.stalls.cooling() == frozenset({"a"})
    assert not result.called
    loop.caller.abandon("client gone")
    loop.pump()
    loop.stalls.stop()

    ungated = assembling(Loop(gated=False, first_body_timeout=5.0))
    result = ungated.run()
    answer = ungated.requests(1001)[0]
    stream_head(answer)
    ungated.pump()
    assert ungated.clock.getDelayedCalls() == []
    ungated.advance(10.0)
    answer.write(PIECE + FINAL)
    ungated.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and json.loads(committed.first) == ANSWER


@pytest.mark.parametrize(
    ("code", "content_type"),
    [(200, b"application/json"), (300, NDJSON), (200, None)],
    ids=["2xx-whole-document", "3xx-stream", "no-content-type"],
)
def test_only_a_2xx_stream_of_the_routes_type_is_assembled(
    code: int, content_type: bytes | None
) -> None:
    """A whole JSON document, a non-2xx stream, or an answer without a Content-Type is relayed as
    it is: a plain body gate commits on its first chunk with the node's own status."""
    loop = assembling(Loop(gated=True))
    result = loop.run()
    answer = loop.requests(1001)[0]
    stream_head(answer, code, content_type)
    answer.write(PIECE)
    loop.pump()
    committed = _result(result)
    assert isinstance(committed, Committed) and isinstance(committed.gate, BodyGate)
    assert (committed.response.code, committed.first) == (code, PIECE)
    committed.gate.stop()


def test_a_caller_leaving_during_assembly_stops_the_attempt() -> None:
    """The caller leaves after the first token: the attempt ends ``cancelled``, the loop is
    abandoned with the caller's reason, and node b is never tried."""
    loop = assembling(Loop(gated=True))
    result = loop.run()
    answer = loop.requests(1001)[0]
    stream_head(answer)
    answer.write(PIECE)
    loop.pump()
    assert not result.called
    loop.caller.abandon("client gone")
    loop.pump()
    assert _result(result) == Abandoned("client gone")
    assert loop.hooks.ended == [("a", "cancelled")] and loop.bodies(1002) == []
