# -*- test-case-name: tests.selection.test_cordons -*-
"""Cordons (docs/behaviour.md §13.1): nodes an operator took out of service for new work.

A cordoned node takes no new work on any route. Unlike a cooling node it is not a last resort: an
operator said so. Its requests in flight and its tunnels finish, and ``X-NVPair-Node`` still reaches
it (maintenance). A node is cordoned by the control channel (``node/cordon``, kept here) or by
``cordon = true`` in the nodes file (kept on the node itself, :attr:`Node.cordon`); with
``--state`` the control channel's cordons are shared by every proxy of the fleet
(``origin="peer"`` on the others).
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.nodes import Node

__all__ = ["Cordon", "CordonBook", "CordonListener"]


@frozen
class Cordon:
    """One cordoned node: why, since when (clock seconds), and who said so: ``"control"`` (this
    proxy's control channel), ``"file"`` (the nodes file) or ``"peer"`` (a proxy of the fleet)."""

    node_id: str
    reason: str
    since: float | None
    origin: str = "control"

    def to_json(self) -> dict[str, object]:
        """What ``nodes/list`` and the status page show (``since`` in ms since the epoch, or
        ``None`` for the nodes file's)."""
        since = None if self.since is None else int(self.since * 1000)
        return {"reason": self.reason, "since": since, "origin": self.origin}


CordonListener = Callable[[str, "Cordon | None"], None]
"""Told ``(node_id, cordon)`` when a node is cordoned and ``(node_id, None)`` when uncordoned."""

FILE_REASON = "cordon = true in the nodes file"


class CordonBook:
    """The cordons of one facade set by the control channel (or shared by the fleet)."""

    def __init__(self, clock: IReactorTime, on_change: CordonListener | None = None) -> None:
        self._clock = clock
        self._cordons: dict[str, Cordon] = {}
        self._listeners: list[CordonListener] = [] if on_change is None else [on_change]

    def subscribe(self, listener: CordonListener) -> None:
        """Also tell ``listener`` of every change from now on."""
        self._listeners.append(listener)

    def cordon(self, node_id: str, reason: str, origin: str = "control") -> Cordon:
        """Cordon ``node_id`` (a second cordon keeps the first one's time, takes the new reason)."""
        previous = self._cordons.get(node_id)
        since = previous.since if previous is not None else None
        cordon = Cordon(node_id, reason, self._clock.seconds() if since is None else since, origin)
        self._cordons[node_id] = cordon
        if cordon != previous:
            for listener in list(self._listeners):
                listener(node_id, cordon)
        return cordon

    def uncordon(self, node_id: str) -> bool:
        """Lift ``node_id``'s cordon; False if it had none here."""
        if self._cordons.pop(node_id, None) is None:
            return False
        for listener in list(self._listeners):
            listener(node_id, None)
        return True

    def of(self, node: Node) -> Cordon | None:
        """The node's cordon: the nodes file's, else the control channel's (or the fleet's)."""
        if node.cordon:
            return Cordon(node.id, FILE_REASON, None, "file")
        return self._cordons.get(node.id)

    def of_id(self, node_id: str) -> Cordon | None:
        """The control channel's (or the fleet's) cordon of ``node_id``, if any."""
        return self._cordons.get(node_id)

    def cordoned(self, node: Node) -> bool:
        """Whether ``node`` takes no new work."""
        return node.cordon or node.id in self._cordons

    def blocks(self, node: Node | None) -> bool:
        """Whether a node looked up by id (``None``: gone) is cordoned."""
        return node is not None and self.cordoned(node)

    def ids(self) -> frozenset[str]:
        """Ids cordoned here (the control channel's and the fleet's; not the nodes file's)."""
        return frozenset(self._cordons)
