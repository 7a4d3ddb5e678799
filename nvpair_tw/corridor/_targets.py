# -*- test-case-name: tests.corridor.test_fanout -*-
"""Which node or nodes a request names itself (docs/behaviour.md §2.1, §13.2): ``X-NVPair-Node``
with one id (that node alone), ``*`` or a list of ids (a fan-out of model management), and
``/api/delete`` without the header (every owner of the model).

:func:`choose` reads the request and answers with a value the facade acts on: the chosen
:class:`Node`, a :class:`FanOutRequest`, a :class:`Rejection` to answer at once, or ``None`` when
the request names no node and is routed as usual. It removes the header either way.
"""

from __future__ import annotations

from twisted.web.server import Request

from nvpair_tw.core import TARGET_HEADER
from nvpair_tw.corridor._fanout import FanOutRequest, is_fan_out, owners_of, parse_targets
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.inbound import Rejection
from nvpair_tw.nodes import Node

__all__ = ["choose"]

_NOT_FAN_OUT = Rejection(
    400,
    "fan-out-not-supported",
    "X-NVPair-Node: * or a list of ids is only for /api/pull, /api/create, /api/copy and"
    " /api/delete",
)
_UNKNOWN = Rejection(404, "unknown-node", "unknown node")


def choose(
    facade: FacadeState, request: Request, path: str, target: bytes
) -> Node | FanOutRequest | Rejection | None:
    """The node(s) ``request`` names for itself, a refusal, or ``None`` (routed as usual)."""
    wanted = request.requestHeaders.getRawHeaders(TARGET_HEADER)
    request.requestHeaders.removeHeader(TARGET_HEADER)
    fan = facade.profile.fan_out_route(request.method, path)
    if wanted is not None and len(wanted) == 1 and is_fan_out(wanted[0].decode("latin-1")):
        if fan is None:
            return _NOT_FAN_OUT
        nodes, unknown = parse_targets(wanted[0].decode("latin-1"), list(facade.directory.nodes()))
        if unknown or not nodes:
            message = f"unknown node: {', '.join(unknown)}" if unknown else "unknown node"
            return Rejection(404, "unknown-node", message[:300])
        # Only nodes whose kind serves the route take part (§11.1): ``*`` means every such node,
        # a list naming another kind's node is refused.
        speaking = [n for n in nodes if n.speaks(facade.profile, path)]
        foreign = [n.id for n in nodes if n not in speaking]
        if foreign and wanted[0].strip() != b"*":
            message = f"{path} is not served by the engine of node(s): {', '.join(foreign)}"
            return Rejection(400, "route-not-served", message[:300])
        if not speaking:
            return Rejection(502, "no-route-owner", "no node of a kind that serves this route")
        return FanOutRequest(fan, speaking, target, b"")
    if wanted is not None:
        chosen = facade.directory.get(wanted[0].decode("latin-1").strip())
        return _UNKNOWN if chosen is None or len(wanted) > 1 else chosen
    if fan is None or not fan.owners:
        return None
    assert request.content is not None
    body = request.content.read()
    request.content.seek(0)
    model, owners = owners_of(facade, body)
    if model is None:
        return None
    owners = [n for n in owners if n.speaks(facade.profile, path)]
    if not owners:
        return Rejection(404, "model-not-found", f"model '{model}' not found")
    return FanOutRequest(fan, owners, target, body)
