# -*- test-case-name: tests.test_inventory -*-
"""Inventory: each node's model list, polled on a timer, keeping the last good answer; and, where
the engine says so, which models are loaded now (residency, SPEC §6.4), polled alongside it.

Also holds the bounded control-plane read (:func:`get_json`) the model-list fan-out shares: a GET
through treq's ``HTTPClient`` over the shared pool, cut off by our own timer (``treq.collect``
cannot be cancelled) and by a body-size cap.
"""

from __future__ import annotations

import json
import random as _random
from collections.abc import Callable
from http.cookiejar import DefaultCookiePolicy
from typing import Any

from attrs import define, field, frozen
from hyperlink import EncodedURL
from treq.client import HTTPClient
from treq.cookies import IndexableCookieJar
from twisted.internet.defer import CancelledError, Deferred, gatherResults
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    ResponseDone,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from nvpair_tw.engines import EngineProfile, ResidencyFormat
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node, NodeDirectory
from nvpair_tw.upstream import is_cancellation

__all__ = [
    "MAX_JSON_BYTES",
    "InventoryBook",
    "ReadError",
    "get_json",
    "join_url",
    "make_http_client",
]

MAX_JSON_BYTES = 8 << 20
"""A control-plane answer larger than this is abandoned."""


class ReadError(Exception):
    """A control-plane read failed; ``str()`` is a short reason without any body."""


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
    headers = Headers({b"authorization": [authorization]}) if authorization is not None else None
    try:
        request = http.get(
            _request_url(url), headers=headers, unbuffered=True, allow_redirects=False
        )
    except Exception as error:  # treq rejects some URLs synchronously
        raise ReadError(type(error).__name__) from None
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
                raise ReadError("timed out") from None
            if is_cancellation(Failure(error)):
                raise CancelledError() from None
            raise ReadError(type(error).__name__) from None
        body = _BoundedBody(limit)
        response.deliverBody(body)
        data = await body.done
    finally:
        if timer.active():
            timer.cancel()
    if response.code != 200:
        raise ReadError(f"status {response.code}")
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


@frozen
class _Known:
    url: str
    models: frozenset[str]
    at: float


@frozen
class _Loaded:
    """One node's last residency answer: the loaded names as the engine spells them, and their
    normalised forms for matching."""

    url: str
    names: frozenset[str]
    normalised: frozenset[str]
    at: float


@define
class InventoryBook:
    """Per facade: the last good inventory of every node, and what each node has loaded.

    Residency is polled with the inventory, concurrently and independently: its own request, the
    same timeout, body cap and error handling, and a residency failure never touches the
    inventory. Unlike the inventory, residency is not kept across a failure: a failed or malformed
    residency answer makes the node's residency unknown until the next good one, because a stale
    "loaded" would steer requests to a node that has since unloaded the model.
    """

    log = LevelledLogger()

    _engine: EngineProfile
    _directory: NodeDirectory
    _http: HTTPClient
    _clock: IReactorTime
    _interval: float = field(default=10.0, kw_only=True)
    _timeout: float = field(default=10.0, kw_only=True)
    _jitter: float = field(default=0.1, kw_only=True)
    _random: Callable[[], float] = field(default=_random.random, kw_only=True)
    _known: dict[str, _Known] = field(factory=dict, init=False)
    _loaded: dict[str, _Loaded] = field(factory=dict, init=False)
    _failing: set[str] = field(factory=set, init=False)
    _inflight: dict[str, Deferred[None]] = field(factory=dict, init=False)
    _timer: IDelayedCall | None = field(default=None, init=False)
    _unsubscribe: Callable[[], None] | None = field(default=None, init=False)
    _matchable: dict[str, tuple[object, frozenset[str]]] = field(factory=dict, init=False)

    def models(self, node_id: str) -> frozenset[str]:
        """Static models for a static node, else the last good poll; empty if never answered."""
        node = self._directory.get(node_id)
        if node is None:
            return frozenset()
        if node.models is not None:
            return frozenset(node.models)
        known = self._known.get(node_id)
        return known.models if known is not None else frozenset()

    def known(self, node_id: str) -> bool:
        """Whether the node has a static or polled inventory."""
        node = self._directory.get(node_id)
        return node is not None and (node.models is not None or node_id in self._known)

    def last_success(self, node_id: str) -> float | None:
        """Clock seconds of the node's last good poll."""
        known = self._known.get(node_id)
        return known.at if known is not None else None

    def owners(self, model: str) -> list[str]:
        """Ids of the directory's nodes that advertise ``model`` (engine matching), by id."""
        return [node.id for node in self._directory.nodes() if self.advertises(node.id, model)]

    def resident(self, node_id: str, model: str) -> bool | None:
        """Whether ``model`` is loaded on the node: True, False (known not loaded), or None when
        unknown (docs/behaviour.md §6.4).

        Unknown: the engine has no residency endpoint, the node is static (never polled), its
        residency poll has not answered yet, or the last one failed. Names match under the
        engine's rule (``llama3`` is resident when ``llama3:latest`` is loaded on Ollama).
        """
        loaded = self._loaded.get(node_id)
        if loaded is None or not self._polled(node_id):
            return None
        return self._engine.normalise(model.strip()) in loaded.normalised

    def loaded(self, node_id: str) -> frozenset[str] | None:
        """The models loaded on the node as its engine names them, or None when unknown."""
        loaded = self._loaded.get(node_id)
        if loaded is None or not self._polled(node_id):
            return None
        return loaded.names

    def _polled(self, node_id: str) -> bool:
        node = self._directory.get(node_id)
        return node is not None and node.models is None

    def advertises(self, node_id: str, model: str) -> bool:
        """Whether the node's inventory serves ``model`` under the engine's name rule.

        This runs for every candidate of every inference request, so each inventory's normalised
        names are computed once and reused until that inventory changes.
        """
        node = self._directory.get(node_id)
        if node is None:
            return False
        known = self._known.get(node_id)
        source: object = node.models if node.models is not None else known
        if source is None:
            return False
        cached = self._matchable.get(node_id)
        if cached is None or cached[0] is not source:
            names = self.models(node_id)
            cached = (source, frozenset(self._engine.normalise(n.strip()) for n in names))
            self._matchable[node_id] = cached
        return self._engine.normalise(model.strip()) in cached[1]

    def poll_now(self) -> Deferred[None]:
        """Poll every polled node once, concurrently; fires when all are done (never fails)."""
        return self._poll_nodes([n for n in self._directory.nodes() if n.models is None])

    def _poll_nodes(self, nodes: list[Node]) -> Deferred[None]:
        waits: list[Deferred[None]] = []
        for node in nodes:
            running = self._inflight.get(node.id)
            if running is None:
                running = Deferred.fromCoroutine(self._poll(node))
                if not running.called:
                    self._inflight[node.id] = running
                running.addBoth(self._finished, node.id, running)
            waits.append(_follow(running))
        return gatherResults(waits).addCallback(lambda _: None)

    def start(self) -> None:
        """Poll at once, then every interval (± jitter); forget nodes the directory drops."""
        if self._unsubscribe is not None:
            return
        self._unsubscribe = self._directory.subscribe(self._nodes_changed)
        self._tick()

    def stop(self) -> None:
        """Cancel the timer and every in-flight poll."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        running, self._inflight = list(self._inflight.values()), {}
        for poll in running:
            poll.cancel()

    def _tick(self) -> None:
        self._timer = None
        self.poll_now()
        spread = self._jitter * (2 * self._random() - 1)
        self._timer = self._clock.callLater(max(0.0, self._interval * (1 + spread)), self._tick)

    def _finished(self, result: object, node_id: str, running: Deferred[None]) -> None:
        if self._inflight.get(node_id) is running:
            del self._inflight[node_id]
        if isinstance(result, Failure) and not result.check(CancelledError):
            self.log.failure("inventory poll crashed", result, node=node_id)

    def _nodes_changed(self) -> None:
        current = {n.id: n for n in self._directory.nodes() if n.models is None}
        for node_id in list(self._known):
            node = current.get(node_id)
            if node is None or node.url != self._known[node_id].url:
                del self._known[node_id]
                self._matchable.pop(node_id, None)
        self._failing &= set(current)
        for node_id in list(self._loaded):
            node = current.get(node_id)
            if node is None or node.url != self._loaded[node_id].url:
                del self._loaded[node_id]
        for node_id, running in list(self._inflight.items()):
            if node_id not in current:
                running.cancel()
        fresh = [n for i, n in current.items() if i not in self._known and i not in self._failing]
        if self._unsubscribe is not None and fresh:
            self._poll_nodes(fresh)

    async def _poll(self, node: Node) -> None:
        """The node's model list and, if the engine has one, its residency, side by side."""
        polls = [Deferred.fromCoroutine(self._poll_models(node))]
        if self._engine.residency is not None:
            polls.append(Deferred.fromCoroutine(self._poll_residency(node, self._engine.residency)))
        try:
            for poll in polls:
                await poll
        except CancelledError:
            for poll in polls:  # cancelled half-way: stop the other read too
                if not poll.called:
                    poll.addErrback(_ignore_cancellation)
                    poll.cancel()
            raise

    async def _poll_residency(self, node: Node, residency: ResidencyFormat) -> None:
        url = join_url(node.public_url, residency.path)
        try:
            document = await get_json(
                self._http,
                self._clock,
                url,
                timeout=self._timeout,
                authorization=node.authorization,
            )
            names = frozenset(n for n in residency.loaded(document) if n.strip())
        except (ReadError, ValueError) as error:
            self._residency_failed(node, str(error))
            return
        current = self._directory.get(node.id)
        if current is None or current.url != node.url or current.models is not None:
            return
        normalised = frozenset(self._engine.normalise(n.strip()) for n in names)
        self._loaded[node.id] = _Loaded(node.url, names, normalised, self._clock.seconds())

    def _residency_failed(self, node: Node, why: str) -> None:
        previous = self._loaded.get(node.id)
        if previous is None or previous.url != node.url:
            self.log.debug(
                "residency poll of {node} failed ({why})",
                node=node.id,
                why=why,
                engine=self._engine.name,
            )
            return
        del self._loaded[node.id]
        self.log.info(
            "residency poll of {node} failed ({why}); its residency is unknown until it answers",
            node=node.id,
            why=why,
            engine=self._engine.name,
        )

    async def _poll_models(self, node: Node) -> None:
        url = join_url(node.public_url, self._engine.inventory.path)
        try:
            document = await get_json(
                self._http,
                self._clock,
                url,
                timeout=self._timeout,
                authorization=node.authorization,
            )
            names = frozenset(self._engine.inventory.names(document))
        except (ReadError, ValueError) as error:
            self._failed(node, str(error))
            return
        current = self._directory.get(node.id)
        if current is None or current.url != node.url or current.models is not None:
            return
        self._known[node.id] = _Known(url=node.url, models=names, at=self._clock.seconds())
        if node.id in self._failing:
            self._failing.discard(node.id)
            self.log.info(
                "inventory of {node} answers again", node=node.id, engine=self._engine.name
            )

    def _failed(self, node: Node, why: str) -> None:
        if self._directory.get(node.id) is None:
            return
        level = self.log.debug if node.id in self._failing else self.log.warn
        self._failing.add(node.id)
        level(
            "inventory poll of {node} failed ({why}); keeping the last good inventory",
            node=node.id,
            why=why,
            engine=self._engine.name,
        )


def _ignore_cancellation(failure: Failure) -> None:
    failure.trap(CancelledError)


def _follow(source: Deferred[None]) -> Deferred[None]:
    """A new Deferred that fires (with None) when ``source`` fires, leaving ``source`` as it was."""
    follower: Deferred[None] = Deferred()

    def relay(result: object) -> object:
        follower.callback(None)
        return result

    source.addBoth(relay)
    return follower
