# -*- test-case-name: tests.test_ordering -*-
"""The one pure function that decides the order in which a request tries its candidates.

Pin, priority list, reservations, prefix affinity and the stall cooldown all meet here (SPEC §5,
§6.3), in a fixed sequence: base order, head selection, then demotion of cooling nodes, which is
always last so nothing can put a cooling node ahead of a ready one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from attrs import frozen

from nvpair_tw.reservations import PrioritySnapshot

__all__ = ["LoadView", "Ordering", "order_candidates"]

AFFINITY_MAX_QUEUE = 1
AFFINITY_MAX_GPU_PRESSURE = 2


class LoadView(Protocol):
    """Per-node load figures; `nvpair_tw.reservations.ReservationLedger` satisfies it."""

    def pending(self, node_id: str) -> int: ...

    def gpu_pressure(self, node_id: str) -> int: ...

    def reservations(self, node_id: str) -> int: ...


@frozen
class Ordering:
    """The decided order.

    ``reserve`` is True when head selection (affinity or least load) chose a head; the caller then
    reserves ``nodes[0]``, the node the first attempt targets. ``affinity`` is True when the warm
    node was promoted to the head.
    """

    nodes: tuple[str, ...]
    reserve: bool = False
    affinity: bool = False


def order_candidates(
    eligible: Sequence[str],
    *,
    pin: str | None,
    snapshot: PrioritySnapshot,
    ledger_view: LoadView,
    affinity_hint: str | None,
    head_selection: bool,
    cooling: Collection[str],
) -> Ordering:
    """Order ``eligible`` (each once): base order, head selection, then demote cooling nodes."""
    candidates = tuple(dict.fromkeys(eligible))
    allowed = frozenset(candidates)
    cooling_set = frozenset(cooling)
    pinned = bool(pin) and pin in allowed

    listed = [n for n in dict.fromkeys(snapshot.nodes) if n in allowed and n != pin]
    seen = set(listed)
    rest = sorted(n for n in candidates if n not in seen and n != pin)
    base = ([pin] if pinned and pin is not None else []) + listed + rest

    reserve = affinity = False
    if head_selection and not pinned:
        head: str | None = None
        if affinity_hint is not None and _affinity_gate_passes(
            affinity_hint, allowed, ledger_view, cooling_set
        ):
            head, affinity = affinity_hint, True
        else:
            position = {n: i for i, n in enumerate(listed)}
            pool = [n for n in listed if n not in cooling_set] or listed
            if pool:
                head = min(pool, key=lambda n: (_load(ledger_view, n), position[n]))
        if head is not None:
            base.remove(head)
            base.insert(0, head)
            reserve = True

    return Ordering(nodes=_demote(base, cooling_set), reserve=reserve, affinity=affinity)


def _affinity_gate_passes(
    node: str, allowed: frozenset[str], view: LoadView, cooling: frozenset[str]
) -> bool:
    return (
        node in allowed
        and view.pending(node) + view.reservations(node) <= AFFINITY_MAX_QUEUE
        and view.gpu_pressure(node) <= AFFINITY_MAX_GPU_PRESSURE
        and node not in cooling
    )


def _load(view: LoadView, node: str) -> int:
    return view.pending(node) + view.gpu_pressure(node) + view.reservations(node)


def _demote(nodes: Sequence[str], cooling: frozenset[str]) -> tuple[str, ...]:
    """Stable partition: ready nodes in order, then cooling ones in order."""
    ready = [n for n in nodes if n not in cooling]
    if not ready:
        return tuple(nodes)
    return (*ready, *(n for n in nodes if n in cooling))
