# -*- test-case-name: tests.selection.test_patience -*-
"""Late binding by prediction (docs/behaviour.md §15.2, amending §6.4): how long a request waits
for the node it predicts best while a worse one is free.

A :class:`Patience` is made when the request is ordered: its best node (the head of the predicted
order), the clock time that node was predicted to finish it, and for every candidate the time it
would take there once dispatched (its prediction without the slot wait). A node that frees a slot
is taken only when finishing there is no later than the best node's predicted finish; once that
time has passed (the better node is late), any node is taken.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

__all__ = ["Patience", "patience"]


@frozen
class Patience:
    """Which freed nodes a queued request takes, and until when it may decline the others."""

    best: str
    best_finish: float
    """Clock seconds the best node was predicted to deliver the last token."""
    service: Mapping[str, float]
    """Per node, the predicted seconds from dispatch to the last token (no slot wait)."""

    def accepts(self, node_id: str, now: float) -> bool:
        """Whether the request takes a free slot on ``node_id`` at clock time ``now``."""
        if node_id == self.best or now >= self.best_finish:
            return True
        service = self.service.get(node_id)
        return service is None or now + service <= self.best_finish


def patience(
    order: list[str], predicted: Mapping[str, float], waits: Mapping[str, float], now: float
) -> Patience | None:
    """The patience of a request ordered ``order`` (best first) at clock time ``now``; None when
    the head was not chosen by prediction (a pin, a cooling demotion) or there is no head."""
    if not order:
        return None
    best = order[0]
    if best not in predicted or predicted[best] > min(predicted.values()):
        return None
    service = {n: max(0.0, seconds - waits.get(n, 0.0)) for n, seconds in predicted.items()}
    return Patience(best, now + predicted[best], service)
