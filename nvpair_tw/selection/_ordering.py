# -*- test-case-name: tests.selection.test_ordering -*-
"""The one pure function that decides the order in which a request tries its candidates.

Pin, priority list, reservations, prefix affinity, residency and the stall cooldown all meet here
(docs/behaviour.md §5, §6.3, §6.4), in a fixed sequence: base order, head selection, then demotion of cooling
nodes, which is always last so nothing can put a cooling node ahead of a ready one.

Head selection without a scheduler (docs/behaviour.md §5.2): when no priority snapshot is in force
(``snapshot=None``), every eligible node counts as listed, in base order (by id). The view then has
no baselines (``pending`` and ``gpu_pressure`` are 0) and this proxy's in-flight requests are
exactly its reservations, so the head is the node with the fewest requests in flight; ties go to a
node where the model is known resident, then to the lowest id. With a snapshot, ties on load go to
a resident node, then to the earlier list position.

The fastest answer (docs/behaviour.md §15.2): when the caller passes each node's predicted time to
the last token, that order replaces the least-load rule and the affinity gate (a warm prefix is
part of the prediction); an eligible pin still goes first and cooling nodes still go last.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Protocol

from attrs import frozen

from nvpair_tw.selection._reservations import PrioritySnapshot

__all__ = ["LoadView", "Ordering", "order_candidates"]

AFFINITY_MAX_QUEUE = 1
AFFINITY_MAX_GPU_PRESSURE = 2


class LoadView(Protocol):
    """Per-node load figures; `nvpair_tw.selection._reservations.ReservationLedger` satisfies it."""

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
    snapshot: PrioritySnapshot | None,
    ledger_view: LoadView,
    affinity_hint: str | None,
    head_selection: bool,
    cooling: Collection[str],
    resident: Collection[str] = frozenset(),
    predicted: Mapping[str, float] | None = None,
) -> Ordering:
    """Order ``eligible`` (each once): base order, head selection, then demote cooling nodes.

    ``snapshot`` is the scheduler snapshot in force, or None when there is none: head selection
    then balances over every eligible node. ``resident`` holds the ids of nodes where the
    request's model is known to be loaded; it breaks ties on load (docs/behaviour.md §5.2, §6.4).

    ``predicted`` (seconds to the last token per node, §15.2) replaces head selection: see
    :func:`_by_prediction`.
    """
    candidates = tuple(dict.fromkeys(eligible))
    if predicted is not None and head_selection and len(candidates) == 1:
        return _alone(candidates[0], pin, affinity_hint)
    allowed = frozenset(candidates)
    cooling_set = frozenset(cooling)
    warm = frozenset(resident)
    pinned = bool(pin) and pin in allowed

    priority = snapshot.nodes if snapshot is not None else ()
    listed = [n for n in dict.fromkeys(priority) if n in allowed and n != pin]
    seen = set(listed)
    rest = sorted(n for n in candidates if n not in seen and n != pin)
    base = ([pin] if pinned and pin is not None else []) + listed + rest
    balanced = listed if snapshot is not None else rest

    if predicted is not None and head_selection:
        groups = [listed, rest] if snapshot is not None else [listed + rest]
        fixed = base[:1] if pinned else []
        return _by_prediction(fixed, groups, predicted, affinity_hint, cooling_set)
    reserve = affinity = False
    if head_selection and not pinned:
        head: str | None = None
        if affinity_hint is not None and _affinity_gate_passes(
            affinity_hint, allowed, ledger_view, cooling_set
        ):
            head, affinity = affinity_hint, True
        else:
            pool = [n for n in balanced if n not in cooling_set] or balanced
            if len(pool) == 1:
                head = pool[0]  # the usual single candidate: nothing to weigh
            elif pool:
                position = {n: i for i, n in enumerate(balanced)}
                head = min(pool, key=lambda n: (_load(ledger_view, n), n not in warm, position[n]))
        if head is not None:
            base.remove(head)
            base.insert(0, head)
            reserve = True

    return Ordering(nodes=_demote(base, cooling_set), reserve=reserve, affinity=affinity)


@lru_cache(maxsize=256)
def _alone(only: str, pin: str | None, warm: str | None) -> Ordering:
    """The usual single candidate ordered by prediction, as :func:`_by_prediction` orders it
    (without the base order's sets and sorts): reserved unless pinned, its affinity when it is
    the warm node. A frozen value of its three arguments alone, so made once for each and given
    again (every request of a one-node fleet asks the same)."""
    chose = not pin or pin != only
    return Ordering(nodes=(only,), reserve=chose, affinity=chose and only == warm)


def _by_prediction(
    fixed: list[str],
    groups: list[list[str]],
    predicted: Mapping[str, float],
    warm: str | None,
    cooling: frozenset[str],
) -> Ordering:
    """``fixed`` (an eligible pin) first, then each group by least predicted time (ties: its
    order; with a snapshot, its listed nodes are the first group), then cooling nodes demoted.
    The head is reserved unless pinned; the warm node heads only when its prediction (its
    prefill saved) is the least."""
    ranked = list(fixed)
    for group in groups:
        position = {n: i for i, n in enumerate(group)}
        ranked += sorted(group, key=lambda n: (predicted.get(n, float("inf")), position[n]))
    nodes = _demote(ranked, cooling)
    head = nodes[0] if nodes else None
    chose = not fixed and head is not None
    return Ordering(nodes=nodes, reserve=chose, affinity=chose and head == warm)


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
    if not cooling:
        return tuple(nodes)
    ready = [n for n in nodes if n not in cooling]
    if not ready:
        return tuple(nodes)
    return (*ready, *(n for n in nodes if n in cooling))
