"""Guards on the private parts of Twisted the code relies on, where no public way exists.

Each private name the code touches is either replaced by a public way (the pool's quiet factory:
``HTTPConnectionPool.getConnection``; treq's response: typed as ``IResponse``) or kept and
guarded here. Twisted is pinned below its next major (setup.cfg: ``twisted[tls]>=25.5,<27``); an
upgrade that changes the shape of one of these fails a test here, naming the internal, before a
test of the proxy fails for a reason far from it.

- ``twisted.test.iosim`` (``FakeTransport``, ``IOPump``, ``connect``): the in-memory network of
  ``nvpair_tw.testing`` (``nvpair_tw/testing/_network.py``). ``twisted.internet.testing`` has
  transports, but no connected pair that moves bytes when pumped.
- ``HTTPChannel._send100Continue`` and ``HTTPChannel._respondToBadRequestAndDisconnect``:
  overridden by ``LimitedChannel`` (``nvpair_tw/inbound/_limits.py``) to send no ``100 Continue``
  after a rejection and to answer a malformed request with JSON; Twisted has no public hook for
  either. ``LimitedChannel`` also reads ``HTTPChannel``'s ``_handlingRequest``, ``_dataBuffer``,
  ``_networkProducer``, ``_receivedHeaderCount`` and ``_receivedHeaderSize``, and
  ``LineReceiver``'s ``_buffer`` (the part of a line read so far).
- ``tcp.Connection``'s write state (``_tempDataLen``, ``offset``, ``dataBuffer``,
  ``_writeDisconnected``, ``_aborting``): ``EagerServer`` (``nvpair_tw/runtime/_eager.py``) sends
  at once only while Twisted's own queue is empty and the connection is open and not being reset.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet import tcp
from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.web import http


def _parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


# ---- twisted.test.iosim (nvpair_tw.testing's MemoryNetwork) --------------------------------------


class _Recorder(Protocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.lost: list[Failure] = []

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.append(reason)


def test_iosim_fake_transport_has_what_the_memory_network_uses() -> None:
    """``FakeTransport(protocol, isServer, hostAddress=, peerAddress=)``, an ``abortConnection``
    to override, and the ``stream`` / ``disconnecting`` / ``disconnected`` /
    ``disconnectReason`` attributes the override sets."""
    assert _parameters(iosim.FakeTransport.__init__)[:5] == [
        "self",
        "protocol",
        "isServer",
        "hostAddress",
        "peerAddress",
    ]
    assert callable(iosim.FakeTransport.abortConnection)
    transport = iosim.FakeTransport(_Recorder(), isServer=False)
    assert transport.stream == []
    assert not transport.disconnecting and not transport.disconnected
    assert isinstance(transport.disconnectReason, ConnectionDone)


def test_iosim_connect_and_pump_take_what_the_memory_network_passes() -> None:
    """``connect(server, server_io, client, client_io, greet=, clock=)`` returns an ``IOPump``
    with ``clientIO`` / ``serverIO`` and a ``pump(advanceClock=)``."""
    assert {
        "serverProtocol",
        "serverTransport",
        "clientProtocol",
        "clientTransport",
        "greet",
        "clock",
    } <= set(_parameters(iosim.connect))
    assert "advanceClock" in _parameters(iosim.IOPump.pump)
    server, client = _Recorder(), _Recorder()
    server_io = iosim.FakeTransport(server, isServer=True)
    client_io = iosim.FakeTransport(client, isServer=False)
    pump = iosim.connect(server, server_io, client, client_io, greet=False, clock=Clock())
    assert isinstance(pump, iosim.IOPump)
    assert pump.clientIO is client_io and pump.serverIO is server_io


def test_iosim_moves_bytes_only_when_pumped_and_reports_each_side_its_reason() -> None:
    """Bytes wait for ``pump``, which leaves the clock alone with ``advanceClock=False``; a
    transport marked disconnecting (as ``_MemoryTransport.abortConnection`` does) closes both
    sides over two pumps, each protocol told its own transport's ``disconnectReason``."""
    clock = Clock()
    ticks: list[float] = []
    clock.callLater(0, lambda: ticks.append(clock.seconds()))
    server, client = _Recorder(), _Recorder()
    server_io = iosim.FakeTransport(server, isServer=True)
    client_io = iosim.FakeTransport(client, isServer=False)
    pump = iosim.connect(server, server_io, client, client_io, greet=False, clock=clock)
    client_io.write(b"ping")
    assert server.received == []
    assert pump.pump(advanceClock=False) is True
    assert server.received == [b"ping"] and ticks == []
    client_io.stream = []
    client_io.disconnectReason = ConnectionAborted()  # type: ignore[assignment]
    server_io.disconnectReason = ConnectionLost("connection reset")  # type: ignore[assignment]
    client_io.disconnecting = True
    while pump.pump(advanceClock=False):
        pass
    assert client_io.disconnected and server_io.disconnected
    assert [f.type for f in server.lost] == [ConnectionLost]
    assert [f.type for f in client.lost] == [ConnectionAborted]
    assert ticks == []


# ---- HTTPChannel (nvpair_tw.inbound's LimitedChannel) -------------------------------------------


def _channel() -> tuple[http.HTTPChannel, StringTransport]:
    channel = http.HTTPChannel()
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport


@pytest.mark.parametrize("name", ["_send100Continue", "_respondToBadRequestAndDisconnect"])
def test_http_channel_hook_exists_and_takes_no_argument(name: str) -> None:
    """``LimitedChannel`` overrides it as a method of no argument and calls ``super()``'s."""
    hook = getattr(http.HTTPChannel, name)
    assert callable(hook)
    assert _parameters(hook) == ["self"]


def test_http_channel_sends_100_continue_through_its_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Expect: 100-continue`` is answered by calling ``_send100Continue`` (after
    ``gotLength``), and Twisted's writes the interim response."""
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
    channel, transport = _channel()
    channel.dataReceived(head)
    assert transport.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    calls: list[str] = []
    channel, transport = _channel()
    monkeypatch.setattr(channel, "_send100Continue", lambda: calls.append("sent"))
    channel.dataReceived(head)
    assert calls == ["sent"] and transport.value() == b""


def test_http_channel_answers_a_malformed_header_through_its_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A header line without a colon (read when the next line shows it is not continued) is
    answered by ``_respondToBadRequestAndDisconnect``; the default writes a bare 400 and closes."""
    head = b"GET / HTTP/1.1\r\nno colon here\r\n\r\n"
    channel, transport = _channel()
    channel.dataReceived(head)
    assert transport.value().startswith(b"HTTP/1.1 400 Bad Request")
    assert transport.disconnecting
    calls: list[str] = []
    channel, transport = _channel()
    monkeypatch.setattr(channel, "_respondToBadRequestAndDisconnect", lambda: calls.append("bad"))
    channel.dataReceived(head)
    assert calls == ["bad"] and transport.value() == b""


def test_http_channel_private_state_the_limited_channel_reads() -> None:
    """The header count and size, whether a request is being handled, the bytes buffered behind
    it and the network producer that may have been paused, as ``LimitedChannel`` reads them."""
    channel, transport = _channel()
    assert channel._handlingRequest is False
    assert channel._dataBuffer == []
    assert channel._receivedHeaderCount == 0 and channel._receivedHeaderSize == 0
    assert channel.line_mode
    channel.dataReceived(b"GET / HT")  # a line read in part waits in LineReceiver's _buffer
    assert channel._buffer == b"GET / HT"
    channel, transport = _channel()
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: y\r\n")
    # every line counts toward the size as it arrives; a header once the next line shows its end
    assert channel._receivedHeaderCount == 1
    assert channel._receivedHeaderSize == len(b"GET / HTTP/1.1Host: xAccept: y")
    channel.dataReceived(b"\r\n")  # the request is handed to http.Request, which never finishes
    assert channel._handlingRequest is True
    channel.dataReceived(b"GET /next HTTP/1.1\r\n")
    assert b"".join(channel._dataBuffer) == b"GET /next HTTP/1.1\r\n"
    assert channel._networkProducer is transport  # what the channel pauses behind a request
    transport.pauseProducing()
    channel._networkProducer.resumeProducing()
    assert transport.producerState == "producing"


def test_tcp_connection_write_state_the_eager_server_reads() -> None:
    """Each part of the write state, at its idle value on a fresh connection class; an abort is
    what ``_aborting`` says (``tests/runtime/test_eager.py`` shows a write after it dropped)."""
    idle = {
        "_tempDataLen": 0,
        "offset": 0,
        "dataBuffer": b"",
        "_writeDisconnected": False,
        "_aborting": False,
        "TLS": False,
    }
    with socket.socket() as skt:
        connection = tcp.Connection(skt, Protocol(), MemoryReactor())
        assert {name: getattr(connection, name) for name in idle} == idle
