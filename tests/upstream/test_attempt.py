"""Tests for nvpair_tw.upstream._attempt: the replayed body, the header deadline, the body gate, endpoints.

Reactor-free where possible (a recording consumer, ``task.Clock``, ``StringTransport``, a memory
reactor); the header deadline, real connect failures and the gate's socket-level edge cases run over
loopback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
import pytest_twisted
import treq
from twisted.internet.address import IPv4Address
from twisted.internet.base import DelayedCall
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.error import (
    ConnectError,
    ConnectingCancelledError,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
)
from twisted.internet.interfaces import (
    IConsumer,
    IHostnameResolver,
    IHostResolution,
    IProducer,
    IReactorPluggableNameResolver,
    IResolutionReceiver,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.client import (
    URI,
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    RequestGenerationFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import (
    IAgent,
    IAgentEndpointFactory,
    IBodyProducer,
    IPolicyForHTTPS,
    IResponse,
)
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair_tw.core import IllegalCall
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.testing import Behaviour, SimulatedEngine, always, start_engine
from nvpair_tw.upstream._agent import NodeAgent
from nvpair_tw.upstream._attempt import (
    BodyEnd,
    BodyGate,
    BusyWait,
    Discard,
    FirstBodyTimeout,
    GateState,
    HeaderTimeout,
    NodeEndpointFactory,
    ReplayBodyProducer,
    UpstreamClient,
    describe_failure,
    is_cancellation,
    make_pool,
    node_url,
)
from tests.helpers import eventually

SECRET = "PROMPT-SECRET-7f3a"
BODY = json.dumps({"model": "llama3", "stream": False, "prompt": SECRET * 20_000}).encode()


# ---- ReplayBodyProducer -------------------------------------------------------------------------


@implementer(IConsumer)
class RecordingConsumer:
    """Collects written bytes; ``on_write`` may pause or stop the producer re-entrantly."""

    def __init__(self, on_write: Callable[[RecordingConsumer], None] | None = None) -> None:
        self.data = bytearray()
        self.writes = 0
        self.on_write = on_write

    def registerProducer(self, producer: IProducer, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes += 1
        if self.on_write is not None:
            self.on_write(self)


class Written:
    """Counts ``on_written`` calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_producer_provides_ibodyproducer_with_known_length() -> None:
    """The producer declares the body length, so the agent frames with Content-Length."""
    producer = ReplayBodyProducer(BODY, lambda: None)
    assert verifyObject(IBodyProducer, producer)
    assert producer.length == len(BODY)


def test_same_body_is_replayed_byte_for_byte_to_several_consumers() -> None:
    """Three attempts each get the whole body, in several chunks, and each says "written" once."""
    for _ in range(3):
        consumer, written = RecordingConsumer(), Written()
        done = ReplayBodyProducer(BODY, written).startProducing(consumer)
        assert bytes(consumer.data) == BODY
        assert consumer.writes > 1
        assert written.calls == 1
        assert done.called


def test_pause_holds_writes_until_resume() -> None:
    """A consumer that pauses after every write gets one chunk per resume; done waits for the end."""
    producer: ReplayBodyProducer
    consumer = RecordingConsumer(lambda _c: producer.pauseProducing())
    written = Written()
    producer = ReplayBodyProducer(BODY, written)
    done = producer.startProducing(consumer)
    assert consumer.writes == 1
    assert written.calls == 0 and not done.called
    while not done.called:
        before = consumer.writes
        producer.resumeProducing()
        assert consumer.writes == before + 1
    assert bytes(consumer.data) == BODY
    assert written.calls == 1


def test_on_written_fires_once_even_when_resumed_after_the_end() -> None:
    """Extra resumes after the last byte write nothing and never call on_written again."""
    consumer, written = RecordingConsumer(), Written()
    producer = ReplayBodyProducer(BODY, written)
    producer.startProducing(consumer)
    producer.pauseProducing()
    producer.resumeProducing()
    producer.resumeProducing()
    assert written.calls == 1
    assert bytes(consumer.data) == BODY


def test_on_written_fires_after_the_last_byte() -> None:
    """on_written runs only once the consumer holds the whole body."""
    consumer = RecordingConsumer()
    seen: list[int] = []
    ReplayBodyProducer(BODY, lambda: seen.append(len(consumer.data))).startProducing(consumer)
    assert seen == [len(BODY)]


def test_stop_while_paused_never_reports_written() -> None:
    """A stopped producer writes nothing more, never calls on_written and never fires done."""
    producer: ReplayBodyProducer
    consumer = RecordingConsumer(lambda _c: producer.pauseProducing())
    written = Written()
    producer = ReplayBodyProducer(BODY, written)
    done = producer.startProducing(consumer)
    producer.stopProducing()
    producer.resumeProducing()
    assert consumer.writes == 1
    assert written.calls == 0 and not done.called


def test_stop_during_the_last_write_never_reports_written() -> None:
    """stopProducing re-entered from the final write still suppresses on_written and done."""
    producer: ReplayBodyProducer
    small = b"x" * 10

    def stop_on_write(_c: RecordingConsumer) -> None:
        producer.stopProducing()

    consumer, written = RecordingConsumer(stop_on_write), Written()
    producer = ReplayBodyProducer(small, written)
    done = producer.startProducing(consumer)
    assert bytes(consumer.data) == small
    assert written.calls == 0 and not done.called


def test_empty_body_is_written_at_once() -> None:
    """A zero-length body reports written as soon as production starts."""
    consumer, written = RecordingConsumer(), Written()
    producer = ReplayBodyProducer(b"", written)
    done = producer.startProducing(consumer)
    assert producer.length == 0
    assert consumer.writes == 0
    assert written.calls == 1 and done.called


# ---- is_cancellation / describe_failure ---------------------------------------------------------


def wrapped(kind: type[Any], reason: BaseException) -> Failure:
    return Failure(kind([Failure(reason)]))


@pytest.mark.parametrize(
    "failure",
    [
        Failure(CancelledError()),
        Failure(ConnectingCancelledError(IPv4Address("TCP", "127.0.0.1", 1))),
        wrapped(ResponseNeverReceived, CancelledError()),
        wrapped(RequestGenerationFailed, CancelledError()),
        wrapped(ResponseFailed, CancelledError()),
        Failure(
            ResponseFailed([Failure(ConnectionLost()), wrapped(ResponseFailed, CancelledError())])
        ),
    ],
    ids=["bare", "connecting", "waiting", "transmitting", "body", "nested"],
)
def test_wrapped_cancellations_are_recognised(failure: Failure) -> None:
    """Cancellation is found bare, while connecting, and inside Twisted's wrapper failures."""
    assert is_cancellation(failure)


@pytest.mark.parametrize(
    "failure",
    [
        Failure(ConnectionRefusedError()),
        wrapped(ResponseNeverReceived, ConnectionLost()),
        wrapped(ResponseFailed, ConnectionDone()),
        Failure(HeaderTimeout("no response headers within 0.4s")),
        Failure(FirstBodyTimeout("no response body within 1s")),
    ],
    ids=["refused", "lost", "done", "header-timeout", "first-body-timeout"],
)
def test_upstream_faults_are_not_cancellations(failure: Failure) -> None:
    """Upstream faults and our own stall timeouts are not the caller going away."""
    assert not is_cancellation(failure)


def test_describe_failure_names_the_wrapped_reasons() -> None:
    """Wrapper failures are described by their inner reasons; timeouts by their message."""
    assert describe_failure(Failure(HeaderTimeout("no response headers within 0.4s"))) == (
        "no response headers within 0.4s"
    )
    text = describe_failure(wrapped(ResponseNeverReceived, ConnectionLost("reset")))
    assert text.startswith("ResponseNeverReceived(ConnectionLost")
    assert describe_failure(Failure(CancelledError())) == "CancelledError"


def test_describe_failure_leaves_out_raw_protocol_bytes() -> None:
    """A parse error carrying the upstream's raw bytes is described by its reason only."""
    from twisted.web._newclient import ParseError

    failure = wrapped(ResponseFailed, ParseError("wrong number of parts", SECRET.encode()))
    text = describe_failure(failure)
    assert "wrong number of parts" in text
    assert SECRET not in text


# ---- the header deadline over loopback ----------------------------------------------------------


CLIENTS = ["native", "twisted"]
"""The two agents of the upstream hop (``--upstream-client``): every loopback test runs on both."""


@pytest.fixture(params=CLIENTS)
def client_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def agent_for(
    kind: str, reactor: Any, endpoints: IAgentEndpointFactory
) -> tuple[IAgent, Callable[[], Deferred[None]]]:
    """The agent of ``kind`` over ``endpoints`` and how to close its idle connections."""
    if kind == "native":
        native = NodeAgent(reactor, endpoints)
        return native, native.close
    pool = make_pool(reactor)
    return Agent.usingEndpointFactory(reactor, endpoints, pool=pool), pool.closeCachedConnections


@pytest_twisted.async_yield_fixture()
async def upstream(reactor: Any, client_kind: str) -> AsyncIterator[UpstreamClient]:
    """An UpstreamClient over its own agent (each kind), idle connections closed after the test."""
    if client_kind == "twisted":
        pool = make_pool(reactor)
        yield UpstreamClient(reactor, pool, connect_timeout=5.0)
        await pool.closeCachedConnections()
        return
    agent, close = agent_for(client_kind, reactor, NodeEndpointFactory(reactor, 5.0))
    yield UpstreamClient.from_agent(agent, reactor)
    await close()


@implementer(IStreamClientEndpoint)
class SlowEndpoint:
    """Waits ``delay`` seconds before dialling (a slow network or TLS setup)."""

    def __init__(self, reactor: Any, delay: float, inner: IStreamClientEndpoint) -> None:
        self._reactor, self._delay, self._inner = reactor, delay, inner

    def connect(self, factory: Any) -> Deferred[Any]:
        return deferLater(self._reactor, self._delay, self._inner.connect, factory)


@implementer(IAgentEndpointFactory)
class SlowConnects:
    """Endpoints whose connect takes ``delay`` seconds before the real dial."""

    def __init__(self, reactor: Any, delay: float) -> None:
        self._reactor, self._delay = reactor, delay

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        inner = TCP4ClientEndpoint(self._reactor, uri.host.decode(), uri.port)
        return SlowEndpoint(self._reactor, self._delay, inner)


class Scripted(Resource):
    """An upstream whose every request does one scripted thing; records how each request ended."""

    isLeaf = True

    def __init__(self, reactor: Any, mode: str) -> None:
        super().__init__()
        self._reactor, self._mode = reactor, mode
        self.finished: list[Deferred[None]] = []

    def render(self, request: Request) -> int:  # type: ignore[override]
        self.finished.append(request.notifyFinish())
        if self._mode == "headers-only":
            request.write(b"")
        elif self._mode == "late-empty":
            request.write(b"")
            self._reactor.callLater(0.05, request.finish)
        return NOT_DONE_YET


def url(port: int, path: bytes = b"/api/chat") -> bytes:
    return b"http://127.0.0.1:%d%s" % (port, path)


async def connection_closed(reactor: Any, finished: Deferred[None]) -> None:
    """Wait (bounded) for the upstream's request to see its connection lost."""
    with pytest.raises((ConnectionLost, ConnectionDone)):
        await finished.addTimeout(5, reactor)


@pytest_twisted.ensureDeferred
async def test_header_deadline_excludes_a_slow_connect(
    reactor: Any, upstream: UpstreamClient, client_kind: str
) -> None:
    """Behind a 0.6 s connect, a 0.4 s header deadline still gets the answer, which a 0.4 s
    timeout counted from the call misses."""
    handle = await start_engine(reactor, SimulatedEngine(reactor, header_delay=0.1))
    try:
        upstream.agent, close = agent_for(client_kind, reactor, SlowConnects(reactor, 0.6))
        target = handle.url.encode() + b"/api/chat"

        control = upstream.agent.request(
            b"POST", target, Headers(), ReplayBodyProducer(BODY, lambda: None)
        )
        control.addTimeout(0.4, reactor)
        with pytest.raises(DeferredTimeoutError):
            await control

        started = reactor.seconds()
        written: list[float] = []
        response = await upstream.request(
            b"POST",
            target,
            Headers(),
            BODY,
            0.4,
            on_written=lambda: written.append(reactor.seconds()),
        )
        content = await treq.content(response)
        await close()
    finally:
        await handle.stop()
    assert response.code == 200 and b"hello" in content
    assert written[0] - started >= 0.6
    assert [r.body for r in handle.engine.received] == [BODY]


@pytest_twisted.ensureDeferred
async def test_silent_server_gets_header_timeout_and_a_closed_connection(
    reactor: Any, upstream: UpstreamClient, listen: Callable[[Any], int]
) -> None:
    """No headers within the deadline: HeaderTimeout (caused by the cancelled wait), the server's
    request sees its connection lost, and on_written ran exactly once."""
    silent = Scripted(reactor, "silent")
    port = listen(Site(silent))
    written = Written()
    started = reactor.seconds()
    attempt = upstream.request(b"POST", url(port), Headers(), BODY, 0.2, on_written=written)
    with pytest.raises(HeaderTimeout) as raised:
        await attempt.addTimeout(5, reactor)
    assert reactor.seconds() - started < 4  # our deadline fired, not the test's 5 s guard
    assert isinstance(raised.value.__cause__, ResponseNeverReceived)
    assert is_cancellation(Failure(raised.value.__cause__))
    assert SECRET not in describe_failure(Failure(raised.value))
    assert written.calls == 1
    [finished] = silent.finished
    await connection_closed(reactor, finished)


class TimersSeen:
    """The reactor, keeping every timer scheduled through it."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self.timers: list[DelayedCall] = []

    def callLater(self, delay: float, f: Callable[..., Any], *a: Any, **kw: Any) -> DelayedCall:
        call: DelayedCall = self._reactor.callLater(delay, f, *a, **kw)
        self.timers.append(call)
        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)


@pytest_twisted.ensureDeferred
async def test_refused_connect_fails_fast_with_connect_error(
    reactor: Any, client_kind: str
) -> None:
    """A refused IP-literal dial is a ConnectError before any timer fires (no 0.3 s happy-eyeballs
    wait, no connect timeout), and the header deadline is never armed."""
    port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
    number = port.getHost().port
    await port.stopListening()
    seen = cast(IProxyReactor, TimersSeen(reactor))
    agent, close = agent_for(client_kind, seen, NodeEndpointFactory(seen, 5.0))
    upstream = UpstreamClient.from_agent(agent, seen)
    written = Written()
    try:
        with pytest.raises(ConnectError):
            await upstream.request(b"POST", url(number), Headers(), BODY, 5.0, on_written=written)
    finally:
        await close()
    assert [call for call in cast(TimersSeen, seen).timers if call.called] == []
    assert written.calls == 0


@pytest_twisted.ensureDeferred
async def test_cancelling_a_waiting_attempt_is_a_cancellation(
    reactor: Any, upstream: UpstreamClient, listen: Callable[[Any], int]
) -> None:
    """The caller cancelling while headers are awaited yields a wrapped cancellation, not a
    HeaderTimeout, and the upstream connection is closed."""
    silent = Scripted(reactor, "silent")
    port = listen(Site(silent))
    attempt = upstream.request(b"POST", url(port), Headers(), BODY, 5.0)
    await eventually(reactor, lambda: silent.finished, what="the request at the silent node")
    attempt.cancel()
    with pytest.raises(ResponseNeverReceived) as raised:
        await attempt
    assert is_cancellation(Failure(raised.value))
    await connection_closed(reactor, silent.finished[0])


@pytest_twisted.ensureDeferred
async def test_garbage_response_is_described_without_its_bytes(
    reactor: Any, upstream: UpstreamClient, listen: Callable[[Any], int]
) -> None:
    """A non-HTTP answer echoing the prompt fails the attempt; the description carries no prompt."""

    class Echo(Protocol):
        def dataReceived(self, data: bytes) -> None:
            assert self.transport is not None
            self.transport.write(SECRET.encode() + b" is not a status line\r\n\r\n")
            self.transport.loseConnection()

    port = listen(Factory.forProtocol(Echo))
    with pytest.raises(ResponseFailed) as raised:
        await upstream.request(b"POST", url(port), Headers(), BODY, 5.0)
    text = describe_failure(Failure(raised.value))
    assert text.startswith("ResponseFailed(")
    assert SECRET not in text


# ---- The header deadline on a clock: cold-load allowance and busy waits (docs/behaviour.md §6.4) ----------


@implementer(IAgent)
class SilentAgent:
    """Writes the whole body at once, then answers only when the test calls :meth:`answer`."""

    def __init__(self) -> None:
        self.pending: list[Deferred[IResponse]] = []

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        assert bodyProducer is not None
        bodyProducer.startProducing(RecordingConsumer())
        waiting: Deferred[IResponse] = Deferred()
        self.pending.append(waiting)
        return waiting

    def answer(self) -> None:
        self.pending[-1].callback(cast(IResponse, object()))


class Busy:
    """A BusyWait whose ``working()`` answers from a list, one value per expiry."""

    def __init__(self, answers: list[bool], max_wait: float) -> None:
        self.answers = answers
        self.waits = 0
        self.rule = BusyWait(self.working, max_wait, self.waited)

    def working(self) -> bool:
        return self.answers.pop(0) if self.answers else False

    def waited(self) -> None:
        self.waits += 1


def silent_attempt(
    first_extra: float = 0.0, busy: Busy | None = None
) -> tuple[Clock, SilentAgent, list[IResponse | Failure]]:
    clock = Clock()
    agent = SilentAgent()
    client = UpstreamClient.from_agent(agent, clock)
    outcome: list[IResponse | Failure] = []
    client.request(
        b"POST",
        b"http://127.0.0.1:1001/api/chat",
        Headers(),
        BODY,
        30.0,
        first_extra=first_extra,
        busy=busy.rule if busy is not None else None,
    ).addBoth(outcome.append)
    return clock, agent, outcome


def test_first_extra_lengthens_the_first_deadline_exactly() -> None:
    """A 45 s allowance: the deadline fires at exactly 75 s and says so."""
    clock, _, outcome = silent_attempt(first_extra=45.0)
    [deadline] = clock.getDelayedCalls()
    assert deadline.getTime() == 75.0
    clock.advance(75.0 - 2**-10)
    assert outcome == []
    clock.advance(2**-10)
    [failure] = outcome
    assert isinstance(failure, Failure) and failure.check(HeaderTimeout)
    assert str(failure.value) == "no response headers within 75s"


def test_busy_wait_rearms_each_period_while_working_then_times_out() -> None:
    """working() true twice: re-armed at 30 and 60 (two waits), then a timeout at 90."""
    busy = Busy([True, True], max_wait=1000.0)
    clock, _, outcome = silent_attempt(busy=busy)
    clock.advance(30.0)
    assert busy.waits == 1 and [c.getTime() for c in clock.getDelayedCalls()] == [60.0]
    clock.advance(30.0)
    assert busy.waits == 2 and outcome == []
    clock.advance(30.0)
    [failure] = outcome
    assert isinstance(failure, Failure) and str(failure.value) == "no response headers within 90s"
    assert busy.waits == 2 and clock.getDelayedCalls() == []


def test_busy_wait_never_exceeds_max_wait() -> None:
    """Always working, max_wait 45 s: waits of 30 s and 15 s, then a timeout at exactly 75 s."""
    busy = Busy([True] * 10, max_wait=45.0)
    clock, _, outcome = silent_attempt(busy=busy)
    clock.advance(30.0)
    clock.advance(30.0)
    assert busy.waits == 2 and [c.getTime() for c in clock.getDelayedCalls()] == [75.0]
    clock.advance(15.0 - 2**-10)
    assert outcome == []
    clock.advance(2**-10)
    [failure] = outcome
    assert isinstance(failure, Failure) and str(failure.value) == "no response headers within 75s"
    assert busy.waits == 2


def test_zero_max_wait_never_asks_and_times_out_at_the_deadline() -> None:
    """busy_max_wait 0 is the seed's rule: the first expiry is the timeout."""
    busy = Busy([True], max_wait=0.0)
    clock, _, outcome = silent_attempt(busy=busy)
    clock.advance(30.0)
    assert len(outcome) == 1 and busy.waits == 0 and busy.answers == [True]


def test_headers_during_a_busy_wait_cancel_the_rearmed_timer() -> None:
    """The answer arrives in the second period: it is delivered and no timer is left."""
    busy = Busy([True], max_wait=1000.0)
    clock, agent, outcome = silent_attempt(busy=busy)
    clock.advance(45.0)
    agent.answer()
    assert len(outcome) == 1 and not isinstance(outcome[0], Failure)
    assert clock.getDelayedCalls() == []


# ---- BodyGate with a clock ----------------------------------------------------------------------

DONE = Failure(ResponseDone())
DROPPED = Failure(ResponseFailed([Failure(ConnectionLost())]))


def failure_of(deferred: Deferred[Any]) -> Failure:
    """The failure a Deferred has already failed with (consumed, so it is not reported)."""
    failures: list[Failure] = []
    deferred.addErrback(failures.append)
    [failure] = failures
    return failure


def gate_on(clock: Clock, timeout: float = 0.0) -> tuple[BodyGate, StringTransport]:
    gate = BodyGate(clock, timeout)
    transport = StringTransport()
    gate.makeConnection(transport)
    return gate, transport


def test_first_chunk_is_held_until_relay_starts() -> None:
    """The first chunk fires ``first``; later chunks wait, in order, until start_relay."""
    clock = Clock()
    gate, _ = gate_on(clock)
    sink: list[bytes] = []
    gate.dataReceived(b"")
    gate.dataReceived(b"one")
    gate.dataReceived(b"two")
    gate.dataReceived(b"three")
    assert gate.first.result == b"one"
    assert not gate.done.called
    gate.start_relay(sink.append)
    assert sink == [b"two", b"three"]
    gate.dataReceived(b"four")
    assert sink == [b"two", b"three", b"four"]
    gate.connectionLost(DONE)
    assert gate.done.called and gate.done.result is BodyEnd.COMPLETE


@pytest.mark.parametrize(
    ("reason", "end"),
    [(DONE, BodyEnd.COMPLETE), (Failure(PotentialDataLoss()), BodyEnd.CLOSED)],
    ids=["done", "close"],
)
def test_clean_empty_end_fires_first_with_empty_bytes(reason: Failure, end: BodyEnd) -> None:
    """A body that ends cleanly before any byte commits as empty; done then fires at once with
    how the framing ended (a close-delimited end is CLOSED: the framing cannot say complete)."""
    gate, _ = gate_on(Clock(), 5.0)
    gate.connectionLost(reason)
    assert gate.first.result == b""
    sink: list[bytes] = []
    gate.start_relay(sink.append)
    assert sink == [] and gate.done.called and gate.done.result is end


def test_empty_end_is_stored_before_first_fires() -> None:
    """A caller that starts the relay from inside ``first``'s callback still sees the end."""
    gate, _ = gate_on(Clock())
    sink: list[bytes] = []
    gate.first.addCallback(lambda _: gate.start_relay(sink.append))
    gate.connectionLost(DONE)
    assert gate.done.called


def test_enabled_first_body_timer_closes_the_upstream() -> None:
    """Headers then silence past the budget: the upstream is stopped and ``first`` fails with
    FirstBodyTimeout whatever reason the closed transport reports."""
    for reason in (DROPPED, Failure(PotentialDataLoss()), DONE):
        clock = Clock()
        gate, transport = gate_on(clock, 2.0)
        clock.advance(1.999)
        assert transport.producerState == "producing"
        clock.advance(0.001)
        assert transport.producerState == "stopped"
        gate.connectionLost(reason)
        assert failure_of(gate.first).check(FirstBodyTimeout)
        assert clock.getDelayedCalls() == []


def test_first_chunk_disarms_the_timer() -> None:
    """A body byte before the budget cancels the first-body timer."""
    clock = Clock()
    gate, transport = gate_on(clock, 2.0)
    gate.dataReceived(b"x")
    assert clock.getDelayedCalls() == []
    clock.advance(10)
    assert transport.producerState == "producing"


def test_disabled_first_body_timer_arms_nothing() -> None:
    """A zero budget (the default) schedules no timer at all."""
    clock = Clock()
    gate, transport = gate_on(clock, 0.0)
    assert clock.getDelayedCalls() == []
    clock.advance(3600)
    assert transport.producerState == "producing"
    assert not gate.first.called


def test_drop_before_first_byte_fails_first() -> None:
    """Headers then a dropped connection is a transport failure, not a commit."""
    gate, _ = gate_on(Clock(), 0.0)
    gate.connectionLost(DROPPED)
    assert failure_of(gate.first).check(ResponseFailed)


@pytest.mark.parametrize("relay_first", [True, False], ids=["while-relaying", "before-relay"])
def test_drop_after_the_first_chunk_fails_done(relay_first: bool) -> None:
    """After the first chunk a drop errbacks ``done``, whether the relay had started or not."""
    gate, _ = gate_on(Clock())
    sink: list[bytes] = []
    gate.dataReceived(b"one")
    if relay_first:
        gate.start_relay(sink.append)
    gate.connectionLost(DROPPED)
    if not relay_first:
        gate.start_relay(sink.append)
    assert failure_of(gate.done).check(ResponseFailed)
    assert gate.first.result == b"one"


def test_on_bytes_is_called_for_every_non_empty_chunk_in_every_state() -> None:
    """The progress callback sees the first chunk, held chunks and relayed chunks; not b""."""
    touched: list[int] = []
    gate = BodyGate(Clock(), 0.0, lambda: touched.append(1))
    gate.makeConnection(StringTransport())
    gate.dataReceived(b"")
    gate.dataReceived(b"first")
    gate.dataReceived(b"held")
    assert len(touched) == 2
    gate.start_relay(lambda chunk: None)
    gate.dataReceived(b"relayed")
    gate.dataReceived(b"")
    assert len(touched) == 3


def test_pass_through_relays_everything_and_finishes() -> None:
    """start_relay before any data (commit on headers): every chunk goes straight to the sink."""
    gate = BodyGate(Clock(), 0.0)
    sink: list[bytes] = []
    gate.start_relay(sink.append)
    gate.makeConnection(StringTransport())
    gate.dataReceived(b"a")
    gate.dataReceived(b"b")
    gate.connectionLost(DONE)
    assert sink == [b"a", b"b"]
    assert gate.done.called and gate.done.result is BodyEnd.COMPLETE
    assert not gate.first.called


def test_stop_closes_the_upstream_and_disarms() -> None:
    """stop() (caller gone) stops the upstream transport and cancels the timer."""
    clock = Clock()
    gate, transport = gate_on(clock, 5.0)
    gate.stop()
    assert transport.producerState == "stopped"
    assert clock.getDelayedCalls() == []


def test_producer_is_the_upstream_transport() -> None:
    """producer() exposes the upstream socket for pausing."""
    gate, transport = gate_on(Clock())
    gate.producer().pauseProducing()
    assert transport.producerState == "paused"


def test_discard_closes_the_connection_at_once() -> None:
    """An unwanted response body is not read: the transport is stopped on connect."""
    transport = StringTransport()
    Discard().makeConnection(transport)
    assert transport.producerState == "stopped"


# ---- BodyGate over loopback ---------------------------------------------------------------------


async def gate_for(
    reactor: Any, upstream: UpstreamClient, target: bytes, timeout: float
) -> BodyGate:
    response = await upstream.request(b"POST", target, Headers(), BODY, 5.0)
    gate = BodyGate(reactor, timeout)
    response.deliverBody(gate)
    return gate


async def relay_all(reactor: Any, gate: BodyGate) -> tuple[bytes, list[bytes]]:
    """Await the first chunk, start the relay at once (as the facade does) and wait for the end."""
    first = await gate.first
    sink: list[bytes] = []
    gate.start_relay(sink.append)
    await gate.done.addTimeout(5, reactor)
    return first, sink


@pytest_twisted.ensureDeferred
async def test_content_length_zero_commits_empty(reactor: Any, upstream: UpstreamClient) -> None:
    """``Content-Length: 0`` fires ``first`` with b"" and finishes cleanly."""
    handle = await start_engine(
        reactor, SimulatedEngine(reactor, policy=always(Behaviour.EMPTY_200))
    )
    try:
        gate = await gate_for(reactor, upstream, handle.url.encode() + b"/api/chat", 0.0)
        assert await relay_all(reactor, gate) == (b"", [])
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_chunked_empty_body_with_late_terminator_commits_empty(
    reactor: Any, upstream: UpstreamClient, listen: Callable[[Any], int]
) -> None:
    """A chunked body whose terminator comes 50 ms after the headers is a clean empty answer."""
    port = listen(Site(Scripted(reactor, "late-empty")))
    gate = await gate_for(reactor, upstream, url(port), 0.0)
    assert await relay_all(reactor, gate) == (b"", [])


@pytest_twisted.ensureDeferred
async def test_first_body_timeout_over_a_socket_closes_the_upstream(
    reactor: Any, upstream: UpstreamClient, listen: Callable[[Any], int]
) -> None:
    """Headers then silence past an enabled budget: FirstBodyTimeout and the upstream connection
    is closed."""
    scripted = Scripted(reactor, "headers-only")
    port = listen(Site(scripted))
    gate = await gate_for(reactor, upstream, url(port), 0.2)
    with pytest.raises(FirstBodyTimeout):
        await gate.first
    await connection_closed(reactor, scripted.finished[0])


@pytest_twisted.ensureDeferred
async def test_first_body_timeout_on_a_close_delimited_body_is_not_an_empty_commit(
    reactor: Any, upstream: UpstreamClient, listen: Callable[[Any], int]
) -> None:
    """A body framed by connection close ends with PotentialDataLoss when we cut it: that is
    still a first-body timeout, never a clean empty answer."""
    closed: Deferred[None] = Deferred()

    class HeadersThenSilence(Protocol):
        answered = False

        def dataReceived(self, data: bytes) -> None:
            assert self.transport is not None
            if not self.answered:
                self.answered = True
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")

        def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
            closed.callback(None)

    port = listen(Factory.forProtocol(HeadersThenSilence))
    gate = await gate_for(reactor, upstream, url(port), 0.2)
    with pytest.raises(FirstBodyTimeout):
        await gate.first
    await closed.addTimeout(5, reactor)


@pytest_twisted.ensureDeferred
async def test_pass_through_gate_relays_a_whole_stream(
    reactor: Any, upstream: UpstreamClient
) -> None:
    """Commit on headers: start_relay before deliverBody relays every byte and finishes."""
    engine = SimulatedEngine(reactor, chunks=5)
    handle = await start_engine(reactor, engine)
    try:
        response = await upstream.request(
            b"POST", handle.url.encode() + b"/api/chat", Headers(), b'{"model":"m"}', 5.0
        )
        gate = BodyGate(reactor, 0.0)
        sink: list[bytes] = []
        gate.start_relay(sink.append)
        response.deliverBody(gate)
        await gate.done.addTimeout(5, reactor)
    finally:
        await handle.stop()
    lines = b"".join(sink).splitlines()
    assert len(lines) == 6
    assert json.loads(lines[-1])["done"] is True


# ---- endpoints and URLs -------------------------------------------------------------------------


@implementer(IHostResolution)
class _Resolution:
    def __init__(self, name: str) -> None:
        self.name = name

    def cancel(self) -> None:
        pass


@implementer(IHostnameResolver)
class _LoopbackResolver:
    """Resolves every name to 127.0.0.1 at once."""

    def resolveHostName(
        self,
        resolutionReceiver: IResolutionReceiver,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Any = None,
        transportSemantics: str = "TCP",
    ) -> IHostResolution:
        resolution = _Resolution(hostName)
        resolutionReceiver.resolutionBegan(resolution)
        resolutionReceiver.addressResolved(IPv4Address("TCP", "127.0.0.1", portNumber))
        resolutionReceiver.resolutionComplete()
        return resolution


@implementer(IReactorPluggableNameResolver)
class ResolvingMemoryReactor(MemoryReactorClock):
    """A memory reactor whose name resolver answers 127.0.0.1 for every name."""

    def __init__(self) -> None:
        super().__init__()
        self.nameResolver: IHostnameResolver = _LoopbackResolver()

    def installNameResolver(self, resolver: IHostnameResolver) -> IHostnameResolver:
        previous, self.nameResolver = self.nameResolver, resolver
        return previous


def dial(node: bytes) -> tuple[IStreamClientEndpoint, tuple[Any, ...], bytes]:
    """Connect a node URL's endpoint on a memory reactor; the dial and the first bytes sent."""
    reactor = ResolvingMemoryReactor()
    endpoint = NodeEndpointFactory(cast(IProxyReactor, reactor), 7.0).endpointForURI(
        URI.fromBytes(node)
    )
    endpoint.connect(Factory.forProtocol(Protocol))
    [dialled] = reactor.tcpClients
    _host, port, factory, _timeout, _bind = dialled
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
    assert protocol is not None
    transport = StringTransport()
    protocol.makeConnection(transport)
    return endpoint, dialled, transport.value()


@pytest.mark.parametrize(
    ("node", "kind", "host"),
    [
        (b"http://127.0.0.1:11434/", TCP4ClientEndpoint, "127.0.0.1"),
        (b"http://[::1]:11434/", TCP6ClientEndpoint, "::1"),
        (b"http://gpu-box.local:11434/", HostnameEndpoint, "127.0.0.1"),
    ],
    ids=["ipv4", "ipv6", "name"],
)
def test_node_endpoints_by_address_kind(node: bytes, kind: type[Any], host: str) -> None:
    """IP literals dial directly (TCP4/TCP6), names through HostnameEndpoint; all with the connect
    timeout and the URL's port; plain http sends nothing before the request."""
    endpoint, (dialled_host, port, _f, timeout, _b), first_bytes = dial(node)
    assert isinstance(endpoint, kind)
    assert (dialled_host, port, timeout) == (host, 11434, 7.0)
    assert first_bytes == b""


@pytest.mark.parametrize(
    ("node", "sni"),
    [(b"https://gpu-box.example:8443/", True), (b"https://127.0.0.1:8443/", False)],
    ids=["name", "ipv4"],
)
def test_https_nodes_are_wrapped_in_tls(node: bytes, sni: bool) -> None:
    """https starts a TLS handshake on connect, naming the host (SNI) when it is a name."""
    endpoint, (_h, port, _f, timeout, _b), first_bytes = dial(node)
    assert not isinstance(endpoint, TCP4ClientEndpoint | HostnameEndpoint)
    assert (port, timeout) == (8443, 7.0)
    assert first_bytes[:1] == b"\x16"  # a TLS handshake record (ClientHello)
    assert (b"gpu-box.example" in first_bytes) is sni


class Hello(Resource):
    """Answers every GET with a short body."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        return b"hello"


async def _pooled_request_log(reactor: Any, pool: HTTPConnectionPool, port: int) -> list[str]:
    """Every line logged while one request goes through ``pool`` and the pool is closed."""
    events: list[LogEvent] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    try:
        response = await Agent(reactor, pool=pool).request(b"GET", url(port, b"/"))
        assert await treq.content(response) == b"hello"
        await pool.closeCachedConnections()
        # The client factory is stopped after the protocol's connectionLost, in the same call
        # stack that fired closeCachedConnections: one reactor turn later it has certainly run.
        await deferLater(reactor, 0, lambda: None)
    finally:
        globalLogPublisher.removeObserver(observer)
    return [formatEvent(e) for e in events]


@pytest_twisted.ensureDeferred
async def test_pooled_connections_log_no_factory_start_or_stop(
    reactor: Any, listen: Callable[[Any], int]
) -> None:
    """Twisted's pool logs "Starting/Stopping factory" per connection; ours (one per poll) does not."""
    port = listen(Site(Hello()))
    plain = await _pooled_request_log(reactor, HTTPConnectionPool(reactor), port)
    assert any(line.startswith("Starting factory _HTTP11ClientFactory") for line in plain)
    assert any(line.startswith("Stopping factory _HTTP11ClientFactory") for line in plain)
    ours = await _pooled_request_log(reactor, make_pool(cast(IProxyReactor, reactor)), port)
    assert [line for line in ours if "_HTTP11ClientFactory" in line] == []


@pytest.mark.parametrize(
    ("base", "target", "expected"),
    [
        ("http://10.0.0.5:11434", b"/api/chat", b"http://10.0.0.5:11434/api/chat"),
        ("http://10.0.0.5:11434/", b"/api/chat?x=1", b"http://10.0.0.5:11434/api/chat?x=1"),
        ("https://gpu.example/ollama", b"/api/tags", b"https://gpu.example/ollama/api/tags"),
        ("https://gpu.example/a/b/", b"/v1/models", b"https://gpu.example/a/b/v1/models"),
        ("http://[::1]:1234/p", b"/x", b"http://[::1]:1234/p/x"),
    ],
)
def test_node_url_joins_base_prefix_and_target(base: str, target: bytes, expected: bytes) -> None:
    """The base URL's path prefix is kept, with exactly one slash before the client's target."""
    assert node_url(base, target) == expected


# ---- BodyGate's named states -------------------------------------------------------------------


def NOWHERE(chunk: bytes) -> None:
    """A sink that drops what it is given."""


def test_gate_states_walk_awaiting_holding_relaying_ended() -> None:
    """Each event moves the gate through its documented states, in order."""
    gate, _ = gate_on(Clock())
    states = [gate.state]
    gate.dataReceived(b"one")
    states.append(gate.state)
    gate.start_relay(NOWHERE)
    states.append(gate.state)
    gate.connectionLost(DONE)
    states.append(gate.state)
    assert states == [
        GateState.AWAITING_FIRST,
        GateState.HOLDING,
        GateState.RELAYING,
        GateState.ENDED,
    ]


def test_pass_through_goes_from_awaiting_straight_to_relaying() -> None:
    """A commit on headers starts the relay before any byte: AWAITING_FIRST -> RELAYING."""
    gate, _ = gate_on(Clock())
    gate.start_relay(NOWHERE)
    assert gate.state is GateState.RELAYING and not gate.first.called


def test_a_drop_before_the_first_byte_ends_the_gate() -> None:
    """AWAITING_FIRST -> ENDED on a dropped body; committing afterwards is illegal."""
    gate, _ = gate_on(Clock())
    gate.connectionLost(DROPPED)
    failure_of(gate.first)
    assert gate.state is GateState.ENDED
    with pytest.raises(IllegalCall, match="ended"):
        gate.start_relay(NOWHERE)


def test_starting_the_relay_twice_is_illegal() -> None:
    """start_relay in RELAYING (or ENDED) raises instead of relaying twice."""
    gate, _ = gate_on(Clock())
    gate.dataReceived(b"one")
    gate.start_relay(NOWHERE)
    with pytest.raises(IllegalCall, match="relaying"):
        gate.start_relay(NOWHERE)
    gate.connectionLost(DONE)
    with pytest.raises(IllegalCall, match="ended"):
        gate.start_relay(NOWHERE)


def test_a_close_delimited_end_is_reported_as_closed_not_complete() -> None:
    """PotentialDataLoss while relaying ends with BodyEnd.CLOSED: the framing cannot vouch."""
    gate, _ = gate_on(Clock())
    gate.dataReceived(b"one")
    gate.start_relay(NOWHERE)
    gate.connectionLost(Failure(PotentialDataLoss()))
    assert gate.done.result is BodyEnd.CLOSED


# ---- pinned details (mutation testing: docs/testing.md) -----------------------------------------


def test_describe_failure_text() -> None:
    """Wrapped reasons are joined with ", "; a plain failure is ``Name: message``; string args
    around raw bytes are kept, joined with ", "."""
    assert (
        describe_failure(
            Failure(ResponseNeverReceived([Failure(ValueError("one")), Failure(KeyError("k"))]))
        )
        == "ResponseNeverReceived(ValueError: one, KeyError: 'k')"
    )
    assert describe_failure(Failure(ValueError("bad thing "))) == "ValueError: bad thing"
    assert describe_failure(Failure(ValueError("first", SECRET.encode(), "second"))) == (
        "ValueError: first, second"
    )
    assert describe_failure(Failure(ValueError())) == "ValueError"


def test_resume_before_start_does_nothing() -> None:
    """A resume that arrives before the body was started writes nothing and reports nothing."""
    written = Written()
    producer = ReplayBodyProducer(b"abc", written)
    producer.resumeProducing()
    assert written.calls == 0
    consumer = RecordingConsumer()
    producer.startProducing(consumer)
    assert (bytes(consumer.data), written.calls) == (b"abc", 1)


def test_endpoints_are_made_once_per_scheme_host_and_port() -> None:
    """The factory reuses a node's endpoint; another scheme, host or port gets its own."""
    factory = NodeEndpointFactory(cast(IProxyReactor, MemoryReactorClock()), 7.0)
    first = factory.endpointForURI(URI.fromBytes(b"http://127.0.0.1:11434/api/chat"))
    assert factory.endpointForURI(URI.fromBytes(b"http://127.0.0.1:11434/api/tags")) is first
    others = [
        factory.endpointForURI(URI.fromBytes(node))
        for node in (
            b"http://127.0.0.1:11435/",
            b"http://127.0.0.2:11434/",
            b"https://127.0.0.1:11434/",
        )
    ]
    assert len({id(endpoint) for endpoint in [first, *others]}) == 4


class _Quiescent(Protocol):
    """A pooled HTTP connection with no request in flight (as the pool sees one)."""

    state = "QUIESCENT"


def test_pool_keeps_connections_for_four_idle_seconds_without_retries() -> None:
    """The shared pool is persistent (32 per host), never retries on its own, and drops an idle
    connection after 4 s on the clock it was given."""
    clock = Clock()
    pool = make_pool(clock)
    assert pool.persistent is True
    assert not pool.retryAutomatically
    assert (pool.maxPersistentPerHost, pool.cachedConnectionTimeout) == (32, 4)
    idle = _Quiescent()
    transport = StringTransport()
    idle.makeConnection(transport)
    pool._putConnection(("http", b"n0", 11434), idle)  # what a finished response does
    [expiry] = clock.getDelayedCalls()
    assert expiry.getTime() == 4
    clock.advance(4)
    assert transport.disconnecting


@pytest.mark.parametrize("client_kind", CLIENTS)
def test_upstream_client_dials_with_the_connect_timeout_through_the_persistent_pool(
    client_kind: str,
) -> None:
    """``UpstreamClient`` dials a node with its connect timeout and keeps the connection open for
    reuse (its request does not ask for ``Connection: close``)."""
    reactor = ResolvingMemoryReactor()
    if client_kind == "twisted":
        client = UpstreamClient(cast(IProxyReactor, reactor), make_pool(reactor), 7.0)
    else:
        endpoints = NodeEndpointFactory(cast(IProxyReactor, reactor), 7.0)
        agent, _close = agent_for(client_kind, reactor, endpoints)
        client = UpstreamClient.from_agent(agent, reactor)
    attempt = client.request(b"POST", url(11434), Headers(), b"{}", 30.0)
    [(host, port, factory, timeout, _bind)] = reactor.tcpClients
    assert (host, port, timeout) == ("127.0.0.1", 11434, 7.0)
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
    assert protocol is not None
    transport = StringTransport()
    protocol.makeConnection(transport)
    sent = transport.value().lower()
    assert sent.startswith(b"post /api/chat http/1.1\r\n")
    assert b"connection: close" not in sent
    attempt.cancel()
    failure_of(attempt)


@implementer(IAgent)
class WritingAgent:
    """Records each request and writes its body at once; never answers."""

    def __init__(self) -> None:
        self.headers: list[Headers | None] = []
        self.consumer = RecordingConsumer()

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[Any]:
        self.headers.append(headers)
        assert bodyProducer is not None
        bodyProducer.startProducing(self.consumer)
        return Deferred()


def test_header_timeout_on_a_clock_names_the_deadline() -> None:
    """Over any agent (``from_agent``): the headers are passed on, ``on_written`` runs after the
    body, and silence fails the attempt at the deadline with a HeaderTimeout naming it."""
    clock = Clock()
    agent = WritingAgent()
    client = UpstreamClient.from_agent(agent, clock)
    headers = Headers({b"content-type": [b"application/json"]})
    written = Written()
    attempt = client.request(b"POST", url(1), headers, b"{}", 30.0, on_written=written)
    assert agent.headers == [headers] and bytes(agent.consumer.data) == b"{}"
    assert written.calls == 1
    clock.advance(30)
    failure = failure_of(attempt)
    assert failure.check(HeaderTimeout)
    assert str(failure.value) == "no response headers within 30s"
    assert clock.getDelayedCalls() == []


def test_first_body_timeout_ends_the_gate_with_a_named_budget() -> None:
    """The first-body timer's failure names the budget, and the gate is ended."""
    clock = Clock()
    gate, _ = gate_on(clock, 2.5)
    clock.advance(2.5)
    gate.connectionLost(DROPPED)
    failure = failure_of(gate.first)
    assert str(failure.value) == "no response body within 2.5s"
    assert gate.state is GateState.ENDED


@implementer(IPolicyForHTTPS)
class RecordingPolicy:
    """The system trust store's policy, recording each ``(host, port)`` it is asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[bytes, int]] = []
        self._inner = BrowserLikePolicyForHTTPS()

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        self.asked.append((hostname, port))
        return self._inner.creatorForNetloc(hostname, port)


def test_https_endpoints_use_the_given_tls_policy() -> None:
    """A TLS policy handed to the factory (a node's own CA, say) is the one https nodes are
    dialled with, not the default trust store, and it is asked with the URL's host and port."""
    policy = RecordingPolicy()
    factory = NodeEndpointFactory(cast(IProxyReactor, ResolvingMemoryReactor()), 7.0, tls=policy)
    factory.endpointForURI(URI.fromBytes(b"https://gpu-box.example:8443/"))
    assert policy.asked == [(b"gpu-box.example", 8443)]
