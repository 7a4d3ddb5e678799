# -*- test-case-name: tests.ops.test_control -*-
"""The control channel's methods (docs/behaviour.md §8), by topic: nodes, selection and scheduling, workloads,
logging. :data:`SCOPED` methods act on one engine's facade, :data:`PROCESS` methods on the whole
runtime; :class:`~nvpair_tw.ops._control.ControlMethods` dispatches to them.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred

from nvpair_tw.core import ENGINES
from nvpair_tw.corridor import FacadeState
from nvpair_tw.logs import LevelledLogger, current_level, parse_level, set_level
from nvpair_tw.nodes import Node, validate_url
from nvpair_tw.ops._maintenance import MAINTENANCE
from nvpair_tw.ops._rpc import (
    INVALID_PARAMS,
    Params,
    Result,
    RpcError,
    any_text,
    array,
    integer,
    invalid,
    obj,
    short,
    string,
    text,
)
from nvpair_tw.ops._usage import USAGE
from nvpair_tw.runtime import Runtime
from nvpair_tw.selection import make_rank, shown_contexts

__all__ = ["CANCEL_REASON", "PROCESS", "SCOPED", "node_param"]

# The control channel's own namespace, as before these methods had a module of their own.
log = LevelledLogger(namespace=__name__)

CANCEL_REASON = "cancelled by request"


def node_param(params: Params, where: str, source: str) -> Node:
    """A node from ``{id, url, models?, kind?}``; the URL is validated but never echoed (it may
    carry a password). A ``kind`` (§11.1) is one of the engines."""
    node_id = text(params, "id", where)
    url = text(params, "url", where)
    try:
        validate_url(url)
    except ValueError as error:
        raise invalid(f"{where}url {error}") from None
    models = params.get("models")
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        raise invalid(f"{where}models must be an array of non-empty strings")
    kind = params.get("kind")
    if kind is not None and (not isinstance(kind, str) or kind not in ENGINES):
        raise invalid(f"{where}kind must be one of {', '.join(sorted(ENGINES))}")
    return Node(node_id, url, None if models is None else tuple(models), source, kind=kind)


# Nodes.


def nodes_list(facade: FacadeState, params: Params) -> Result:
    nodes = []
    for node in facade.directory.nodes():
        cooldown = facade.stalls.cooldown(node.id)
        cordon = facade.cordons.of(node)
        loaded = facade.inventory.loaded(node.id)
        nodes.append(
            {
                "id": node.id,
                "url": node.public_url,
                "models": sorted(facade.inventory.models(node.id)),
                "loaded": None if loaded is None else sorted(loaded),
                "source": node.source,
                "kind": node.kind_of(facade.profile).name,
                "coolingUntil": None if cooldown is None else int(cooldown.until * 1000),
                "slots": facade.admission.slots(node.id),
                "slotsInUse": facade.admission.slots_in_use(node.id),
                "busyWaits": facade.progress.busy_waits(node.id),
                "cordon": None if cordon is None else cordon.to_json(),
                "rates": facade.speeds.to_json(node.id),
                "caches": facade.caches.to_json(node.id),
                "contexts": shown_contexts(
                    facade.inventory.facts.contexts(node.id), facade.inventory.models(node.id)
                ),
            }
        )
    return {"nodes": nodes, "queueDepth": facade.admission.queue_depth}


def add_manual(facade: FacadeState, params: Params) -> Result:
    node = node_param(params, "", "manual")
    added = facade.directory.add_manual(node)
    log.info("manual node {node} added to {engine}", node=node.id, engine=facade.engine)
    return {"added": added}


def remove_manual(facade: FacadeState, params: Params) -> Result:
    node_id = text(params, "id")
    removed = facade.directory.remove_manual(node_id)
    log.info("manual node {node} removed from {engine}", node=node_id, engine=facade.engine)
    return {"removed": removed}


def discovery(facade: FacadeState, params: Params) -> Result:
    nodes = [
        node_param(obj(entry, f"nodes[{i}]"), f"nodes[{i}].", "discovery")
        for i, entry in enumerate(array(params, "nodes"))
    ]
    facade.directory.set_discovered(nodes)
    log.info(
        "discovery snapshot for {engine}: {count} nodes", engine=facade.engine, count=len(nodes)
    )
    return {"count": len(nodes)}


# Selection and scheduling.


def select(facade: FacadeState, params: Params) -> Result:
    node_id = any_text(params, "id")
    if node_id and facade.directory.get(node_id) is None:
        raise RpcError(INVALID_PARAMS, f'node "{short(node_id)}" not found')
    facade.pin = node_id or None
    log.info("{engine} selection: {node}", engine=facade.engine, node=node_id or "automatic")
    return {"id": node_id}


def model_owners(facade: FacadeState, params: Params) -> Result:
    model = text(params, "model")
    return {"nodes": [node.id for node in facade.eligible(model)]}


def set_priority(runtime: Runtime, params: Params) -> Result:
    generation = integer(params, "generation")
    nodes = [string(n, f"nodes[{i}]") for i, n in enumerate(array(params, "nodes"))]
    ranks = []
    for i, entry in enumerate(array(params, "ranks") if "ranks" in params else []):
        where = f"ranks[{i}]."
        rank = obj(entry, f"ranks[{i}]")
        ranks.append(
            make_rank(
                text(rank, "id", where),
                integer(rank, "pending", where, 0),
                integer(rank, "gpuPressure", where, 0),
            )
        )
    ledger = runtime.shared.ledger
    if not ledger.apply(generation, nodes, ranks):
        log.info(
            "stale priority snapshot {generation} ignored (current {current})",
            generation=generation,
            current=ledger.snapshot.generation,
        )
        return {"count": 0}
    count = len(ledger.snapshot.ranks)
    log.debug("priority snapshot {generation} applied", generation=generation, count=count)
    return {"count": count}


# Workloads.


def cancel(runtime: Runtime, params: Params) -> Result:
    workload_id = integer(params, "id")
    accepted = runtime.shared.workloads.cancel(workload_id, CANCEL_REASON)
    log.info("cancel of workload {workload} requested", workload=workload_id, accepted=accepted)
    return {"accepted": accepted}


# Logging.


def log_set_level(runtime: Runtime, params: Params) -> Result:
    try:
        level = parse_level(text(params, "level"))
    except ValueError as error:
        raise invalid(f"level: {error}") from None
    set_level(level)
    log.info("log level set to {log_level_name}", log_level_name=level.name)
    return {"level": current_level().name}


SCOPED: dict[str, Callable[[FacadeState, Params], Result | Deferred[Result]]] = {
    "nodes/list": nodes_list,
    "node/add-manual": add_manual,
    "node/remove-manual": remove_manual,
    "discovery:nodes": discovery,
    "node/select": select,
    "node/selected": select,
    "node/model-owners": model_owners,
    **MAINTENANCE,
}
"""Methods on one engine's facade (``ENGINE:`` prefix when several engines are served)."""

PROCESS: dict[str, Callable[[Runtime, Params], Result | Deferred[Result]]] = {
    "node/set-priority": set_priority,
    "workload/cancel": cancel,
    "log/set-level": log_set_level,
    **USAGE,
}
"""Methods on the whole process."""
