# -*- test-case-name: tests.selection.test_gaps -*-
"""The routes a node was found to lack (docs/behaviour.md §17.3): learnt when the node answers a
route its kind speaks with a 404 that says the route itself is missing (``dialects.route_missing``,
not a model it does not have), so the requests for that route go translated to it from then on.

Per facade, per node, kept with the URL that answered and with the node's reachability at the time
(:mod:`~nvpair_tw.selection._reachability`). A gap holds until the node's next restart is seen:
its inventory poll fails (the server is down, or stopped answering) or it answers again after
failing, either of which changes its reachability; a node at another URL is another server, and
a polled node that left the directory and came back is unknown again until its poll. A node
whose inventory is static is never polled, so its gaps hold until its URL changes or the proxy
restarts. Either mistake costs little: a gap that outlived an upgrade sends a translation the node
also understands, and a gap forgotten too early costs one more 404, answered within the same
request. What is kept is checked when it is read, so nothing needs to be told of a change.
"""

from __future__ import annotations

from attrs import define, field, frozen

from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.selection._reachability import Reachability, ReachabilityBook

__all__ = ["RouteGaps"]

log = LevelledLogger(namespace=__name__)


@frozen
class _Gaps:
    url: str
    seen: Reachability  # the node's reachability when the first gap was learnt
    routes: tuple[str, ...]


@define
class RouteGaps:
    """Per facade: the routes each node answered a missing-route 404 to (``engine`` names the
    facade in the log line, since a node behind several facades learns behind each)."""

    _engine: str
    _reach: ReachabilityBook
    _kept: dict[str, _Gaps] = field(factory=dict, init=False)

    def learn(self, node: Node, route: str) -> None:
        """``node`` answered a missing-route 404 to ``route`` (logged once per gap)."""
        gaps = self._live(node)
        if gaps is not None and route in gaps.routes:
            return
        routes = (*gaps.routes, route) if gaps is not None else (route,)
        self._kept[node.id] = _Gaps(node.url, self._reach.of(node), routes)
        log.info(
            "node {node} has no {route}: it is sent the translation until it restarts"
            " ({engine} facade)",
            node=node.id,
            route=route,
            engine=self._engine,
        )

    def lacks(self, node: Node, path: str) -> bool:
        """Whether ``node`` was found to lack the route ``path`` is under (a prefix: a node without
        ``/v1/messages`` has no ``/v1/messages/count_tokens`` either)."""
        gaps = self._live(node)
        return gaps is not None and path.startswith(gaps.routes)

    def of(self, node: Node) -> tuple[str, ...]:
        """The routes ``node`` is known to lack now."""
        gaps = self._live(node)
        return () if gaps is None else gaps.routes

    def _live(self, node: Node) -> _Gaps | None:
        """The node's gaps while they hold: same URL, no restart seen since."""
        gaps = self._kept.get(node.id)
        if gaps is None:
            return None
        if gaps.url != node.url or self._reach.of(node) != gaps.seen:
            del self._kept[node.id]
            return None
        return gaps
