"""No model swap on a busy llama.cpp router (docs/behaviour.md §17.2)."""

from __future__ import annotations

from attrs import define, field

from nvpair_tw.core import ModelControl
from nvpair_tw.selection import spare_busy_routers, would_evict_busy_work
from nvpair_tw.selection._holdings import ROUTER_CONTROL


@define
class View:
    """Nodes as the rule sees them: what each last said it has loaded (None: unknown), routers,
    ``models_max`` per node, and the models with requests in flight on each."""

    held: dict[str, frozenset[str] | None]
    routers: set[str] = field(factory=set)
    limits: dict[str, int | None] = field(factory=dict)
    busy: dict[str, frozenset[str]] = field(factory=dict)

    def loaded(self, node_id: str) -> frozenset[str] | None:
        return self.held.get(node_id)

    def control(self, node_id: str) -> ModelControl | None:
        return ROUTER_CONTROL if node_id in self.routers else None

    def models_max(self, node_id: str) -> int | None:
        return self.limits.get(node_id)

    def running(self, node_id: str) -> frozenset[str]:
        return self.busy.get(node_id, frozenset())


def _router(
    limit: int | None = 2,
    loaded: frozenset[str] | None = frozenset({"a", "b"}),
    busy: frozenset[str] = frozenset({"a", "b"}),
) -> View:
    """Router ``r`` (and a plain node ``o``): ``loaded`` at its last poll, ``busy`` in flight."""
    return View({"r": loaded, "o": frozenset()}, {"r"}, {"r": limit}, {"r": busy})


def _evicts(view: View, name: str) -> bool:
    return would_evict_busy_work(view, view, "r", name, view.running)


def _spared(view: View, name: str, candidates: list[str]) -> list[str]:
    return spare_busy_routers(candidates, lambda _node: name, view, view, view.running)


def test_a_full_router_whose_loaded_models_are_all_busy_is_spared_while_another_can_serve() -> None:
    assert _evicts(_router(), "c")
    assert _spared(_router(), "c", ["r", "o"]) == ["o"]


def test_it_still_goes_there_when_no_other_candidate_exists() -> None:
    assert _spared(_router(), "c", ["r"]) == ["r"]


def test_one_busy_model_is_enough_the_router_evicts_by_its_own_last_use() -> None:
    """llama.cpp evicts the model it last used longest ago (its ``last_used``, set by every
    client's request): a running stream's model goes before an idle one used since. The proxy
    does not see that order, so any busy model spares the router."""
    assert _evicts(_router(loaded=frozenset({"a", "z"}), busy=frozenset({"a"})), "c")


def test_a_model_it_loaded_for_a_request_in_flight_counts_as_loaded_whatever_the_poll_said() -> (
    None
):
    """The last poll said nothing loaded (or ``c`` loaded), but the router loaded ``a`` for the
    request still running there: with ``models_max`` 1, serving ``c`` evicts ``a``."""
    assert _evicts(_router(limit=1, loaded=frozenset(), busy=frozenset({"a"})), "c")
    assert _evicts(_router(limit=1, loaded=frozenset({"c"}), busy=frozenset({"a"})), "c")
    assert _evicts(_router(limit=1, loaded=None, busy=frozenset({"a"})), "c")


def test_a_model_loaded_or_in_flight_there_or_a_router_with_room_evicts_nothing() -> None:
    assert not _evicts(_router(), "a")
    assert not _evicts(_router(limit=1, loaded=frozenset(), busy=frozenset({"a"})), "a")
    assert not _evicts(_router(loaded=frozenset({"a", "c"}), busy=frozenset({"a"})), "c")
    assert not _evicts(_router(limit=3), "c")
    assert not _evicts(_router(limit=2, loaded=None, busy=frozenset({"a"})), "c")


def test_an_idle_router_an_unknown_or_no_models_max_or_a_non_router_is_not_spared() -> None:
    assert not _evicts(_router(busy=frozenset()), "c")
    assert not _evicts(_router(limit=None), "c")
    assert not _evicts(_router(limit=0), "c")
    plain = View({"r": frozenset({"a", "b"})}, set(), {"r": 2}, {"r": frozenset({"a", "b"})})
    assert not _evicts(plain, "c")
