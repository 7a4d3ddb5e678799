# -*- test-case-name: tests.corridor.test_facade -*-
"""The stages a facade hands a checked request to besides the corridor (docs/behaviour.md §2.1,
§4.3, §13.2, §14.1): the LM Studio tunnel, a model list, a fan-out's nodes, and letting a large
body go when its request ended.
"""

from __future__ import annotations

from twisted.web.server import Request

from nvpair_tw.corridor._aggregate import Cooling, aggregate_model_list
from nvpair_tw.corridor._collector import let_go
from nvpair_tw.corridor._fanout import FanOutRequest
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._refusal import refuse
from nvpair_tw.corridor._roles import Targeting
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._tunnel import TUNNEL_ENGINES, open_tunnel
from nvpair_tw.corridor._workloads import RequestRecord
from nvpair_tw.inbound import LOCAL, Rejection

__all__ = ["fan_of", "let_go_of", "serve_model_list", "serve_tunnel"]

_NO_ROUTE_OWNER = Rejection(502, "no-route-owner", "no node of a kind that serves this route")


async def serve_tunnel(
    facade: FacadeState, request: Request, record: RequestRecord, head: Head
) -> None:
    """A WebSocket upgrade (§2.1): the base order with demotion, no reservation; or the
    targeted node alone."""
    shared = facade.shared
    target = head.node
    caller = head.caller
    if target is not None:
        nodes = [target]
        if target.kind_of(facade.profile).name not in TUNNEL_ENGINES:
            refuse(facade, request, record, _NO_ROUTE_OWNER)
            return
    else:
        # Only a node of a kind that speaks the SDK channel itself can carry it (§11.3).
        speaking = [n for n in facade.serving() if n.kind_of(facade.profile).name in TUNNEL_ENGINES]
        nodes, _ = facade.order(speaking, head_selection=False)
    assert shared.endpoints is not None
    await open_tunnel(
        request,
        nodes,
        head.target.wire,
        head.headers,
        key=None if caller is LOCAL else (caller.name, caller.rules.max_tunnels),
        engine=facade.engine,
        book=shared.tunnels,
        endpoints=shared.endpoints,
        clock=shared.clock,
        timeout=shared.settings.response_header_timeout,
        record=record,
        bus=shared.bus,
    )


async def serve_model_list(
    facade: FacadeState, request: Request, record: RequestRecord, head: Head
) -> None:
    """Answer a model list from every node at once (docs/behaviour.md §4.3), without waiting on a
    cooling one (named in ``X-NVPair-Stale``), or from the targeted node alone; a key with a model
    scope sees only its models (§12.1)."""
    fmt = facade.profile.model_lists[head.path]
    target = head.node
    rules = head.caller.rules
    cooling = None
    if target is not None:
        nodes = [target]
    else:
        nodes, _ = facade.order(facade.serving(), head_selection=False)
        deadline = facade.shared.settings.response_header_timeout
        cooling = Cooling(facade.inventory, facade.stalls, deadline)
    result = await aggregate_model_list(
        fmt,
        nodes,
        head.target.wire.decode("latin-1"),
        facade.shared.http,
        facade.shared.clock,
        timeout=facade.shared.settings.model_list_timeout,
        facade=facade.profile,
        catalogue=facade.directory.catalogue,
        allows=rules.allows if rules.models is not None else None,
        first_seen=facade.first_seen,
        fallbacks=facade.directory.catalogue if target is None else None,  # §16.2
        cooling=cooling,
    )
    if not request.finished and request.channel is not None:
        request.setResponseCode(result.status)
        if result.stale:
            request.setHeader(b"x-nvpair-stale", ",".join(result.stale).encode())
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"content-length", b"%d" % len(result.body))
        request.write(result.body)
        request.finish()
    record.publish(
        facade.shared.bus,
        status=result.status,
        node_id=None,
        error=None if result.status == 200 else "inventory-unavailable",
    )


def fan_of(facade: FacadeState, inbound: Inbound) -> FanOutRequest | Rejection | None:
    """The fan-out of docs/behaviour.md §13.2: the nodes ``X-NVPair-Node`` listed, or every
    owner of the model a delete names; None when the request goes down the corridor."""
    head = inbound.head
    route = head.fan
    if route is None:
        return None
    if head.targeting is Targeting.MANY:
        nodes = list(head.nodes)
    elif head.targeting is Targeting.NONE and route.owners and inbound.model is not None:
        nodes = [n for n in facade.eligible(inbound.model) if n.speaks(facade.profile, head.path)]
        if not nodes:
            model = inbound.model
            return Rejection(404, "model-not-found", f"model '{model}' not found"[:300])
    else:
        return None
    return FanOutRequest(route, nodes, head.method, head.target.wire, head.headers, inbound.body)


def let_go_of(facade: FacadeState, inbound: Inbound) -> None:
    """The request that held a large body ended: free it a slice at a time (§14.1)."""
    shared = facade.shared
    if inbound.doc is not None:
        let_go(inbound.doc, shared.clock)
    shared.collector.released()
