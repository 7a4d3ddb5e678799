# -*- test-case-name: tests.selection.test_holdings -*-
"""What nodes report about themselves besides their models (docs/behaviour.md §11.1, §15.3, §17.2):
each loaded model's context length, the slots it runs requests in, how many models a llama.cpp
router keeps loaded, and the API a router loads and unloads models with. Every fact is kept with
the URL that said it and forgotten when the node moves or goes."""

from __future__ import annotations

from collections.abc import Mapping

from attrs import define, field, frozen

from nvpair_tw.core import IdentityEnum, ModelControl
from nvpair_tw.nodes import Node, NodeDirectory

__all__ = ["NodeFacts", "PolledContexts", "ResidentContexts", "SlotContexts"]


class PolledContexts(IdentityEnum):
    """Which poll reported context lengths (each kept apart: one does not erase the other)."""

    RESIDENT = "residency"
    """Ollama's ``/api/ps``: each loaded model's ``context_length``."""
    SLOTS = "slots"
    """llama.cpp's ``/props``: the per-slot context, for whatever the server serves."""


_POLLS = tuple(PolledContexts)
"""The polls in their order, iterated without the enum's own iterator (a request reads them)."""

ResidentContexts = PolledContexts.RESIDENT
SlotContexts = PolledContexts.SLOTS


@frozen
class _Contexts:
    url: str
    contexts: Mapping[str, int]


@frozen
class _Value:
    url: str
    value: int


@frozen
class _Said:
    url: str
    contexts: Mapping[str, int]
    control: ModelControl | None


@define
class NodeFacts:
    """Per facade, the facts each polled node last reported."""

    _directory: NodeDirectory
    _said: dict[str, _Said] = field(factory=dict, init=False)
    _slots: dict[str, _Value] = field(factory=dict, init=False)
    _models_max: dict[str, _Value] = field(factory=dict, init=False)
    _polled: dict[tuple[str, PolledContexts], _Contexts] = field(factory=dict, init=False)

    def record(self, node: Node, contexts: Mapping[str, int], control: ModelControl | None) -> None:
        """A good model-list answer: its loaded models' context lengths, and the router API."""
        self._said[node.id] = _Said(node.url, dict(contexts), control)

    def forget(self, node: Node) -> None:
        """No list answered: what the node said of its models is unknown again."""
        self._said.pop(node.id, None)

    def record_polled(self, node: Node, poll: PolledContexts, contexts: Mapping[str, int]) -> None:
        """The context lengths a residency or slots poll reported (§15.3); empty forgets them."""
        if contexts:
            self._polled[node.id, poll] = _Contexts(node.url, dict(contexts))
        else:
            self._polled.pop((node.id, poll), None)

    def record_slots(self, node: Node, slots: int | None) -> None:
        """The slots the node reports (llama.cpp's ``/props``); None forgets them."""
        _keep(self._slots, node, slots)

    def record_models_max(self, node: Node, models_max: int | None) -> None:
        """How many models a router says it keeps loaded (``/props`` ``max_instances``)."""
        _keep(self._models_max, node, models_max)

    def _current(self, node_id: str) -> Node | None:
        node = self._directory.get(node_id)
        return node if node is not None and node.models is None else None

    def contexts(self, node_id: str) -> Mapping[str, int]:
        """Each loaded model's context length as the node names the model (empty: unknown):
        what its polls reported, then what its model list said (the list wins)."""
        node = self._current(node_id)
        if node is None:
            return {}
        merged: dict[str, int] = {}
        for poll in _POLLS:
            polled = self._polled.get((node_id, poll))
            if polled is not None and polled.url == node.url:
                merged.update(polled.contexts)
        said = self._said.get(node_id)
        if said is not None and said.url == node.url:
            merged.update(said.contexts)
        return merged

    def control(self, node_id: str) -> ModelControl | None:
        """The load and unload API the node answered as a router, or None."""
        node = self._current(node_id)
        said = self._said.get(node_id)
        if node is None or said is None or said.url != node.url:
            return None
        return said.control

    def reported_slots(self, node_id: str) -> int | None:
        """The slots the node itself reports, while it is at the URL that said so (§11.1)."""
        return _kept(self._slots, self._directory.get(node_id))

    def models_max(self, node_id: str) -> int | None:
        """The node's ``models_max`` (nodes file), else what its router says; None: unknown."""
        node = self._directory.get(node_id)
        if node is not None and node.models_max is not None:
            return node.models_max
        return _kept(self._models_max, node)

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget the facts of nodes gone from ``current`` or moved."""
        for book in (self._said, self._slots, self._models_max):
            for node_id in list(book):
                node = current.get(node_id)
                if node is None or node.url != book[node_id].url:
                    del book[node_id]
        for node_id, poll in list(self._polled):
            node = current.get(node_id)
            if node is None or node.url != self._polled[node_id, poll].url:
                del self._polled[node_id, poll]


def _keep(book: dict[str, _Value], node: Node, value: int | None) -> None:
    if value is None:
        book.pop(node.id, None)
    else:
        book[node.id] = _Value(node.url, value)


def _kept(book: dict[str, _Value], node: Node | None) -> int | None:
    if node is None:
        return None
    kept = book.get(node.id)
    return kept.value if kept is not None and kept.url == node.url else None
