# -*- test-case-name: tests.selection.test_inventory, tests.selection.test_reachability -*-
"""The bounded control-plane read (:func:`get_json`) the inventory poll and the model-list fan-out
share: a GET through treq's ``HTTPClient`` over the shared pool, cut off by our own timer
(``treq.collect`` cannot be cancelled) and by a body-size cap. A failure is a :class:`ReadError`
whose text says what happened in plain words (``connection refused``), a :class:`ReadTimeout`
when the timer ran out.
"""

from __future__ import annotations

import json
from http.cookiejar import DefaultCookiePolicy
from typing import Any, cast

from hyperlink import EncodedURL
from treq.client import HTTPClient
from treq.cookies import IndexableCookieJar
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.error import (
    ConnectError,
    ConnectionClosed,
    ConnectionRefusedError,
    DNSLookupError,
    NoRouteError,
    TCPTimedOutError,
    TimeoutError,
)
from twisted.internet.interfaces import IConsumer, IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer, IResponse
from zope.interface import implementer

from nvpair_tw.core import LOOP_HEADER, PROCESS_NONCE
from nvpair_tw.upstream._attempt import is_cancellation

__all__ = [
    "MAX_JSON_BYTES",
    "ReadError",
    "ReadTimeout",
    "WholeBody",
    "get_json",
    "join_url",
    "make_http_client",
    "post_json",
]

MAX_JSON_BYTES = 8 << 20
"""A control-plane answer larger than this is abandoned."""


class ReadError(Exception):
    """A control-plane read failed; ``str()`` is a short reason in plain words, without any body."""


class ReadTimeout(ReadError):
    """No whole answer within the read's timeout (``str()``: ``timed out``)."""


_PLAIN: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (DNSLookupError, "host name not found"),
    (TimeoutError, "connection timed out"),
    (TCPTimedOutError, "connection timed out"),
    (NoRouteError, "no route to host"),
    (ConnectionClosed, "connection closed before an answer"),
    (ResponseNeverReceived, "connection closed before an answer"),
)
"""What a transport failure means, in the words a log line and the status page use."""


def _plain(error: BaseException) -> str:
    """``error`` in plain words: from :data:`_PLAIN`, else a connect error's own text (``TLS
    handshake failed``), else its class's name."""
    words = next((words for kind, words in _PLAIN if isinstance(error, kind)), None)
    if words is not None:
        return words
    return str(error).rstrip(".") if isinstance(error, ConnectError) else type(error).__name__


@implementer(IBodyProducer)
class WholeBody:
    """A request body written in one go when the request starts: no cooperator (treq's own
    producer for ``bytes`` runs on the global reactor's), no pausing, nothing to stop."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def make_http_client(agent: IAgent) -> HTTPClient:
    """A treq client for control-plane reads that never stores or sends cookies."""
    return HTTPClient(
        agent, cookiejar=IndexableCookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
    )


def join_url(base: str, path_and_query: str) -> str:
    """A node's base URL joined with an absolute path (and query)."""
    return base.rstrip("/") + path_and_query


class _BoundedBody(Protocol):
    """Collects a response body up to a size cap; :meth:`abort` tears the connection down."""

    def __init__(self, limit: int) -> None:
        self.done: Deferred[bytes] = Deferred(self._cancel)
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._why: str | None = None
        self._cancelled = False

    def _cancel(self, _: Deferred[bytes]) -> None:
        self._cancelled = True
        self.abort("cancelled")

    def abort(self, why: str) -> None:
        if self._why is None:
            self._why = why
        if self.transport is not None:
            IPushProducer(self.transport).stopProducing()

    def dataReceived(self, data: bytes) -> None:
        if self._why is not None:
            return
        self._size += len(data)
        if self._size > self._limit:
            self.abort("answer too large")
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.done.called:
            return
        if self._cancelled:
            self.done.errback(CancelledError())
        elif self._why is not None:
            self.done.errback(ReadError(self._why))
        elif reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self._chunks))
        else:
            self.done.errback(ReadError(f"body failed: {type(reason.value).__name__}"))


async def get_json(
    http: HTTPClient,
    clock: IReactorTime,
    url: str,
    *,
    timeout: float,
    limit: int = MAX_JSON_BYTES,
    authorization: bytes | None = None,
) -> Any:
    """GET ``url`` and parse a 200 answer as JSON, all within ``timeout`` seconds.

    No client header is sent (treq adds only ``Host`` and ``Accept-Encoding``); ``authorization``
    is the node's own credential (:attr:`Node.authorization`), if any. Raises :class:`ReadError`
    on any failure: connect error, non-200, timeout, oversize or bad JSON.
    """
    code, data = await _read(_start_get(http, url, authorization), clock, timeout, limit)
    return _parse_answer(code, data)


async def post_json(
    http: HTTPClient,
    clock: IReactorTime,
    url: str,
    document: Any,
    *,
    timeout: float,
    limit: int = MAX_JSON_BYTES,
    authorization: bytes | None = None,
) -> tuple[int, Any]:
    """POST ``document`` as JSON to ``url``: the status and the answer parsed as JSON (``None``
    when it is not JSON), all within ``timeout`` seconds. Raises :class:`ReadError` when no whole
    answer arrives (connect error, timeout, oversize, a cut body)."""
    headers = {b"content-type": [b"application/json"], LOOP_HEADER: [PROCESS_NONCE]}
    if authorization is not None:
        headers[b"authorization"] = [authorization]
    try:
        posting = http.post(
            _request_url(url),
            data=WholeBody(json.dumps(document).encode()),
            headers=Headers(headers),
            unbuffered=True,
            allow_redirects=False,
        )
    except Exception as error:  # treq rejects some URLs synchronously
        raise ReadError(type(error).__name__) from None
    code, data = await _read(cast("Deferred[IResponse]", posting), clock, timeout, limit)
    try:
        return code, json.loads(data)
    except (ValueError, RecursionError):
        return code, None


async def _read(
    request: Deferred[IResponse], clock: IReactorTime, timeout: float, limit: int
) -> tuple[int, bytes]:
    """The status and whole body of ``request``'s answer within ``timeout`` seconds and ``limit``
    bytes; :class:`ReadError` otherwise (``CancelledError`` when the caller cancelled)."""
    body: _BoundedBody | None = None
    timed_out = False

    def expire() -> None:
        nonlocal timed_out
        timed_out = True
        if body is None:
            request.cancel()
        else:
            body.abort("timed out")

    timer: IDelayedCall = clock.callLater(timeout, expire)
    try:
        try:
            response = await request
        except Exception as error:
            if timed_out:
                raise ReadTimeout("timed out") from None
            if is_cancellation(Failure(error)):
                raise CancelledError() from None
            raise ReadError(_plain(error)) from None
        body = _BoundedBody(limit)
        response.deliverBody(body)
        try:
            data = await body.done
        except ReadError:
            if timed_out:
                raise ReadTimeout("timed out") from None
            raise
    finally:
        if timer.active():
            timer.cancel()
    return response.code, data


def _start_get(http: HTTPClient, url: str, authorization: bytes | None) -> Deferred[IResponse]:
    """The GET of ``url`` (with the node's ``authorization``, if any, and this process's loop
    mark, docs/behaviour.md §14.3), unbuffered, no redirects.

    Typed as the public ``IResponse`` it provides (treq's response class is private): only
    ``code`` and ``deliverBody`` are used.
    """
    headers = Headers({LOOP_HEADER: [PROCESS_NONCE]})
    if authorization is not None:
        headers.setRawHeaders(b"authorization", [authorization])
    try:
        getting = http.get(
            _request_url(url), headers=headers, unbuffered=True, allow_redirects=False
        )
    except Exception as error:  # treq rejects some URLs synchronously
        raise ReadError(type(error).__name__) from None
    return cast("Deferred[IResponse]", getting)


def _parse_answer(code: int, data: bytes) -> Any:
    """A 200 answer's body as JSON, else :class:`ReadError`."""
    if code != 200:
        raise ReadError(f"status {code}")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ReadError("malformed JSON") from None


class _AsWritten(EncodedURL):
    """A URL treq sends as written. hyperlink's ``to_uri`` IDNA-encodes every host, which fails on
    an IPv6 literal (python-hyper/hyperlink#68, #188); an ASCII URL has nothing to encode anyway."""

    def to_uri(self) -> EncodedURL:
        return self


def _request_url(url: str) -> str | EncodedURL:
    """``url`` for treq: an ASCII URL with an IPv6 literal host bypasses the IDNA step."""
    if url.isascii():
        parsed = _AsWritten.from_text(url)
        if ":" in parsed.host:
            return parsed
    return url
