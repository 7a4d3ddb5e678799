# -*- test-case-name: tests.corridor.test_peek -*-
"""A node's small answer read before the attempt decides what it is, then handed on as if unread
(docs/behaviour.md §17.3: a 404 whose body says the route itself is missing is learnt, any other
goes on as before).

:func:`peek` reads the body of ``response`` into memory, at most ``limit`` bytes and for at most
``timeout`` seconds, and gives back the whole body when it ended cleanly within both (None when it
did not: longer, slower, or cut), with a response whose ``deliverBody`` replays what was read and
relays the rest as it comes, so whoever reads it next sees the node's body from its first byte.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair_tw.corridor._caller import CallerState

__all__ = ["PEEK_LIMIT", "peek"]

PEEK_LIMIT = 16 << 10
"""Bytes: a body longer than this is not one of the short answers a peek looks for."""


class _Peek(Protocol):
    """Holds the body until :meth:`hand`, then relays it. ``decided`` fires once: with the whole
    body at a clean end within the limit, with None at the limit, at the timer or at a cut."""

    def __init__(self, clock: IReactorTime, limit: int, timeout: float) -> None:
        self.decided: Deferred[bytes | None] = Deferred()
        self._limit = limit
        self._held: list[bytes] = []
        self._size = 0
        self._ending: Failure | None = None
        self._next: Protocol | None = None
        self._timer: IDelayedCall | None = clock.callLater(timeout, self._decide, None)

    def dataReceived(self, data: bytes) -> None:
        if self._next is not None:
            self._next.dataReceived(data)
            return
        self._held.append(data)
        self._size += len(data)
        if self._size > self._limit:
            self._decide(None)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._next is not None:
            self._next.connectionLost(reason)
            return
        self._ending = reason
        clean = reason.check(ResponseDone, PotentialDataLoss) is not None
        self._decide(b"".join(self._held) if clean else None)

    def stop(self) -> None:
        """Close the node's body (the caller left): the peek decides None."""
        if self.transport is not None:
            IPushProducer(self.transport).stopProducing()
        self._decide(None)

    def hand(self, protocol: Protocol) -> None:
        """From now on ``protocol`` reads the body: what was held first, then the rest."""
        protocol.makeConnection(self.transport)
        held, self._held = self._held, []
        for chunk in held:
            protocol.dataReceived(chunk)
        if self._ending is not None:
            protocol.connectionLost(self._ending)
        else:
            self._next = protocol

    def _decide(self, body: bytes | None) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if not self.decided.called:
            self.decided.callback(body)


@implementer(IResponse)
class _Peeked:
    """``original`` whose body a peek holds: the same head, the body handed on from its start."""

    def __init__(self, original: IResponse, held: _Peek) -> None:
        self._held = held
        self.version = original.version
        self.code = original.code
        self.phrase = original.phrase
        self.headers = original.headers
        self.length = original.length
        self.request = original.request
        self.previousResponse = original.previousResponse

    def deliverBody(self, protocol: Protocol) -> None:
        self._held.hand(protocol)

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response


async def peek(
    response: IResponse, clock: IReactorTime, timeout: float, caller: CallerState
) -> tuple[bytes | None, IResponse]:
    """The whole body of ``response`` when it ends cleanly within :data:`PEEK_LIMIT` bytes and
    ``timeout`` seconds (else None), and the response to read it from again."""
    held = _Peek(clock, PEEK_LIMIT, timeout)
    caller.track(held.stop)
    response.deliverBody(held)
    body = await held.decided
    caller.track(None)
    return body, _Peeked(response, held)
