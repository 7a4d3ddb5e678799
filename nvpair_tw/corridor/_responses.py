# -*- test-case-name: tests.corridor.test_exchange -*-
"""``/v1/responses``: the conversation's stored state lives on the node that produced it
(docs/behaviour.md §2.1). The node of each response id is remembered in the affinity table; a
request naming ``previous_response_id`` goes there first.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from nvpair_tw.core import RESPONSES_PATH
from nvpair_tw.corridor._attempts import (
    Committed,
)
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    AffinityKey,
)

__all__ = ["conversation_first", "remember_response"]


_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')


_RESPONSE_ID_SCAN = 64 << 10


def _response_key(response_id: str) -> AffinityKey:
    """The affinity-table slot of a response id (same LRU and TTL as prefix affinity)."""
    digest = hashlib.sha256(response_id.encode()).digest()
    return AffinityKey(_RESPONSES_SLOT, digest, (digest,))


_RESPONSES_SLOT = "\0responses"


def remember_response(facade: FacadeState, path: str, committed: Committed) -> None:
    """Remember which node produced a ``/v1/responses`` answer, from its first body chunk: the
    first ``"id"`` of the JSON object, or of the first SSE event (``response.created``).

    Nothing is buffered: an id not in the first chunk is not remembered.
    """
    if path != RESPONSES_PATH or committed.response.code != 200:
        return
    found = _RESPONSE_ID.search(committed.first, 0, _RESPONSE_ID_SCAN)
    if found is not None:
        response_id = found.group(1).decode("utf-8", "replace")
        facade.affinity.record(_response_key(response_id), committed.node.id)


def conversation_first(
    facade: FacadeState, parsed: dict[str, Any], nodes: list[Node]
) -> list[Node]:
    """``previous_response_id``'s node first, when it is a candidate and not cooling (§2.1)."""
    previous = parsed.get("previous_response_id")
    if not isinstance(previous, str) or not previous:
        return nodes
    owner = facade.affinity.lookup(_response_key(previous))
    cooling = facade.stalls.cooling()
    if owner is None or owner in cooling:
        return nodes
    first = [n for n in nodes if n.id == owner]
    return first + [n for n in nodes if n.id != owner]
