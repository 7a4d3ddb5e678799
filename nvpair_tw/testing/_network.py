# -*- test-case-name: tests.test_testing -*-
"""The in-memory network under :class:`~nvpair_tw.testing.MemoryCluster`: servers addressed by
``host:port``, reached through ``twisted.test.iosim`` connections that move bytes only when pumped.

``iosim`` is Twisted's own test helper, not public API (``twisted.internet.testing`` has no
connected pair of transports); this module is the only one that touches it, and
``tests/test_dependency_internals.py`` guards the parts it relies on.
"""

from __future__ import annotations

from itertools import count

from attrs import define
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionAborted, ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import (
    IProtocol,
    IProtocolFactory,
    IStreamClientEndpoint,
)
from twisted.internet.task import Clock
from twisted.test import iosim
from twisted.web.client import URI
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

__all__ = ["MemoryNetwork"]


class _MemoryTransport(iosim.FakeTransport):
    """An ``iosim`` transport whose abort is a reset: unsent bytes are dropped, the peer sees
    ``ConnectionLost`` (``FakeTransport`` treats an abort as a clean close)."""

    peer: _MemoryTransport | None = None

    def abortConnection(self) -> None:
        self.stream = []
        # iosim declares ``disconnectReason`` as a ConnectionDone; any reason is reported as given
        self.disconnectReason = ConnectionAborted()  # type: ignore[assignment]
        if self.peer is not None and not self.peer.disconnected:
            self.peer.disconnectReason = ConnectionLost("connection reset")  # type: ignore[assignment]
        self.disconnecting = True


@implementer(IStreamClientEndpoint)
@define
class _MemoryEndpoint:
    network: MemoryNetwork
    host: str
    port: int

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        return self.network.connect(self.host, self.port, protocolFactory)


@implementer(IAgentEndpointFactory)
class MemoryNetwork:
    """Servers addressed by ``host:port``, reached through in-memory connections.

    An ``IAgentEndpointFactory``: give it to ``Agent.usingEndpointFactory`` and every request to
    ``http://host:port/...`` is served by the factory added there with :meth:`add` (``https`` is
    treated as ``http``). Connecting to an address nobody serves fails with
    ``ConnectionRefusedError``. Bytes move only when :meth:`pump` is called; ``connections``
    counts the connections made, :attr:`open` those not yet closed on both sides.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._servers: dict[tuple[str, int], IProtocolFactory] = {}
        self._pumps: list[iosim.IOPump] = []
        self._ports = count(40000)
        self.connections = 0

    def add(self, host: str, port: int, factory: IProtocolFactory) -> None:
        """Serve ``host:port`` (host compared case-insensitively) with ``factory``."""
        self._servers[(host.lower(), port)] = factory

    def remove(self, host: str, port: int) -> None:
        """Stop accepting connections to ``host:port`` (open ones stay open)."""
        self._servers.pop((host.lower(), port), None)

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        if uri.scheme not in (b"http", b"https"):
            raise SchemeNotSupported(f"unsupported scheme: {uri.scheme!r}")
        return _MemoryEndpoint(self, uri.host.decode("ascii"), uri.port)

    def connect(self, host: str, port: int, client: IProtocolFactory) -> Deferred[IProtocol]:
        """Connect ``client`` to the server at ``host:port`` (in memory, at once)."""
        server = self._servers.get((host.lower(), port))
        if server is None:
            return fail(ConnectionRefusedError(host, port))
        client_address = IPv4Address("TCP", "127.0.0.1", next(self._ports))
        server_address = IPv4Address("TCP", host, port)
        client_protocol = client.buildProtocol(server_address)
        server_protocol = server.buildProtocol(client_address)
        if client_protocol is None or server_protocol is None:
            return fail(ConnectionRefusedError(host, port))
        client_io = _MemoryTransport(
            client_protocol, isServer=False, hostAddress=client_address, peerAddress=server_address
        )
        server_io = _MemoryTransport(
            server_protocol, isServer=True, hostAddress=server_address, peerAddress=client_address
        )
        client_io.peer, server_io.peer = server_io, client_io
        self._pumps.append(
            iosim.connect(
                server_protocol,
                server_io,
                client_protocol,
                client_io,
                greet=False,
                clock=self._clock,
            )
        )
        self.connections += 1
        return succeed(client_protocol)

    @property
    def open(self) -> int:
        """How many connections are not yet closed on both sides."""
        return len(self._pumps)

    def pump(self) -> bool:
        """Move pending bytes and closes one step on every connection; whether anything moved."""
        moved = False
        for pump in list(self._pumps):
            if pump.pump(advanceClock=False):
                moved = True
            if pump.clientIO.disconnected and pump.serverIO.disconnected:
                self._pumps.remove(pump)
        return moved
