# -*- test-case-name: tests.selection.test_reachability -*-
"""Each node's last good answer to each model list (docs/behaviour.md §4.3): what a model list
says of a node it does not wait on (a cooling node) — the answer as the node gave it, so its
records keep their real digests and sizes.

An answer is kept by the list's path alone (``/api/tags``, ``/api/ps``, ``/v1/models``, …; never
a query), from the inventory poll's reads and the facade's own list reads; one per node and path,
each at most the read's body cap (8 MiB). It is forgotten when the node leaves or moves to another
URL; a failed read leaves it as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import define, field, frozen

from nvpair_tw.nodes import Node

__all__ = ["LastLists"]


@frozen
class _Answer:
    url: str
    document: Any


@define
class LastLists:
    """Per facade: each node's last good answer to each list path."""

    _kept: dict[tuple[str, str], _Answer] = field(factory=dict, init=False)

    def keep(self, node: Node, path: str, document: Any) -> None:
        """``node`` answered the list at ``path`` (a path without query) with ``document``."""
        self._kept[(node.id, path)] = _Answer(node.url, document)

    def last(self, node: Node, path: str) -> Any | None:
        """The node's last good answer to the list at ``path`` from its current URL, or None."""
        kept = self._kept.get((node.id, path))
        return kept.document if kept is not None and kept.url == node.url else None

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget the answers of nodes gone from ``current`` or moved to another URL."""
        for key, kept in list(self._kept.items()):
            node = current.get(key[0])
            if node is None or node.url != kept.url:
                del self._kept[key]
