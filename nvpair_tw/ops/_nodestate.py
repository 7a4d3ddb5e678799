# -*- test-case-name: tests.ops.test_board -*-
"""A node's state on the status page, from what the proxy knows of it (docs/operations.md, "The
status page"), the first that holds of:

1. **unreachable**: its last inventory poll failed (the poll's error, its URL without userinfo,
   since when); for a node with a static model list, which is never polled, its last request
   could not connect;
2. **cooling**: it stalled and is tried last until the cooldown ends (docs/behaviour.md §6.3);
3. **cordoned**: an operator took it out of service for new work (§13.1);
4. **busy**: every slot is taken, or requests wait in the queue for it (§6.4);
5. **unknown**: nothing says it answers yet: its first poll has not ended, or (a static list)
   no request to it has been answered or failed to connect yet;
6. **ready**.

So a node never reached is never "ready".
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from attrs import frozen

from nvpair_tw.corridor import FacadeState
from nvpair_tw.nodes import Node
from nvpair_tw.ops._recent import Contact, LastContact
from nvpair_tw.selection import Reach, Reachability

__all__ = ["NodeState", "StateOf", "node_state"]


class NodeState(Enum):
    """The states of a node on the status page, first to last in precedence."""

    UNREACHABLE = "unreachable"
    COOLING = "cooling"
    CORDONED = "cordoned"
    BUSY = "busy"
    UNKNOWN = "unknown"
    READY = "ready"


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


@frozen
class StateOf:
    """One node's state: why in plain words, since when and until when (clock seconds), and
    the URL the proxy reaches it at (never its userinfo)."""

    state: NodeState
    url: str
    why: str | None = None
    since: float | None = None
    until: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"state", "why", "since", "until", "url"}`` (times in ms since the epoch)."""
        return {
            "state": self.state.value,
            "why": self.why,
            "since": _ms(self.since),
            "until": _ms(self.until),
            "url": self.url,
        }


_NOT_YET_POLLED = "waiting for its first poll"
_NOT_CONTACTED = "not heard from yet (a static model list is never polled)"
_COULD_NOT_CONNECT = "could not connect on its last request"


@frozen
class _Seen:
    """What is known of one node, for the checks."""

    facade: FacadeState
    node: Node
    contact: LastContact | None


def _reach(seen: _Seen) -> Reachability:
    reach = seen.facade.inventory.reachability(seen.node.id)
    return reach if reach is not None else Reachability(Reach.UNKNOWN, seen.node.public_url)


def _unreachable(seen: _Seen) -> StateOf | None:
    reach = _reach(seen)
    if reach.state is Reach.UNREACHABLE:
        return StateOf(NodeState.UNREACHABLE, reach.url, reach.error, reach.since)
    contact = seen.contact
    if reach.state is not Reach.NOT_POLLED or contact is None:
        return None
    if contact.contact is not Contact.NO_CONNECTION:
        return None
    return StateOf(NodeState.UNREACHABLE, reach.url, _COULD_NOT_CONNECT, contact.since)


def _cooling(seen: _Seen) -> StateOf | None:
    cooldown = seen.facade.stalls.cooldown(seen.node.id)
    if cooldown is None:
        return None
    return StateOf(NodeState.COOLING, seen.node.public_url, cooldown.reason, until=cooldown.until)


def _cordoned(seen: _Seen) -> StateOf | None:
    cordon = seen.facade.cordons.of(seen.node)
    if cordon is None:
        return None
    return StateOf(NodeState.CORDONED, seen.node.public_url, cordon.reason, cordon.since)


def _busy(seen: _Seen) -> StateOf | None:
    admission, node_id = seen.facade.admission, seen.node.id
    slots, taken = admission.slots(node_id), admission.slots_in_use(node_id)
    waiting = admission.waiting_for(node_id)
    why = [f"{taken} of {slots} slots taken"] if 0 < slots <= taken else []
    if waiting:
        why.append(f"{waiting} waiting for it")
    return StateOf(NodeState.BUSY, seen.node.public_url, ", ".join(why)) if why else None


def _unknown(seen: _Seen) -> StateOf | None:
    reach = _reach(seen)
    url = seen.node.public_url
    if reach.state is Reach.UNKNOWN:
        return StateOf(NodeState.UNKNOWN, url, _NOT_YET_POLLED)
    if reach.state is Reach.NOT_POLLED and seen.contact is None:
        return StateOf(NodeState.UNKNOWN, url, _NOT_CONTACTED)
    return None


_CHECKS: tuple[Callable[[_Seen], StateOf | None], ...] = (
    _unreachable,
    _cooling,
    _cordoned,
    _busy,
    _unknown,
)
"""The states but ready, in precedence: the first that holds is the node's."""


def node_state(facade: FacadeState, node: Node, contact: LastContact | None) -> StateOf:
    """The node's state (``contact``: how the last request's attempt to it went, if any)."""
    seen = _Seen(facade, node, contact)
    for check in _CHECKS:
        state = check(seen)
        if state is not None:
            return state
    return StateOf(NodeState.READY, node.public_url)
