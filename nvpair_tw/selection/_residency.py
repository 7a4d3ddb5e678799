# -*- test-case-name: tests.selection.test_inventory -*-
"""Residency: which models each polled node has loaded now, as its last residency answer said
(docs/behaviour.md §6.4).

Unlike the inventory, residency is not kept across a failure: a failed or malformed answer makes
the node's residency unknown until the next good one, because a stale "loaded" would steer
requests to a node that has since unloaded the model.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import define, field, frozen

from nvpair_tw.core import EngineProfile
from nvpair_tw.nodes import Catalogue, Node, NodeDirectory
from nvpair_tw.selection._names import LastAnswers, normalised_names

__all__ = ["Residency"]


@frozen
class _Loaded:
    """One node's last residency answer: the loaded names as the engine spells them, and their
    normalised forms for matching."""

    url: str
    names: frozenset[str]
    normalised: frozenset[str]
    at: float


def _is_loaded(
    profile: EngineProfile, loaded: frozenset[str], catalogue: Catalogue, model: str
) -> bool:
    """Whether any name of ``model`` is among a node's ``loaded`` names (normalised)."""
    return any(profile.normalise(name) in loaded for name in catalogue.lookup(model).names)


@define
class Residency:
    """Per facade: each polled node's last residency answer, and whether a model is loaded."""

    _engine: EngineProfile
    _directory: NodeDirectory
    _loaded: dict[str, _Loaded] = field(factory=dict, init=False)
    _resident: LastAnswers[bool] = field(factory=lambda: LastAnswers(), init=False)

    def resident(self, node_id: str, model: str) -> bool | None:
        """Whether ``model`` is loaded on the node: True, False, or None when unknown.

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

    def record(self, node: Node, names: frozenset[str], at: float) -> None:
        """A good residency answer from ``node`` at clock seconds ``at``."""
        normalised = frozenset(normalised_names(node.kind_of(self._engine), names))
        self._loaded[node.id] = _Loaded(node.url, names, normalised, at)

    def forget(self, node: Node) -> bool:
        """Drop the node's residency; whether one was kept for its current URL."""
        previous = self._loaded.get(node.id)
        if previous is None or previous.url != node.url:
            return False
        del self._loaded[node.id]
        return True

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget the residency of nodes gone from ``current`` (the polled nodes) or moved."""
        for node_id in list(self._loaded):
            node = current.get(node_id)
            if node is None or node.url != self._loaded[node_id].url:
                del self._loaded[node_id]
                self._resident.forget(node_id)
