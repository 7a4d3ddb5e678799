# -*- test-case-name: tests.corridor.test_tunnel -*-
"""The WebSocket tunnel of the lmstudio facade (docs/behaviour.md §2.1).

A ``GET`` with ``Upgrade: websocket`` is tried against the candidates in order. The upgrade
request is written to each node by hand (raw HTTP/1.1 over the runtime's endpoint factory, so TLS
trust and IP-literal dialling are the same as for every other request); until a node answers
``101 Switching Protocols`` nothing is committed, so a refusal, a timeout or any other status
moves on to the next node, and the last node's non-101 answer becomes the client's answer (its
head read by the node client's own parser, ``upstream.HeadParser``, its body framed by
``upstream.BodyReader``: ``Content-Length``, chunked or to the close, at most 1 MiB). After
the 101 the node's response head is relayed verbatim and the two connections are spliced
byte-for-byte, each transport registered as the other's push producer (backpressure both ways),
until either side closes, which closes the other.

Why a raw splice and not ``twisted.web.websocket`` or autobahn: the proxy need not understand a
single frame (no inspection, no rewriting), a frame-level proxy would parse and re-serialise every
frame and would have to agree with both peers on extensions (``permessage-deflate``) and limits,
and the node's own handshake answer (``Sec-WebSocket-Accept``, chosen subprotocol, extensions)
reaches the client untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import connectProtocol
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import URI
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from nvpair_tw.core import (
    HOP_BY_HOP,
    IllegalCall,
    abort,
    close,
    forward_headers,
    header_tokens,
)
from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._record import AttemptLog
from nvpair_tw.corridor._writer import Whole, Writer
from nvpair_tw.events import Attempt, AttemptOutcome, Outcome, StatusOutcome
from nvpair_tw.inbound import LimitedChannel, Rejection
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.upstream import BadResponse, BodyReader, HeadParser, ResponseHead

__all__ = [
    "TUNNEL_ENGINES",
    "Tunnel",
    "TunnelBook",
    "TunnelEnd",
    "TunnelState",
    "Upgrade",
    "is_upgrade",
    "open_tunnel",
]

TUNNEL_ENGINES = frozenset({"lmstudio"})
"""Facades that carry WebSocket upgrades (the LM Studio SDK channel)."""

MAX_HEAD_BYTES = 64 * 1024
"""A node's response head longer than this is a failed attempt."""
MAX_REFUSAL_BODY = 1024 * 1024
"""The largest non-101 answer body relayed to the client (a longer one: 502)."""

_log = LevelledLogger(namespace=__name__)


class TunnelState(Enum):
    """The states of a :class:`Tunnel`.

    ``HANDSHAKE``: the upgrade request is being tried against the candidates; nothing has reached
    the client. Allowed: :meth:`Tunnel.open`, :meth:`Tunnel.close`.

    ``OPEN``: a node answered 101, its head went to the client, the connections are spliced.
    Allowed: :meth:`Tunnel.client_data`, :meth:`Tunnel.node_data`, :meth:`Tunnel.client_lost`,
    :meth:`Tunnel.node_lost`, :meth:`Tunnel.close`.

    ``CLOSED``: either side closed and the other was closed too (terminal). :meth:`Tunnel.close`
    and the ``*_lost`` notifications are no-ops; data raises.

    Any other call raises :class:`IllegalCall`.
    """

    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


def is_upgrade(method: bytes, headers: Headers) -> bool:
    """A ``GET`` asking to switch to WebSocket (``Upgrade: websocket``, ``Connection: upgrade``)."""
    if method != b"GET":
        return False
    upgrade = header_tokens(headers, b"upgrade")
    connection = header_tokens(headers, b"connection")
    return b"websocket" in upgrade and b"upgrade" in connection


def _pending(transport: Any) -> int:
    """Bytes a transport holds unsent in user space (0 when it does not say)."""
    buffered = getattr(transport, "dataBuffer", b"")
    offset = getattr(transport, "offset", 0)
    temp = getattr(transport, "_tempDataLen", 0)
    size = len(buffered) - offset + temp if isinstance(buffered, bytes | bytearray) else temp
    return size if isinstance(size, int) else 0


@define
class TunnelBook:
    """The open tunnels of a process: the ``--max-tunnels`` cap and the count per node."""

    limit: int
    tunnels: set[Tunnel] = field(factory=set)
    peak_held: int = 0
    """The most bytes one tunnel ever held unsent in the proxy (both directions)."""
    on_pause: Callable[[Tunnel, str], None] | None = None
    """Called with ``"node"`` when a node's reading is paused because its client is slow, and
    ``"client"`` when a client's reading is paused because its node is slow."""

    def admit(self, engine: str, key: str | None = None, cap: int | None = None) -> Tunnel | None:
        """A new tunnel in ``HANDSHAKE`` for the named ``key`` (None: the ``local`` caller), or
        None at the process's cap or at the key's own ``cap`` (``max_tunnels``, §14.2)."""
        if len(self.tunnels) >= self.limit:
            return None
        if key is not None and cap is not None and self.held_by(key) >= cap:
            return None
        tunnel = Tunnel(self, engine, key=key)
        self.tunnels.add(tunnel)
        return tunnel

    def held_by(self, key: str) -> int:
        """Tunnels the named ``key`` has open (or opening)."""
        return sum(1 for t in self.tunnels if t.key == key)

    def revoke(self, keys: frozenset[str]) -> None:
        """Close the tunnels of keys removed or re-scoped in the keys file (§14.2)."""
        for tunnel in [t for t in self.tunnels if t.key in keys]:
            if tunnel.state is TunnelState.OPEN:
                tunnel.close()

    def count(self, engine: str, node_id: str) -> int:
        """Open tunnels to ``node_id`` through ``engine``'s facade (in flight on that node)."""
        return sum(
            1
            for t in self.tunnels
            if t.state is TunnelState.OPEN and t.engine == engine and t.node_id == node_id
        )

    def note_held(self, held: int) -> None:
        self.peak_held = max(self.peak_held, held)

    def close_all(self) -> None:
        """Close every tunnel (the process stops)."""
        for tunnel in list(self.tunnels):
            tunnel.close()


@implementer(IPushProducer)
@define
class _Valve:
    """One side's transport as the other side's producer, reporting pauses."""

    tunnel: Tunnel
    transport: Any
    side: str

    def pauseProducing(self) -> None:
        self.transport.pauseProducing()
        self.tunnel.paused(self.side)

    def resumeProducing(self) -> None:
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        close(self.transport)


@define(eq=False)
class Tunnel:
    """One upgraded connection: the client's channel spliced to one node (see :class:`TunnelState`)."""

    book: TunnelBook
    engine: str
    key: str | None = None
    """The named key that opened it (None: the ``local`` caller)."""
    state: TunnelState = TunnelState.HANDSHAKE
    node_id: str | None = None
    _channel: LimitedChannel | None = None
    _node: Any = None
    closed: Deferred[None] = field(factory=Deferred)
    """Fires once the tunnel is ``CLOSED`` and both connections are gone."""
    _client_gone: bool = False
    _node_gone: bool = False

    def _require(self, *states: TunnelState) -> None:
        if self.state not in states:
            raise IllegalCall(f"not allowed in state {self.state.name}")

    def open(self, node_id: str, channel: LimitedChannel, node: Any, head: bytes) -> None:
        """The node answered 101 with ``head`` (and maybe frames): relay it and splice."""
        self._require(TunnelState.HANDSHAKE)
        self.state = TunnelState.OPEN
        self.node_id = node_id
        self._channel = channel
        self._node = node
        client = channel.transport
        assert client is not None
        buffered = channel.hand_over(self)
        channel.registerProducer(_Valve(self, node, "node"), True)
        node.registerProducer(_Valve(self, client, "client"), True)
        client.write(head)
        self.book.note_held(_pending(client))
        if buffered:
            self.client_data(buffered)

    def client_data(self, data: bytes) -> None:
        """Bytes from the client: to the node as they are."""
        self._require(TunnelState.OPEN)
        self._node.write(data)
        self.book.note_held(_pending(self._node))

    def node_data(self, data: bytes) -> None:
        """Bytes from the node: to the client as they are."""
        self._require(TunnelState.OPEN)
        assert self._channel is not None
        client = self._channel.transport
        assert client is not None
        client.write(data)
        self.book.note_held(_pending(client))

    def paused(self, side: str) -> None:
        """``side``'s reading was paused (its peer's transport is full)."""
        if self.book.on_pause is not None:
            self.book.on_pause(self, side)

    def client_lost(self, reason: Failure = connectionDone) -> None:
        """The client's connection is gone: close the node's."""
        self._require(TunnelState.OPEN, TunnelState.CLOSED)
        self._client_gone = True
        self.close()
        self._settle()

    def node_lost(self, reason: Failure = connectionDone) -> None:
        """The node's connection is gone: close the client's (after what was written to it)."""
        self._require(TunnelState.OPEN, TunnelState.CLOSED)
        self._node_gone = True
        self.close()
        self._settle()

    def close(self) -> None:
        """Close both sides (each after its pending bytes); idempotent. :attr:`closed` fires once
        both connections are gone (at once when no node was spliced)."""
        if self.state is TunnelState.CLOSED:
            return
        spliced = self.state is TunnelState.OPEN
        self.state = TunnelState.CLOSED
        self.book.tunnels.discard(self)
        if not spliced:
            self._client_gone = self._node_gone = True
        if self._node is not None and not self._node_gone:
            self._node.unregisterProducer()
            close(self._node)
        if self._channel is not None and not self._client_gone:
            self._channel.unregisterProducer()
            close(self._channel.transport)
        self._settle()

    def _settle(self) -> None:
        if self._client_gone and self._node_gone and not self.closed.called:
            self.closed.callback(None)


# --- the handshake with one node -----------------------------------------------------------------


@frozen
class _Switched:
    side: _NodeSide
    """The node's connection, holding its 101 head and what followed (see ``attach``)."""


@frozen
class _Answer:
    status: int
    headers: Headers
    body: bytes


class _HandshakeFailed(Exception):
    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class _NodeSide(Protocol):
    """The node's connection: reads the answer head with the node client's own parser
    (``upstream.HeadParser``), then after a 101 feeds the tunnel. Any other answer's body is
    framed by ``upstream.BodyReader`` (``Content-Length``, chunked, to the close, none) and
    becomes the :class:`_Answer` the client may get."""

    def __init__(self, request_head: bytes) -> None:
        self._request = request_head
        self._parser = HeadParser()
        self.answer: Deferred[_Switched | _Answer] = Deferred()
        self.tunnel: Tunnel | None = None
        self._head: ResponseHead | None = None
        self._reader: BodyReader | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._switched = False
        self._early = b""
        self.lost = False

    def attach(self, tunnel: Tunnel) -> bytes:
        """Feed the tunnel from now on; returns the 101 head and what followed it so far."""
        self.tunnel = tunnel
        early, self._early = self._early, b""
        return early

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self._request)

    def _fail(self, outcome: Outcome, message: str) -> None:
        if not self.answer.called:
            self.answer.errback(_HandshakeFailed(outcome, message))
        abort(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.node_data(data)
        elif self._switched:
            self._early += data
        elif self.answer.called:
            return
        elif self._reader is not None:
            self._refusal_body(data)
        else:
            self._early += data  # every byte so far: after a 101 it goes to the client verbatim
            self._answer_head(data)

    def _answer_head(self, data: bytes) -> None:
        try:
            head = self._parser.feed(data)
            if head is not None and head.code != 101:
                self._reader = BodyReader(b"GET", head)
        except BadResponse:
            self._fail(AttemptOutcome.DROPPED, "the node's answer is not HTTP/1.1")
            return
        if head is None:
            if len(self._early) > MAX_HEAD_BYTES:
                self._fail(AttemptOutcome.DROPPED, "the node's answer head is too long")
        elif head.code == 101:
            self._switched = True
            self.answer.callback(_Switched(self))
        else:
            self._head, self._early = head, b""
            self._refusal_body(head.rest)

    def _refusal_body(self, data: bytes) -> None:
        assert self._head is not None and self._reader is not None
        code = self._head.code
        if self._reader.empty:
            self._answered()
            return
        try:
            payload, after = self._reader.feed(data)
        except BadResponse:
            self._fail(AttemptOutcome.DROPPED, "the node's answer body is malformed")
            return
        self._body.append(payload)
        self._size += len(payload)
        if self._size > MAX_REFUSAL_BODY:
            self._fail(StatusOutcome(code), f"the node answered {code}")
        elif after is not None:
            self._answered()

    def _answered(self) -> None:
        """The refusal is complete: it is the answer; the connection is closed."""
        assert self._head is not None
        self.answer.callback(_Answer(self._head.code, self._head.headers, b"".join(self._body)))
        close(self.transport)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.tunnel is not None:
            self.tunnel.node_lost(reason)
        elif self._switched:
            self.lost = True  # before the tunnel attached: open_tunnel tells it
        elif not self.answer.called:
            if self._reader is not None and self._reader.close_delimited:
                self._answered()
            else:
                self._fail(AttemptOutcome.DROPPED, "the node closed during the handshake")


def _request_head(
    upgrade: list[bytes], forwarded: Headers, node: Node, target: bytes, uri: URI
) -> bytes:
    """The upgrade request toward ``node``: the head's forwardable headers (docs/behaviour.md
    §14.1), the client's ``Upgrade`` values, its credentials."""
    headers = forwarded.copy()
    headers.setRawHeaders(b"upgrade", upgrade)
    headers.setRawHeaders(b"connection", [b"Upgrade"])
    authorization = node.authorization
    if authorization is not None:
        headers.setRawHeaders(b"authorization", [authorization])
    default = 443 if uri.scheme == b"https" else 80
    netloc = uri.host if uri.port == default else b"%s:%d" % (uri.host, uri.port)
    lines = [b"GET " + target + b" HTTP/1.1", b"Host: " + netloc]
    for name, values in headers.getAllRawHeaders():
        lines.extend(name + b": " + value for value in values)
    return b"\r\n".join(lines) + b"\r\n\r\n"


@frozen
class Upgrade:
    """One upgrade as the driver hands it on: the target a node receives, the forwardable
    headers and the client's ``Upgrade`` values."""

    target: bytes
    forwarded: Headers
    upgrade: list[bytes]


async def _handshake(
    upgrade: Upgrade,
    node: Node,
    endpoints: IAgentEndpointFactory,
    clock: IReactorTime,
    timeout: float,
) -> _Switched | _Answer:
    """Try the upgrade on one node; raises :class:`_HandshakeFailed`."""
    base = node.public_url.rstrip("/").encode("utf-8")
    uri = URI.fromBytes(base + upgrade.target)
    head = _request_head(upgrade.upgrade, upgrade.forwarded, node, upgrade.target, uri)
    side = _NodeSide(head)
    try:
        await connectProtocol(endpoints.endpointForURI(uri), side)
    except Exception as error:
        raise _HandshakeFailed(AttemptOutcome.CONNECT_ERROR, "connection failed") from error
    timer: IDelayedCall = clock.callLater(
        timeout, side._fail, AttemptOutcome.STALL, "no answer to the upgrade"
    )
    try:
        return await side.answer
    finally:
        if timer.active():
            timer.cancel()


@frozen
class TunnelEnd:
    """How a tunnel ended, for its record: the status (101 once spliced), the node spliced to,
    the error, each node tried, and when the client's answer began (clock seconds)."""

    status: int
    node_id: str | None
    error: str | None
    attempts: tuple[Attempt, ...]
    first_byte_at: float | None = None
    refused: Rejection | None = None
    """The refusal the client gets, when it gets one (the record then says ``error``)."""


@define
class _Tries:
    """The nodes an upgrade was tried on, as its record lists them."""

    clock: IReactorTime
    log: AttemptLog = field(factory=AttemptLog)

    def start(self, node: Node) -> None:
        self.log.start(node.id, self.clock.seconds())

    def end(self, outcome: Outcome) -> None:
        self.log.close(outcome, self.clock.seconds())

    def over(
        self, status: int, error: str | None, node_id: str | None = None, at: float | None = None
    ) -> TunnelEnd:
        self.log.close(AttemptOutcome.UNFINISHED, self.clock.seconds())
        return TunnelEnd(status, node_id, error, tuple(self.log.closed), at)

    def refused(self, refused: Rejection) -> TunnelEnd:
        self.log.close(AttemptOutcome.UNFINISHED, self.clock.seconds())
        attempts = tuple(self.log.closed)
        return TunnelEnd(refused.status, None, refused.code, attempts, refused=refused)


async def open_tunnel(
    writer: Writer,
    candidates: list[Node],
    upgrade: Upgrade,
    caller: CallerState,
    *,
    key: tuple[str, int | None] | None = None,
    engine: str,
    book: TunnelBook,
    endpoints: IAgentEndpointFactory,
    clock: IReactorTime,
    timeout: float,
) -> TunnelEnd:
    """Try ``candidates`` in order until one switches protocols; splice; end when it closes."""
    tries = _Tries(clock)
    tunnel = book.admit(engine, *key) if key is not None else book.admit(engine)
    if tunnel is None:
        return tries.refused(Rejection(503, "too-many-tunnels", "too many open tunnels"))
    last: _Answer | None = None
    failure = "no node accepted the upgrade"
    try:
        for node in candidates:
            tries.start(node)
            try:
                answer = await _handshake(upgrade, node, endpoints, clock, timeout)
            except _HandshakeFailed as error:
                tries.end(error.outcome)
                failure = f"{node.id}: {error}"
                last = None
                continue
            if caller.gone is not None or tunnel.state is TunnelState.CLOSED:
                tries.end(AttemptOutcome.CANCELLED)
                if isinstance(answer, _Switched):
                    close(answer.side.transport)
                break
            if isinstance(answer, _Answer):
                tries.end(StatusOutcome(answer.status))
                last = answer
                continue
            tries.end(AttemptOutcome.COMMITTED)
            return await _splice(writer, tunnel, node, answer, tries)
    finally:
        tunnel.close()
    if caller.gone is not None:
        return tries.over(499, "client disconnected")
    if last is not None:
        writer.whole(_relayed_answer(last))
        return tries.over(last.status, StatusOutcome(last.status).value, at=clock.seconds())
    return tries.refused(Rejection(502, "upstream-error", failure))


async def _splice(
    writer: Writer, tunnel: Tunnel, node: Node, answer: _Switched, tries: _Tries
) -> TunnelEnd:
    """After the node's 101: splice the client's channel and the node's connection until one
    closes."""
    channel = writer.hand_over()
    if channel is None:
        close(answer.side.transport)
        return tries.refused(
            Rejection(500, "internal-error", "this listener cannot carry a tunnel")
        )
    at = tries.clock.seconds()
    tunnel.open(node.id, channel, answer.side.transport, answer.side.attach(tunnel))
    if answer.side.lost:
        tunnel.node_lost()
    await tunnel.closed
    return tries.over(101, None, node.id, at)


def _relayed_answer(answer: _Answer) -> Whole:
    """The last node's non-101 answer as the client's (end-to-end headers, the body)."""
    drop = frozenset({b"content-length", b"content-type", *HOP_BY_HOP})
    headers = forward_headers(answer.headers, drop)
    pairs = [(name, value) for name, values in headers.getAllRawHeaders() for value in values]
    kind = answer.headers.getRawHeaders(b"content-type", [b""])[0]
    return Whole(answer.status, answer.body, kind, (*pairs, (b"connection", b"close")))
