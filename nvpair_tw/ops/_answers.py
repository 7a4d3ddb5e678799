# -*- test-case-name: tests.ops.test_control -*-
"""The answers a control connection still owes (docs/behaviour.md §8): each sent when it comes, every
one cancelled when the client leaves (a ``node/drain`` stops waiting), and the one in-order answer
that later request lines wait for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred

from nvpair_tw.ops._rpc import Result

__all__ = ["PendingAnswers"]


class PendingAnswers:
    """One connection's answers to come; ``send`` writes one (a no-op once the connection closed)."""

    def __init__(self, send: Callable[[Result], None]) -> None:
        self._send = send
        self._pending: set[Deferred[Any]] = set()
        self.waiting: Deferred[None] | None = None
        """The in-order answer later lines wait for, while it is pending."""

    def later(self, answer: Deferred[Result | None]) -> Deferred[None]:
        """Send ``answer`` when it comes; until then it is cancelled if the client leaves."""
        self._pending.add(answer)
        answer.addBoth(self._settled, answer)
        return answer.addCallback(self._send_later)

    def in_order(self, answer: Deferred[Result | None], resume: Callable[[], None]) -> None:
        """Send ``answer`` when it comes, then ``resume`` reading; until then :attr:`waiting`."""
        self.waiting = self.later(answer)
        self.waiting.addCallback(self._resume, resume)

    def cancel_all(self) -> None:
        """Nobody to answer: cancel every answer still to come."""
        for answer in list(self._pending):
            answer.cancel()

    def _settled(self, result: object, answer: Deferred[Any]) -> object:
        self._pending.discard(answer)
        return result

    def _send_later(self, response: Result | None) -> None:
        if response is not None:
            self._send(response)

    def _resume(self, _: None, resume: Callable[[], None]) -> None:
        self.waiting = None  # the in-order answer is sent: read on
        resume()
