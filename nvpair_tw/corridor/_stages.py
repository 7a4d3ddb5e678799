# -*- test-case-name: tests.corridor.test_facade -*-
"""The stages a facade hands a checked request to besides the corridor (docs/behaviour.md §2.1,
§4.3, §13.2, §14.1): the LM Studio tunnel, a model list, a fan-out's nodes, and letting a large
body go when its request ended.
"""

from __future__ import annotations

from nvpair_tw.corridor._aggregate import Cooling, aggregate_model_list
from nvpair_tw.corridor._collector import let_go
from nvpair_tw.corridor._fanout import FanOutRequest
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._roles import Targeting
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._tunnel import TUNNEL_ENGINES
from nvpair_tw.corridor._writer import Whole
from nvpair_tw.inbound import Rejection
from nvpair_tw.nodes import Node

__all__ = ["fan_of", "let_go_of", "list_answer", "tunnel_nodes"]

_NO_ROUTE_OWNER = Rejection(502, "no-route-owner", "no node of a kind that serves this route")


def tunnel_nodes(facade: FacadeState, head: Head) -> list[Node] | Rejection:
    """The nodes a WebSocket upgrade (§2.1) tries: the base order with demotion, no reservation,
    among those of a kind that speaks the SDK channel itself (§11.3); or the targeted node alone."""
    target = head.node
    if target is not None:
        if target.kind_of(facade.profile).name not in TUNNEL_ENGINES:
            return _NO_ROUTE_OWNER
        return [target]
    speaking = [n for n in facade.serving() if n.kind_of(facade.profile).name in TUNNEL_ENGINES]
    nodes, _ = facade.order(speaking, head_selection=False)
    return nodes


async def list_answer(facade: FacadeState, head: Head) -> tuple[Whole, str | None]:
    """A model list from every node at once (docs/behaviour.md §4.3), without waiting on a
    cooling one (named in ``X-NVPair-Stale``), or from the targeted node alone; a key with a
    model scope sees only its models (§12.1). With the error the record names (None for a
    200)."""
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
    stale = ((b"x-nvpair-stale", ",".join(result.stale).encode()),) if result.stale else ()
    answer = Whole(result.status, result.body, headers=(*_NOSNIFF, *stale))
    return answer, None if result.status == 200 else "inventory-unavailable"


_NOSNIFF = ((b"x-content-type-options", b"nosniff"),)


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
    target, body = head.target.wire, inbound.body
    return FanOutRequest(route, nodes, head.method, target, head.headers, body, inbound.model)


def let_go_of(facade: FacadeState, inbound: Inbound) -> None:
    """The request that held a large body ended: free it a slice at a time (§14.1)."""
    shared = facade.shared
    if inbound.doc is not None:
        let_go(inbound.doc, shared.clock)
    shared.collector.released()
