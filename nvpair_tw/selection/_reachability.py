# -*- test-case-name: tests.selection.test_reachability -*-
"""Whether each polled node answers its inventory poll (docs/behaviour.md §3): a fact the proxy
knows, not a guess from one request.

A node is ``reachable`` once a poll of its model list succeeded, ``unreachable`` once one failed,
with the last error in plain words (``connection refused``, ``no answer within 10s``), and
``unknown`` until its first poll ends; a node with a static inventory is never polled
(``not-polled``). Each state carries the node's public URL (never its userinfo) and since when it
holds (clock seconds). A change of state is logged once — a node becoming unreachable, and
reachable again — never every poll; a node that never answered is unreachable, not "keeping the
last good inventory".
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from attrs import define, evolve, field, frozen

from nvpair_tw.core import format_duration
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node

__all__ = ["Reach", "Reachability", "ReachabilityBook"]

log = LevelledLogger(namespace=__name__)


class Reach(Enum):
    """Where a node stands with its inventory poll."""

    UNKNOWN = "unknown"
    """Polled, but no poll has ended yet."""
    NOT_POLLED = "not-polled"
    """A static inventory (``models`` in the nodes file, a manual or discovered node's list)."""
    REACHABLE = "reachable"
    UNREACHABLE = "unreachable"


@frozen
class Reachability:
    """One node's reachability: its state, its URL without userinfo, since when (clock seconds;
    None while unknown or not polled) and, when unreachable, the last error in plain words."""

    state: Reach
    url: str
    since: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"state", "url", "since", "error"}`` (``since`` in clock seconds) for the status page,
        ``nodes/list`` and the state data."""
        return {
            "state": self.state.value,
            "url": self.url,
            "since": self.since,
            "error": self.error,
        }


@frozen
class _Kept:
    url: str  # the node's URL as configured, to forget the state when it changes
    reach: Reachability


@define
class ReachabilityBook:
    """Per facade: each polled node's reachability, as its polls end (``engine`` names the facade
    in the log lines, since a node behind several facades is polled by each)."""

    _engine: str
    _kept: dict[str, _Kept] = field(factory=dict, init=False)

    def of(self, node: Node) -> Reachability:
        """The node's reachability now (``not-polled`` for a static inventory)."""
        if node.models is not None:
            return Reachability(Reach.NOT_POLLED, node.public_url)
        kept = self._kept.get(node.id)
        if kept is None or kept.url != node.url:
            return Reachability(Reach.UNKNOWN, node.public_url)
        return kept.reach

    def unreachable(self, node_id: str) -> bool:
        """Whether the node's last poll failed."""
        kept = self._kept.get(node_id)
        return kept is not None and kept.reach.state is Reach.UNREACHABLE

    def answered(self, node: Node, at: float, models: int) -> None:
        """A poll of ``node`` read its model list (``models`` names) at clock seconds ``at``."""
        before = self.of(node)
        if before.state is Reach.REACHABLE:
            return
        self._keep(node, Reachability(Reach.REACHABLE, node.public_url, at))
        if before.state is Reach.UNREACHABLE and before.since is not None:
            log.info(
                "node {node} reachable again at {url} after {down} ({engine} facade)",
                node=node.id,
                url=node.public_url,
                down=format_duration(round(at - before.since)),
                engine=self._engine,
            )
        else:
            log.info(
                "node {node} reachable at {url}: {models} models ({engine} facade)",
                node=node.id,
                url=node.public_url,
                models=models,
                engine=self._engine,
            )

    def failed(self, node: Node, why: str, at: float, kept: int | None) -> None:
        """A poll of ``node`` failed at clock seconds ``at`` (``why`` in plain words); ``kept``:
        how many models its last good inventory lists, None when it never answered."""
        before = self.of(node)
        if before.state is Reach.UNREACHABLE:
            self._keep(node, evolve(before, error=why))
            log.debug(
                "node {node} still unreachable: {why} at {url} ({engine} facade)",
                node=node.id,
                why=why,
                url=node.public_url,
                engine=self._engine,
            )
            return
        self._keep(node, Reachability(Reach.UNREACHABLE, node.public_url, at, why))
        keeping = "" if kept is None else f"; its last inventory ({kept} models) is kept"
        log.warn(
            "node {node} unreachable: {why} at {url} ({engine} facade){keeping}",
            node=node.id,
            why=why,
            url=node.public_url,
            engine=self._engine,
            keeping=keeping,
        )

    def prune(self, current: Mapping[str, Node]) -> None:
        """Forget the nodes gone from ``current`` (the polled nodes) or moved to another URL."""
        for node_id, kept in list(self._kept.items()):
            node = current.get(node_id)
            if node is None or node.url != kept.url:
                del self._kept[node_id]

    def _keep(self, node: Node, reach: Reachability) -> None:
        self._kept[node.id] = _Kept(node.url, reach)
