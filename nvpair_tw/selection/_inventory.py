# -*- test-case-name: tests.selection.test_inventory -*-
"""Inventory: each node's model list, polled on a timer (:mod:`nvpair_tw.selection._polling`), keeping the
last good answer; and, where the engine says so, which models are loaded now (residency, docs/behaviour.md
§6.4), polled alongside it.

The bounded control-plane read the polls use lives in :mod:`nvpair_tw.upstream._fetch`; its names are
re-exported here for the modules that import them from this one.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from attrs import define, field, frozen
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.core import EngineProfile, ModelControl
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Catalogue, Node, NodeDirectory
from nvpair_tw.selection._contexts import ANY_MODEL
from nvpair_tw.selection._facts import NodeFacts
from nvpair_tw.selection._polling import InventoryPoller
from nvpair_tw.upstream import MAX_JSON_BYTES, ReadError, get_json, join_url, make_http_client

__all__ = [
    "MAX_JSON_BYTES",
    "InventoryBook",
    "ReadError",
    "get_json",
    "join_url",
    "make_http_client",
]


_T = TypeVar("_T")


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


def _normalised(profile: EngineProfile, names: frozenset[str]) -> dict[str, str]:
    """Each name's normalised form (the node kind's rule, §4.1) to the name as the node spells it."""
    return {profile.normalise(n.strip()): n for n in sorted(names)}


def _local(
    profile: EngineProfile, normalised: Mapping[str, str], catalogue: Catalogue, model: str
) -> str | None:
    """The name a node whose inventory normalises to ``normalised`` knows ``model`` by."""
    wanted = model.strip()
    for name in (wanted, *catalogue.lookup(wanted).names):
        local = normalised.get(profile.normalise(name))
        if local is not None:
            return local
    return None


def _is_loaded(
    profile: EngineProfile, loaded: frozenset[str], catalogue: Catalogue, model: str
) -> bool:
    """Whether any name of ``model`` is among a node's ``loaded`` names (normalised)."""
    return any(profile.normalise(name) in loaded for name in catalogue.lookup(model).names)


class _LastAnswers(Generic[_T]):
    """Per node, the last model asked and the answer, with the inputs it came from: asked the
    same with equal inputs, the answer is given again (every request of a burst asks the same,
    several times over)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[str, tuple[object, ...], _T]] = {}

    def find(self, node_id: str, model: str, inputs: tuple[object, ...]) -> tuple[_T] | None:
        """The kept answer (in a 1-tuple), or None when the question or its inputs differ."""
        kept = self._kept.get(node_id)
        if kept is None or kept[0] != model or kept[1] != inputs:
            return None
        return (kept[2],)

    def keep(self, node_id: str, model: str, inputs: tuple[object, ...], answer: _T) -> _T:
        """Keep ``answer`` as the node's last; return it."""
        self._kept[node_id] = (model, inputs, answer)
        return answer

    def forget(self, node_id: str) -> None:
        self._kept.pop(node_id, None)


@define
class InventoryBook:
    """Per facade: the last good inventory of every node, and what each node has loaded, as its
    :class:`~nvpair_tw.selection._polling.InventoryPoller` finds them. Unlike the inventory, residency is not
    kept across a failure: a failed or malformed answer makes the node's residency unknown until
    the next good one, because a stale "loaded" would steer requests to a node that has since
    unloaded the model."""

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
    _loaded: dict[str, _Loaded] = field(factory=dict, init=False)
    facts: NodeFacts = field(init=False)
    """What each node says besides its models: contexts, slots, a router's API (§17.2)."""
    _matchable: dict[str, tuple[object, EngineProfile, dict[str, str]]] = field(
        factory=dict, init=False
    )
    _named: _LastAnswers[str | None] = field(factory=lambda: _LastAnswers(), init=False)
    _resident: _LastAnswers[bool] = field(factory=lambda: _LastAnswers(), init=False)
    _poller: InventoryPoller = field(init=False)

    def __attrs_post_init__(self) -> None:
        self.facts = NodeFacts(self._directory)
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
        node = self._directory.get(node_id)
        if loaded is None or node is None or node.models is not None:
            return None
        profile = node.kind_of(self._engine)
        inputs = (loaded, profile, self._directory.catalogue)
        last = self._resident.find(node_id, model, inputs)
        if last is not None:
            return last[0]
        found = _is_loaded(profile, loaded.normalised, inputs[2], model)
        return self._resident.keep(node_id, model, inputs, found)

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
        """Whether the node's inventory serves ``model`` under its kind's name rule: the name, or
        with a catalogue any name of its model (§11.4)."""
        return self.local_name(node_id, model) is not None

    def local_name(self, node_id: str, model: str) -> str | None:
        """The name the node knows ``model`` by, as its inventory spells it, or None when it does
        not serve it (§11.4). The requested name wins over the model's other names.

        This runs for every candidate of every inference request, so each inventory's normalised
        names are computed once and reused until that inventory changes.
        """
        node = self._directory.get(node_id)
        if node is None:
            return None
        known = self._known.get(node_id)
        source: object = node.models if node.models is not None else known
        if source is None:
            return None
        profile = node.kind_of(self._engine)
        cached = self._matchable.get(node_id)
        if cached is None or cached[0] is not source or cached[1] is not profile:
            cached = (source, profile, _normalised(profile, self.models(node_id)))
            self._matchable[node_id] = cached
        inputs = (cached, self._directory.catalogue)
        last = self._named.find(node_id, model, inputs)
        if last is not None:
            return last[0]
        return self._named.keep(
            node_id, model, inputs, _local(profile, cached[2], inputs[1], model)
        )

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
        normalised = frozenset(_normalised(node.kind_of(self._engine), names))
        self._loaded[node.id] = _Loaded(node.url, names, normalised, at)

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
        profile = node.kind_of(self._engine)
        spelt = frozenset(contexts)
        local = _local(profile, _normalised(profile, spelt), self._directory.catalogue, model)
        return None if local is None else contexts[local]

    def control(self, node: Node) -> ModelControl | None:
        """How ``model/load`` and ``model/unload`` reach the node (§13.3): a router's own API
        (§17.2) where it answered as one, else its kind's."""
        return self.facts.control(node.id) or node.kind_of(self._engine).control

    def forget_loaded(self, node: Node) -> bool:
        """Drop the node's residency; whether one was kept for its current URL."""
        previous = self._loaded.get(node.id)
        if previous is None or previous.url != node.url:
            return False
        del self._loaded[node.id]
        return True

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget what was kept of nodes gone from ``current`` (the polled nodes) or moved."""
        for node_id in list(self._known):
            node = current.get(node_id)
            if node is None or node.url != self._known[node_id].url:
                del self._known[node_id]
                self._matchable.pop(node_id, None)
                self._named.forget(node_id)
        for node_id in list(self._loaded):
            node = current.get(node_id)
            if node is None or node.url != self._loaded[node_id].url:
                del self._loaded[node_id]
                self._resident.forget(node_id)
        self.facts.prune(current)
