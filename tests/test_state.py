"""Per-facade state (nvpair_tw.state): who may serve a model, and in what order."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock

from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]


def three(memory_cluster: Make) -> MemoryCluster:
    clock = Clock()
    return memory_cluster(
        clock,
        {
            "c": SimulatedEngine(clock, models=("llama3:latest",)),
            "a": SimulatedEngine(clock, models=("qwen:7b",)),
            "b": SimulatedEngine(clock, models=("llama3:latest", "qwen:7b")),
        },
    )


def ids(nodes: list) -> list[str]:  # type: ignore[type-arg]
    return [n.id for n in nodes]


def test_eligible_is_the_owners_of_the_model_under_the_engine_rule(memory_cluster: Make) -> None:
    """Owners only (``llama3`` matches ``llama3:latest``); no model means every node."""
    facade = three(memory_cluster).facade()
    assert sorted(ids(facade.eligible("llama3"))) == ["b", "c"]
    assert sorted(ids(facade.eligible("qwen:7b"))) == ["a", "b"]
    assert facade.eligible("mistral") == []
    assert sorted(ids(facade.eligible(None))) == ["a", "b", "c"]


def test_order_is_by_id_with_the_pin_first_and_cooling_nodes_last(memory_cluster: Make) -> None:
    """Base order is by id; a pin goes first; a cooling node goes behind its ready peers."""
    facade = three(memory_cluster).facade()
    everyone = facade.eligible(None)
    assert ids(facade.order(everyone, head_selection=False)[0]) == ["a", "b", "c"]
    facade.pin = "c"
    assert ids(facade.order(everyone, head_selection=False)[0]) == ["c", "a", "b"]
    facade.stalls.cool("c", "test")
    assert ids(facade.order(everyone, head_selection=False)[0]) == ["a", "b", "c"]


def test_order_promotes_a_warm_node_and_says_so(memory_cluster: Make) -> None:
    """An affinity hint that passes the gate goes first, and the second value says it was promoted."""
    facade = three(memory_cluster).facade()
    owners = facade.eligible("llama3")
    nodes, promoted = facade.order(owners, head_selection=True, affinity_hint="c")
    assert (ids(nodes)[0], promoted) == ("c", True)
    nodes, promoted = facade.order(owners, head_selection=True, affinity_hint=None)
    assert promoted is False
