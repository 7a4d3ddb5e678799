"""A request's priority from its key's and its header (docs/behaviour.md §16.3)."""

from __future__ import annotations

import pytest

from nvpair_tw.core import Priority, priority_of

INT, B = Priority.INTERACTIVE, Priority.BATCH


@pytest.mark.parametrize(
    ("granted", "said", "expected"),
    [
        (INT, None, INT),
        (B, None, B),
        (INT, [b"batch"], B),
        (INT, [b" Batch "], B),
        (INT, [b"interactive"], INT),
        (B, [b"interactive"], B),
        (B, [b"batch"], B),
    ],
)
def test_a_header_can_lower_the_keys_priority_never_raise_it(
    granted: Priority, said: list[bytes] | None, expected: Priority
) -> None:
    assert priority_of(granted, said) is expected


@pytest.mark.parametrize("said", [[b"urgent"], [b""], [b"batch", b"batch"], [b"batch,batch"]])
def test_a_header_that_is_not_one_known_value_is_not_understood(said: list[bytes]) -> None:
    assert priority_of(INT, said) is None
