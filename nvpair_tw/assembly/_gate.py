# -*- test-case-name: tests.assembly.test_whole -*-
"""The :class:`AssemblyGate` (docs/behaviour.md §6.5), the sibling of
:class:`~nvpair_tw.upstream._attempt.BodyGate` for assembled attempts, and the client-facing response for
its whole answer."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from zope.interface import implementer

from nvpair_tw.assembly._frames import Assembled, AssemblyError, Dialect
from nvpair_tw.assembly._lines import Assembler
from nvpair_tw.core import IllegalCall, ProxyBug
from nvpair_tw.upstream import BodyEnd, FirstBodyTimeout, FirstBodyTimer

__all__ = ["ANSWER_CONTENT_TYPE", "AssembledResponse", "AssemblyGate", "AssemblyState"]

ANSWER_CONTENT_TYPE = b"application/json; charset=utf-8"
"""What an assembled answer is sent as (what Ollama sends for its own non-streaming answers)."""


@implementer(IPushProducer)
class _Still:
    """The relay's flow control for an answer already in memory: nothing to pause upstream."""

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class AssemblyState(Enum):
    """Where an :class:`AssemblyGate` is in its life (see the class docstring)."""

    AWAITING_FIRST = "awaiting-first"
    ASSEMBLING = "assembling"
    HOLDING = "holding"
    DRAINING = "draining"
    ENDED = "ended"


_FOLDING = (AssemblyState.AWAITING_FIRST, AssemblyState.ASSEMBLING)
"""The states in which body bytes are folded."""


def _failed(error: Exception) -> Failure:
    """An assembly failure (the node's stream: a ``StreamCut``) as a transport failure, which the
    attempt loop classifies ``dropped``; anything else the folder raised as the proxy's bug."""
    if isinstance(error, AssemblyError):
        return Failure(ResponseFailed([Failure(error)]))
    return Failure(ProxyBug(error))


class AssemblyGate(FirstBodyTimer):
    """Folds a streamed upstream body into one answer and commits only when it is whole.

    The sibling of :class:`~nvpair_tw.upstream._attempt.BodyGate` for assembled attempts (docs/behaviour.md
    §6.5): the node is chosen at the first token (the first-body timer stops there), but
    ``first`` fires only with the complete answer, so nothing reaches the client before the
    terminal object and a node that fails earlier is a pre-commit drop.

    :ivar _state: One of :class:`AssemblyState`:

        - ``AWAITING_FIRST``: no body byte yet. The first-body timer runs when enabled. A chunk
          moves to ``ASSEMBLING`` (or straight on, as below); the timer or any end fails ``first``
          and moves to ``ENDED``.
        - ``ASSEMBLING``: chunks are folded by the :class:`Assembler`. The terminal frame fires
          ``first`` with the answer and moves to ``HOLDING``; a cut, a clean end before the
          terminal frame, a malformed frame or an answer past the cap fails ``first`` (a
          ``ResponseFailed`` wrapping the :class:`AssemblyError`, or the transport's reason) and
          moves to ``ENDED``, stopping the upstream body.
        - ``HOLDING``: ``first`` has fired; later upstream bytes are ignored and the body's end
          is noted. :meth:`start_relay` moves to ``ENDED`` and fires ``done`` if the upstream body
          has ended, else to ``DRAINING``.
        - ``DRAINING``: committed, the answer written; the upstream body's end (clean or not: the
          answer is whole either way) fires ``done`` with ``BodyEnd.COMPLETE`` and moves to
          ``ENDED``, so the exchange concludes (and the node's booking is released) only once the
          engine is done with the request.
        - ``ENDED``: nothing more happens; :meth:`start_relay` here raises :class:`IllegalCall`.
    :ivar first: Fires with the whole answer's bytes, or fails (:class:`FirstBodyTimeout` when the
        enabled timer expired, a ``ResponseFailed`` otherwise).
    :ivar done: After :meth:`start_relay`: fires with ``BodyEnd.COMPLETE`` at the upstream body's
        end.
    :ivar answer: The :class:`Assembled` answer once ``first`` has fired.
    :ivar _on_bytes: Called for every non-empty chunk, in every state (the progress record), as
        for :class:`~nvpair_tw.upstream._attempt.BodyGate`: a generation being assembled is
        progress.
    """

    def __init__(
        self,
        clock: IReactorTime,
        first_body_timeout: float,
        dialect: Dialect,
        limit: int,
        on_bytes: Callable[[], None] | None = None,
    ) -> None:
        self.first: Deferred[bytes] = Deferred()
        self._on_bytes = on_bytes
        self.done: Deferred[BodyEnd] = Deferred()
        self.answer: Assembled | None = None
        self._state = AssemblyState.AWAITING_FIRST
        self._clock = clock
        self.first_at: float | None = None
        """Clock seconds of the stream's first body bytes: the first token (§12.3)."""
        self._upstream_ended = False
        self._assembler = Assembler(dialect, limit)
        self._arm(clock, first_body_timeout)

    @property
    def state(self) -> AssemblyState:
        """The current state (read-only; transitions happen through the methods)."""
        return self._state

    @property
    def held(self) -> int:
        """Characters the assembler keeps now."""
        return self._assembler.held

    def producer(self) -> IPushProducer:
        """Flow control for the relay: the answer is in memory, so there is nothing to pause."""
        return _Still()

    def dataReceived(self, data: bytes) -> None:
        if data and self._on_bytes is not None:
            self._on_bytes()  # the node is working (busy waits of its other attempts, §6.4)
        if not data or self._state not in _FOLDING:
            return
        if self._state is AssemblyState.AWAITING_FIRST:
            self._disarm()
            self._state = AssemblyState.ASSEMBLING
            self.first_at = self._clock.seconds()
        try:
            answer = self._assembler.feed(data)
        except Exception as error:
            self._fail(_failed(error))
            self.stop()
            return
        if answer is not None:
            self._hold(answer)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        state = self._state
        self._upstream_ended = True
        if state is AssemblyState.DRAINING:
            self._state = AssemblyState.ENDED
            self.done.callback(BodyEnd.COMPLETE)
            return
        if state in (AssemblyState.HOLDING, AssemblyState.ENDED):
            return
        if self._timed_out:
            self._fail(Failure(FirstBodyTimeout(f"no response body within {self._timeout:g}s")))
        elif reason.check(ResponseDone, PotentialDataLoss):
            try:
                answer = self._assembler.finish()
            except Exception as error:
                self._fail(_failed(error))
            else:
                self._hold(answer)
        else:
            self._fail(reason)

    def _hold(self, answer: Assembled) -> None:
        self._state = AssemblyState.HOLDING
        self.answer = answer
        self.first.callback(answer.body)

    def _fail(self, reason: Failure) -> None:
        self._state = AssemblyState.ENDED
        self.first.errback(reason)

    def response(self, upstream: IResponse) -> AssembledResponse:
        """The client-facing response for the held answer: its status, JSON type and length."""
        if self.answer is None:
            raise IllegalCall(f"response in state {self._state.value}")
        return _answer_response(upstream, self.answer)

    def start_relay(self, sink: Callable[[bytes], None]) -> None:
        """Commit: the answer went out as ``first``; nothing more is relayed, ``done`` fires at
        the upstream body's end."""
        if self._state is not AssemblyState.HOLDING:
            raise IllegalCall(f"start_relay in state {self._state.value}")
        if self._upstream_ended:
            self._state = AssemblyState.ENDED
            self.done.callback(BodyEnd.COMPLETE)
        else:
            self._state = AssemblyState.DRAINING


def _answer_response(upstream: IResponse, answer: Assembled) -> AssembledResponse:
    """``answer`` with ``upstream``'s headers, less its body's type and framing."""
    headers = Headers()
    for name, values in upstream.headers.getAllRawHeaders():
        if name.lower() not in (b"content-type", b"content-length", b"transfer-encoding"):
            headers.setRawHeaders(name, list(values))
    headers.setRawHeaders(b"content-type", [ANSWER_CONTENT_TYPE])
    phrase = b"OK" if answer.status == 200 else b"Internal Server Error"
    return AssembledResponse(upstream.version, answer.status, phrase, headers, answer.body)


@implementer(IResponse)
class AssembledResponse:
    """The response the client gets for an assembled answer (status, headers, whole body)."""

    def __init__(
        self,
        version: tuple[bytes, int, int],
        code: int,
        phrase: bytes,
        headers: Headers,
        body: bytes,
    ) -> None:
        self.version = version
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.length = len(body)
        self.request = None
        self.previousResponse: IResponse | None = None
        self._body = body

    def deliverBody(self, protocol: Protocol) -> None:
        protocol.makeConnection(None)  # type: ignore[arg-type]
        protocol.dataReceived(self._body)
        protocol.connectionLost(Failure(ResponseDone()))

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response
