# -*- test-case-name: tests.corridor.test_boundary -*-
"""A request understood once (docs/behaviour.md §14.1): the checked head, then the body.

:func:`read_body` parses the body of every route the proxy reads a model from (inference,
model-routed, model management, fan-out, and for a key with a model scope every route of
:data:`~nvpair_tw.core.MODEL_NAMES`) once and strictly, reads the one model the engine would run,
and checks it against the key's scope — for a scoped key every model the body names (``source``,
``destination``, ``from``, ``name``, ...), docs/behaviour.md §14.2. A model id in the path is a
model name too: it passes the model rule or is 400 ``bad-model``. The :class:`Inbound` it gives is
what every later stage uses (gate, catalogue, affinity, translation, usage, records): none of them
reads the body again, and what a node receives is what was checked.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from attrs import field, frozen
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.core import MODEL_NAMES, Outline, Priority, RouteKind
from nvpair_tw.corridor._decoding import decode_body
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._roles import MANAGEMENT_PATHS, Targeting
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.inbound import (
    LARGE_BODY,
    Caller,
    Parsed,
    Rejection,
    model_not_allowed,
    model_rule,
    parse_document,
    parse_document_large,
    read_model,
    read_models,
)
from nvpair_tw.nodes import Node

__all__ = ["Inbound", "read_body"]

_INFERENCE_NAMES = ("model",)
_ROUTED_NAMES = ("model", "name")
_QUERY_NOT_ALLOWED = Rejection(
    403, "route-not-allowed", "this key may not name a model outside its scope (role user)"
)
_NAMES_NONE = Rejection(
    403, "model-not-allowed", "this key may only use its own models, and the request names none"
)
_READING = (b"GET", b"HEAD")


@frozen
class Inbound:
    """One request, understood once: its checked head, the client's body bytes, the parsed
    document (routes that name a model in their body) and the model as the client named it."""

    head: Head
    body: bytes
    doc: dict[str, Any] | None
    model: str | None
    outline: Outline | None = None
    """Where the body's top-level members are (from the one parse): what the rewriters edit
    without reading the body again."""
    large: bool = False
    """The body was parsed in slices (docs/behaviour.md §14.1): its objects are frozen out of the
    collector's passes until :meth:`QuietCollector.released`."""
    # The head's, kept here (every stage reads them): not looked up through the head each time.
    path: str = field(init=False)
    kind: RouteKind = field(init=False)
    caller: Caller = field(init=False)
    node: Node | None = field(init=False)
    priority: Priority = field(init=False)
    """Its place in the queue, read once at the head (docs/behaviour.md §16.3)."""

    def __attrs_post_init__(self) -> None:
        head, kept = self.head, object.__setattr__
        kept(self, "path", head.path)
        kept(self, "kind", head.kind)
        kept(self, "caller", head.caller)
        kept(self, "node", head.node)
        kept(self, "priority", head.priority)


def _reads_body(head: Head) -> bool:
    """Whether the route names its model in a JSON body (so the body is parsed, §14.1): for a key
    with a model scope, every route whose body names models (§14.2)."""
    if head.kind is RouteKind.INFERENCE:
        return True
    if head.kind is RouteKind.MODEL_ROUTED:
        return head.method == b"POST"
    if head.fan is not None or head.path in MANAGEMENT_PATHS:
        return True
    scoped = head.caller.rules.models is not None
    return scoped and head.method not in _READING and head.path in MODEL_NAMES


async def read_body(
    facade: FacadeState, head: Head, body: bytes, clock: IReactorTime
) -> Inbound | Rejection:
    """The request with its body parsed and its model read and scope-checked, or the refusal
    (400 ``bad-body`` / ``bad-model``, 403 ``model-not-allowed``); no node is contacted.

    A compressed body is decoded first (docs/behaviour.md §17.5: 413 past the cap once decoded,
    415 for a coding the proxy does not decode); the :class:`Inbound` holds the decoded body and
    a head without ``Content-Encoding``."""
    decoded = await decode_body(head, body, facade.shared.settings.max_body_size, clock)
    if isinstance(decoded, Rejection):
        return decoded
    head, body = decoded
    if not _reads_body(head):
        model = _unbodied_model(facade, head)
        if isinstance(model, Rejection):
            return model
        refused = _out_of_scope(facade, head, model)
        if refused is not None and head.kind is RouteKind.PASS_THROUGH:
            return _QUERY_NOT_ALLOWED  # a pass-through GET naming a model outside the scope
        return refused if refused is not None else Inbound(head, body, None, model)
    large = len(body) >= LARGE_BODY
    parsed = parse_document(body) if not large else await _parse_large(facade, body, clock)
    if isinstance(parsed, Rejection):
        return parsed
    doc = parsed.doc
    names = _INFERENCE_NAMES if head.kind is RouteKind.INFERENCE else _ROUTED_NAMES
    named = read_model(doc, names)
    if isinstance(named, Rejection):
        return named
    refused = _out_of_scope(facade, head, named) or _names_out_of_scope(facade, head, doc)
    if refused is not None:
        if large:
            facade.shared.collector.released()
        return refused
    return Inbound(head, body, doc, named, parsed, large)


async def _parse_large(facade: FacadeState, body: bytes, clock: IReactorTime) -> Parsed | Rejection:
    """A large body parsed in slices, its objects kept out of the collector's passes."""
    collector = facade.shared.collector
    collector.parse_started()
    try:
        doc = await parse_document_large(body, clock)
    finally:
        collector.parse_ended()
    if isinstance(doc, Rejection):
        collector.released()
    return doc


def _unbodied_model(facade: FacadeState, head: Head) -> str | Rejection | None:
    """The model a route names outside a body: the id of ``/v1/models/{id}`` and its twins (by
    the model rule, §14.1), or a ``model`` query parameter of a pass-through ``GET`` (§14.2)."""
    if head.target.model_id is not None:
        return model_rule(head.target.model_id)
    route = facade.profile.model_route(head.method, head.path)
    if route is not None:
        return model_rule(route.model(head.path, None))
    query = head.target.query.decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name.casefold() in _ROUTED_NAMES and value.strip():
            return value
    return None


def _names_out_of_scope(facade: FacadeState, head: Head, doc: dict[str, Any]) -> Rejection | None:
    """For a key with a model scope, every other model the body names (``source``,
    ``destination``, ``from``, ``name``, ... of :data:`~nvpair_tw.core.MODEL_NAMES`) must be in
    scope too, and a member that names models the proxy cannot read (blob digests) is refused
    (docs/behaviour.md §14.2)."""
    rules = head.caller.rules
    names = MODEL_NAMES.get(head.path)
    if rules.models is None or names is None:
        return None
    sent = {key.casefold() for key, value in doc.items() if value is not None}
    opaque = next((member for member in names.opaque if member in sent), None)
    if opaque is not None:
        return Rejection(
            403,
            "route-not-allowed",
            f"this key may not send '{opaque}' here: it names models the proxy cannot read"
            " (a key with a model scope may not)",
        )
    models = read_models(doc, names.fields)
    if isinstance(models, Rejection):
        return models
    public = facade.directory.catalogue.public
    outside = next((public(m) for m in models if not rules.allows(public(m))), None)
    return None if outside is None else model_not_allowed(outside)


def _out_of_scope(facade: FacadeState, head: Head, model: str | None) -> Rejection | None:
    """403 ``model-not-allowed`` for a model outside the key's scope, before anything else looks
    at the model (so the answer never says whether the fleet has it)."""
    rules = head.caller.rules
    if rules.models is None:
        return None
    if model is None:
        named = head.kind in (RouteKind.INFERENCE, RouteKind.MODEL_ROUTED)
        return _NAMES_NONE if named and head.targeting is not Targeting.MANY else None
    public = facade.directory.catalogue.public(model)
    return None if rules.allows(public) else model_not_allowed(public)
