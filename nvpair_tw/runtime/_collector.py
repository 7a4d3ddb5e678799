# -*- test-case-name: tests.runtime.test_collector -*-
"""How the process's cyclic garbage collector runs once the proxy is built (docs/performance.md).

A request leaves no reference cycle (``tests/corridor/test_garbage.py``): reference counting frees
what it made when it ends, so the collector finds nothing there. Its passes still cost: with
Python's default first threshold (700 allocations) a young pass ran every request or two at c=32
and walked the live objects of every request in flight, and a full pass walked the whole start-up
heap (modules, classes, the configuration: 118 to 145 ms each, on the reactor). So, once the process
is built, what exists is moved to the permanent generation (``gc.freeze``), where no pass walks it,
and a young pass waits for :data:`YOUNG_THRESHOLD` allocations. Measured at c=32
(``gc.callbacks``): the collector's share of the proxy's CPU fell from 2 to 5 % to under 1 %, with no
full pass. Only ``makeService`` calls :func:`steady_collector`: it changes the whole process.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "steady_collector"]

YOUNG_THRESHOLD = 10_000
"""Net container allocations between two young passes (Python's default: 700)."""


def steady_collector() -> None:
    """Freeze what the process has built and space the young passes (see the module)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
