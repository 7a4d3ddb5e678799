# -*- test-case-name: tests.selection.test_routers -*-
"""No model swap on a busy llama.cpp router (docs/behaviour.md §17.2).

Loading a model on a router already at its ``models_max`` evicts another model and aborts the
requests still running on it (llama.cpp #22447). A request for a model the router has not loaded,
whose loaded models all have requests in flight, therefore goes there only when no other candidate
exists: :func:`spare_busy_routers` takes such routers out of a candidate list that has others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from nvpair_tw.core import ModelControl

__all__ = ["Residency", "RouterFacts", "spare_busy_routers", "would_evict_busy_work"]


class Residency(Protocol):
    """What is loaded where (an :class:`~nvpair_tw.selection.InventoryBook`)."""

    def resident(self, node_id: str, model: str) -> bool | None: ...

    def loaded(self, node_id: str) -> frozenset[str] | None: ...


class RouterFacts(Protocol):
    """What a node said of itself (an ``InventoryBook``'s ``facts``)."""

    def control(self, node_id: str) -> ModelControl | None: ...

    def models_max(self, node_id: str) -> int | None: ...


InFlight = Callable[[str, str], int]
"""``in_flight(node_id, name)``: how many requests for the model the node calls ``name`` are
running there now."""


def would_evict_busy_work(
    book: Residency, facts: RouterFacts, node_id: str, model: str, in_flight: InFlight
) -> bool:
    """Whether sending a request for ``model`` to ``node_id`` would make a router evict a model
    whose requests are still running: the node answered as a router, the model is known not
    loaded there, as many models as its ``models_max`` (known, not 0) are loaded, and every one
    of them has a request in flight."""
    if facts.control(node_id) is None or book.resident(node_id, model) is not False:
        return False
    loaded = book.loaded(node_id)
    limit = facts.models_max(node_id)
    if not loaded or limit is None or limit == 0 or len(loaded) < limit:
        return False
    return all(in_flight(node_id, name) > 0 for name in loaded)


def spare_busy_routers(
    candidates: Sequence[str],
    model: str,
    book: Residency,
    facts: RouterFacts,
    in_flight: InFlight,
) -> list[str]:
    """``candidates`` in their order without the routers a request for ``model`` would make
    evict busy work — unless that would leave none, when they all stay."""
    kept = [n for n in candidates if not would_evict_busy_work(book, facts, n, model, in_flight)]
    return kept if kept else list(candidates)
