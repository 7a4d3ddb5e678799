"""Tests for nvpair_tw.upstream._protocol: one node connection, driven over a
``StringTransport`` where the split of the reads is exact (framing edge cases, the states)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IConsumer, IPushProducer
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.client import (
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss, _DataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IClientRequest, IResponse
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair_tw.core import IllegalCall
from nvpair_tw.upstream._http1 import BadResponse
from nvpair_tw.upstream._protocol import (
    TRANSITIONS,
    ClientEvent,
    ClientRequest,
    ClientState,
    NodeClientProtocol,
)
from tests.upstream.scripted import (
    CHUNKED_HEAD,
    Collect,
    StuckProducer,
    chunked_streams,
    length_reply,
    split,
)

# ---- states -------------------------------------------------------------------------------------


def connected() -> tuple[NodeClientProtocol, StringTransport, list[NodeClientProtocol]]:
    released: list[NodeClientProtocol] = []
    protocol = NodeClientProtocol(released.append, lambda p: None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, released


def send(protocol: NodeClientProtocol, method: bytes = b"GET") -> Deferred[IResponse]:
    request = ClientRequest(method, b"http://n/", Headers())
    return protocol.request(b"%s / HTTP/1.1\r\nHost: n\r\n\r\n" % method, request, None, True)


def state_of(protocol: NodeClientProtocol) -> ClientState:
    return protocol.state  # read afresh (mypy would keep the narrowed value of the property)


def test_states_walk_idle_awaiting_body_and_back_to_idle() -> None:
    protocol, transport, released = connected()
    assert state_of(protocol) is ClientState.IDLE
    responses: list[IResponse] = []
    send(protocol).addCallback(responses.append)
    assert state_of(protocol) is ClientState.AWAITING_HEADERS
    assert transport.value().startswith(b"GET / HTTP/1.1\r\n")
    with pytest.raises(IllegalCall):
        send(protocol)
    protocol.dataReceived(CHUNKED_HEAD + b"1\r\na\r\n")
    assert state_of(protocol) is ClientState.BODY
    [response] = responses
    assert verifyObject(IResponse, response)
    protocol.dataReceived(b"0\r\n\r\n")
    assert state_of(protocol) is ClientState.IDLE and released == [protocol]
    protocol.connectionLost(Failure(ConnectionDone()))
    assert state_of(protocol) is ClientState.CLOSED


def test_bytes_on_an_idle_connection_close_it() -> None:
    protocol, transport, _ = connected()
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\n")
    assert transport.disconnecting


def test_leftover_bytes_after_a_response_forbid_reuse() -> None:
    protocol, transport, released = connected()
    send(protocol)
    protocol.dataReceived(length_reply(b"ok") + b"HTTP/1.1 200 OK\r\n")
    assert released == [] and transport.disconnecting


def test_the_response_arriving_before_the_body_is_written_forbids_reuse() -> None:
    protocol, transport, released = connected()
    producer = StuckProducer()
    request = ClientRequest(b"POST", b"http://n/", Headers())
    protocol.request(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n", request, producer, True)
    assert state_of(protocol) is ClientState.WRITING
    protocol.dataReceived(length_reply(b"no"))
    assert producer.stopped and released == [] and transport.disconnecting


def test_body_bytes_before_deliver_body_are_handed_over_in_one_call() -> None:
    """Body data of several reads buffered before ``deliverBody`` reaches the protocol at once,
    then the end; a second ``deliverBody`` is illegal."""
    protocol, _, released = connected()
    responses: list[IResponse] = []
    send(protocol).addCallback(responses.append)
    protocol.dataReceived(CHUNKED_HEAD + b"a\r\n" + b"a" * 10 + b"\r\n")
    protocol.dataReceived(b"a\r\n" + b"b" * 10 + b"\r\n0\r\n\r\n")
    assert released == [protocol]  # complete: the connection is idle again before delivery
    [response] = responses
    collect = Collect()
    response.deliverBody(collect)
    assert collect.calls == [b"a" * 10 + b"b" * 10]
    assert collect.ended is not None and collect.ended.check(ResponseDone)
    with pytest.raises(IllegalCall):
        response.deliverBody(Collect())


# ---- chunked decoding under any split -----------------------------------------------------------


@given(chunked_streams())
@settings(max_examples=300, deadline=None)
def test_any_split_of_a_chunked_stream_yields_the_same_body(
    case: tuple[bytes, bytes, list[int]],
) -> None:
    """However the reads cut the framing, the body protocol sees exactly the payload bytes, then
    ResponseDone, and the connection goes back idle."""
    stream, payload, cuts = case
    protocol, _, released = connected()
    responses: list[IResponse] = []
    send(protocol).addCallback(responses.append)
    protocol.dataReceived(CHUNKED_HEAD)
    [response] = responses
    collect = Collect()
    response.deliverBody(collect)
    for piece in split(stream, cuts):
        protocol.dataReceived(piece)
    assert collect.body == payload
    assert collect.ended is not None and collect.ended.check(ResponseDone)
    assert released == [protocol]


# ---- the transition table (issue 20) ------------------------------------------------------------


class Recording(NodeClientProtocol):
    """Records every (state, event) it moves by."""

    def __init__(self) -> None:
        super().__init__(lambda p: None, lambda p: None)
        self.moves: set[tuple[ClientState, ClientEvent]] = set()

    def _move(self, event: ClientEvent) -> ClientState:
        self.moves.add((self.state, event))
        return super()._move(event)


@implementer(IBodyProducer)
class ManualProducer:
    """Writes its whole declared body (in two writes); finishes when the test fires ``done``."""

    length = 3

    def __init__(self) -> None:
        self.done: Deferred[None] = Deferred()
        self.stopped = False

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(b"a")
        consumer.write(b"bc")
        return self.done

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def stopProducing(self) -> None:
        self.stopped = True


class Walk:
    """One connection driven through its public calls, step by named step."""

    def __init__(self) -> None:
        self.protocol = Recording()
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)
        self.producer = ManualProducer()
        self.responses: list[IResponse] = []
        self.collect = Collect()
        self.attempt: Deferred[IResponse] | None = None

    def _ask(self, method: bytes, producer: IBodyProducer | None) -> None:
        request = ClientRequest(method, b"http://n/", Headers())
        self.attempt = self.protocol.request(
            b"%s / HTTP/1.1\r\n\r\n" % method, request, producer, True
        )
        self.attempt.addCallbacks(self.responses.append, lambda f: None)

    def _head(self, extra: bytes) -> None:
        self.protocol.dataReceived(b"Content-Length: 2\r\n%s\r\n" % extra)
        if self.responses:
            self.responses[0].deliverBody(self.collect)

    def step(self, name: str) -> None:
        flow = IPushProducer(self.collect.transport) if self.collect.transport else None
        {
            "get": lambda: self._ask(b"GET", None),
            "post": lambda: self._ask(b"POST", self.producer),
            "written": lambda: self.producer.done.callback(None),
            "broken": lambda: self.producer.done.errback(Failure(RuntimeError("broke"))),
            "cancel": lambda: self.attempt.cancel() if self.attempt else None,
            "partial": lambda: self.protocol.dataReceived(b"HTTP/1.1 200 OK\r\n"),
            "head": lambda: self._head(b""),
            "head-close": lambda: self._head(b"Connection: close\r\n"),
            "garbage": lambda: self.protocol.dataReceived(b"garbage\r\n"),
            "body": lambda: self.protocol.dataReceived(b"ok"),
            "pause": lambda: flow.pauseProducing() if flow else None,
            "resume": lambda: flow.resumeProducing() if flow else None,
            "stop": lambda: flow.stopProducing() if flow else None,
            "close-idle": lambda: self.protocol.close_idle(),
            "lost": lambda: self.protocol.connectionLost(Failure(ConnectionDone())),
        }[name]()


S = ClientState
WALKS: list[tuple[str, ClientState]] = [
    ("", S.IDLE),
    ("get", S.AWAITING_HEADERS),
    ("get partial head body", S.IDLE),
    ("get partial head-close body", S.CLOSING),
    ("get partial head pause pause body", S.IDLE),
    ("get partial head-close pause body", S.CLOSING),
    ("get partial head resume pause resume", S.BODY),
    ("post", S.WRITING),
    ("post written", S.AWAITING_HEADERS),
    ("post partial written", S.HEAD),
    ("post partial head written", S.BODY),
    ("post partial head pause written", S.PAUSED),
    ("post broken", S.ABORTING),
    ("get cancel", S.ABORTING),
    ("get partial garbage", S.ABORTING),
    ("get partial head stop pause resume stop", S.ABORTING),
    ("get partial head pause stop", S.ABORTING),
    ("garbage close-idle", S.ABORTING),
    ("close-idle close-idle", S.CLOSING),
    ("lost", S.CLOSED),
    ("post lost", S.CLOSED),
    ("get lost", S.CLOSED),
    ("get partial lost", S.CLOSED),
    ("get partial head lost", S.CLOSED),
    ("get partial head pause lost", S.CLOSED),
    ("get cancel lost", S.CLOSED),
    ("close-idle lost", S.CLOSED),
]
"""Public calls from a new connection, and the state they leave it in."""


def walk(steps: str) -> Walk:
    made = Walk()
    for name in steps.split():
        made.step(name)
    return made


@pytest.mark.parametrize(("steps", "state"), WALKS, ids=[s or "new" for s, _ in WALKS])
def test_public_calls_walk_the_table(steps: str, state: ClientState) -> None:
    """Each walk ends where the table says, and every move it made is in the table."""
    made = walk(steps)
    assert state_of(made.protocol) is state
    assert all(event in TRANSITIONS[before] for before, event in made.protocol.moves)


def test_the_walks_take_every_legal_move() -> None:
    """Together the walks take every (state, event) of the table: no move is dead."""
    taken: set[tuple[ClientState, ClientEvent]] = set()
    for steps, _ in WALKS:
        taken |= walk(steps).protocol.moves
    legal = {(state, event) for state, moves in TRANSITIONS.items() for event in moves}
    assert taken == legal


ILLEGAL = [
    (state, event)
    for state in ClientState
    for event in ClientEvent
    if event not in TRANSITIONS[state]
]


@pytest.mark.parametrize(
    ("state", "event"), ILLEGAL, ids=[f"{s.value}-{e.value}" for s, e in ILLEGAL]
)
def test_every_illegal_move_raises_illegal_call(state: ClientState, event: ClientEvent) -> None:
    protocol, _, _ = connected()
    protocol._state = state
    with pytest.raises(IllegalCall):
        protocol._move(event)
    assert state_of(protocol) is state


def test_illegal_public_calls_raise() -> None:
    """A second request, ``close_idle`` on a busy connection, a second ``connectionLost``."""
    made = walk("get partial head")
    with pytest.raises(IllegalCall):
        send(made.protocol)
    with pytest.raises(IllegalCall):
        made.protocol.close_idle()
    made.step("lost")
    with pytest.raises(IllegalCall):
        made.step("lost")
    assert state_of(made.protocol) is ClientState.CLOSED


# ---- endings and calls, deterministically (issue 20) -------------------------------------------


def ended(made: Walk) -> Failure:
    assert made.collect.ended is not None
    return made.collect.ended


def request_failure(made: Walk) -> Failure:
    assert made.attempt is not None
    failures: list[Failure] = []
    made.attempt.addErrback(failures.append)
    [failure] = failures
    return failure


def value(failure: Failure) -> Any:
    """The exception a failure holds (``reasons``, ``response``: not on ``BaseException``)."""
    return failure.value


def lose(made: Walk) -> Failure:
    reason = Failure(ConnectionDone())
    made.protocol.connectionLost(reason)
    return reason


@pytest.mark.parametrize(
    ("steps", "kind"),
    [
        ("post", RequestTransmissionFailed),
        ("get", ResponseNeverReceived),
        ("get partial", ResponseFailed),
    ],
)
def test_a_loss_before_the_head_fails_the_request_by_state(steps: str, kind: type) -> None:
    made = Walk()
    seen: list[Failure] = []
    request = ClientRequest(b"GET", b"http://n/", Headers())
    producer = made.producer if steps == "post" else None
    made.protocol.request(b"X / HTTP/1.1\r\n\r\n", request, producer, True).addErrback(seen.append)
    if "partial" in steps:
        made.step("partial")
    reason = lose(made)
    [failure] = seen
    assert failure.check(kind)
    assert value(failure).reasons == [reason]
    assert made.transport.producer is None


def test_a_body_cut_by_the_loss_fails_with_data_loss_and_a_close_delimited_one_ends() -> None:
    made = walk("get partial head")
    reason = lose(made)
    cut = ended(made)
    assert cut.check(ResponseFailed)
    first, second = value(cut).reasons
    assert first is reason and second.check(_DataLoss)
    close_delimited = Walk()
    close_delimited.step("get")
    close_delimited.protocol.dataReceived(b"HTTP/1.1 200 OK\r\n\r\nsome")
    close_delimited.responses[0].deliverBody(close_delimited.collect)
    close_delimited.step("stop")  # stopped early: still the close's ending
    lose(close_delimited)
    assert close_delimited.collect.body == b"some"
    assert ended(close_delimited).check(PotentialDataLoss)


def test_cancelling_before_the_head_aborts_with_a_cancellation() -> None:
    made = Walk()
    seen: list[Failure] = []
    request = ClientRequest(b"GET", b"http://n/", Headers())
    attempt = made.protocol.request(b"GET / HTTP/1.1\r\n\r\n", request, None, True)
    attempt.addErrback(seen.append)
    attempt.cancel()
    [failure] = seen
    assert failure.check(ResponseNeverReceived)
    assert value(failure).reasons[0].check(CancelledError)
    assert made.transport.disconnected  # aborted, not closed
    attempt.cancel()  # again: nothing more happens
    assert state_of(made.protocol) is ClientState.ABORTING


def test_a_malformed_head_fails_the_request_and_aborts() -> None:
    made = Walk()
    seen: list[Failure] = []
    request = ClientRequest(b"GET", b"http://n/", Headers())
    made.protocol.request(b"GET / HTTP/1.1\r\n\r\n", request, None, True).addErrback(seen.append)
    made.protocol.dataReceived(b"HTTP/9.9 200 OK\r\n")
    [failure] = seen
    assert failure.check(ResponseFailed)
    assert value(failure).reasons[0].check(BadResponse)
    assert made.transport.disconnected


def test_malformed_chunks_end_the_body_with_the_response_and_abort() -> None:
    made = Walk()
    made.step("get")
    made.protocol.dataReceived(CHUNKED_HEAD + b"1\r\na\r\n")
    [response] = made.responses
    response.deliverBody(made.collect)
    made.protocol.dataReceived(b"zz\r\n")
    failure = ended(made)
    assert failure.check(ResponseFailed)
    assert value(failure).response is response
    assert value(failure).reasons[0].check(BadResponse)
    assert made.collect.body == b"a" and made.transport.disconnected
    made.protocol.dataReceived(b"1\r\nb\r\n")  # dropped
    assert made.collect.body == b"a"


def test_a_producer_that_writes_short_or_fails_is_a_generation_failure() -> None:
    for fail in (False, True):
        protocol, transport, _ = connected()
        seen: list[Failure] = []
        producer = StuckProducer(fail=fail)
        request = ClientRequest(b"POST", b"http://n/", Headers())
        protocol.request(b"POST / HTTP/1.1\r\n\r\n", request, producer, True).addErrback(
            seen.append
        )
        if not fail:
            producer.done.callback(None)  # wrote 10 of 100
        [failure] = seen
        assert failure.check(RequestGenerationFailed)
        reason = value(failure).reasons[0]
        if fail:
            assert reason.check(RuntimeError)
        else:
            assert str(reason.value) == "body producer wrote 10 of 100"
        assert transport.disconnected and transport.producer is None
        assert state_of(protocol) is ClientState.ABORTING


def test_a_producer_that_raises_at_once_is_a_generation_failure() -> None:
    @implementer(IBodyProducer)
    class Raising(ManualProducer):
        def startProducing(self, consumer: IConsumer) -> Deferred[None]:
            raise RuntimeError("at once")

    protocol, transport, _ = connected()
    seen: list[Failure] = []
    request = ClientRequest(b"POST", b"http://n/", Headers())
    protocol.request(b"POST / HTTP/1.1\r\n\r\n", request, Raising(), True).addErrback(seen.append)
    [failure] = seen
    assert failure.check(RequestGenerationFailed) and transport.producer is None


def test_the_body_is_written_through_the_transport_until_the_exchange_is_given_up() -> None:
    made = walk("post")
    assert made.transport.value() == b"POST / HTTP/1.1\r\n\r\nabc"
    assert made.transport.producer is made.producer and made.transport.streaming
    made.step("written")
    assert made.transport.producer is None
    given_up = walk("post")
    consumer = given_up.protocol._body
    assert consumer is not None
    given_up.step("cancel")
    consumer.write(b"late")
    assert b"late" not in given_up.transport.value()


def test_pause_and_resume_reach_the_transport_and_the_end_resumes_it() -> None:
    made = walk("get partial head pause")
    assert made.transport.producerState == "paused"
    made.step("resume")
    assert made.transport.producerState == "producing"
    made.step("pause")
    made.step("body")
    assert made.transport.producerState == "producing"
    assert state_of(made.protocol) is ClientState.IDLE


def test_a_complete_body_releases_or_closes_the_connection() -> None:
    released: list[NodeClientProtocol] = []
    protocol = NodeClientProtocol(released.append, lambda p: None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    seen: list[IResponse] = []
    request = ClientRequest(b"GET", b"http://n/", Headers())
    protocol.request(b"GET / HTTP/1.1\r\n\r\n", request, None, True).addCallback(seen.append)
    protocol.dataReceived(length_reply(b"ok"))
    assert released == [protocol] and not transport.disconnecting
    [response] = seen
    assert (response.version, response.code, response.phrase) == ((b"HTTP", 1, 1), 200, b"OK")
    assert response.length == 2 and response.request is request
    protocol.request(b"GET / HTTP/1.1\r\n\r\n", request, None, False)
    protocol.dataReceived(length_reply(b"ok"))
    assert released == [protocol] and transport.disconnecting  # the request said close
    assert state_of(protocol) is ClientState.CLOSING


def test_close_idle_fires_once_the_connection_is_gone() -> None:
    lost: list[NodeClientProtocol] = []
    protocol = NodeClientProtocol(lambda p: None, lost.append)
    transport = StringTransport()
    protocol.makeConnection(transport)
    first, second = protocol.close_idle(), protocol.close_idle()
    assert transport.disconnecting and not transport.disconnected  # closed, not aborted
    assert not first.called and not second.called
    protocol.connectionLost(Failure(ConnectionDone()))
    assert first.called and second.called and lost == [protocol]
    assert protocol.close_idle().called


def test_connections_ask_for_no_delay_and_survive_a_refusal() -> None:
    class NoDelay(StringTransport):
        def __init__(self, refuse: bool) -> None:
            super().__init__()
            self.asked: list[bool] = []
            self._refuse = refuse

        def setTcpNoDelay(self, enabled: bool) -> None:
            self.asked.append(enabled)
            if self._refuse:
                raise OSError("not a TCP socket")

    for refuse in (False, True):
        transport = NoDelay(refuse)
        NodeClientProtocol(lambda p: None, lambda p: None).makeConnection(transport)
        assert transport.asked == [True]


def test_a_response_refuses_body_calls_its_state_does_not_allow() -> None:
    made = walk("get partial head body")
    [response] = made.responses
    previous = made.responses[0]
    response.setPreviousResponse(previous)
    assert response.previousResponse is previous
    with pytest.raises(IllegalCall):
        cast(Any, response).body_data(b"more")
    with pytest.raises(IllegalCall):
        cast(Any, response).body_ended(Failure(ResponseDone()))
    assert ended(made).check(ResponseDone) and made.collect.body == b"ok"


# ---- what mutation testing asked for (issue 20) ------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "stopped"),
    [
        ("post written", False),
        ("post broken", False),
        ("post cancel", True),
        ("post partial garbage", True),
        ("post partial head stop", True),
        ("post partial head body", True),
        ("post lost", True),
    ],
)
def test_the_producer_is_stopped_only_when_the_exchange_ends_before_it(
    steps: str, stopped: bool
) -> None:
    made = walk(steps)
    assert made.producer.stopped is stopped
    assert made.transport.producer is None


def test_the_request_and_response_show_what_was_asked_and_answered() -> None:
    headers = Headers({b"x-asked": [b"1"]})
    request = ClientRequest(b"GET", b"http://n/x", headers)
    assert verifyObject(IClientRequest, request)
    assert (request.method, request.absoluteURI, request.headers) == (
        b"GET",
        b"http://n/x",
        headers,
    )
    made = walk("get partial head")
    [response] = made.responses
    assert response.headers.getRawHeaders(b"content-length") == [b"2"]
    assert response.previousResponse is None


def test_after_the_end_the_body_transport_does_nothing() -> None:
    made = walk("get partial head body")
    flow = IPushProducer(made.collect.transport)
    flow.pauseProducing()
    flow.resumeProducing()
    flow.stopProducing()
    assert made.transport.producerState == "producing" and not made.transport.disconnecting
    assert state_of(made.protocol) is ClientState.IDLE


def test_illegal_calls_say_what_and_where() -> None:
    made = walk("get partial head body")
    [response] = made.responses
    with pytest.raises(IllegalCall, match=r"^deliverBody in state finished$"):
        response.deliverBody(Collect())
    with pytest.raises(IllegalCall, match=r"^body data in state finished$"):
        cast(Any, response).body_data(b"x")
    with pytest.raises(IllegalCall, match=r"^body end in state finished$"):
        cast(Any, response).body_ended(Failure(ResponseDone()))
    with pytest.raises(IllegalCall, match=r"^lost in state closed$"):
        made.step("lost")
        made.step("lost")


def test_a_head_request_has_no_body_whatever_its_length() -> None:
    made = Walk()
    request = ClientRequest(b"HEAD", b"http://n/", Headers())
    made.protocol.request(b"HEAD / HTTP/1.1\r\n\r\n", request, None, True).addCallback(
        made.responses.append
    )
    made.protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
    assert state_of(made.protocol) is ClientState.IDLE
    [response] = made.responses
    response.deliverBody(made.collect)
    assert ended(made).check(ResponseDone) and made.collect.body == b""


def test_bytes_after_a_bodyless_answer_forbid_reuse() -> None:
    protocol, transport, released = connected()
    send(protocol)
    protocol.dataReceived(b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert released == [] and transport.disconnecting
    assert state_of(protocol) is ClientState.CLOSING
