"""Tests for the reservation ledger and the scheduler priority snapshot."""

from __future__ import annotations

import pytest

from nvpair_tw.selection._ordering import order_candidates
from nvpair_tw.selection._reservations import (
    Booking,
    PrioritySnapshot,
    Rank,
    ReservationLedger,
    make_rank,
)


def _route(ledger: ReservationLedger, eligible: list[str]) -> str:
    """Order one inference request as the proxy does and reserve its head."""
    ordering = order_candidates(
        eligible,
        pin=None,
        snapshot=ledger.snapshot,
        ledger_view=ledger,
        affinity_hint=None,
        head_selection=True,
        cooling=(),
    )
    assert ordering.reserve
    ledger.reserve(ordering.nodes[0])
    return ordering.nodes[0]


def test_initial_snapshot_is_empty() -> None:
    """Before any snapshot the ledger has no list, no baselines and generation -1."""
    ledger = ReservationLedger()
    assert ledger.snapshot == PrioritySnapshot(generation=-1, nodes=(), ranks={})
    assert (ledger.pending("a"), ledger.gpu_pressure("a"), ledger.load("a")) == (0, 0, 0)


def test_first_snapshot_is_applied_whatever_its_generation() -> None:
    """The first snapshot applies even with generation 0 or below."""
    ledger = ReservationLedger()
    assert ledger.apply(-5, ["a"], [])
    assert ledger.snapshot.generation == -5


def test_apply_replaces_list_and_baselines() -> None:
    """A newer snapshot replaces the priority list and every baseline."""
    ledger = ReservationLedger()
    assert ledger.apply(1, ["a", "b"], [Rank("a", 2, 1), Rank("b", 1, 0)])
    assert ledger.apply(2, ["b"], [Rank("b", 4, 2)])
    assert ledger.snapshot.nodes == ("b",)
    assert (ledger.pending("a"), ledger.gpu_pressure("a")) == (0, 0)
    assert (ledger.pending("b"), ledger.gpu_pressure("b"), ledger.load("b")) == (4, 2, 6)


def test_duplicate_ids_in_the_list_keep_first_place() -> None:
    """A node listed twice keeps its first position only."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b", "a"], [])
    assert ledger.snapshot.nodes == ("a", "b")


@pytest.mark.parametrize("stale", [3, 2])
def test_stale_generation_is_ignored(stale: int) -> None:
    """A snapshot whose generation is not greater than the last applied one changes nothing."""
    ledger = ReservationLedger()
    ledger.apply(3, ["a"], [Rank("a", 1, 1)])
    ledger.reserve("a")
    assert not ledger.apply(stale, ["b"], [Rank("a", 9, 3)])
    assert ledger.snapshot.generation == 3
    assert ledger.snapshot.nodes == ("a",)
    assert (ledger.pending("a"), ledger.reservations("a")) == (1, 1)


def test_new_snapshot_clears_reservations() -> None:
    """Applying a newer snapshot forgets every reservation."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b"], [])
    ledger.reserve("a")
    ledger.reserve("b")
    ledger.apply(2, ["a", "b"], [])
    assert (ledger.reservations("a"), ledger.reservations("b")) == (0, 0)


def test_reservation_is_stamped_with_the_current_generation() -> None:
    """A reservation records the node and the generation it was taken under."""
    ledger = ReservationLedger()
    ledger.apply(7, ["a"], [])
    reservation = ledger.reserve("a")
    assert (reservation.node_id, reservation.generation) == ("a", 7)
    assert ledger.reservations("a") == 1


def test_stale_release_is_dropped() -> None:
    """A release stamped with an older generation does not touch the new generation's count."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a"], [])
    old = ledger.reserve("a")
    ledger.apply(2, ["a"], [])
    ledger.reserve("a")
    ledger.release(old)
    assert ledger.reservations("a") == 1


def test_release_never_goes_below_zero() -> None:
    """Releasing twice releases once; the count stays at zero."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a"], [])
    first = ledger.reserve("a")
    second = ledger.reserve("a")
    ledger.release(first)
    ledger.release(first)
    assert ledger.reservations("a") == 1
    ledger.release(second)
    ledger.release(second)
    assert ledger.reservations("a") == 0


def test_move_releases_old_node_and_reserves_new_one() -> None:
    """Moving a reservation shifts one hold from the old node to the new one."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b"], [])
    moved = ledger.move(ledger.reserve("a"), "b")
    assert moved.node_id == "b"
    assert (ledger.reservations("a"), ledger.reservations("b")) == (0, 1)
    ledger.release(moved)
    assert ledger.reservations("b") == 0


def test_move_of_a_stale_reservation_takes_a_fresh_one() -> None:
    """Moving a pre-snapshot reservation reserves under the new generation and releases nothing."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b"], [])
    old = ledger.reserve("a")
    ledger.apply(2, ["a", "b"], [])
    other = ledger.reserve("a")
    moved = ledger.move(old, "b")
    assert moved.generation == 2
    assert (ledger.reservations("a"), ledger.reservations("b")) == (1, 1)
    ledger.release(other)
    assert ledger.reservations("a") == 0


@pytest.mark.parametrize(
    ("pending", "gpu", "expected"),
    [(-3, 1, (0, 1)), (5, -1, (5, 0)), (2, 4, (2, 3)), (0, 3, (0, 3)), (1, 0, (1, 0))],
)
def test_make_rank_clamps(pending: int, gpu: int, expected: tuple[int, int]) -> None:
    """pending < 0 becomes 0 and gpu_pressure is clamped to 0..3."""
    rank = make_rank("a", pending, gpu)
    assert (rank.id, rank.pending, rank.gpu_pressure) == ("a", *expected)


def test_apply_clamps_ranks() -> None:
    """Unclamped ranks passed to apply are clamped in the snapshot and the load figures."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b"], [Rank("a", -2, 9), Rank("b", 3, -4)])
    assert ledger.snapshot.ranks["a"] == Rank("a", 0, 3)
    assert (ledger.pending("b"), ledger.gpu_pressure("b")) == (3, 0)


def test_snapshot_ranks_are_read_only() -> None:
    """The snapshot's rank mapping cannot be mutated by a caller."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a"], [Rank("a", 1, 1)])
    with pytest.raises(TypeError):
        ledger.snapshot.ranks["a"] = Rank("a", 0, 0)  # type: ignore[index]


def test_equal_loads_spread_reservations_evenly() -> None:
    """100 concurrent equal-load requests over 4 listed nodes differ by at most one reservation."""
    ledger = ReservationLedger()
    nodes = ["n1", "n2", "n3", "n4"]
    ledger.apply(1, nodes, [Rank(n, 1, 1) for n in nodes])
    for _ in range(100):
        _route(ledger, ["n4", "n3", "n2", "n1"])
    counts = [ledger.reservations(n) for n in nodes]
    assert sum(counts) == 100
    assert max(counts) - min(counts) <= 1


def test_uneven_pending_converges_to_equal_load() -> None:
    """Pending 0/2/4 with 6 concurrent requests converges to loads 4/4/4."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b", "c"], [Rank("a", 0, 0), Rank("b", 2, 0), Rank("c", 4, 0)])
    picks = [_route(ledger, ["a", "b", "c"]) for _ in range(6)]
    assert picks == ["a", "a", "a", "b", "a", "b"]
    assert [ledger.load(n) for n in "abc"] == [4, 4, 4]


def test_released_reservations_free_the_node_again() -> None:
    """Finishing a request releases its hold, so the node becomes the least loaded again."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b"], [])
    held = ledger.reserve("a")
    assert _route(ledger, ["a", "b"]) == "b"
    ledger.release(held)
    assert _route(ledger, ["a", "b"]) == "a"


# ---- Booking: one request's reservation life ---------------------------------------------------


def test_booking_takes_moves_and_releases_one_hold() -> None:
    """take reserves, move transfers the hold, release frees it once (a second release is a no-op)."""
    ledger = ReservationLedger()
    booking = Booking.take(ledger, "a")
    assert (booking.node_id, ledger.reservations("a")) == ("a", 1)
    booking.move("b")
    assert (booking.node_id, ledger.reservations("a"), ledger.reservations("b")) == ("b", 0, 1)
    booking.move("b")
    assert ledger.reservations("b") == 1
    booking.release()
    booking.release()
    assert (booking.node_id, ledger.reservations("b")) == (None, 0)


def test_an_empty_booking_reserves_nothing() -> None:
    """Requests without a model hold an empty booking: moving and releasing touch no ledger."""
    booking = Booking.nothing()
    booking.move("a")
    booking.release()
    assert booking.node_id is None


def test_a_released_booking_does_not_move_back_onto_a_node() -> None:
    """After release, a late move (an attempt starting after the end) reserves nothing."""
    ledger = ReservationLedger()
    booking = Booking.take(ledger, "a")
    booking.release()
    booking.move("b")
    assert ledger.reservations("a") == ledger.reservations("b") == 0


def test_an_empty_booking_is_one_for_all_and_stays_empty() -> None:
    """Every request without a model holds the same empty booking (not one made each time):
    moving and releasing it leave it empty for the next request."""
    booking = Booking.nothing()
    booking.move("a")
    booking.release()
    again = Booking.nothing()
    assert again is booking
    assert again.node_id is None


def test_a_hold_another_ledger_made_releases_nothing_here() -> None:
    """A ledger releases only the holds it made: another ledger's first hold on the same node
    (the same node, generation and serial) leaves this ledger's hold in place."""
    ledger, other = ReservationLedger(), ReservationLedger()
    ledger.reserve("a")
    ledger.release(other.reserve("a"))
    assert ledger.reservations("a") == 1
