# -*- test-case-name: tests.selection.test_inventory -*-
"""Which name a node knows a model by: its inventory's names under its kind's rule (docs/behaviour.md
§4.1), with a catalogue any name of the model (§11.4), each answer kept until its inputs change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from attrs import define, field

from nvpair_tw.core import EngineProfile
from nvpair_tw.nodes import Catalogue, Node, NodeDirectory

__all__ = ["LastAnswers", "LocalNames", "local_in", "normalised_names"]

_T = TypeVar("_T")


def normalised_names(profile: EngineProfile, names: frozenset[str]) -> dict[str, str]:
    """Each name's normalised form (the node kind's rule, §4.1) to the name as the node spells it."""
    return {profile.normalise(n.strip()): n for n in sorted(names)}


def local_in(
    profile: EngineProfile, normalised: Mapping[str, str], catalogue: Catalogue, model: str
) -> str | None:
    """The name a node whose inventory normalises to ``normalised`` knows ``model`` by."""
    wanted = model.strip()
    for name in (wanted, *catalogue.lookup(wanted).names):
        local = normalised.get(profile.normalise(name))
        if local is not None:
            return local
    return None


class LastAnswers(Generic[_T]):
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
class LocalNames:
    """Per facade: the name each node knows a model by, as its inventory spells it (§11.4).

    This runs for every candidate of every inference request, so each inventory's normalised
    names are computed once and reused until that inventory (``source``, by identity) changes.
    """

    _engine: EngineProfile
    _directory: NodeDirectory
    _models: Callable[[str], frozenset[str]]
    """A node's inventory, static or polled."""
    _matchable: dict[str, tuple[object, EngineProfile, dict[str, str]]] = field(
        factory=dict, init=False
    )
    _named: LastAnswers[str | None] = field(factory=lambda: LastAnswers(), init=False)

    def local_name(self, node: Node, source: object, model: str) -> str | None:
        """The name ``node``, whose inventory is ``source``, knows ``model`` by, or None when it
        does not serve it. The requested name wins over the model's other names."""
        profile = node.kind_of(self._engine)
        cached = self._matchable.get(node.id)
        if cached is None or cached[0] is not source or cached[1] is not profile:
            cached = (source, profile, normalised_names(profile, self._models(node.id)))
            self._matchable[node.id] = cached
        inputs = (cached, self._directory.catalogue)
        last = self._named.find(node.id, model, inputs)
        if last is not None:
            return last[0]
        return self._named.keep(
            node.id, model, inputs, local_in(profile, cached[2], inputs[1], model)
        )

    def among(self, node: Node, names: frozenset[str], model: str) -> str | None:
        """The one of ``names`` (as ``node`` spells them) that is ``model``'s, or None."""
        profile = node.kind_of(self._engine)
        return local_in(profile, normalised_names(profile, names), self._directory.catalogue, model)

    def forget(self, node_id: str) -> None:
        """The node's inventory is gone or moved: drop what was kept of it."""
        self._matchable.pop(node_id, None)
        self._named.forget(node_id)
