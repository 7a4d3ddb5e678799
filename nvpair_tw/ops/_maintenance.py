# -*- test-case-name: tests.ops.test_maintenance -*-
"""Cluster operations on the control channel (docs/behaviour.md §13): cordon, uncordon, drain,
load and unload.

``node/cordon`` takes a node out of service for new work, ``node/uncordon`` puts it back, and
``node/drain`` cordons it and answers once nothing is in flight there (or at its timeout). In
flight means what a graceful shutdown waits for: the facade's inference workloads dispatched to
the node and its open WebSocket tunnels. The drain's wait runs on the facade's clock and looks
again at each event on the bus (no polling); it stops when the control client leaves.

``model/load`` and ``model/unload`` ask the given nodes (by default every node serving the model)
at once, each through its engine's own API (:class:`~nvpair_tw.core.ModelControl`), and answer
per node; residency is then read again at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, gatherResults

from nvpair_tw.core import ModelChange, parse_duration
from nvpair_tw.corridor import FacadeState, WorkloadState, ask_node
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.ops._idle import until_idle
from nvpair_tw.ops._rpc import INVALID_PARAMS, Params, Result, RpcError, array, short, string, text
from nvpair_tw.upstream import ReadError

__all__ = [
    "DRAIN_TIMEOUT",
    "LOAD_TIMEOUT",
    "MAINTENANCE",
    "in_flight",
    "load_model",
    "unload_model",
]

log = LevelledLogger(namespace=__name__)

DRAIN_TIMEOUT = 600.0
"""How long ``node/drain`` waits by default (10 minutes: a long generation finishes well within)."""

DEFAULT_REASON = "cordoned by the control channel"

LOAD_TIMEOUT = 600.0
"""How long ``model/load`` and ``model/unload`` wait for each node by default (a large model can
take minutes to load)."""


def _node(facade: FacadeState, params: Params) -> Node:
    node_id = text(params, "id")
    node = facade.directory.get(node_id)
    if node is None:
        raise RpcError(INVALID_PARAMS, f'node "{short(node_id)}" not found')
    return node


def _reason(params: Params, default: str) -> str:
    if "reason" not in params:
        return default
    return text(params, "reason")


def in_flight(facade: FacadeState, node_id: str) -> int:
    """The facade's inference workloads running on ``node_id`` plus its open tunnels there."""
    shared = facade.shared
    running = sum(
        1
        for w in shared.workloads.live()
        if w.engine == facade.engine
        and w.scheduled_on == node_id
        and w.state is WorkloadState.RUNNING
    )
    return running + shared.tunnels.count(facade.engine, node_id)


def cordon(facade: FacadeState, params: Params) -> Result:
    node = _node(facade, params)
    given = facade.cordons.cordon(node.id, _reason(params, DEFAULT_REASON))
    log.info("node {node} of {engine} cordoned", node=node.id, engine=facade.engine)
    return {"id": node.id, "cordon": given.to_json(), "inFlight": in_flight(facade, node.id)}


def uncordon(facade: FacadeState, params: Params) -> Result:
    node = _node(facade, params)
    if node.cordon:
        raise RpcError(
            INVALID_PARAMS,
            f'node "{short(node.id)}" is cordoned by the nodes file (cordon = true): lift it there',
        )
    lifted = facade.cordons.uncordon(node.id)
    log.info("node {node} of {engine} uncordoned", node=node.id, engine=facade.engine)
    return {"id": node.id, "uncordoned": lifted}


def _timeout(params: Params, default: float = DRAIN_TIMEOUT) -> float:
    value = params.get("timeout", default)
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as error:
            raise RpcError(INVALID_PARAMS, f"timeout: {error}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise RpcError(INVALID_PARAMS, 'timeout: seconds >= 0, or a duration such as "5m"')
    return float(value)


def drain(facade: FacadeState, params: Params) -> Deferred[Result]:
    """Cordon the node, then answer ``{drained: true, waited_ms}`` once nothing is in flight
    there, or ``{drained: false, inFlight}`` when ``timeout`` (seconds or a duration) runs out."""
    node = _node(facade, params)
    timeout = _timeout(params)
    if not node.cordon:
        facade.cordons.cordon(node.id, _reason(params, "draining"))
    clock = facade.shared.clock
    started = clock.seconds()

    def idle() -> bool:
        return in_flight(facade, node.id) == 0

    def answer(drained: bool) -> Result:
        log.info(
            "drain of {node} of {engine}: {outcome}",
            node=node.id,
            engine=facade.engine,
            outcome="drained" if drained else "timed out",
        )
        if drained:
            waited = clock.seconds() - started
            return {"id": node.id, "drained": True, "waited_ms": int(waited * 1000)}
        return {"id": node.id, "drained": False, "inFlight": in_flight(facade, node.id)}

    waiting = until_idle(clock, facade.shared.bus, idle, timeout, f"drain {node.id}")
    return waiting.addCallback(answer)


def _targets(facade: FacadeState, params: Params, model: str) -> list[Node]:
    """``nodes`` (ids, cordoned ones included: an operator named them), else the serving owners."""
    if "nodes" not in params:
        return facade.eligible(model)
    targets = []
    for i, entry in enumerate(array(params, "nodes")):
        node_id = string(entry, f"nodes[{i}]")
        node = facade.directory.get(node_id)
        if node is None:
            raise RpcError(INVALID_PARAMS, f'node "{short(node_id)}" not found')
        targets.append(node)
    return targets


def _keep_alive(params: Params) -> str | float | None:
    value = params.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RpcError(INVALID_PARAMS, 'keep_alive: seconds or a duration such as "10m"')
    return value


_DONE = {ModelChange.LOAD: "loaded", ModelChange.UNLOAD: "unloaded"}
"""The status a node's success reports for each change."""


async def _ask(
    facade: FacadeState,
    node: Node,
    asking: tuple[str, dict[str, Any]],
    change: ModelChange,
    timeout: float,
) -> tuple[str, dict[str, object]]:
    """One node's part: ``{"status": "loaded" | "unloaded"}`` or ``{"error": ..., "status"?}``."""
    path, body = asking
    try:
        code, answer = await ask_node(facade, node, path, body, timeout)
    except ReadError as error:
        return node.id, {"error": str(error)}
    if 200 <= code < 300:
        return node.id, {"status": _DONE[change]}
    said = answer.get("error") if isinstance(answer, dict) else None
    text = said if isinstance(said, str) else f"status {code}"
    return node.id, {"error": text[:300], "status": code}


def load_model(facade: FacadeState, params: Params) -> Deferred[Result]:
    """``model/load`` (docs/behaviour.md §13.3): load the model on the nodes, each in its API."""
    return _change_model(facade, params, ModelChange.LOAD)


def unload_model(facade: FacadeState, params: Params) -> Deferred[Result]:
    """``model/unload`` (docs/behaviour.md §13.3): unload the model from the nodes."""
    return _change_model(facade, params, ModelChange.UNLOAD)


def _change_model(facade: FacadeState, params: Params, change: ModelChange) -> Deferred[Result]:
    model = text(params, "model")
    nodes = _targets(facade, params, model)
    timeout = _timeout(params, LOAD_TIMEOUT)
    keep_alive = _keep_alive(params)
    # Each node is asked in its own kind's API (§11.1): LM Studio's REST load beside Ollama's.
    controls = {node.id: facade.inventory.control(node) for node in nodes}
    if any(control is None for control in controls.values()):
        without = sorted(n for n, c in controls.items() if c is None)
        raise RpcError(
            INVALID_PARAMS,
            f"no API to load or unload models on node(s) {', '.join(without)}"
            f" (the {facade.engine} engine has none)"
            if all(n.kind is None for n in nodes)
            else f"no API to load or unload models on node(s) {', '.join(without)}"
            " (their engine has none)",
        )
    parts = []
    for node in nodes:
        control = controls[node.id]
        assert control is not None
        asking = control.asking(change, model, keep_alive)
        parts.append(Deferred.fromCoroutine(_ask(facade, node, asking, change, timeout)))

    def answer(results: list[tuple[str, dict[str, object]]]) -> Result:
        facade.inventory.poll_now()  # residency reflects it now, not at the next poll
        log.info(
            "{what} of a model on {count} node(s) of {engine}",
            what=change.value,
            count=len(results),
            engine=facade.engine,
        )
        return {"model": model, "nodes": dict(results)}

    return gatherResults(parts).addCallback(answer)


MAINTENANCE: dict[str, Callable[[FacadeState, Params], Result | Deferred[Result]]] = {
    "node/cordon": cordon,
    "node/uncordon": uncordon,
    "node/drain": drain,
    "model/load": load_model,
    "model/unload": unload_model,
}
"""Engine-scoped methods of §13.1 (``node/drain`` answers later: its result is a Deferred)."""
