# -*- test-case-name: tests.corridor.test_preload -*-
"""Ollama's prompt-less ``/api/generate`` for nodes of another kind (docs/behaviour.md §17.6).

``ollama run`` sends ``{"model"}`` (with ``keep_alive``) to load a model before the first prompt,
and ``ollama stop`` the same with ``keep_alive: 0`` to unload it. An Ollama node answers both at
once with ``done: true`` and ``done_reason: "load"`` / ``"unload"``. Translated to a chat
completion with no message it would be an error, so when no eligible node speaks the route natively
the facade answers it in Ollama's shape itself: through the first candidate's load API where its
kind has one (§13.3, §17.2; the next candidate is tried when that fails), else at once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from attrs import frozen

from nvpair_tw.core import ModelChange, parse_duration
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._writer import Whole
from nvpair_tw.inbound import Rejection
from nvpair_tw.nodes import Node
from nvpair_tw.upstream import ReadError, join_url, post_json

__all__ = ["LOAD_WAIT", "Preload", "ask_node", "preload_answer", "preload_of"]

GENERATE = "/api/generate"

LOAD_WAIT = 300.0
"""Seconds a node's load API may take (a cold load of a large model)."""


@frozen
class Preload:
    """A prompt-less generate that no candidate speaks natively: the nodes to try, in order."""

    verb: ModelChange
    """What the generate asks (its ``done_reason``)."""
    model: str
    keep_alive: str | float | None
    nodes: tuple[Node, ...]


def _verb(doc: dict[str, Any]) -> ModelChange | None:
    """Load or unload, as Ollama reads the body; None when it carries a prompt."""
    prompt = doc.get("prompt")
    if prompt is not None and prompt != "":
        return None
    keep_alive = doc.get("keep_alive")
    if isinstance(keep_alive, bool):
        return ModelChange.LOAD
    if isinstance(keep_alive, int | float) and keep_alive == 0:
        return ModelChange.UNLOAD
    if isinstance(keep_alive, str):
        try:
            return ModelChange.UNLOAD if parse_duration(keep_alive) == 0 else ModelChange.LOAD
        except ValueError:
            return ModelChange.LOAD
    return ModelChange.LOAD


def preload_of(facade: FacadeState, inbound: Inbound) -> Preload | None:
    """The preload or unload to answer here, or None when the corridor takes the request (a
    prompt, no owner — the gate then says why —, or an owner that speaks the route natively)."""
    doc = inbound.doc
    if inbound.path != GENERATE or doc is None or not inbound.model:
        return None
    verb = _verb(doc)
    if verb is None:
        return None
    model = inbound.model
    eligible = facade.eligible(model)
    target = inbound.node
    if target is not None:  # the gate still runs on a named node (§14.2): else the corridor says
        eligible = [target] if target in eligible else []
    owners = eligible
    if not owners or any(n.speaks(facade.profile, GENERATE) for n in owners):
        return None
    nodes, _ = facade.order(owners, head_selection=False)
    keep_alive = doc.get("keep_alive")
    if isinstance(keep_alive, bool) or not isinstance(keep_alive, str | int | float):
        keep_alive = None
    return Preload(verb, model, keep_alive, tuple(nodes))


async def _through_api(facade: FacadeState, node: Node, preload: Preload) -> bool | None:
    """Ask ``node``'s load API: True when it did it, False when it failed, None when its kind
    has no such API."""
    control = facade.inventory.control(node)  # a router's own API first (§17.2)
    if control is None:
        return None
    local = facade.inventory.local_name(node.id, preload.model) or preload.model
    path, body = control.asking(preload.verb, local, preload.keep_alive)
    try:
        code, _ = await ask_node(facade, node, path, body, LOAD_WAIT)
    except ReadError:
        return False
    return 200 <= code < 300


async def ask_node(
    facade: FacadeState, node: Node, path: str, body: Any, timeout: float
) -> tuple[int, Any]:
    """POST ``body`` to ``path`` of ``node``'s own API (a model load or unload), with the node's
    credential: the status and the JSON answer; :class:`ReadError` when no whole answer came."""
    shared = facade.shared
    return await post_json(
        shared.http,
        shared.clock,
        join_url(node.public_url, path),
        body,
        timeout=timeout,
        authorization=node.authorization,
    )


async def preload_answer(facade: FacadeState, preload: Preload) -> tuple[Whole, str] | Rejection:
    """Load or unload on the first candidate that can: the answer in Ollama's shape and the node
    that did it; 502 ``load-failed`` when every candidate's load API failed."""
    served: Node | None = None
    for node in preload.nodes:
        done = await _through_api(facade, node, preload)
        if done is not False:
            served = node
            break
    if served is None:
        return Rejection(502, "load-failed", f"no node could {preload.verb.value} the model")
    if facade.inventory.control(served) is not None:
        facade.inventory.poll_now()  # residency reflects the load now, as model/load's does
    created = datetime.fromtimestamp(facade.shared.clock.seconds(), UTC)
    answer = {
        "model": preload.model,
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "response": "",
        "done": True,
        "done_reason": preload.verb.value,
    }
    body = json.dumps(answer).encode()
    named = ((b"x-nvpair-node", served.id.encode()),)
    return Whole(200, body, b"application/json; charset=utf-8", named), served.id
