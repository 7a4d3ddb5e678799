# -*- test-case-name: tests.runtime.test_eager -*-
"""Listening sockets whose connections send at once when nothing is queued.

Twisted's TCP transport never sends from ``write()``: it queues the bytes, asks the reactor to watch
the socket for writability (one ``epoll_ctl``), sends from ``doWrite()`` on the next reactor turn and
then stops watching (another ``epoll_ctl``). For a stream that trickles one token every 50 ms that is
a reactor turn and two system calls per token, on every one of thousands of client connections
(docs/performance.md, "Many slow streams"). :class:`EagerServer` does what asyncio's transports do:
when its queue is empty it hands the bytes to the kernel in ``write()`` itself and queues only what
the kernel did not take, through the stock path, so ordering, producers and backpressure
(``pauseProducing`` when the queue passes the buffer size), ``loseConnection`` and TLS stay Twisted's.

:func:`eager_endpoint` is the server endpoint for ``tcp:`` / ``tcp6:`` descriptions on a reactor
that has file descriptors (the real one); everything else keeps ``serverFromString``.
``tcp.Port.transport`` is Twisted's documented hook for choosing the connection class.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from typing import Any

from twisted.internet import tcp
from twisted.internet.defer import Deferred, execute
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IStreamServerEndpoint,
)
from twisted.internet.posixbase import PosixReactorBase
from zope.interface import implementer

from nvpair_tw.core import IProxyReactor, IWriteHolding
from nvpair_tw.runtime._endpoints import tcp_listener

__all__ = ["EagerPort", "EagerServer", "EagerTCPServerEndpoint", "eager_endpoint"]


@implementer(IWriteHolding)
class EagerServer(tcp.Server):
    """A server connection whose ``write`` sends at once when its queue is empty.

    It also sets ``TCP_NODELAY``, as nginx does on keep-alive connections: a token written 50 ms
    after the last one must not wait for the client's delayed ACK of it (Nagle's algorithm).
    Between :meth:`hold` and :meth:`send_held` (``core.one_send``: a response's head and first
    body bytes, written in one call) writes are gathered and leave as one.
    """

    _held: list[bytes] | None = None
    _host: Any = None

    def getHost(self) -> Any:
        """This end's address, asked of the kernel once: Twisted's ``Request`` asks for it on
        every request, and an accepted socket's local address never changes."""
        if self._host is None:
            self._host = super().getHost()
        return self._host

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        with contextlib.suppress(OSError):
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _sendable(self) -> bool:
        """Nothing queued, open for writing, not being reset (``abortConnection`` leaves the
        connection ``connected`` and makes ``doWrite`` drop what is written after it: so do we),
        no TLS layered on the transport itself."""
        return bool(
            self._tempDataLen == 0
            and self.offset == len(self.dataBuffer)
            and self.connected
            and not self._writeDisconnected
            and not self._aborting
            and not self.TLS
        )

    def _send_now(self, data: bytes) -> bytes:
        """Give ``data`` to the kernel; what it did not take (to be queued as usual)."""
        try:
            sent = self.socket.send(data)
        except OSError:
            return data  # EAGAIN, EINTR or a dead socket: the stock path (doWrite) handles it
        return data[sent:] if sent < len(data) else b""

    def hold(self) -> None:
        if self._held is None:
            self._held = []

    def send_held(self) -> None:
        held, self._held = self._held, None
        if held:
            self.writeSequence(held)

    def loseConnection(self) -> None:
        self.send_held()
        super().loseConnection()

    def write(self, data: bytes) -> None:
        if self._held is not None:
            if not isinstance(data, bytes):
                raise TypeError(f"Data must be bytes, not {type(data).__name__}")
            self._held.append(data)
            return
        if data and self._sendable():
            data = self._send_now(data)
            if not data:
                return
        super().write(data)

    def writeSequence(self, iovec: Iterable[bytes]) -> None:
        if self._held is not None:
            self._held.extend(iovec)
            return
        if self._sendable():
            data = self._send_now(b"".join(iovec))
            if data:
                super().write(data)
            return
        super().writeSequence(iovec)


class EagerPort(tcp.Port):
    """A TCP listening port whose connections are :class:`EagerServer`."""

    transport = EagerServer


@implementer(IStreamServerEndpoint)
class EagerTCPServerEndpoint:
    """Listens like ``TCP4ServerEndpoint`` / ``TCP6ServerEndpoint``, with :class:`EagerPort`."""

    def __init__(self, reactor: PosixReactorBase, port: int, backlog: int, interface: str) -> None:
        self._reactor = reactor
        self._port = port
        self._backlog = backlog
        self._interface = interface

    def listen(self, protocolFactory: IProtocolFactory) -> Deferred[IListeningPort]:
        def start() -> IListeningPort:
            port = EagerPort(
                self._port, protocolFactory, self._backlog, self._interface, self._reactor
            )
            port.startListening()
            return port

        return execute(start)


def eager_endpoint(reactor: IProxyReactor, description: str) -> IStreamServerEndpoint | None:
    """The eager endpoint for a plain ``tcp:``/``tcp6:`` description on a real reactor, else None."""
    if not isinstance(reactor, PosixReactorBase):  # a test double (MemoryReactor has "fds" too)
        return None
    try:
        listener = tcp_listener(description)
    except ValueError:
        return None
    if listener is None:
        return None
    return EagerTCPServerEndpoint(reactor, listener.port, listener.backlog, listener.interface)
