# -*- test-case-name: tests.corridor.test_responses -*-
"""``/v1/responses``: the conversation's stored state lives on the node that produced it, and
belongs to the key that made it (docs/behaviour.md §2.1, §14.2).

Two entries of the facade's response table (an affinity table kept as long as a session, §5.3)
remember each response a node produced: its placement (the
response id's digest → the node) and its owner (the digest of the caller's name and the id → the
node). Both are digests, so they travel through the fleet store like affinity entries, sealed
under its secret when it has one. A request that names a stored response — ``previous_response_id``
of a ``POST /v1/responses``, or the id of ``/v1/responses/{id}`` and what is below it — goes to its
node first when the caller is its owner; when the proxy knows the response and the caller is not
its owner, it is 404 ``response-not-found`` and no node is contacted. ``local`` callers are one
principal. The owner is remembered as long as the placement: both are refreshed together, by the
owner only.
"""

from __future__ import annotations

import hashlib
import re

from nvpair_tw.core import RESPONSES_PATH
from nvpair_tw.corridor._attempts import Committed
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.inbound import Rejection
from nvpair_tw.nodes import Node
from nvpair_tw.selection import AffinityKey

__all__ = ["conversation_first", "remember_response", "stored_response"]


_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')
_RESPONSE_ID_SCAN = 64 << 10
_RESPONSES_SLOT = "\0responses"
_BELOW = RESPONSES_PATH + "/"
_NOT_FOUND = Rejection(
    404, "response-not-found", "no stored response with this id is this key's to use"
)


def _placement(response_id: str) -> AffinityKey:
    """The response-table slot of a response id."""
    digest = hashlib.sha256(response_id.encode()).digest()
    return AffinityKey(_RESPONSES_SLOT, digest, (digest,))


def _owned(response_id: str, owner: str) -> AffinityKey:
    """The slot saying ``owner`` (a key's name, or ``local``) made the response."""
    digest = hashlib.sha256(b"owner\0" + owner.encode() + b"\0" + response_id.encode()).digest()
    return AffinityKey(_RESPONSES_SLOT, digest, (digest,))


def remember_response(facade: FacadeState, inbound: Inbound, committed: Committed) -> None:
    """Remember which node produced a ``/v1/responses`` answer, and for whom, from its first body
    chunk: the first ``"id"`` of the JSON object, or of the first SSE event
    (``response.created``). Nothing is buffered: an id not in the first chunk is not remembered."""
    if inbound.path != RESPONSES_PATH or committed.response.code != 200:
        return
    found = _RESPONSE_ID.search(committed.first, 0, _RESPONSE_ID_SCAN)
    if found is None:
        return
    response_id = found.group(1).decode("utf-8", "replace")
    # the placement first, so the owner's entry is the newer: an LRU that evicts one of the two
    # evicts the placement, and the owner is never refused its own response
    facade.responses.record(_placement(response_id), committed.node.id)
    facade.responses.record(_owned(response_id, inbound.caller.name), committed.node.id)


def _named(inbound: Inbound) -> str | None:
    """The stored response a request names, if any."""
    if inbound.path.startswith(_BELOW):
        named = inbound.path[len(_BELOW) :].partition("/")[0]
        return named or None
    if inbound.path != RESPONSES_PATH or inbound.doc is None:
        return None
    previous = inbound.doc.get("previous_response_id")
    return previous if isinstance(previous, str) and previous else None


def stored_response(facade: FacadeState, inbound: Inbound) -> str | Rejection | None:
    """The node holding the response ``inbound`` names, when its caller owns it; 404
    ``response-not-found`` when the proxy knows the response and it is another's; None when the
    request names none, or one the proxy does not know."""
    response_id = _named(inbound)
    if response_id is None:
        return None
    table = facade.responses
    owned = _owned(response_id, inbound.caller.name)
    placement = _placement(response_id)
    if table.holds(owned):
        table.lookup(placement)  # refreshed with the owner's, never by anyone else's look
        return table.lookup(owned)
    return _NOT_FOUND if table.holds(placement) else None


def conversation_first(facade: FacadeState, node_id: str | None, nodes: list[Node]) -> list[Node]:
    """The stored response's node first, when it is a candidate and not cooling (§2.1)."""
    if node_id is None or node_id in facade.stalls.cooling():
        return nodes
    first = [n for n in nodes if n.id == node_id]
    return first + [n for n in nodes if n.id != node_id]
