# -*- test-case-name: tests.selection.test_patience -*-
"""Late binding by prediction (docs/behaviour.md §15.2, amending §6.4): where a queued request
binds, decided again whenever that could change, from what is known then.

A :class:`Patience` is made when the request is ordered. It holds a callable that gives, for every
candidate, its :class:`Outlook` *now*: the predicted seconds from dispatch to the last token there
(the rates learnt so far, the requests that would share the node), the seconds until the node
could take it (its requests in flight: to their predicted end, then as long again as they are
late), and whether it is *held* — a node never measured for the model whose first request there
has not yet shown its speed (nor run :data:`HOLD_MAX`), which takes no second request for the
model meanwhile.

:func:`choose` adds, per node, the work of the requests queued ahead of this one, and picks the
node predicted to finish the request first. The request binds when that node can take it now;
else it keeps waiting for it, and is looked at again when a slot frees, when the time it waits
for could be lost (its :attr:`Choice.recheck`: the margin it is ahead by, at least
:data:`RECHECK_MIN`), and every :data:`HELD_RECHECK` while a held node may show its speed. A
node that is late is thus waited for as long as waiting is still predicted to pay, never longer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from attrs import define, field, frozen

__all__ = ["HELD_RECHECK", "HOLD_MAX", "RECHECK_MIN", "Choice", "Outlook", "Patience", "choose"]

RECHECK_MIN = 0.05
"""The least time between two looks at a waiting request (seconds)."""
HELD_RECHECK = 0.1
"""How often a request waiting on a held node looks again whether it showed its speed."""
HOLD_MAX = 0.5
"""Seconds a node's first request for a model holds it at most: past them it takes more
requests before its speed shows (at the stand-in rates), as it did before any hold."""


@frozen
class Outlook:
    """One candidate as a queued request sees it now: seconds from dispatch to its last token
    there, seconds until the node could take it, and whether it is held (see the module)."""

    service: float
    wait: float = 0.0
    held: bool = False


Outlooks = Callable[[], Mapping[str, Outlook]]


@define(eq=False)
class Patience:
    """How a queued request chooses its node (docs/behaviour.md §15.2): its :attr:`outlook`,
    read again at every look; :attr:`last` is the outlook last read (what a bound request's
    flight counts as work ahead on its node)."""

    outlook: Outlooks
    last: Mapping[str, Outlook] = field(factory=dict)

    def read(self) -> Mapping[str, Outlook]:
        """The candidates' outlook now (kept as :attr:`last`)."""
        self.last = self.outlook()
        return self.last


@frozen
class Choice:
    """Where a request goes: the node predicted to finish it first, in how many seconds, whether
    that node can take it now, and when to look again if not (seconds from now; None: only when
    a slot frees)."""

    node: str
    finish: float
    bind: bool
    recheck: float | None = None


def choose(
    candidates: Sequence[str],
    views: Mapping[str, Outlook],
    free: Collection[str],
    ahead: Mapping[str, float],
    slots: Callable[[str], int],
) -> Choice | None:
    """The choice among ``candidates`` (ties: their order) given each one's outlook, the nodes
    with a slot ``free`` for the request, and the seconds of work queued ``ahead`` of it per node
    (over the node's ``slots``; an unlimited node counts as one). None: no candidate has an
    outlook."""
    best: tuple[float, str] | None = None
    takes_now: tuple[float, str] | None = None
    held = False
    for node_id in candidates:
        view = views.get(node_id)
        if view is None:
            continue
        held = held or view.held
        if node_id in free and not view.held:
            finish = view.service
            if takes_now is None or finish < takes_now[0]:
                takes_now = (finish, node_id)
        else:
            finish = view.wait + ahead.get(node_id, 0.0) / max(1, slots(node_id)) + view.service
        if best is None or finish < best[0]:
            best = (finish, node_id)
    if best is None:
        return None
    if takes_now is not None and takes_now[0] <= best[0]:
        return Choice(takes_now[1], takes_now[0], True)
    margin = math.inf if takes_now is None else takes_now[0] - best[0]
    recheck = None if math.isinf(margin) else max(RECHECK_MIN, margin)
    if held:
        recheck = HELD_RECHECK if recheck is None else min(recheck, HELD_RECHECK)
    return Choice(best[1], best[0], False, recheck)
