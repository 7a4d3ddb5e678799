"""Tests for nvpair_tw.upstream._protocol: one node connection, driven over a
``StringTransport`` where the split of the reads is exact (framing edge cases, the states)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.client import (
    ResponseDone,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface.verify import verifyObject

from nvpair_tw.core import IllegalCall
from nvpair_tw.upstream._protocol import ClientRequest, ClientState, NodeClientProtocol
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
