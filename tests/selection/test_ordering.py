"""Tests for order_candidates: base order, head selection, affinity and stall demotion."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence

import pytest
from attrs import define, field
from hypothesis import given
from hypothesis import strategies as st

from nvpair_tw.selection._ordering import Ordering, order_candidates
from nvpair_tw.selection._reservations import PrioritySnapshot, Rank, ReservationLedger, make_rank


@define
class Loads:
    """A LoadView with fixed figures: id -> (pending, gpu_pressure, reservations)."""

    figures: Mapping[str, tuple[int, int, int]] = field(factory=dict)

    def pending(self, node_id: str) -> int:
        return self.figures.get(node_id, (0, 0, 0))[0]

    def gpu_pressure(self, node_id: str) -> int:
        return self.figures.get(node_id, (0, 0, 0))[1]

    def reservations(self, node_id: str) -> int:
        return self.figures.get(node_id, (0, 0, 0))[2]


def _order(
    eligible: Sequence[str],
    *,
    pin: str | None = None,
    priority: Sequence[str] = (),
    loads: Mapping[str, tuple[int, int, int]] | None = None,
    hint: str | None = None,
    head: bool = True,
    cooling: Collection[str] = (),
) -> Ordering:
    snapshot = PrioritySnapshot(generation=1, nodes=tuple(priority), ranks={})
    return order_candidates(
        eligible,
        pin=pin,
        snapshot=snapshot,
        ledger_view=Loads(loads or {}),
        affinity_hint=hint,
        head_selection=head,
        cooling=cooling,
    )


# Base order


def test_pin_goes_first() -> None:
    """An eligible pin heads the list, ahead of the priority list."""
    ordering = _order(["a", "b", "c"], pin="c", priority=["a", "b"], head=False)
    assert ordering == Ordering(("c", "a", "b"), reserve=False, affinity=False)


def test_ineligible_pin_is_ignored() -> None:
    """A pin outside the eligible set changes nothing."""
    assert _order(["a", "b"], pin="z", priority=["b"], head=False).nodes == ("b", "a")


def test_empty_pin_means_automatic() -> None:
    """An empty pin string is no pin."""
    assert _order(["b", "a"], pin="", head=False).nodes == ("a", "b")


def test_priority_list_order_then_rest_by_id() -> None:
    """Listed nodes come in list order, unlisted ones after them sorted by id."""
    ordering = _order(["e", "d", "c", "b", "a"], priority=["c", "a"], head=False)
    assert ordering.nodes == ("c", "a", "b", "d", "e")


def test_unknown_priority_ids_are_ignored() -> None:
    """Ids in the priority list that are not eligible do not appear."""
    assert _order(["b", "a"], priority=["x", "b", "y"], head=False).nodes == ("b", "a")


def test_duplicate_eligible_ids_appear_once() -> None:
    """Every eligible candidate appears exactly once."""
    assert _order(["a", "b", "a"], priority=["b", "b"], head=False).nodes == ("b", "a")


def test_no_candidates_gives_an_empty_order() -> None:
    """An empty eligible set orders to nothing and reserves nothing."""
    assert _order([], pin="a", priority=["a"], hint="a") == Ordering((), False, False)


def test_pass_through_does_no_head_selection() -> None:
    """Without head selection the base order stands even when a later node is less loaded."""
    ordering = _order(["a", "b"], priority=["a", "b"], loads={"a": (5, 0, 0)}, hint="b", head=False)
    assert ordering == Ordering(("a", "b"), reserve=False, affinity=False)


# Least-load head selection


def test_least_loaded_listed_node_goes_first() -> None:
    """Head selection moves the least pending + gpu_pressure + reservations node first."""
    loads = {"a": (1, 1, 1), "b": (0, 1, 1), "c": (1, 0, 0)}
    ordering = _order(["a", "b", "c", "d"], priority=["a", "b", "c"], loads=loads)
    assert ordering == Ordering(("c", "a", "b", "d"), reserve=True, affinity=False)


def test_least_load_ties_go_to_list_position() -> None:
    """Equal loads are broken by priority-list position, not by id."""
    ordering = _order(["a", "b", "c"], priority=["c", "b", "a"], loads={"c": (1, 0, 0)})
    assert ordering.nodes == ("b", "c", "a")


def test_unlisted_nodes_are_never_head_selected() -> None:
    """Least load considers listed candidates only; with none listed nothing is reserved."""
    assert _order(["a", "b"], priority=["b"], loads={"b": (9, 3, 9)}).nodes == ("b", "a")
    assert _order(["b", "a"], loads={"a": (9, 0, 0)}) == Ordering(("a", "b"), False, False)


def test_eligible_pin_turns_least_load_off() -> None:
    """An eligible pin keeps its head and nothing is reserved."""
    ordering = _order(["a", "b"], pin="a", priority=["a", "b"], loads={"a": (9, 0, 0)})
    assert ordering == Ordering(("a", "b"), reserve=False, affinity=False)


def test_ineligible_pin_keeps_least_load_on() -> None:
    """An ineligible pin does not disable head selection."""
    ordering = _order(["a", "b"], pin="z", priority=["a", "b"], loads={"a": (9, 0, 0)})
    assert ordering == Ordering(("b", "a"), reserve=True, affinity=False)


def test_ledger_reservations_drive_the_head() -> None:
    """The real ledger serves as the load view: a reservation shifts the next head."""
    ledger = ReservationLedger()
    ledger.apply(1, ["a", "b"], [make_rank("a", 0, 0), make_rank("b", 0, 1)])

    def run() -> Ordering:
        return order_candidates(
            ["a", "b"],
            pin=None,
            snapshot=ledger.snapshot,
            ledger_view=ledger,
            affinity_hint=None,
            head_selection=True,
            cooling=(),
        )

    first = run()
    ledger.reserve(first.nodes[0])
    ledger.reserve(first.nodes[0])
    assert (first.nodes, run().nodes) == (("a", "b"), ("b", "a"))


# Affinity


def test_affinity_gate_passes_promotes_warm_node() -> None:
    """A warm node with pending + reservations <= 1 and gpu_pressure < 3 goes first."""
    loads = {"c": (1, 2, 0), "a": (0, 0, 0)}
    ordering = _order(["a", "b", "c"], priority=["a", "b"], loads=loads, hint="c")
    assert ordering == Ordering(("c", "a", "b"), reserve=True, affinity=True)


def test_affinity_gate_fails_on_load() -> None:
    """pending + reservations of 2 fails the gate; least-load selection takes over."""
    for figures in [(2, 0, 0), (1, 0, 1), (0, 0, 2)]:
        ordering = _order(["a", "b"], priority=["a", "b"], loads={"b": figures}, hint="b")
        assert ordering == Ordering(("a", "b"), reserve=True, affinity=False)


def test_affinity_gate_fails_on_gpu_pressure() -> None:
    """gpu_pressure 3 fails the gate."""
    ordering = _order(["a", "b"], priority=["a", "b"], loads={"b": (0, 3, 0)}, hint="b")
    assert ordering == Ordering(("a", "b"), reserve=True, affinity=False)


def test_affinity_gate_fails_on_cooling() -> None:
    """A cooling warm node fails the gate."""
    ordering = _order(["a", "b"], priority=["a", "b"], hint="b", cooling={"b"})
    assert ordering == Ordering(("a", "b"), reserve=True, affinity=False)


def test_ineligible_warm_node_is_ignored() -> None:
    """A warm node outside the eligible set never appears and affinity stays off."""
    ordering = _order(["a", "b"], priority=["a", "b"], loads={"a": (3, 0, 0)}, hint="z")
    assert ordering == Ordering(("b", "a"), reserve=True, affinity=False)


def test_eligible_pin_disables_affinity() -> None:
    """An eligible pin beats a warm node that would pass the gate."""
    ordering = _order(["a", "b"], pin="a", hint="b")
    assert ordering == Ordering(("a", "b"), reserve=False, affinity=False)


# Demotion


def test_demotion_is_a_stable_partition() -> None:
    """Ready nodes keep their order, then cooling nodes in theirs."""
    ordering = _order(["a", "b", "c", "d", "e"], cooling={"a", "c"}, head=False)
    assert ordering.nodes == ("b", "d", "e", "a", "c")


def test_pinned_cooling_node_goes_behind_a_ready_peer() -> None:
    """A pin cannot put a cooling node ahead of a ready one."""
    assert _order(["a", "b"], pin="a", cooling={"a"}).nodes == ("b", "a")


def test_reserved_cooling_node_goes_behind_a_ready_unlisted_peer() -> None:
    """When every listed node cools, the least-load pick is still demoted behind a ready node."""
    ordering = _order(["a", "b", "z"], priority=["a", "b"], loads={"a": (3, 0, 0)}, cooling="ab")
    assert ordering == Ordering(("z", "b", "a"), reserve=True, affinity=False)


def test_affinity_cooling_node_goes_behind_a_ready_peer() -> None:
    """A cooling warm node is not promoted and ends up behind ready peers."""
    assert _order(["a", "b"], hint="a", cooling={"a"}, priority=["a"]).nodes == ("b", "a")


def test_sole_cooling_candidate_is_kept() -> None:
    """A sole candidate that is cooling is still used."""
    assert _order(["a"], priority=["a"], cooling={"a"}) == Ordering(("a",), True, False)


def test_all_cooling_list_is_unchanged() -> None:
    """When every candidate cools the order is what it would be without the cooldown."""
    loads = {"a": (2, 0, 0)}
    cooled = _order(["a", "b", "c"], pin=None, priority=["a", "b"], loads=loads, cooling="abc")
    plain = _order(["a", "b", "c"], pin=None, priority=["a", "b"], loads=loads)
    assert cooled == plain == Ordering(("b", "a", "c"), reserve=True, affinity=False)


def test_least_load_skips_a_cooling_listed_node() -> None:
    """The least-loaded ready listed node is picked over a less-loaded cooling listed node."""
    loads = {"a": (0, 0, 0), "b": (5, 0, 0), "c": (1, 0, 0)}
    ordering = _order(["a", "b", "c", "d"], priority=["a", "b", "c"], loads=loads, cooling={"a"})
    assert ordering == Ordering(("c", "b", "d", "a"), reserve=True, affinity=False)


# Properties

IDS = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@given(
    eligible=st.lists(IDS, max_size=6),
    pin=st.one_of(st.none(), st.just(""), IDS),
    priority=st.lists(IDS, max_size=6),
    ranks=st.lists(st.tuples(IDS, st.integers(-2, 6), st.integers(-1, 4)), max_size=6),
    reserved=st.lists(IDS, max_size=8),
    hint=st.one_of(st.none(), IDS),
    head=st.booleans(),
    cooling=st.frozensets(IDS),
)
def test_order_properties(
    eligible: list[str],
    pin: str | None,
    priority: list[str],
    ranks: list[tuple[str, int, int]],
    reserved: list[str],
    hint: str | None,
    head: bool,
    cooling: frozenset[str],
) -> None:
    """The order is a permutation of the eligible set, ready before cooling, and deterministic."""
    ledger = ReservationLedger()
    ledger.apply(1, priority, [Rank(*r) for r in ranks])
    for node in reserved:
        ledger.reserve(node)
    before = (list(eligible), ledger.snapshot, sorted(cooling))

    def run() -> Ordering:
        return order_candidates(
            eligible,
            pin=pin,
            snapshot=ledger.snapshot,
            ledger_view=ledger,
            affinity_hint=hint,
            head_selection=head,
            cooling=cooling,
        )

    result = run()
    assert sorted(result.nodes) == sorted(set(eligible))
    flags = [n in cooling for n in result.nodes]
    if not all(flags):
        assert flags == sorted(flags)
    assert run() == result
    assert (list(eligible), ledger.snapshot, sorted(cooling)) == before
    if result.affinity:
        assert result.reserve and result.nodes[0] == hint
    if pin and pin in eligible:
        assert not result.reserve


# --- Spreading without a scheduler, and residency (issue 13, docs/behaviour.md §5.2 / §6.4) ------------------
# Kept apart from the sections above on purpose: these tests belong to the residency branch.


def _spread(
    eligible: Sequence[str],
    *,
    pin: str | None = None,
    loads: Mapping[str, tuple[int, int, int]] | None = None,
    hint: str | None = None,
    head: bool = True,
    cooling: Collection[str] = (),
    resident: Collection[str] = (),
    priority: Sequence[str] | None = None,
) -> Ordering:
    """order_candidates with no scheduler snapshot in force (``priority=None``) or with one."""
    snapshot = (
        None
        if priority is None
        else PrioritySnapshot(generation=1, nodes=tuple(priority), ranks={})
    )
    return order_candidates(
        eligible,
        pin=pin,
        snapshot=snapshot,
        ledger_view=Loads(loads or {}),
        affinity_hint=hint,
        head_selection=head,
        cooling=cooling,
        resident=resident,
    )


def _in_flight(**counts: int) -> dict[str, tuple[int, int, int]]:
    """Loads with no scheduler: only this proxy's reservations (its requests in flight)."""
    return {node: (0, 0, n) for node, n in counts.items()}


def test_without_a_snapshot_every_eligible_node_is_balanced() -> None:
    """No snapshot: the head is the eligible node with the fewest requests in flight, the others
    stay in id order, and the head is reserved."""
    ordering = _spread(["c", "a", "b"], loads=_in_flight(a=2, b=1, c=3))
    assert ordering == Ordering(("b", "a", "c"), reserve=True, affinity=False)


def test_without_a_snapshot_an_idle_cluster_starts_at_the_lowest_id() -> None:
    """No snapshot, no load, no residency: the lowest id heads (and is reserved)."""
    assert _spread(["b", "c", "a"]) == Ordering(("a", "b", "c"), reserve=True, affinity=False)


def test_without_a_snapshot_a_tie_on_load_goes_to_a_resident_node() -> None:
    """Equal in-flight counts: a node where the model is resident beats a lower id."""
    assert _spread(["a", "b", "c"], resident={"c"}).nodes == ("c", "a", "b")
    assert _spread(["a", "b", "c"], resident={"b", "c"}).nodes == ("b", "a", "c")
    busy = _spread(["a", "b", "c"], loads=_in_flight(a=1, b=1, c=1), resident={"c"})
    assert busy.nodes == ("c", "a", "b")


def test_without_a_snapshot_load_beats_residency() -> None:
    """Fewer requests in flight wins over residency: a busy cluster still spreads."""
    ordering = _spread(["a", "b"], loads=_in_flight(b=1), resident={"b"})
    assert ordering.nodes == ("a", "b")


def test_without_a_snapshot_the_load_is_pending_plus_pressure_plus_reservations() -> None:
    """Whatever the view reports (a fleet's in-flight count as pending, say) is summed."""
    loads = {"a": (1, 0, 0), "b": (0, 1, 0), "c": (0, 0, 0), "d": (0, 0, 1)}
    assert _spread(["a", "b", "c", "d"], loads=loads).nodes[0] == "c"


def test_with_a_snapshot_residency_breaks_ties_before_list_position() -> None:
    """With a snapshot, equal loads go to a resident listed node, then to list position."""
    assert _spread(["a", "b", "c"], priority=["a", "b", "c"], resident={"c"}).nodes == (
        "c",
        "a",
        "b",
    )
    two = _spread(["a", "b", "c"], priority=["c", "b", "a"], resident={"a", "b"})
    assert two.nodes == ("b", "c", "a")
    loaded = _spread(["a", "b"], priority=["a", "b"], loads={"b": (1, 0, 0)}, resident={"b"})
    assert loaded.nodes == ("a", "b")


def test_with_a_snapshot_residency_never_lifts_an_unlisted_node() -> None:
    """A resident node outside the priority list is still not head-selected."""
    assert _spread(["a", "b"], priority=["b"], resident={"a"}).nodes == ("b", "a")
    ordering = _spread(["a", "b"], priority=[], resident={"a", "b"})
    assert ordering == Ordering(("a", "b"), reserve=False, affinity=False)


def test_without_a_snapshot_a_cooling_resident_node_is_skipped_and_demoted() -> None:
    """A cooling node loses the head to a ready one, resident or not, and ends up last."""
    ordering = _spread(["a", "b", "c"], resident={"a"}, cooling={"a"})
    assert ordering == Ordering(("b", "c", "a"), reserve=True, affinity=False)


def test_without_a_snapshot_every_node_cooling_still_balances() -> None:
    """When every node cools, head selection runs over all of them and demotion changes nothing."""
    ordering = _spread(["a", "b", "c"], loads=_in_flight(a=1), resident={"c"}, cooling="abc")
    assert ordering == Ordering(("c", "a", "b"), reserve=True, affinity=False)


def test_without_a_snapshot_the_pin_keeps_precedence() -> None:
    """An eligible pin heads even when loaded and not resident; nothing is reserved."""
    ordering = _spread(["a", "b"], pin="b", loads=_in_flight(b=5), resident={"a"})
    assert ordering == Ordering(("b", "a"), reserve=False, affinity=False)
    ignored = _spread(["a", "b"], pin="z", loads=_in_flight(a=1))
    assert ignored == Ordering(("b", "a"), reserve=True, affinity=False)


def test_without_a_snapshot_affinity_keeps_precedence() -> None:
    """A warm node passing the gate heads even when another node is idle and resident."""
    ordering = _spread(["a", "b", "c"], loads=_in_flight(c=1), hint="c", resident={"a"})
    assert ordering == Ordering(("c", "a", "b"), reserve=True, affinity=True)
    failed = _spread(["a", "b", "c"], loads=_in_flight(a=1, c=2), hint="c", resident={"a"})
    assert failed == Ordering(("b", "a", "c"), reserve=True, affinity=False)


def test_without_head_selection_residency_and_load_change_nothing() -> None:
    """Pass-through (no head selection) keeps the id order with or without a snapshot."""
    plain = _spread(["b", "a"], loads=_in_flight(a=3), resident={"b"}, head=False)
    assert plain == Ordering(("a", "b"), reserve=False, affinity=False)


def test_resident_ids_outside_the_eligible_set_are_ignored() -> None:
    """A resident id that is not a candidate never appears and changes nothing."""
    assert _spread(["a", "b"], resident={"z"}) == Ordering(("a", "b"), True, False)


def test_ledger_without_a_snapshot_spreads_six_requests_three_and_three() -> None:
    """The real ledger with no snapshot in force: six overlapping requests (each reserving its head)
    alternate over two equal nodes, 3/3; a resident node takes the first."""
    for resident, first in [((), "a"), (("b",), "b")]:
        ledger = ReservationLedger()
        assert ledger.in_force is None
        heads = []
        for _ in range(6):
            ordering = order_candidates(
                ["a", "b"],
                pin=None,
                snapshot=ledger.in_force,
                ledger_view=ledger,
                affinity_hint=None,
                head_selection=True,
                cooling=(),
                resident=resident,
            )
            heads.append(ordering.nodes[0])
            ledger.reserve(ordering.nodes[0])
        assert heads[0] == first
        assert (heads.count("a"), heads.count("b")) == (3, 3)


def test_ledger_snapshot_is_in_force_once_applied() -> None:
    """``in_force`` is None until a snapshot is applied, even an empty one; then it is that
    snapshot, and head selection balances only over its list."""
    ledger = ReservationLedger()
    assert ledger.in_force is None
    ledger.apply(1, [], [])
    assert ledger.in_force is ledger.snapshot
    ordering = order_candidates(
        ["a", "b"],
        pin=None,
        snapshot=ledger.in_force,
        ledger_view=ledger,
        affinity_hint=None,
        head_selection=True,
        cooling=(),
        resident={"b"},
    )
    assert ordering == Ordering(("a", "b"), reserve=False, affinity=False)


NODES3 = ("a", "b", "c")


@pytest.mark.parametrize("scheduled", [False, True])
def test_head_tie_breaks_exhaustively(scheduled: bool) -> None:
    """Every combination of in-flight counts (0-2), residency and cooling over three nodes: the head
    is the least loaded ready node (every node when all cool), then resident, then id (or list
    position, with a snapshot listing them in reverse); the rest keep base order, ready first."""
    priority = ["c", "b", "a"] if scheduled else None
    base = ["c", "b", "a"] if scheduled else ["a", "b", "c"]
    subsets = [frozenset(s) for r in range(4) for s in itertools.combinations(NODES3, r)]
    checked = 0
    for counts in itertools.product(range(3), repeat=3):
        loads = _in_flight(**dict(zip(NODES3, counts, strict=True)))
        for resident in subsets:
            for cooling in subsets:
                ordering = _spread(
                    list(NODES3),
                    loads=loads,
                    resident=resident,
                    cooling=cooling,
                    priority=priority,
                )
                pool = [n for n in base if n not in cooling] or base
                head = min(pool, key=lambda n: (loads[n][2], n not in resident, base.index(n)))
                rest = [n for n in base if n != head]
                expected = [head, *rest]
                ready = [n for n in expected if n not in cooling]
                if ready:
                    expected = ready + [n for n in expected if n in cooling]
                assert ordering == Ordering(tuple(expected), reserve=True, affinity=False), (
                    counts,
                    sorted(resident),
                    sorted(cooling),
                )
                checked += 1
    assert checked == 27 * 8 * 8


@given(
    eligible=st.lists(IDS, max_size=6),
    pin=st.one_of(st.none(), st.just(""), IDS),
    reserved=st.lists(IDS, max_size=8),
    hint=st.one_of(st.none(), IDS),
    head=st.booleans(),
    cooling=st.frozensets(IDS),
    resident=st.frozensets(IDS),
)
def test_unscheduled_order_properties(
    eligible: list[str],
    pin: str | None,
    reserved: list[str],
    hint: str | None,
    head: bool,
    cooling: frozenset[str],
    resident: frozenset[str],
) -> None:
    """With no snapshot: a permutation, ready before cooling, and an automatic head (no pin, no
    affinity) is never more loaded than a ready node it was preferred to."""
    ledger = ReservationLedger()
    for node in reserved:
        ledger.reserve(node)
    result = order_candidates(
        eligible,
        pin=pin,
        snapshot=None,
        ledger_view=ledger,
        affinity_hint=hint,
        head_selection=head,
        cooling=cooling,
        resident=resident,
    )
    assert sorted(result.nodes) == sorted(set(eligible))
    flags = [n in cooling for n in result.nodes]
    if not all(flags):
        assert flags == sorted(flags)
    automatic = head and result.reserve and not result.affinity
    if automatic and result.nodes[0] not in cooling:
        chosen = result.nodes[0]
        for other in result.nodes[1:]:
            if other not in cooling:
                assert ledger.reservations(chosen) <= ledger.reservations(other)
                if ledger.reservations(chosen) == ledger.reservations(other):
                    assert (chosen not in resident, chosen) < (other not in resident, other)
    if pin and pin in eligible:
        assert not result.reserve
    elif head and eligible:
        assert result.reserve


# The fastest answer (docs/behaviour.md §15.2)


def _predicted(
    eligible: Sequence[str],
    predicted: Mapping[str, float],
    *,
    pin: str | None = None,
    hint: str | None = None,
    cooling: Collection[str] = (),
    priority: Sequence[str] | None = None,
) -> Ordering:
    snapshot = (
        None
        if priority is None
        else PrioritySnapshot(generation=1, nodes=tuple(priority), ranks={})
    )
    return order_candidates(
        eligible,
        pin=pin,
        snapshot=snapshot,
        ledger_view=Loads({}),
        affinity_hint=hint,
        head_selection=True,
        cooling=cooling,
        predicted=predicted,
    )


def test_the_least_predicted_time_goes_first_then_the_rest_by_prediction() -> None:
    """The slow node's id sorting first no longer decides (PAIR #7: 10.3 against 57.7 tok/s)."""
    ordering = _predicted(["a-slow", "b-fast", "c"], {"a-slow": 3.9, "b-fast": 0.7, "c": 2.0})
    assert ordering == Ordering(("b-fast", "c", "a-slow"), reserve=True)


def test_equal_predictions_keep_the_base_order() -> None:
    assert _predicted(["b", "a"], {"a": 1.0, "b": 1.0}).nodes == ("a", "b")


def test_a_pin_keeps_its_precedence_over_the_prediction() -> None:
    ordering = _predicted(["a", "b", "c"], {"a": 1.0, "b": 9.0, "c": 2.0}, pin="b")
    assert ordering == Ordering(("b", "a", "c"), reserve=False)


def test_a_cooling_node_never_heads_however_fast() -> None:
    ordering = _predicted(["a", "b"], {"a": 0.1, "b": 9.0}, cooling={"a"})
    assert ordering.nodes == ("b", "a")


def test_the_warm_node_heads_only_when_its_prediction_is_the_least() -> None:
    """Affinity is part of the prediction: warm and fastest → promoted; warm but slower → not."""
    assert _predicted(["a", "b"], {"a": 2.0, "b": 1.0}, hint="b").affinity
    slower = _predicted(["a", "b"], {"a": 1.0, "b": 2.0}, hint="b")
    assert (slower.nodes, slower.affinity) == (("a", "b"), False)


def test_with_a_snapshot_its_listed_nodes_go_before_the_rest() -> None:
    ordering = _predicted(["a", "b", "c"], {"a": 5.0, "b": 3.0, "c": 0.1}, priority=["a", "b"])
    assert ordering.nodes == ("b", "a", "c")


def test_without_head_selection_the_prediction_is_not_used() -> None:
    ordering = order_candidates(
        ["b", "a"],
        pin=None,
        snapshot=None,
        ledger_view=Loads({}),
        affinity_hint=None,
        head_selection=False,
        cooling=(),
        predicted={"a": 9.0, "b": 1.0},
    )
    assert ordering.nodes == ("a", "b")
