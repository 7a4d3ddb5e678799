# -*- test-case-name: tests.selection.test_routers -*-
"""No model swap on a busy llama.cpp router (docs/behaviour.md §17.2).

Loading a model on a router already at its ``models_max`` evicts the model it used longest ago
(llama.cpp's ``last_used``, set by every client's request) and aborts the requests still running
on it (llama.cpp #22447). The models a router has requests of this proxy in flight for are loaded
there, whatever its last poll said (it loads a model for the request that names it); and the proxy
does not see the router's own order of use. So a request for a model that would make a router
load it while it holds ``models_max`` models, any of them with requests in flight, goes there only
when no other candidate exists: :func:`spare_busy_routers` takes such routers out of a candidate
list that has others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from nvpair_tw.core import ModelControl

__all__ = ["Residency", "RouterFacts", "Running", "spare_busy_routers", "would_evict_busy_work"]


class Residency(Protocol):
    """What is loaded where (an :class:`~nvpair_tw.selection.InventoryBook`)."""

    def loaded(self, node_id: str) -> frozenset[str] | None: ...


class RouterFacts(Protocol):
    """What a node said of itself (an ``InventoryBook``'s ``facts``)."""

    def control(self, node_id: str) -> ModelControl | None: ...

    def models_max(self, node_id: str) -> int | None: ...


Running = Callable[[str], frozenset[str]]
"""``running(node_id)``: the models, as the node names them, that this proxy has requests in
flight for on the node now."""


def would_evict_busy_work(
    book: Residency, facts: RouterFacts, node_id: str, name: str, running: Running
) -> bool:
    """Whether sending a request for the model the node calls ``name`` to ``node_id`` could make
    a router evict a model whose requests are still running: the node answered as a router with a
    known ``models_max`` (not 0), some model has requests in flight there (``name`` not among
    them), and the models loaded there (its last poll's and those in flight) leave no room for
    ``name`` beside them."""
    limit = facts.models_max(node_id)
    if facts.control(node_id) is None or not limit:
        return False
    busy = running(node_id)
    if not busy or name in busy:
        return False
    loaded = (book.loaded(node_id) or frozenset()) | busy
    return len(loaded | {name}) > limit


def spare_busy_routers(
    candidates: Sequence[str],
    name_of: Callable[[str], str],
    book: Residency,
    facts: RouterFacts,
    running: Running,
) -> list[str]:
    """``candidates`` in their order without the routers a request for the model (as each node
    names it: ``name_of(node_id)``) would make evict busy work — unless that would leave none,
    when they all stay."""
    kept = [n for n in candidates if not would_evict_busy_work(book, facts, n, name_of(n), running)]
    return kept if kept else list(candidates)
