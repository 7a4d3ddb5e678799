# -*- test-case-name: tests.upstream.test_probe -*-
"""The cheap question a cooling node is asked when its cooldown expires (docs/behaviour.md §6.3,
"paid once until it answers"): does it send response headers to its own inventory read within a
bound?

Any status counts as an answer: a node that says 401 or 503 is not frozen, and the next client
request learns the rest quickly. No headers in time (a frozen process, a refused or reset
connection, a dial that never completes) is no answer. The body is never read: the connection is
torn down as soon as the head is in, so a probe costs the node one small request.
"""

from __future__ import annotations

from treq.client import HTTPClient
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol

from nvpair_tw.upstream._fetch import ReadError, _start_get

__all__ = ["node_answers"]


class _Discard(Protocol):
    """Takes the body's transport only to stop it: the probe needs the head alone."""

    def connectionMade(self) -> None:
        IPushProducer(self.transport).stopProducing()


async def node_answers(
    http: HTTPClient,
    clock: IReactorTime,
    url: str,
    *,
    timeout: float,
    authorization: bytes | None = None,
) -> bool:
    """Whether a GET of ``url`` gets response headers (any status) within ``timeout`` seconds.

    Never raises: every failure, the timeout included, is ``False``.
    """
    try:
        request = _start_get(http, url, authorization)
    except ReadError:
        return False
    timer = clock.callLater(timeout, request.cancel)
    try:
        response = await request
    except Exception:  # refused, reset, TLS, timed out (cancelled): no answer
        return False
    finally:
        if timer.active():
            timer.cancel()
    response.deliverBody(_Discard())
    return True
