# -*- test-case-name: tests.app.test_demo -*-
"""``--demo``: two simulated Ollama machines in-process, on loopback: a fast one that hangs once,
for a stretch, and a slow one that never fails (docs/operations.md, "Demo").

Both are real kinds (``kind="ollama"``, :mod:`nvpair_tw.simulated`): the official clients work
against the facade unchanged, and each states its token counts and durations at its own pace,
so the status page shows tokens per second, time to first token and measured rates.

The story they tell: ``demo-fast`` (about 50 tokens/s) hangs on the first request it is asked to
run and stays stuck for :data:`STUCK_FOR` seconds, answering nothing, not even its model list;
that first request waits one response-header deadline (5 s in the demo) and ``demo-slow`` (about
12 tokens/s) answers it. ``demo-fast`` cools; the question the proxy asks it at the end of its
first cooldown goes unanswered (it is stuck), so the cooldown is renewed, and the next one is
answered: ``demo-fast`` serves again, is measured, and from then on is preferred as the fastest.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from attrs import frozen
from twisted.application import service

from nvpair_tw.core import IProxyReactor
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import ListenerService
from nvpair_tw.simulated import Behaviour, Pace, Policy, SimulatedEngine, always, once

__all__ = ["DEMO_MODELS", "DEMO_NODES", "DEMO_PORTS", "STUCK_FOR", "DemoNode", "demo_nodes"]

DEMO_MODELS = ("llama3:latest", "qwen2.5:7b")

STUCK_FOR = 12.0
"""Seconds ``demo-fast`` stays stuck from the first request it is asked to run: longer than one
cooldown (5 s) plus its question (5 s), so the first question is not answered and the cooldown is
renewed; shorter than two, so the second one is (about 20 s after that request)."""


@frozen
class DemoNode:
    """One simulated machine of the demo: its id, port, speed and what it does with requests."""

    id: str
    port: int
    pace: Pace
    policy: Policy


DEMO_NODES = (
    DemoNode("demo-fast", 11501, Pace(decode=50.0, prefill=800.0), once(Behaviour.STUCK)),
    DemoNode("demo-slow", 11502, Pace(decode=12.0, prefill=150.0), always(Behaviour.HEALTHY)),
)
"""The demo's machines, in the order they join each facade."""

DEMO_PORTS = {node.id: node.port for node in DEMO_NODES}


class _DemoNodes(service.MultiService):
    def __init__(self, engines: Sequence[SimulatedEngine]) -> None:
        super().__init__()
        self._engines = engines

    def stopService(self) -> Any:
        for engine in self._engines:
            engine.stop()
        return super().stopService()


def demo_engine(reactor: IProxyReactor, node: DemoNode) -> SimulatedEngine:
    """The simulated Ollama that plays ``node``, both demo models loaded."""
    return SimulatedEngine(
        reactor,
        DEMO_MODELS,
        node.policy,
        loaded=DEMO_MODELS,
        kind="ollama",
        pace=node.pace,
        stuck_for=STUCK_FOR,
    )


def demo_nodes(
    reactor: IProxyReactor, engines: Sequence[str], nodes: MutableMapping[str, list[Node]]
) -> service.IService:
    """Add :data:`DEMO_NODES` to every facade, each listening on 127.0.0.1 at its port."""
    simulated = {node.id: demo_engine(reactor, node) for node in DEMO_NODES}
    services = _DemoNodes(list(simulated.values()))
    for node in DEMO_NODES:
        ListenerService(
            reactor,
            f"tcp:{node.port}:interface=127.0.0.1",
            simulated[node.id].site(),
            f"demo node {node.id}",
        ).setServiceParent(services)
        for facade in engines:
            nodes.setdefault(facade, []).append(
                Node(id=node.id, url=f"http://127.0.0.1:{node.port}", source="flag")
            )
    return services
