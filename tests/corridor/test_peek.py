"""A node's short answer read before the attempt decides what it is, then handed on as if unread
(docs/behaviour.md §17.3): the whole body within the limit and the time, else None; either way the
next reader gets every byte from the first, and the end as it came."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._peek import PEEK_LIMIT, peek

pytestmark = pytest.mark.timeout(30)


@implementer(IPushProducer)
class _Socket:
    stopped = False

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        self.stopped = True


@implementer(IResponse)
class _Answer:
    """A 404 whose body the test writes: :meth:`send`, then :meth:`end`."""

    version = (b"HTTP", 1, 1)
    code = 404
    phrase = b"Not Found"
    request = None
    previousResponse = None
    length = 22

    def __init__(self) -> None:
        self.headers = Headers({b"content-type": [b"application/json"]})
        self.socket = _Socket()
        self.reader: Protocol | None = None

    def deliverBody(self, protocol: Protocol) -> None:
        self.reader = protocol
        protocol.makeConnection(self.socket)  # type: ignore[arg-type]

    def send(self, data: bytes) -> None:
        assert self.reader is not None
        self.reader.dataReceived(data)

    def end(self, reason: Failure | None = None) -> None:
        assert self.reader is not None
        self.reader.connectionLost(reason or Failure(ResponseDone()))

    def setPreviousResponse(self, response: IResponse) -> None:
        pass


class _Reader(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.ended: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.ended = reason


def _peeking(answer: _Answer, clock: Clock, caller: CallerState) -> Deferred[Any]:
    return Deferred.fromCoroutine(peek(answer, clock, 5.0, caller))


def _result(pending: Deferred[Any]) -> Any:
    out: list[Any] = []
    pending.addCallback(out.append)
    assert out, "the peek has not decided"
    return out[0]


def test_a_short_body_is_read_whole_and_read_again_from_its_first_byte() -> None:
    clock, caller, answer = Clock(), CallerState(), _Answer()
    pending = _peeking(answer, clock, caller)
    answer.send(b'{"detail":')
    assert not pending.called
    answer.send(b'"Not Found"}')
    answer.end()
    body, again = _result(pending)
    assert body == b'{"detail":"Not Found"}'
    assert (again.code, again.headers, again.length) == (404, answer.headers, 22)
    reader = _Reader()
    again.deliverBody(reader)
    assert reader.data == body and reader.ended is not None and reader.ended.check(ResponseDone)
    assert reader.transport is answer.socket  # type: ignore[comparison-overlap]
    assert not clock.getDelayedCalls()


def test_a_longer_body_is_not_decided_on_and_goes_on_to_the_next_reader_whole() -> None:
    clock, caller, answer = Clock(), CallerState(), _Answer()
    pending = _peeking(answer, clock, caller)
    answer.send(b"x" * PEEK_LIMIT)
    assert not pending.called
    answer.send(b"y")
    body, again = _result(pending)
    assert body is None
    reader = _Reader()
    again.deliverBody(reader)
    answer.send(b"z")
    assert reader.data == b"x" * PEEK_LIMIT + b"yz" and reader.ended is None
    answer.end()
    assert reader.ended is not None


def test_a_body_slower_than_the_timeout_is_not_decided_on() -> None:
    clock, caller, answer = Clock(), CallerState(), _Answer()
    pending = _peeking(answer, clock, caller)
    answer.send(b"{")
    clock.advance(5.0)
    body, again = _result(pending)
    assert body is None
    reader = _Reader()
    again.deliverBody(reader)
    answer.send(b"}")
    assert reader.data == b"{}"


def test_a_cut_body_is_not_decided_on_and_its_cut_reaches_the_next_reader() -> None:
    clock, caller, answer = Clock(), CallerState(), _Answer()
    pending = _peeking(answer, clock, caller)
    answer.send(b"404 page")
    cut = Failure(ResponseFailed([Failure(ConnectionError())]))
    answer.end(cut)
    body, again = _result(pending)
    assert body is None and not clock.getDelayedCalls()
    reader = _Reader()
    again.deliverBody(reader)
    assert reader.data == b"404 page" and reader.ended is cut


def test_the_caller_leaving_closes_the_nodes_body() -> None:
    clock, caller, answer = Clock(), CallerState(), _Answer()
    pending = _peeking(answer, clock, caller)
    caller.abandon("client disconnected")
    assert answer.socket.stopped
    body, _ = _result(pending)
    assert body is None and not clock.getDelayedCalls()


@pytest_twisted.ensureDeferred
async def test_a_peek_ended_leaves_nothing_for_the_caller_to_stop() -> None:
    clock, caller, answer = Clock(), CallerState(), _Answer()
    pending = _peeking(answer, clock, caller)
    answer.send(b"{}")
    answer.end()
    await pending
    caller.abandon("client disconnected")
    assert not answer.socket.stopped
