"""Tests for nvpair_tw.selection._caches: which conversations each node's prompt cache can still
hold, its capacity and how the engine's cached counts correct it (docs/behaviour.md §5.3.1)."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from nvpair_tw.selection import CacheBook, Capacity, CapacitySource, Place
from nvpair_tw.selection._caches import TRACKED

pytestmark = pytest.mark.timeout(10)

MODEL = "qwen3-coder:30b"


def book(
    clock: Clock | None = None,
    configured: dict[str, int] | None = None,
    stated: dict[str, int] | None = None,
) -> CacheBook:
    file, engine = configured or {}, stated or {}
    return CacheBook(clock or Clock(), file.get, engine.get, active_within=300.0)


def served(caches: CacheBook, *roots: bytes, node: str = "a", tokens: int = 5000) -> None:
    for root in roots:
        caches.note(node, MODEL, root, tokens)


def missed(caches: CacheBook, root: bytes = b"A") -> Place:
    """``root``'s place on node a, judged a miss: nothing of a 6,000-token prompt was cached."""
    place = caches.place("a", MODEL, root)
    assert place is not None
    caches.judge("a", MODEL, place, cached=0, prompt=6000)
    return place


def test_a_conversation_pushed_out_of_a_nodes_cache_can_no_longer_be_there() -> None:
    caches = book(configured={"a": 2})
    served(caches, b"A", b"B")
    assert caches.place("a", MODEL, b"A") == Place(2, 5000, resident=True)
    served(caches, b"C")
    assert caches.place("a", MODEL, b"A") == Place(3, 5000, resident=False)
    assert caches.place("a", MODEL, b"C") == Place(1, 5000, resident=True)


def test_a_turn_brings_its_conversation_back_to_the_front() -> None:
    caches = book(configured={"a": 2})
    served(caches, b"A", b"B", b"A", b"C")
    assert caches.place("a", MODEL, b"A") == Place(2, 5000, resident=True)
    assert caches.place("a", MODEL, b"B") == Place(3, 5000, resident=False)


def test_the_cache_is_per_node_and_model_and_unknown_conversations_have_no_place() -> None:
    caches = book(configured={"a": 1, "b": 1})
    served(caches, b"A", node="a")
    served(caches, b"B", node="b")
    caches.note("a", "other:7b", b"C", 10)
    assert caches.place("a", MODEL, b"A") == Place(1, 5000, resident=True)
    assert caches.place("b", MODEL, b"A") is None
    assert caches.place("a", MODEL, b"Z") is None


def test_without_a_figure_or_a_report_the_capacity_is_unbounded() -> None:
    caches = book()
    served(caches, *(bytes([i]) for i in range(40)))
    assert caches.capacity("a", MODEL) == Capacity(None)
    assert caches.place("a", MODEL, bytes([0])) == Place(40, 5000, resident=True)


def test_a_contradicted_warm_prediction_shrinks_the_capacity_to_the_position_before() -> None:
    caches = book()
    served(caches, b"A", b"B", b"C", b"D")
    place = caches.place("a", MODEL, b"A")
    assert place is not None and place.resident
    caches.judge("a", MODEL, place, cached=2000, prompt=9000)  # the system prompt only
    assert caches.capacity("a", MODEL) == Capacity(3, 0, CapacitySource.LEARNT)
    assert caches.place("a", MODEL, b"A") == Place(4, 5000, resident=False)
    assert caches.place("a", MODEL, b"B") == Place(3, 5000, resident=True)


def test_a_hit_beyond_the_capacity_grows_it_and_one_within_it_changes_nothing() -> None:
    caches = book(configured={"a": 2})
    served(caches, b"A", b"B", b"C")
    inside = caches.place("a", MODEL, b"B")
    assert inside is not None
    caches.judge("a", MODEL, inside, cached=4900, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(2, 0, CapacitySource.FILE)
    beyond = caches.place("a", MODEL, b"A")
    assert beyond is not None and not beyond.resident
    caches.judge("a", MODEL, beyond, cached=4900, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(3, 0, CapacitySource.LEARNT)
    assert caches.capacity("a", "other:7b") == Capacity(2, 0, CapacitySource.FILE)


def test_a_miss_beyond_the_capacity_is_what_was_predicted() -> None:
    caches = book(configured={"a": 1})
    served(caches, b"A", b"B")
    beyond = caches.place("a", MODEL, b"A")
    assert beyond is not None
    caches.judge("a", MODEL, beyond, cached=0, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(1, 0, CapacitySource.FILE)


def test_the_stated_slots_are_a_floor_under_an_unbounded_belief() -> None:
    """llama.cpp states its slots; a host-memory cache may hold more, so the capacity starts
    unbounded, and a miss leaves at least the slots."""
    caches = book(stated={"a": 2})
    assert caches.capacity("a", MODEL) == Capacity(None, 2, CapacitySource.ENGINE)
    served(caches, b"A", b"B", b"C")
    newest = caches.place("a", MODEL, b"C")
    assert newest is not None
    caches.judge("a", MODEL, newest, cached=10, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(2, 2, CapacitySource.LEARNT)
    oldest = caches.place("a", MODEL, b"A")
    assert oldest == Place(3, 5000, resident=False)


def test_a_changed_figure_in_the_nodes_file_starts_again_from_it() -> None:
    configured = {"a": 4}
    caches = book(configured=configured)
    served(caches, b"A", b"B", b"C")
    missed(caches)
    assert caches.capacity("a", MODEL).conversations == 2
    configured["a"] = 8
    assert caches.capacity("a", MODEL) == Capacity(8, 0, CapacitySource.FILE)


def test_a_turn_whose_last_tokens_are_unknown_is_not_judged() -> None:
    caches = book()
    caches.note("a", MODEL, b"A", None)
    place = caches.place("a", MODEL, b"A")
    assert place == Place(1, None, resident=True)
    caches.judge("a", MODEL, place, cached=0, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(None)


def test_a_hit_is_three_quarters_of_what_the_last_turn_left() -> None:
    caches = book(configured={"a": 0})
    served(caches, b"A", tokens=4000)
    place = caches.place("a", MODEL, b"A")
    assert place is not None
    caches.judge("a", MODEL, place, cached=2999, prompt=5000)
    assert caches.capacity("a", MODEL).conversations == 0
    caches.judge("a", MODEL, place, cached=3000, prompt=5000)
    assert caches.capacity("a", MODEL).conversations == 1


def test_a_new_conversation_would_push_out_the_active_one_at_the_edge() -> None:
    clock = Clock()
    caches = book(clock, configured={"a": 2})
    assert caches.pushed_out("a", MODEL) is None  # nothing there
    caches.note("a", MODEL, b"A", 7000)
    assert caches.pushed_out("a", MODEL) is None  # room left
    clock.advance(10)
    caches.note("a", MODEL, b"B", 3000)
    assert caches.pushed_out("a", MODEL) == 7000
    clock.advance(289)
    assert caches.pushed_out("a", MODEL) == 7000
    clock.advance(1)  # A idle for the affinity idle time: not active
    assert caches.pushed_out("a", MODEL) is None


def test_nothing_is_pushed_out_of_an_unbounded_or_empty_cache() -> None:
    caches = book(configured={"b": 0})
    served(caches, b"A", b"B", b"C")
    assert caches.pushed_out("a", MODEL) is None
    served(caches, b"A", node="b")
    assert caches.pushed_out("b", MODEL) is None


def test_an_active_conversation_of_unknown_size_is_pushed_out_at_no_stated_cost() -> None:
    caches = book(configured={"a": 1})
    caches.note("a", MODEL, b"A", None)
    assert caches.pushed_out("a", MODEL) == 0


def test_the_book_remembers_a_bounded_number_of_conversations() -> None:
    caches = book()
    served(caches, *(i.to_bytes(2, "big") for i in range(TRACKED + 5)))
    assert caches.place("a", MODEL, (0).to_bytes(2, "big")) is None
    assert caches.place("a", MODEL, (5).to_bytes(2, "big")) == Place(TRACKED, 5000, True)
    assert caches.to_json("a") == {
        MODEL: {"conversations": None, "source": "unknown", "recent": TRACKED}
    }
    assert caches.to_json("b") == {}


def test_more_stated_slots_raise_a_learnt_capacity_below_them() -> None:
    stated = {"a": 2}
    caches = book(stated=stated)
    served(caches, b"A", b"B", b"C")
    missed(caches)
    assert caches.capacity("a", MODEL) == Capacity(2, 2, CapacitySource.LEARNT)
    stated["a"] = 4  # the engine restarted with more slots
    assert caches.capacity("a", MODEL) == Capacity(4, 4, CapacitySource.LEARNT)


# --- the edges the mutation run of 2026-12-06 found unasserted -------------------------------------


def test_a_shared_book_seals_each_root_and_tells_its_listener_of_each_note() -> None:
    """§6.6: the fleet's listener hears (node, model, sealed root, tokens) of every note, and a
    local lookup meets the sealed root."""
    caches = book()
    heard: list[tuple[str, str, bytes, int | None]] = []
    caches.shared(lambda root: b"sealed:" + root, lambda *said: heard.append(said))
    caches.note("a", MODEL, b"A", 700)
    caches.note("b", "other:7b", b"B", None)
    assert heard == [("a", MODEL, b"sealed:A", 700), ("b", "other:7b", b"sealed:B", None)]
    assert caches.place("a", MODEL, b"A") == Place(1, 700, resident=True)
    caches.fold("a", MODEL, b"sealed:C", 5)  # a peer's note: nobody is told
    assert len(heard) == 2 and caches.place("a", MODEL, b"C") == Place(1, 5, resident=True)


def test_a_capacity_learnt_under_a_figure_in_the_file_has_no_floor_of_stated_slots() -> None:
    caches = book(configured={"a": 2}, stated={"a": 4})
    served(caches, b"A", b"B")
    place = caches.place("a", MODEL, b"A")
    assert place == Place(2, 5000, resident=True)
    caches.judge("a", MODEL, place, cached=0, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(1, 0, CapacitySource.LEARNT)
    assert caches.place("a", MODEL, b"A") == Place(2, 5000, resident=False)


def test_a_miss_at_the_front_learns_a_cache_that_holds_nothing() -> None:
    caches = book()
    served(caches, b"A")
    place = caches.place("a", MODEL, b"A")
    assert place == Place(1, 5000, resident=True)
    caches.judge("a", MODEL, place, cached=0, prompt=6000)
    assert caches.capacity("a", MODEL) == Capacity(0, 0, CapacitySource.LEARNT)
    assert caches.place("a", MODEL, b"A") == Place(1, 5000, resident=False)
    assert caches.pushed_out("a", MODEL) is None  # nothing can be pushed out of nothing


def test_a_miss_at_the_edge_of_the_capacity_shrinks_it() -> None:
    caches = book(configured={"a": 2})
    served(caches, b"A", b"B")
    place = caches.place("a", MODEL, b"A")
    assert place is not None and place.position == 2
    caches.judge("a", MODEL, place, cached=0, prompt=6000)
    assert caches.capacity("a", MODEL).conversations == 1


def test_a_learnt_capacity_is_the_models_own() -> None:
    caches = book(configured={"a": 3})
    served(caches, b"A", b"B", b"C")
    caches.note("a", "other:7b", b"X", 100)
    missed(caches)
    assert caches.capacity("a", MODEL).conversations == 2
    assert caches.capacity("a", "other:7b").conversations == 3
    assert caches.pushed_out("a", MODEL) == 5000  # two held, the edge at two
    assert caches.pushed_out("a", "other:7b") is None  # one held of three
    assert caches.to_json("a") == {
        MODEL: {"conversations": 2, "source": "learnt", "recent": 3},
        "other:7b": {"conversations": 3, "source": "file", "recent": 1},
    }


def test_an_active_conversation_is_measured_from_its_last_turn_not_from_the_clocks_start() -> None:
    clock = Clock()
    clock.advance(10_000)
    caches = book(clock, configured={"a": 1})
    caches.note("a", MODEL, b"A", 7000)
    assert caches.pushed_out("a", MODEL) == 7000


def test_a_capacity_learnt_to_nothing_under_a_file_figure_holds_nothing() -> None:
    caches = book(configured={"a": 1})
    served(caches, b"A")
    missed(caches)
    assert caches.place("a", MODEL, b"A") == Place(1, 5000, resident=False)


def test_more_stated_slots_keep_more_conversations_warm() -> None:
    stated = {"a": 2}
    caches = book(stated=stated)
    served(caches, b"A", b"B", b"C")
    missed(caches)
    stated["a"] = 4
    assert caches.place("a", MODEL, b"A") == Place(3, 5000, resident=True)


def test_the_conversation_at_the_edge_of_a_learnt_capacity_is_the_one_pushed_out() -> None:
    caches = book(configured={"a": 3})
    for root, tokens in ((b"A", 100), (b"B", 200), (b"C", 300)):
        caches.note("a", MODEL, root, tokens)
    missed(caches)  # learnt: 2
    assert caches.pushed_out("a", MODEL) == 200


def test_a_learnt_capacity_grows_again_on_a_hit_beyond_it() -> None:
    caches = book(configured={"a": 3})
    served(caches, b"A", b"B", b"C")
    place = missed(caches)
    assert caches.capacity("a", MODEL).conversations == 2
    caches.judge("a", MODEL, place, cached=5000, prompt=6000)
    assert caches.capacity("a", MODEL).conversations == 3
