# -*- test-case-name: tests.corridor.test_boundary -*-
"""The end of a request's head: who is calling and what they ask, decided once, before the body.

:func:`read_head` runs when the head is complete (the site's head gate, before any ``100 Continue``
and before a body byte is read, docs/behaviour.md §14.1) and gives a :class:`Head` or a refusal:
the loop mark (508), the source and the key (401/403, §14.2), the drain (503), a body on ``GET``
or ``HEAD`` (400 ``body-not-allowed``), the normalised path (400 ``bad-path``), the route, the node
``X-NVPair-Node`` names (an unknown name is never repeated back), the role and the scope (403
``route-not-allowed``), the priority (``X-NVPair-Priority`` under the key's, 400 ``bad-priority``,
§16.3) and the limits that need no body (429). Every later stage reads the :class:`Head`, never
the request's raw target or headers again.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import field, frozen
from twisted.internet.interfaces import IAddress
from twisted.web.http_headers import Headers

from nvpair_tw.core import (
    PRIORITY_HEADER,
    TARGET_HEADER,
    FanOutRoute,
    Priority,
    RouteKind,
    loop_marks,
    priority_of,
    upstream_request_headers,
)
from nvpair_tw.corridor._fanout import is_fan_out, parse_targets
from nvpair_tw.corridor._probes import probe_of
from nvpair_tw.corridor._roles import Channel, Targeting, refusal
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._tunnel import TUNNEL_ENGINES, is_upgrade
from nvpair_tw.inbound import LOCAL, Caller, Rejection, Target, parse_target
from nvpair_tw.nodes import Node

__all__ = ["Arrival", "Head", "Refused", "read_head"]

_LOOP = Rejection(508, "loop-detected", "this request came back to the proxy that sent it")
_SHUTTING_DOWN = Rejection(
    503, "shutting-down", "the proxy is shutting down", ((b"Connection", b"close"),)
)
_NOT_SERVED = Rejection(404, "not-found", "this facade does not serve this route")
_UNKNOWN = Rejection(404, "unknown-node", "X-NVPair-Node names a node this facade does not know")
_BODY_NOT_ALLOWED = Rejection(
    400,
    "body-not-allowed",
    "a GET or HEAD request carries no body (no Content-Length, no Transfer-Encoding)",
)
_READING = (b"GET", b"HEAD")
_BAD_PRIORITY = Rejection(
    400, "bad-priority", "X-NVPair-Priority must be one value: interactive or batch"
)
_NOT_FAN_OUT = Rejection(
    400,
    "fan-out-not-supported",
    "X-NVPair-Node: * or a list of ids is only for /api/pull, /api/create, /api/copy and"
    " /api/delete",
)


@frozen
class Arrival:
    """What the door read of a request's head: its method, target, headers and peer. Later stages
    read the :class:`Head` made from it, never these again."""

    method: bytes
    uri: bytes
    headers: Headers
    peer: IAddress


@frozen
class Refused:
    """A head refused: the answer, and the named key that sent it when it was known (for the
    record, docs/behaviour.md §12.1)."""

    rejection: Rejection
    key: str | None = None


@frozen
class Head:
    """A request as its head says it, checked: every stage after the head reads this."""

    method: bytes
    target: Target
    kind: RouteKind
    channel: Channel
    caller: Caller
    targeting: Targeting
    nodes: tuple[Node, ...]
    """The nodes ``X-NVPair-Node`` named (one, or a fan-out's), in the header's order."""
    headers: Headers
    """What a node may receive of the client's headers: end-to-end ones, without the proxy's
    keys and ``X-NVPair-*`` headers, with this process's loop mark."""
    fan: FanOutRoute | None
    """The model-management route of docs/behaviour.md §13.2 this request takes, if any
    (looked up once: the fan-out, the body rule and ``X-NVPair-Node: *`` all ask)."""
    priority: Priority = Priority.INTERACTIVE
    """Its place in the queue (docs/behaviour.md §16.3): the key's, lowered by the header."""
    upgrade: tuple[bytes, ...] = ()
    """The client's ``Upgrade`` values, for a tunnel (§2.1)."""
    path: str = field(init=False)
    """The target's path (read at every stage: kept, not looked up each time)."""
    node: Node | None = field(init=False)
    """The one node ``X-NVPair-Node: ID`` chose (docs/behaviour.md §2.1)."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "path", self.target.path)
        one = self.nodes[0] if self.targeting is Targeting.ONE else None
        object.__setattr__(self, "node", one)


def read_head(facade: FacadeState, arrival: Arrival) -> Head | Refused:
    """The checked head of a request, or why it is refused (nothing read of its body)."""
    headers = arrival.headers
    if loop_marks(headers):
        return Refused(_LOOP)
    caller = _caller(facade, arrival)
    if isinstance(caller, Rejection):
        return Refused(caller)
    checked = _checked(facade, arrival, caller)
    if isinstance(checked, Rejection):
        return Refused(checked, None if caller is LOCAL else caller.name)
    return checked


def _checked(facade: FacadeState, arrival: Arrival, caller: Caller) -> Head | Rejection:
    """The head of a caller who passed the source and key checks, or why it is refused."""
    headers = arrival.headers
    if facade.shared.draining:
        return _SHUTTING_DOWN
    method = arrival.method
    if method in _READING and _has_body(headers):
        return _BODY_NOT_ALLOWED
    target = parse_target(arrival.uri)
    if isinstance(target, Rejection):
        return target
    kind = facade.profile.classify(method, target.path)
    answered_here = probe_of(facade.engine, method, target.path) is not None  # §17.6
    if kind is RouteKind.PASS_THROUGH and not facade.profile.passes_through and not answered_here:
        return _NOT_SERVED
    channel = (
        Channel.TUNNEL
        if facade.engine in TUNNEL_ENGINES and is_upgrade(method, headers)
        else Channel.HTTP
    )
    wanted = headers.getRawHeaders(TARGET_HEADER)
    targeting = _targeting(wanted)
    denied = refusal(caller, method, target.path, kind, targeting, channel)
    if denied is not None:
        return denied
    fan = facade.profile.fan_out_route(method, target.path)
    nodes = _named(facade, fan, target.path, wanted, targeting)
    if isinstance(nodes, Rejection):
        return nodes
    priority = priority_of(caller.rules.priority, headers.getRawHeaders(PRIORITY_HEADER))
    if priority is None:
        return _BAD_PRIORITY
    if not answered_here:  # every request that reaches a node meets the key's limits (§12.1)
        over = facade.shared.limiter.check(caller, kind)
        if over is not None:
            return over.rejection
    host = getattr(arrival.peer, "host", None)
    forwarded = upstream_request_headers(headers, host if isinstance(host, str) else None)
    if facade.shared.ingress is not None:
        facade.shared.ingress.strip(forwarded)
    upgrade = tuple(headers.getRawHeaders(b"upgrade", ())) if channel is Channel.TUNNEL else ()
    return Head(
        method, target, kind, channel, caller, targeting, nodes, forwarded, fan, priority, upgrade
    )


def _caller(facade: FacadeState, arrival: Arrival) -> Caller | Rejection:
    """The source and key check (docs/behaviour.md §14.2). The proxy's keys are removed from
    :attr:`Head.headers`, so no node ever receives them."""
    ingress = facade.shared.ingress
    if ingress is None:
        return LOCAL
    query = arrival.uri.partition(b"?")[2].partition(b"#")[0]
    return ingress.admit(arrival.peer, arrival.headers, query)


def _has_body(headers: Headers) -> bool:
    """Whether a request's framing says a body follows: any ``Transfer-Encoding``, or a
    ``Content-Length`` other than 0 (docs/behaviour.md §14.1)."""
    if headers.hasHeader(b"transfer-encoding"):
        return True
    return any(v.strip() != b"0" for v in headers.getRawHeaders(b"content-length", ()))


def _targeting(wanted: Sequence[bytes] | None) -> Targeting:
    if wanted is None:
        return Targeting.NONE
    if len(wanted) == 1 and is_fan_out(wanted[0].decode("latin-1")):
        return Targeting.MANY
    return Targeting.ONE


def _named(
    facade: FacadeState,
    fan: FanOutRoute | None,
    path: str,
    wanted: Sequence[bytes] | None,
    targeting: Targeting,
) -> tuple[Node, ...] | Rejection:
    """The nodes ``X-NVPair-Node`` names, or why the header is refused (404, 400, 502)."""
    if wanted is None:
        return ()
    if targeting is Targeting.ONE:
        chosen = facade.directory.get(wanted[0].decode("latin-1").strip())
        return _UNKNOWN if chosen is None or len(wanted) > 1 else (chosen,)
    if fan is None:
        return _NOT_FAN_OUT
    value = wanted[0].decode("latin-1")
    nodes, unknown = parse_targets(value, list(facade.directory.nodes()))
    if unknown or not nodes:
        return _UNKNOWN  # the names a caller sent are never repeated back (§14.2)
    # Only nodes whose kind serves the route take part (§11.1): ``*`` means every such node,
    # a list naming another kind's node is refused.
    speaking = [n for n in nodes if n.speaks(facade.profile, path)]
    foreign = [n.id for n in nodes if n not in speaking]
    if foreign and value.strip() != "*":
        message = f"{path} is not served by the engine of node(s): {', '.join(foreign)}"
        return Rejection(400, "route-not-served", message[:300])
    if not speaking:
        return Rejection(502, "no-route-owner", "no node of a kind that serves this route")
    return tuple(speaking)
