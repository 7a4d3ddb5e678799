# -*- test-case-name: tests.app.test_demo -*-
"""``--demo``: two simulated nodes in-process, one healthy and one that stalls on every other request."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from twisted.application import service

from nvpair_tw.core import IProxyReactor
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import ListenerService
from nvpair_tw.simulated import Behaviour, SimulatedEngine, alternate, always

__all__ = ["DEMO_MODELS", "DEMO_PORTS", "demo_nodes"]

DEMO_MODELS = ("llama3:latest", "qwen2.5:7b")
DEMO_PORTS = {"healthy": 11501, "flaky": 11502}


class _DemoNodes(service.MultiService):
    def __init__(self, engines: Sequence[SimulatedEngine]) -> None:
        super().__init__()
        self._engines = engines

    def stopService(self) -> Any:
        for engine in self._engines:
            engine.stop()
        return super().stopService()


def demo_nodes(
    reactor: IProxyReactor, engines: Sequence[str], nodes: MutableMapping[str, list[Node]]
) -> service.IService:
    """Add ``demo-flaky`` (stalls every other request) and ``demo-healthy`` to every facade."""
    healthy = SimulatedEngine(
        reactor, DEMO_MODELS, always(Behaviour.HEALTHY), chunks=20, chunk_delay=0.1
    )
    flaky = SimulatedEngine(
        reactor,
        DEMO_MODELS,
        alternate(Behaviour.FROZEN, Behaviour.HEALTHY),
        chunks=20,
        chunk_delay=0.1,
    )
    services = _DemoNodes([healthy, flaky])
    for name, engine in (("healthy", healthy), ("flaky", flaky)):
        port = DEMO_PORTS[name]
        ListenerService(
            reactor, f"tcp:{port}:interface=127.0.0.1", engine.site(), f"demo node {name}"
        ).setServiceParent(services)
        for facade in engines:
            nodes.setdefault(facade, []).append(
                Node(id=f"demo-{name}", url=f"http://127.0.0.1:{port}", source="flag")
            )
    return services
