"""Eager server connections: bytes leave in ``write()`` when nothing is queued, over real sockets."""

from __future__ import annotations

import functools
import select
import socket
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IListeningPort, IPushProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.testing import MemoryReactor
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair_tw.core._reactor import IProxyReactor, one_send
from nvpair_tw.runtime._eager import EagerPort, EagerServer, EagerTCPServerEndpoint, eager_endpoint
from nvpair_tw.runtime._service import ListenerService


class Held(Protocol):
    """Server side: hands its transport to the test when the connection is made."""

    def __init__(self, made: Deferred[Any], lost: Deferred[BaseException]) -> None:
        self._made = made
        self._lost = lost

    def connectionMade(self) -> None:
        self._made.callback(self.transport)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._lost.callback(cast(BaseException, reason.value))


class Pair:
    """One eager listening port, one blocking client socket, and the server's transport."""

    def __init__(self, reactor: Any) -> None:
        self.made: Deferred[Any] = Deferred()
        self.lost: Deferred[BaseException] = Deferred()
        made, lost = self.made, self.lost
        factory = Factory.forProtocol(lambda: Held(made, lost))
        self.endpoint = EagerTCPServerEndpoint(reactor, 0, 50, "127.0.0.1")
        self.port: IListeningPort | None = None
        self.client = socket.socket()
        self.factory = factory

    async def open(self, rcvbuf: int | None = None) -> Any:
        self.port = await self.endpoint.listen(self.factory)
        if rcvbuf is not None:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.client.connect(("127.0.0.1", self.port.getHost().port))  # type: ignore[attr-defined]
        return await self.made

    def received(self, timeout: float = 2.0) -> bytes:
        """What has arrived at the client within ``timeout`` (the reactor does not turn)."""
        readable, _, _ = select.select([self.client], [], [], timeout)
        return self.client.recv(1 << 20) if readable else b""

    async def read_all(self) -> bytes:
        """Everything until EOF, read in a thread so the reactor can flush meanwhile."""

        def read() -> bytes:
            self.client.settimeout(10)
            chunks = []
            while chunk := self.client.recv(1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)

        return await deferToThread(read)

    async def close(self) -> None:
        self.client.close()
        if self.port is not None:
            await maybeDeferred(self.port.stopListening)


@pytest.fixture
def pair(reactor: Any) -> Any:
    return Pair(reactor)


@pytest_twisted.ensureDeferred
async def test_a_write_on_an_idle_connection_reaches_the_peer_without_a_reactor_turn(
    pair: Pair,
) -> None:
    """The stock transport would only queue the bytes until ``doWrite``; this one sends them."""
    transport = await pair.open()
    assert isinstance(transport, EagerServer)
    transport.write(b"token one")
    assert pair.received() == b"token one"
    transport.writeSequence([b"5\r\n", b"token", b"\r\n"])
    assert pair.received() == b"5\r\ntoken\r\n"
    assert transport.dataBuffer == b"" and transport._tempDataLen == 0
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_connections_do_not_wait_for_the_clients_ack_to_send_the_next_token(
    pair: Pair,
) -> None:
    """``TCP_NODELAY`` is set: Nagle's algorithm would hold a small write behind an unacked one."""
    transport = await pair.open()
    assert transport.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_what_the_kernel_does_not_take_is_queued_in_order_and_pauses_the_producer(
    pair: Pair,
) -> None:
    """A client that does not read: the send goes partial, the rest queues, later writes queue
    behind it even when the kernel has room again, and the producer is paused (backpressure)."""
    transport = await pair.open(rcvbuf=4096)
    transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    @implementer(IPushProducer)
    class Producer:
        paused = 0

        def pauseProducing(self) -> None:
            self.paused += 1

        def resumeProducing(self) -> None:
            pass

        def stopProducing(self) -> None:
            pass

    producer = Producer()
    transport.registerProducer(producer, True)
    big = bytes(range(256)) * 4096  # 1 MiB: the kernel takes part of it, the rest is queued
    transport.write(big)
    assert 0 < transport._tempDataLen < len(big)
    assert producer.paused >= 1
    head = pair.received()  # the client reads a little: the kernel has room again...
    assert big.startswith(head) and head
    pieces = [b"%06d" % i * 10 for i in range(50)]
    for number, piece in enumerate(pieces):  # ...but these must still queue behind the rest
        if number % 2:
            transport.writeSequence([piece[:25], piece[25:]])
        else:
            transport.write(piece)
    transport.unregisterProducer()
    transport.loseConnection()
    assert head + await pair.read_all() == big + b"".join(pieces)
    await pair.lost
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_a_sequence_the_kernel_takes_only_in_part_arrives_whole(pair: Pair) -> None:
    """``writeSequence`` on an idle connection: one send of the joined pieces, the rest queued."""
    transport = await pair.open(rcvbuf=4096)
    transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    pieces = [bytes([n]) * 65536 for n in range(16)]  # 1 MiB in 16 pieces
    transport.writeSequence(pieces)
    assert 0 < transport._tempDataLen < len(pieces) * 65536
    transport.loseConnection()
    assert await pair.read_all() == b"".join(pieces)
    await pair.lost
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_writes_after_lose_connection_still_arrive_before_the_close(pair: Pair) -> None:
    """As with Twisted's transport: what is written before the flush goes out, then the FIN."""
    transport = await pair.open()
    transport.write(b"last words")
    transport.loseConnection()
    transport.write(b" and more")  # Twisted still queues these for the flush before the close
    assert await pair.read_all() == b"last words and more"
    await pair.lost
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_a_write_to_a_peer_that_reset_does_not_raise_and_the_loss_is_reported(
    pair: Pair,
) -> None:
    transport = await pair.open()
    pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    pair.client.close()  # RST
    for _ in range(3):
        transport.write(b"x" * 1000)
    reason = await pair.lost
    assert isinstance(reason, ConnectionClosed), reason
    if pair.port is not None:
        await maybeDeferred(pair.port.stopListening)


def test_eager_endpoint_only_for_tcp_on_a_reactor_with_file_descriptors(reactor: Any) -> None:
    assert isinstance(eager_endpoint(reactor, "tcp:0:interface=127.0.0.1"), EagerTCPServerEndpoint)
    assert isinstance(
        eager_endpoint(reactor, "tcp6:port=0:interface=\\:\\:1"), EagerTCPServerEndpoint
    )
    assert eager_endpoint(reactor, "unix:/tmp/nvpair-eager-test.sock") is None
    assert eager_endpoint(reactor, "tcp:notaport") is None
    memory: IProxyReactor = MemoryReactor()  # type: ignore[assignment]
    assert eager_endpoint(memory, "tcp:0") is None


def test_the_backlog_of_the_description_is_kept(reactor: Any) -> None:
    endpoint = eager_endpoint(reactor, "tcp:0:interface=127.0.0.1:backlog=4096")
    assert isinstance(endpoint, EagerTCPServerEndpoint)
    assert endpoint._backlog == 4096


@pytest_twisted.ensureDeferred
async def test_the_listener_service_listens_with_eager_connections_on_ipv4_and_ipv6(
    reactor: Any,
) -> None:
    for description, host in (
        ("tcp:0:interface=127.0.0.1", "127.0.0.1"),
        ("tcp6:port=0:interface=\\:\\:1", "::1"),
    ):
        made: Deferred[Any] = Deferred()
        lost: Deferred[BaseException] = Deferred()
        factory = Factory.forProtocol(functools.partial(Held, made, lost))
        listener = ListenerService(reactor, description, factory, "proxy")
        listener.startService()
        port = await listener.ready
        assert isinstance(port, EagerPort)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as client:
            client.connect((host, port.getHost().port))  # type: ignore[attr-defined]
            transport = await made
            assert isinstance(transport, EagerServer)
            transport.write(b"hello")
            client.settimeout(2)
            assert client.recv(100) == b"hello"
        await lost
        await listener.stopService()


@pytest_twisted.ensureDeferred
async def test_held_writes_leave_together_when_sent_and_none_before(pair: Pair) -> None:
    """Between ``hold`` and ``send_held`` nothing reaches the peer (a loopback send would be in
    its buffer at once); then the head and body arrive as one, and writes are direct again."""
    transport = await pair.open()
    transport.hold()
    transport.writeSequence([b"HTTP/1.1 200 OK\r\n", b"\r\n"])
    transport.write(b"body")
    assert select.select([pair.client], [], [], 0)[0] == []
    transport.send_held()
    assert pair.received() == b"HTTP/1.1 200 OK\r\n\r\nbody"
    transport.write(b"more")
    assert pair.received() == b"more"
    with pytest.raises(TypeError):
        transport.hold()
        try:
            transport.write("text")  # type: ignore[arg-type]
        finally:
            transport.send_held()
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_closing_while_holding_sends_what_was_held_first(pair: Pair) -> None:
    """``loseConnection`` inside a hold does not drop the held bytes."""
    transport = await pair.open()
    transport.hold()
    transport.write(b"last words")
    transport.loseConnection()
    assert await pair.read_all() == b"last words"
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_the_local_address_is_asked_of_the_kernel_once(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request asks for it; the answer is kept (a connection's local address is fixed)."""
    transport = await pair.open()
    first = transport.getHost()
    assert (first.host, first.port) == pair.client.getpeername()
    monkeypatch.setattr(transport, "socket", None)  # asking the socket again would raise
    assert transport.getHost() is first
    monkeypatch.undo()
    await pair.close()


async def _what_arrives_after_a_reset(pair: Pair) -> bytes:
    await pair.lost
    pair.client.settimeout(2)
    try:
        return pair.client.recv(100)
    except OSError as error:  # the reset
        return repr(error).encode()


@pytest_twisted.ensureDeferred
async def test_a_write_after_an_abort_is_dropped_as_twisted_drops_it(pair: Pair) -> None:
    """``abortConnection`` leaves the connection ``connected``; a later write must not reach the
    peer (a relay's last chunk written as it cuts a stream would look like a whole answer)."""
    transport = await pair.open()
    transport.abortConnection()
    transport.write(b"late")
    transport.writeSequence([b"later"])
    assert b"late" not in await _what_arrives_after_a_reset(pair)
    await pair.close()


@pytest_twisted.ensureDeferred
async def test_an_abort_inside_a_hold_sends_nothing_that_was_held(pair: Pair) -> None:
    transport = await pair.open()
    with one_send(transport):
        transport.write(b"held head")
        transport.abortConnection()
    assert b"held head" not in await _what_arrives_after_a_reset(pair)
    await pair.close()
