# -*- test-case-name: tests.selection.test_inventory, tests.selection.test_reachability -*-
"""The inventory poller: the timer, one poll of a node, and its two reads (the model list and, where
the engine has one, residency, docs/behaviour.md §6.4). What the reads find goes to an :class:`InventorySink`
(the :class:`~nvpair_tw.selection._inventory.InventoryBook`), which keeps it: the answers, each
list's last good document (:mod:`~nvpair_tw.selection._lists`), and whether the model-list read
reached the node (:mod:`~nvpair_tw.selection._reachability`, which logs the changes).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Mapping
from typing import Protocol

from attrs import define, field
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred, gatherResults, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair_tw.core import EngineProfile, ResidencyFormat, SlotsFormat, format_duration
from nvpair_tw.nodes import Node, NodeDirectory
from nvpair_tw.selection._cascade import read_contexts, read_holdings, sources_of
from nvpair_tw.selection._contexts import props_context, ps_contexts
from nvpair_tw.selection._facts import NodeFacts, ResidentContexts, SlotContexts
from nvpair_tw.selection._holdings import HOLDINGS, Holdings, HoldingsSource, router_models_max
from nvpair_tw.selection._lists import LastLists
from nvpair_tw.selection._reachability import ReachabilityBook
from nvpair_tw.upstream import ReadError, ReadTimeout, get_json, join_url, node_answers

__all__ = ["PROBE_BOUND", "InventoryPoller", "InventorySink", "NodeReads", "expiry_probe"]

PROBE_BOUND = 10.0
"""The longest a cooling node's expiry probe waits for headers (docs/behaviour.md §6.3)."""


class InventorySink(Protocol):
    """Where a poll's findings go (``facts``: what nodes say besides their models)."""

    @property
    def facts(self) -> NodeFacts:
        """Contexts, slots, a router's ``models_max`` and its load API."""

    @property
    def reach(self) -> ReachabilityBook:
        """Whether each polled node answered its last model-list read."""

    @property
    def lists(self) -> LastLists:
        """Each node's last good answer to each list, for a list that does not wait on it
        (docs/behaviour.md §4.3)."""

    def has_inventory(self, node_id: str) -> bool:
        """Whether a polled inventory of the node is kept."""

    def models(self, node_id: str) -> frozenset[str]:
        """The node's last good inventory (empty when it never answered)."""

    def record_models(self, node: Node, names: frozenset[str], at: float) -> None:
        """A good model-list answer from ``node`` at clock seconds ``at``."""

    def record_loaded(self, node: Node, names: frozenset[str], at: float) -> None:
        """A good residency answer from ``node`` at clock seconds ``at``."""

    def forget_loaded(self, node: Node) -> bool:
        """Drop the node's residency; whether one was kept for its current URL."""

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget what was kept of nodes gone from ``current`` (the polled nodes) or moved."""


@define
class InventoryPoller:
    """Polls every polled node on a timer (± jitter), each node's two reads side by side.

    Residency is polled with the inventory, concurrently and independently: its own request, the
    same timeout, body cap and error handling, and a residency failure never touches the inventory.
    """

    _engine: EngineProfile
    _directory: NodeDirectory
    _http: HTTPClient
    _clock: IReactorTime
    _sink: InventorySink
    _log: Logger
    _interval: float = field(default=10.0, kw_only=True)
    _timeout: float = field(default=10.0, kw_only=True)
    _jitter: float = field(default=0.1, kw_only=True)
    _random: Callable[[], float] = field(default=_random.random, kw_only=True)
    _reads: NodeReads = field(init=False)
    _inflight: dict[str, Deferred[None]] = field(factory=dict, init=False)
    _timer: IDelayedCall | None = field(default=None, init=False)
    _unsubscribe: Callable[[], None] | None = field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._reads = NodeReads(
            self._engine,
            self._directory,
            self._http,
            self._clock,
            self._sink,
            self._log,
            timeout=self._timeout,
        )

    def poll_now(self) -> Deferred[None]:
        """Poll every polled node once, concurrently; fires when all are done (never fails)."""
        return self._poll_nodes([n for n in self._directory.nodes() if n.models is None])

    def _poll_nodes(self, nodes: list[Node]) -> Deferred[None]:
        waits: list[Deferred[None]] = []
        for node in nodes:
            running = self._inflight.get(node.id)
            if running is None:
                running = Deferred.fromCoroutine(self._reads.poll(node))
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
            self._log.failure("inventory poll crashed", result, node=node_id)

    def _nodes_changed(self) -> None:
        current = {n.id: n for n in self._directory.nodes() if n.models is None}
        self._sink.prune(current)
        for node_id, running in list(self._inflight.items()):
            if node_id not in current:
                running.cancel()
        fresh = [
            n
            for i, n in current.items()
            if not self._sink.has_inventory(i) and not self._sink.reach.unreachable(i)
        ]
        if self._unsubscribe is not None and fresh:
            self._poll_nodes(fresh)


@define
class NodeReads:
    """One poll of a node: its model list and, if the engine has one, its residency, side by side;
    each answer goes to the sink, and so does a failed model-list read (the sink's reachability
    logs it once); a residency failure is logged here, quietly while the node is unreachable."""

    _engine: EngineProfile
    _directory: NodeDirectory
    _http: HTTPClient
    _clock: IReactorTime
    _sink: InventorySink
    _log: Logger
    _timeout: float = field(default=10.0, kw_only=True)

    async def poll(self, node: Node) -> None:
        """The node's model list and, if the engine has one, its residency, side by side (a kind
        whose richer list says what is loaded, §17.1 and §17.2, reads residency from it). A failed
        residency read is told once the model list's read has ended, so that it is quiet when the
        node is unreachable (the reachability line says it all)."""
        polls: list[Deferred[str | None]] = [Deferred.fromCoroutine(self._poll_models(node))]
        kind = node.kind_of(self._engine)
        if kind.residency is not None and kind.name not in HOLDINGS:
            polls.append(Deferred.fromCoroutine(self._poll_residency(node, kind.residency)))
        if kind.slots is not None and (node.slots is None or node.models_max is None):
            polls.append(Deferred.fromCoroutine(self._poll_slots(node, kind.slots)))
        try:
            for poll in polls:
                why = await poll
                if why is not None:
                    self._residency_failed(node, why)
        except CancelledError:
            for poll in polls:  # cancelled half-way: stop the other read too
                if not poll.called:
                    poll.addErrback(_ignore_cancellation)
                    poll.cancel()
            raise

    def _words(self, error: Exception) -> str:
        """A failed read in plain words (its timeout named)."""
        if isinstance(error, ReadTimeout):
            return f"no answer within {format_duration(self._timeout)}"
        return str(error)

    def _still_polled(self, node: Node) -> bool:
        """Whether ``node`` is still in the directory, at the same URL, and polled."""
        current = self._directory.get(node.id)
        return current is not None and current.url == node.url and current.models is None

    async def _poll_residency(self, node: Node, residency: ResidencyFormat) -> str | None:
        """The node's residency list; why it failed, or None."""
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
            return self._words(error)
        if self._still_polled(node):
            self._sink.lists.keep(node, residency.path, document)
            self._sink.record_loaded(node, names, self._clock.seconds())
            self._sink.facts.record_polled(node, ResidentContexts, ps_contexts(document))
        return None

    async def _poll_slots(self, node: Node, slots: SlotsFormat) -> None:  # never fails
        """llama.cpp's ``/props``: how many requests it runs at once and, from a router, how many
        models it keeps loaded (quietly unknown when a server of the kind does not say)."""
        url = join_url(node.public_url, slots.path)
        try:
            document = await get_json(
                self._http,
                self._clock,
                url,
                timeout=self._timeout,
                authorization=node.authorization,
            )
        except ReadError:
            document = None
        if self._still_polled(node):
            self._sink.facts.record_slots(node, _slots_in(slots, document))
            self._sink.facts.record_models_max(node, router_models_max(document))
            self._sink.facts.record_polled(node, SlotContexts, props_context(document))

    def _residency_failed(self, node: Node, why: str) -> None:
        if not self._sink.forget_loaded(node) or self._sink.reach.unreachable(node.id):
            self._log.debug(
                "residency poll of {node} failed ({why})",
                node=node.id,
                why=why,
                engine=self._engine.name,
            )
            return
        self._log.info(
            "residency poll of {node} failed ({why}); its residency is unknown until it answers",
            node=node.id,
            why=why,
            engine=self._engine.name,
        )

    async def _poll_models(self, node: Node) -> None:  # tells its failure to the sink
        kind = node.kind_of(self._engine)
        try:
            source, holdings, document = await read_holdings(
                self._http, self._clock, node, sources_of(kind), self._timeout
            )
        except (ReadError, ValueError) as error:
            if not self._still_polled(node):
                return
            kept = len(self._sink.models(node.id)) if self._sink.has_inventory(node.id) else None
            self._sink.reach.failed(node, self._words(error), self._clock.seconds(), kept)
            if kind.name in HOLDINGS:
                self._sink.facts.forget(node)
                self._residency_failed(node, self._words(error))
            return
        if kind.name in HOLDINGS:
            await self._record_holdings(node, source, holdings)
        if not self._still_polled(node):
            return
        at = self._clock.seconds()
        self._sink.lists.keep(node, source.path, document)
        self._sink.record_models(node, holdings.names, at)
        self._sink.reach.answered(node, at, len(holdings.names))

    async def _record_holdings(self, node: Node, source: HoldingsSource, held: Holdings) -> None:
        """Residency, contexts and the router API from a list that says them (§17.1, §17.2)."""
        contexts = held.contexts
        if source.context is not None and held.loaded:
            query = source.context
            contexts = await read_contexts(
                self._http, self._clock, node, query, held.loaded, self._timeout
            )
        if not self._still_polled(node):
            return
        self._sink.facts.record(node, contexts, source.control)
        if held.loaded is None:
            self._residency_failed(node, f"{source.path} does not say what is loaded")
        else:
            self._sink.record_loaded(node, held.loaded, self._clock.seconds())


def _slots_in(slots: SlotsFormat, document: object) -> int | None:
    try:
        return None if document is None else slots.slots(document)
    except ValueError:
        return None


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


def expiry_probe(
    engine: EngineProfile,
    directory: NodeDirectory,
    http: HTTPClient,
    clock: IReactorTime,
    timeout: float,
) -> Callable[[str], Deferred[bool]]:
    """The question a cooling node is asked when its cooldown expires: its kind's inventory read
    (the model list), answered when response headers arrive within ``timeout`` seconds. A node no
    longer in the directory has nothing to protect: the cooldown just ends."""

    def probe(node_id: str) -> Deferred[bool]:
        node = directory.get(node_id)
        if node is None:
            return succeed(True)
        url = join_url(node.public_url, node.kind_of(engine).inventory.path)
        return Deferred.fromCoroutine(
            node_answers(http, clock, url, timeout=timeout, authorization=node.authorization)
        )

    return probe
