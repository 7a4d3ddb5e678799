"""Tests for nvpair_tw.usage._storage: the table of the usage database's states, and the one
error for a move the table does not allow."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from nvpair_tw.usage._buffer import UsageBuffer
from nvpair_tw.usage._storage import MOVES, IllegalMove, Move, Storage, UsageStorage


def storage(path: str | None) -> UsageStorage:
    return UsageStorage(Clock(), path, UsageBuffer(3600.0), lambda: None)  # type: ignore[arg-type]


def test_a_recorder_without_a_database_starts_in_memory_and_one_with_a_path_opening() -> None:
    assert storage(None).state is Storage.MEMORY
    assert storage("/nonexistent/never-opened").state is Storage.OPENING


@pytest.mark.parametrize("state", list(Storage))
@pytest.mark.parametrize("move", list(Move))
def test_every_move_follows_the_table_or_is_the_one_illegal_move_error(
    state: Storage, move: Move
) -> None:
    """A move in the table gives its state and returns the one before; any other raises
    IllegalMove naming both, and leaves the state as it was."""
    held = storage(None)
    held.state = state
    if (state, move) in MOVES:
        assert held.move(move) is state
        assert held.state is MOVES[(state, move)]
    else:
        with pytest.raises(IllegalMove) as raised:
            held.move(move)
        assert (raised.value.state, raised.value.move) == (state, move)
        assert repr(move.value) in str(raised.value) and repr(state.value) in str(raised.value)
        assert held.state is state


def test_the_table_only_ever_gives_up_the_database_for_memory() -> None:
    """Once in memory, usage never goes back to a database (nothing is retried, §12.4)."""
    assert {after for (before, _), after in MOVES.items() if before is Storage.MEMORY} == {
        Storage.MEMORY
    }
    assert MOVES[(Storage.OPENING, Move.OPENED)] is Storage.DATABASE
    assert (Storage.OPENING, Move.CLOSED) not in MOVES
    assert (Storage.DATABASE, Move.OPENED) not in MOVES
