# -*- test-case-name: tests.upstream.test_agent -*-
"""A lean keep-alive HTTP/1.1 client for the upstream hop, behind Twisted's ``IAgent``.

Twisted's ``Agent`` decodes a chunked body one chunk at a time and hands every chunk to the body
protocol on its own, so a token stream costs several method calls and one relay write per token.
:class:`NodeAgent` decodes all complete chunks found in one socket read at once and delivers their
payloads in **one** ``dataReceived`` call (likewise one call per read for ``Content-Length`` and
close-delimited bodies): the relay writes once per read.

The parts: ``_http1`` reads responses without I/O (head, framing, chunked decoding),
``_protocol`` is one connection (:class:`~nvpair_tw.upstream._protocol.NodeClientProtocol`, its
states and endings), this module the agent and its keep-alive idle set. Cancelling while
connecting is the endpoint's ``ConnectingCancelledError``.

No automatic retry: the proxy owns failover. A connection is reused only after its whole response
was read, neither side said ``Connection: close`` and the body was not close-delimited.
"""

from __future__ import annotations

import re
from typing import Any, cast

from attrs import frozen
from twisted.internet.abstract import isIPv6Address
from twisted.internet.defer import Deferred, fail, gatherResults
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory
from twisted.web.client import URI
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgent, IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from nvpair_tw.core import IProxyReactor, close, header_tokens
from nvpair_tw.upstream._http1 import TOKEN
from nvpair_tw.upstream._protocol import ClientRequest, ClientState, NodeClientProtocol

__all__ = ["NodeAgent"]

_TARGET = re.compile(rb"[\x21-\x7e]+\Z")
_Key = tuple[bytes, bytes, int]
PARSED_KEPT = 256
"""How many request URLs an agent keeps parsed (a node's base URL and a path each)."""


class _ClientFactory(Factory):
    noisy = False

    def __init__(self, agent: NodeAgent) -> None:
        self._agent = agent

    def buildProtocol(self, addr: Any) -> NodeClientProtocol:
        return NodeClientProtocol(self._agent._release, self._agent._lost)


def _host_value(scheme: bytes, host: bytes, port: int) -> bytes:
    if isIPv6Address(host.decode("ascii", "replace")):
        host = b"[" + host + b"]"
    if (scheme, port) in ((b"http", 80), (b"https", 443)):
        return host
    return b"%b:%d" % (host, port)


@frozen
class _Url:
    """A request URL, parsed and checked: its request target and its ``Host`` value."""

    parsed: URI
    target: bytes
    host: bytes


def _url(uri: bytes) -> _Url:
    """Parse and check a request URL (ValueError when it cannot be sent)."""
    parsed = URI.fromBytes(uri)
    if parsed.scheme not in (b"http", b"https"):
        raise ValueError("only http and https node URLs")
    target = parsed.originForm
    if not _TARGET.match(target):
        raise ValueError("invalid request target")
    return _Url(parsed, target, _host_value(parsed.scheme, parsed.host, parsed.port))


@implementer(IAgent)
class NodeAgent:
    """An ``IAgent`` over :class:`NodeClientProtocol` with a keep-alive idle set per node.

    Connections come from ``endpoints`` (``upstream.NodeEndpointFactory``: TLS, IPv6, the connect
    timeout). A connection goes back to the idle set of its (scheme, host, port) once its response
    was complete and reusable; it expires after ``idle_seconds`` on ``reactor``'s clock, and at most
    ``max_idle_per_host`` are kept. Nothing is retried.
    """

    def __init__(
        self,
        reactor: IProxyReactor | IReactorTime,
        endpoints: IAgentEndpointFactory,
        *,
        max_idle_per_host: int = 32,
        idle_seconds: float = 4,
    ) -> None:
        self._clock: IReactorTime = reactor
        self._endpoints = endpoints
        self.max_idle_per_host = max_idle_per_host
        self.idle_seconds = idle_seconds
        self._factory = _ClientFactory(self)
        self._idle: dict[_Key, list[NodeClientProtocol]] = {}
        self._keys: dict[NodeClientProtocol, _Key] = {}
        self._since: dict[NodeClientProtocol, float] = {}  # idle since, on the clock
        self._sweep: IDelayedCall | None = None
        self._parsed: dict[bytes, _Url] = {}

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]:
        try:
            url = self._parse(uri)
            head, persistent = _head(method, url, headers, bodyProducer)
        except Exception:
            return fail()
        request = ClientRequest(method, uri, headers if headers is not None else Headers())
        parsed = url.parsed
        key: _Key = (parsed.scheme, parsed.host, parsed.port)
        idle = self._take_idle(key)
        if idle is not None:
            return idle.request(head, request, bodyProducer, persistent)
        try:
            endpoint = self._endpoints.endpointForURI(parsed)
        except Exception:
            return fail()
        connecting = cast("Deferred[NodeClientProtocol]", endpoint.connect(self._factory))

        def connected(protocol: NodeClientProtocol) -> Deferred[IResponse]:
            self._keys[protocol] = key
            return protocol.request(head, request, bodyProducer, persistent)

        return connecting.addCallback(connected)

    def _parse(self, uri: bytes) -> _Url:
        """The URL parsed and checked (`_url`), kept for the next request to the same URL (the
        same few node paths, again and again), up to `PARSED_KEPT` of them."""
        kept = self._parsed.get(uri)
        if kept is None:
            kept = _url(uri)
            if len(self._parsed) >= PARSED_KEPT:
                self._parsed.clear()
            self._parsed[uri] = kept
        return kept

    def close(self) -> Deferred[None]:
        """Close every idle connection; fires once all of them are gone."""
        closing: list[Deferred[None]] = []
        for protocols in list(self._idle.values()):
            for protocol in list(protocols):
                self._forget(protocol)
                closing.append(protocol.close_idle())
        self._idle.clear()
        return gatherResults(closing).addCallback(lambda _: None)

    def idle_count(self, key: _Key | None = None) -> int:
        """Idle connections kept (for one node, or all)."""
        if key is not None:
            return len(self._idle.get(key, ()))
        return sum(len(p) for p in self._idle.values())

    def _take_idle(self, key: _Key) -> NodeClientProtocol | None:
        protocols = self._idle.get(key)
        while protocols:
            protocol = protocols.pop()
            del self._since[protocol]
            if protocol.state is ClientState.IDLE:
                return protocol
        return None

    def _release(self, protocol: NodeClientProtocol) -> None:
        key = self._keys.get(protocol)
        if key is None:
            close(protocol.transport)
            return
        protocols = self._idle.setdefault(key, [])
        if len(protocols) >= self.max_idle_per_host:
            close(protocol.transport)
            return
        protocols.append(protocol)
        self._since[protocol] = self._clock.seconds()
        if self._sweep is None:
            self._sweep = self._clock.callLater(self.idle_seconds, self._expire)

    def _expire(self) -> None:
        """Close the connections idle for ``idle_seconds``; come back when the next one will be.
        One timer for the whole idle set: a connection taken and given back (every request)
        schedules and cancels none."""
        self._sweep = None
        now = self._clock.seconds()
        for protocol, since in list(self._since.items()):
            if since + self.idle_seconds <= now:  # as ``due`` below is worked out
                self._forget(protocol)
                close(protocol.transport)
        if self._since:
            due = min(self._since.values()) + self.idle_seconds
            self._sweep = self._clock.callLater(max(due - now, 0.0), self._expire)

    def _forget(self, protocol: NodeClientProtocol) -> None:
        self._since.pop(protocol, None)
        if not self._since and self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        key = self._keys.get(protocol)
        if key is not None:
            protocols = self._idle.get(key, [])
            if protocol in protocols:
                protocols.remove(protocol)
            if not protocols:
                self._idle.pop(key, None)

    def _lost(self, protocol: NodeClientProtocol) -> None:
        self._forget(protocol)
        self._keys.pop(protocol, None)


def _head(
    method: bytes, url: _Url, headers: Headers | None, producer: IBodyProducer | None
) -> tuple[bytes, bool]:
    """The request line and headers, and whether the request allows keep-alive."""
    if not TOKEN.match(method):
        raise ValueError("invalid request method")
    lines = [method, b" ", url.target, b" HTTP/1.1\r\n"]
    persistent = True
    if headers is None or not headers.hasHeader(b"host"):
        lines += [b"Host: ", url.host, b"\r\n"]
    if headers is not None:
        persistent = b"close" not in header_tokens(headers, b"connection")
        for name, values in headers.getAllRawHeaders():
            for value in values:
                lines += [name, b": ", value, b"\r\n"]
    if producer is not None:
        if producer.length is UNKNOWN_LENGTH:
            raise ValueError("a request body of unknown length is not supported")
        lines.append(b"Content-Length: %d\r\n" % cast(int, producer.length))
    elif method in (b"PUT", b"POST"):
        lines.append(b"Content-Length: 0\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), persistent
