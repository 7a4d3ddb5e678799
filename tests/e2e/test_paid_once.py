"""A frozen node is paid for once until it answers (docs/behaviour.md §6.3): real facades over
simulated engines in memory, every timer on one ``task.Clock``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.core import Settings
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

pytestmark = pytest.mark.e2e

DEADLINE = 5.0
CHAT = {"model": "llama3", "messages": [], "stream": True}


def _frozen_and_healthy(
    memory_cluster: Callable[..., MemoryCluster], **settings: Any
) -> tuple[MemoryCluster, SimulatedEngine]:
    clock = Clock()
    frozen = SimulatedEngine(clock, frozen=True)
    cluster = memory_cluster(
        clock,
        {"a": frozen, "b": SimulatedEngine(clock)},
        settings=Settings(response_header_timeout=DEADLINE, **settings),
    )
    cluster.facade().pin = "a"  # a first whenever it is ready, so every ready moment costs a wait
    return cluster, frozen


def _chat(cluster: MemoryCluster) -> tuple[str | None, float]:
    """One streamed chat: the node that answered and how long the headers took."""
    started = cluster.clock.seconds()
    pending = cluster.request("POST", "/api/chat", json=CHAT)
    cluster.advance(DEADLINE + 1)
    answered = cluster.result(pending)
    return answered.header("x-nvpair-node"), answered.headers_at - started


def test_a_node_frozen_for_several_periods_costs_one_request_one_deadline(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """Frozen for five cooldown periods, one chat per period: only the first waits the deadline;
    each expiry's probe gets no answer and renews the cooldown (``renewed: true``)."""
    cluster, _frozen = _frozen_and_healthy(memory_cluster)
    waits = []
    for _ in range(5):
        node, wait = _chat(cluster)
        assert node == "b"
        waits.append(wait)
        cluster.advance(DEADLINE)  # the cooldown expires; its probe waits min(deadline, 10 s)
    assert waits[0] == pytest.approx(DEADLINE)
    assert waits[1:] == [pytest.approx(0.0)] * 4
    cooldowns = cluster.named("node/cooldown")
    assert [c.get("renewed", False) for c in cooldowns][:3] == [False, True, True]
    assert all(c["node_id"] == "a" for c in cooldowns)
    assert cluster.named("node/cooldown-ended") == []


def test_once_it_answers_the_probe_ends_the_cooldown(
    memory_cluster: Callable[..., MemoryCluster],
) -> None:
    """Thawed, the node answers the next probe: the cooldown ends (``expired``) and the pin takes
    it again."""
    cluster, frozen = _frozen_and_healthy(memory_cluster)
    node, wait = _chat(cluster)
    assert (node, wait) == ("b", DEADLINE)
    frozen.frozen = False
    [cooling] = cluster.named("node/cooldown")
    cluster.advance(cooling["coolingUntil"] / 1000 - cluster.clock.seconds())
    [ended] = cluster.named("node/cooldown-ended")
    assert (ended["node_id"], ended["why"]) == ("a", "expired")
    node, wait = _chat(cluster)
    assert (node, wait) == ("a", 0.0)
