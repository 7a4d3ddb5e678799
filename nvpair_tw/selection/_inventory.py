# -*- test-case-name: tests.selection.test_inventory -*-
"""Inventory: each node's model list, polled on a timer (:mod:`nvpair_tw.selection._polling`), keeping the
last good answer; and, where the engine says so, which models are loaded now (residency, docs/behaviour.md
§6.4), polled alongside it.

The bounded control-plane read the polls use lives in :mod:`nvpair_tw.upstream._fetch`; its names are
re-exported here for the modules that import them from this one. Which name a node knows a model by
is :mod:`nvpair_tw.selection._names`'s; what is loaded is :mod:`nvpair_tw.selection._residency`'s;
whether a node answers its poll is :mod:`nvpair_tw.selection._reachability`'s; each list's last
good answer is :mod:`nvpair_tw.selection._lists`'s.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Mapping

from attrs import define, field, frozen
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.core import EngineProfile, ModelControl
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node, NodeDirectory
from nvpair_tw.selection._contexts import ANY_MODEL
from nvpair_tw.selection._facts import NodeFacts
from nvpair_tw.selection._lists import LastLists
from nvpair_tw.selection._names import LocalNames
from nvpair_tw.selection._polling import InventoryPoller
from nvpair_tw.selection._reachability import Reachability, ReachabilityBook
from nvpair_tw.selection._residency import Residency
from nvpair_tw.upstream import MAX_JSON_BYTES, ReadError, get_json, join_url, make_http_client

__all__ = [
    "MAX_JSON_BYTES",
    "InventoryBook",
    "ReadError",
    "get_json",
    "join_url",
    "make_http_client",
]


@frozen
class _Known:
    url: str
    models: frozenset[str]
    at: float


@define
class InventoryBook:
    """Per facade: the last good inventory of every node, and what each node has loaded, as its
    :class:`~nvpair_tw.selection._polling.InventoryPoller` finds them. Residency
    (:mod:`~nvpair_tw.selection._residency`) is not kept across a failure; the inventory is."""

    log = LevelledLogger(namespace=__name__)

    _engine: EngineProfile
    _directory: NodeDirectory
    _http: HTTPClient
    _clock: IReactorTime
    _interval: float = field(default=10.0, kw_only=True)
    _timeout: float = field(default=10.0, kw_only=True)
    _jitter: float = field(default=0.1, kw_only=True)
    _random: Callable[[], float] = field(default=_random.random, kw_only=True)
    _known: dict[str, _Known] = field(factory=dict, init=False)
    facts: NodeFacts = field(init=False)
    """What each node says besides its models: contexts, slots, a router's API (§17.2)."""
    reach: ReachabilityBook = field(init=False)
    """Whether each polled node answers its poll (read it with :meth:`reachability`)."""
    lists: LastLists = field(factory=LastLists, init=False)
    """Each node's last good answer to each model list (docs/behaviour.md §4.3)."""
    _names: LocalNames = field(init=False)
    _residency: Residency = field(init=False)
    _poller: InventoryPoller = field(init=False)

    def __attrs_post_init__(self) -> None:
        self.facts = NodeFacts(self._directory)
        self.reach = ReachabilityBook(self._engine.name)
        self._names = LocalNames(self._engine, self._directory, self.models)
        self._residency = Residency(self._engine, self._directory)
        self._poller = InventoryPoller(
            self._engine,
            self._directory,
            self._http,
            self._clock,
            self,
            self.log,
            interval=self._interval,
            timeout=self._timeout,
            jitter=self._jitter,
            random=self._random,
        )

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

    def reachability(self, node_id: str) -> Reachability | None:
        """Whether the node answers its poll, since when, the last error (:class:`Reachability`);
        None for a node not in the directory."""
        node = self._directory.get(node_id)
        return None if node is None else self.reach.of(node)

    def owners(self, model: str) -> list[str]:
        """Ids of the directory's nodes that advertise ``model`` (engine matching), by id."""
        return [node.id for node in self._directory.nodes() if self.advertises(node.id, model)]

    def resident(self, node_id: str, model: str) -> bool | None:
        """Whether ``model`` is loaded on the node: True, False (known not loaded), or None when
        unknown (docs/behaviour.md §6.4; :meth:`Residency.resident`)."""
        return self._residency.resident(node_id, model)

    def loaded(self, node_id: str) -> frozenset[str] | None:
        """The models loaded on the node as its engine names them, or None when unknown."""
        return self._residency.loaded(node_id)

    def advertises(self, node_id: str, model: str) -> bool:
        """Whether the node's inventory serves ``model`` under its kind's name rule: the name, or
        with a catalogue any name of its model (§11.4)."""
        return self.local_name(node_id, model) is not None

    def local_name(self, node_id: str, model: str) -> str | None:
        """The name the node knows ``model`` by, as its inventory spells it, or None when it does
        not serve it (§11.4). The requested name wins over the model's other names."""
        node = self._directory.get(node_id)
        if node is None:
            return None
        known = self._known.get(node_id)
        source: object = node.models if node.models is not None else known
        return None if source is None else self._names.local_name(node, source, model)

    def poll_now(self) -> Deferred[None]:
        """Poll every polled node once, concurrently; fires when all are done (never fails)."""
        return self._poller.poll_now()

    def start(self) -> None:
        """Poll at once, then every interval (± jitter); forget nodes the directory drops."""
        self._poller.start()

    def stop(self) -> None:
        """Cancel the timer and every in-flight poll."""
        self._poller.stop()

    # What the poller finds (InventorySink).

    def has_inventory(self, node_id: str) -> bool:
        """Whether a polled inventory of the node is kept."""
        return node_id in self._known

    def record_models(self, node: Node, names: frozenset[str], at: float) -> None:
        """A good model-list answer from ``node`` at clock seconds ``at``."""
        self._known[node.id] = _Known(url=node.url, models=names, at=at)

    def record_loaded(self, node: Node, names: frozenset[str], at: float) -> None:
        """A good residency answer from ``node`` at clock seconds ``at``."""
        self._residency.record(node, names, at)

    def reported_slots(self, node_id: str) -> int | None:
        """The slots the node itself reports, while it is at the URL that said so (§11.1)."""
        return self.facts.reported_slots(node_id)

    def context_length(self, node_id: str, model: str) -> int | None:
        """The context ``model`` is loaded with on the node, where it says (§15.3), else None:
        what its list, residency or ``/props`` answers reported, by the node's name for it."""
        node = self._directory.get(node_id)
        contexts = self.facts.contexts(node_id)
        if node is None or not contexts:
            return None
        if ANY_MODEL in contexts:
            return contexts[ANY_MODEL]
        local = self._names.among(node, frozenset(contexts), model)
        return None if local is None else contexts[local]

    def control(self, node: Node) -> ModelControl | None:
        """How ``model/load`` and ``model/unload`` reach the node (§13.3): a router's own API
        (§17.2) where it answered as one, else its kind's."""
        return self.facts.control(node.id) or node.kind_of(self._engine).control

    def forget_loaded(self, node: Node) -> bool:
        """Drop the node's residency; whether one was kept for its current URL."""
        return self._residency.forget(node)

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget what was kept of nodes gone from ``current`` (the polled nodes) or moved."""
        for node_id in list(self._known):
            node = current.get(node_id)
            if node is None or node.url != self._known[node_id].url:
                del self._known[node_id]
                self._names.forget(node_id)
        self._residency.prune(current)
        self.reach.prune(current)
        self.lists.prune(current)
        self.facts.prune(current)
