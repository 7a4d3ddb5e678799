# -*- test-case-name: tests.core.test_priority -*-
"""A request's priority (docs/behaviour.md §16.3): ``interactive`` (the default) or ``batch``.

A key may be given ``priority = "batch"`` in the keys file; a request may say
``X-NVPair-Priority: batch``. A header can lower the key's priority, never raise it:
:func:`priority_of` gives the lower of the two, or ``None`` for a header it does not understand.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

__all__ = ["PRIORITY_HEADER", "Priority", "priority_of"]

PRIORITY_HEADER = b"x-nvpair-priority"


class Priority(Enum):
    """Who a freed slot goes to first (docs/behaviour.md §16.3)."""

    INTERACTIVE = "interactive"
    """Served first: a person is waiting."""
    BATCH = "batch"
    """Served when no interactive request waits, or once it has waited ``--batch-max-wait``."""


def priority_of(granted: Priority, said: Sequence[bytes] | None) -> Priority | None:
    """The priority of a request from a caller ``granted`` one, whose header said ``said``
    (``None``: no header): the lower of the two; ``None`` when the header is not one value of
    ``interactive`` or ``batch`` (case-insensitive)."""
    if said is None:
        return granted
    if len(said) != 1:
        return None
    try:
        asked = Priority(said[0].decode("latin-1").strip().lower())
    except ValueError:
        return None
    return Priority.BATCH if Priority.BATCH in (granted, asked) else Priority.INTERACTIVE
