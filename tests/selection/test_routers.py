"""No model swap on a busy llama.cpp router (docs/behaviour.md §17.2)."""

from __future__ import annotations

from attrs import define, field

from nvpair_tw.core import ModelControl
from nvpair_tw.selection import spare_busy_routers, would_evict_busy_work
from nvpair_tw.selection._holdings import ROUTER_CONTROL


@define
class View:
    """Nodes as the rule sees them: what each has loaded, routers, ``models_max`` per node."""

    held: dict[str, frozenset[str] | None]
    routers: set[str] = field(factory=set)
    limits: dict[str, int | None] = field(factory=dict)

    def resident(self, node_id: str, model: str) -> bool | None:
        loaded = self.held.get(node_id)
        return None if loaded is None else model in loaded

    def loaded(self, node_id: str) -> frozenset[str] | None:
        return self.held.get(node_id)

    def control(self, node_id: str) -> ModelControl | None:
        return ROUTER_CONTROL if node_id in self.routers else None

    def models_max(self, node_id: str) -> int | None:
        return self.limits.get(node_id)


BUSY = {("r", "a"): 1, ("r", "b"): 2}


def _evicts(view: View, model: str) -> bool:
    return would_evict_busy_work(view, view, "r", model, _in_flight)


def _in_flight(node_id: str, name: str) -> int:
    return BUSY.get((node_id, name), 0)


def _full_router(limit: int | None = 2, loaded: frozenset[str] = frozenset({"a", "b"})) -> View:
    return View({"r": loaded, "o": frozenset()}, {"r"}, {"r": limit})


def test_a_full_router_whose_loaded_models_are_all_busy_is_spared_while_another_can_serve() -> None:
    book = _full_router()
    assert would_evict_busy_work(book, book, "r", "c", _in_flight)
    assert spare_busy_routers(["r", "o"], "c", book, book, _in_flight) == ["o"]


def test_it_still_goes_there_when_no_other_candidate_exists() -> None:
    assert spare_busy_routers(["r"], "c", (full := _full_router()), full, _in_flight) == ["r"]


def test_a_model_already_loaded_there_evicts_nothing() -> None:
    assert not _evicts(_full_router(), "a")


def test_a_router_with_room_or_an_idle_loaded_model_is_not_spared() -> None:
    assert not _evicts(_full_router(limit=3), "c")
    assert not _evicts(_full_router(limit=0), "c")
    idle = _full_router(loaded=frozenset({"a", "z"}))
    assert not would_evict_busy_work(idle, idle, "r", "c", _in_flight)


def test_unknown_models_max_residency_or_a_non_router_is_not_spared() -> None:
    assert not _evicts(_full_router(limit=None), "c")
    unknown = View({"r": None}, {"r"}, {"r": 2})
    assert not would_evict_busy_work(unknown, unknown, "r", "c", _in_flight)
    plain = View({"r": frozenset({"a", "b"})}, set(), {"r": 2})
    assert not would_evict_busy_work(plain, plain, "r", "c", _in_flight)
