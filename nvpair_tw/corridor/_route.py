# -*- test-case-name: tests.corridor.test_exchange, tests.corridor.test_conversations -*-
"""The route of one request (docs/behaviour.md §4, §5, §11.3, §14.6): the capability gate, the
nodes that can take the route (decided once per node kind), affinity, the candidate order, and the
:class:`~nvpair_tw.corridor._attempts.AttemptPlan` every attempt sends — from the
:class:`~nvpair_tw.corridor._inbound.Inbound` value, never from the request again.
"""

from __future__ import annotations

import difflib
from typing import Any

from attrs import evolve, field, frozen

from nvpair_tw.assembly import Assembly, Dialect, plan_assembly, rewrite_outlined
from nvpair_tw.core import Outline, Outlined, RouteKind
from nvpair_tw.corridor._attempts import (
    AttemptPlan,
)
from nvpair_tw.corridor._billing import without_billing
from nvpair_tw.corridor._conversation import Conversation, conversation, pushing_out
from nvpair_tw.corridor._dialect import (
    AsIs,
    Reach,
    Sends,
    Speech,
    UsageCell,
    UsageNoted,
    may_lack,
    reach,
)
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._responses import conversation_first, stored_response
from nvpair_tw.corridor._scheduling import Ranked, rank
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import Workload
from nvpair_tw.dialects import asks_usage
from nvpair_tw.events import Choice
from nvpair_tw.inbound import Rejection, Role
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    RETRY_AFTER_SECONDS,
    AffinityKey,
    Patience,
    RequestSize,
    Session,
    request_size,
    spare_busy_routers,
)

__all__ = ["OTHER_MODEL", "Route", "route"]


@frozen
class Route:
    """What the facade learnt of a request before the first attempt."""

    plan: AttemptPlan
    model: str | None
    candidates: list[Node]
    key: AffinityKey | None
    warm: str | None
    label: str | None
    """The model as records, usage and metrics name it: the public name the gate resolved, else
    ``other`` (docs/behaviour.md §14.6)."""
    predicted: dict[str, float] = field(factory=dict)
    """Each candidate's predicted seconds to the last token (§15.2); empty when not predicted."""
    patience: Patience | None = None
    """Late binding by prediction (§15.2); None: the first free candidate in order."""
    size: RequestSize = field(factory=RequestSize)
    """What the prediction read of the request (§15.2): its measured prompt text teaches the
    model's bytes per token when the answer states its prompt tokens (§15.1)."""
    reloads: frozenset[str] = frozenset()
    """The candidates predicted to reload the model for the context the request asks (§15.2)."""
    context_fit: bool = True
    """False when no candidate's known context held the request (§15.3)."""
    chosen: Choice = Choice.ORDER
    """Why the first candidate is first."""
    usage: UsageCell | None = None
    """Where the usage chunk asked for on the client's behalf is kept once removed (§12.2)."""
    session: Session | None = None
    """The session the client named (§5.3): with ``key`` (the conversation's chain), what is
    recorded on the node that answers it whole."""


def route(facade: FacadeState, inbound: Inbound) -> Route | Rejection:
    """The gate, affinity and candidate order, or the refusal (502/404/400/503).

    A model-routed request (``/api/show``, ``/api/v0/models/{id}``) is gated like inference but
    has no workload, reservation or affinity: its plan moves on past a 404 (``inference``) and
    commits on headers (not ``gated``). A targeted node is the only candidate; a key of role
    ``user`` still has the gate run on it (docs/behaviour.md §14.2).
    """
    inference = inbound.kind is RouteKind.INFERENCE
    gated = inbound.model if inbound.kind in _GATED else None
    parsed = inbound.doc if inference else None
    stored = stored_response(facade, inbound)  # §2.1: a stored response is its owner's
    if isinstance(stored, Rejection):
        return stored
    eligible = _eligible(facade, inbound, gated)
    if isinstance(eligible, Rejection):
        return eligible
    speakable = _speakable(facade, inbound.path, eligible, parsed)
    if isinstance(speakable, Rejection):
        return speakable
    eligible, translated = speakable
    # Affinity, reservations, residency, workloads and events key on the public name (§11.4).
    model = facade.directory.catalogue.public(gated) if gated else None
    target = inbound.node
    if model and inference and target is None and len(eligible) > 1:
        eligible = _spare_busy_routers(facade, eligible, model)
    label = model
    if model and target is not None and target not in facade.eligible(gated):
        label = OTHER_MODEL  # a targeted node that does not list it (§14.6)
    known = _NO_CONVERSATION
    if model and parsed is not None and target is None:
        known = conversation(facade, inbound, model, parsed)
    ordered, chosen, size = _ordered(facade, inbound, eligible, model, parsed, known, stored)
    candidates = ordered.nodes
    usage = UsageCell() if inference else None
    plan = _plan(facade, inbound, usage, gated, candidates, translated)
    warm = candidates[0].id if ordered.affinity else None
    if not inference:
        model = label = None
    return Route(
        plan,
        model,
        candidates,
        known.key,
        warm,
        label,
        ordered.predicted,
        ordered.patience,
        size,
        ordered.reloads,
        ordered.context_fit,
        chosen,
        usage,
        known.session,
    )


def _ordered(
    facade: FacadeState,
    inbound: Inbound,
    eligible: list[Node],
    model: str | None,
    parsed: dict[str, Any] | None,
    known: Conversation,
    stored: str | None = None,
) -> tuple[Ranked, Choice, RequestSize]:
    """The order of §5 and §15.2: the targeted node alone; by prediction for a model (and the
    active conversations it would push out of a node's prompt cache, §5.3.1); else the base
    order; the node of the stored response the request names first (§2.1). With the order, why
    its first candidate is first and what the prediction read of the request (its size)."""
    target = inbound.node
    if target is not None:
        return Ranked([target], False, {}), Choice.TARGET, _NO_SIZE
    warm = known.warm
    hint = None if warm is None else warm.node
    size = _NO_SIZE
    if model:
        ratio = facade.speeds.bytes_per_token(model)  # learnt per model, §15.1
        size = request_size(parsed, len(inbound.body), ratio)
        pushing = pushing_out(facade, known, eligible, model, size)
        ordered = rank(facade, eligible, model, size, hint, pushing)
        chosen = warm.by if ordered.affinity and warm is not None else Choice.PREDICTION
    else:
        nodes, promoted = facade.order(eligible, head_selection=False, affinity_hint=hint)
        chosen = warm.by if promoted and warm is not None else Choice.ORDER
        ordered = Ranked(nodes, promoted, {})
    if facade.pin and ordered.nodes and ordered.nodes[0].id == facade.pin:
        chosen = Choice.PIN
    nodes = conversation_first(facade, stored, ordered.nodes)
    if nodes and nodes[0] is not ordered.nodes[0]:
        # The response's node goes first, free or not: no choice by prediction (§2.1, §15.2).
        ordered = evolve(ordered, nodes=nodes, patience=None)
        chosen = Choice.CONVERSATION
    return ordered, chosen, size


_GATED = (RouteKind.INFERENCE, RouteKind.MODEL_ROUTED)

_NO_CONVERSATION = Conversation()
"""What a route knows of a request without a conversation (a frozen value: made once)."""

_NONE: frozenset[str] = frozenset()
"""No node ids (the candidates that take a route translated, usually none)."""

_NO_SIZE = RequestSize()
"""What a route reads of a request it does not predict for (a frozen value: made once)."""


OTHER_MODEL = "other"
"""How records, usage and metrics name a model the gate did not resolve (§14.6)."""


def _eligible(facade: FacadeState, inbound: Inbound, model: str | None) -> list[Node] | Rejection:
    """The capability gate (§4.2): the nodes that may answer, or why none may (404/503)."""
    target = inbound.node
    if target is not None:
        if inbound.caller.rules.role is Role.ADMIN or not model:
            return [target]
        if facade.cordons.cordoned(target):
            return Rejection(
                503, "node-cordoned", f"node '{target.id}' is cordoned for maintenance"
            )
        if target in facade.eligible(model):
            return [target]
        return Rejection(404, "model-not-found", not_found_message(inbound.path, model))
    eligible = facade.eligible(model)
    if eligible or not model:
        return eligible
    return no_owner(facade, inbound, model)


def no_owner(facade: FacadeState, inbound: Inbound, model: str) -> Rejection:
    """No node can be asked for ``model`` (docs/behaviour.md §4.2): 503 ``model-unavailable``
    while an owner may exist but cannot be asked (cordoned, or a node whose inventory is not
    known yet), else 404 ``model-not-found`` naming the closest models the caller may use.

    ``model`` passed the model rule (§14.1), so it may be repeated; the error body escapes it."""
    cordoned = facade.cordoned_owners(model)
    if cordoned:
        message = f"every node with model '{model}' is cordoned for maintenance"
        return Rejection(503, "model-unavailable", message, _RETRY)
    unknown = [n.id for n in facade.serving() if not facade.inventory.known(n.id)]
    if unknown:
        message = f"model '{model}' is not available now: {_listed(unknown)} not answered yet"
        return Rejection(503, "model-unavailable", message, _RETRY)
    message = not_found_message(inbound.path, model)
    closest = closest_models(facade, inbound, model)
    if closest:
        message += f" (models you may use: {', '.join(closest)})"
    return Rejection(404, "model-not-found", message)


_RETRY = ((b"Retry-After", b"%d" % RETRY_AFTER_SECONDS),)


def _listed(ids: list[str]) -> str:
    shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return f"node {shown} has" if len(ids) == 1 else f"nodes {shown} have"


def not_found_message(path: str, model: str) -> str:
    """What the engine whose route ``path`` is says of a model it does not have: Ollama's own
    words on its routes (``/api/show`` has its own), OpenAI's on ``/v1``, Anthropic's on Messages."""
    if path.startswith("/v1/messages"):
        return f"model: {model}"
    if path.startswith("/v1/"):
        return f"The model `{model}` does not exist or you do not have access to it."
    if path == "/api/show":
        return f"model '{model}' not found"
    return f'model "{model}" not found, try pulling it first'


def closest_models(facade: FacadeState, inbound: Inbound, model: str, most: int = 3) -> list[str]:
    """The public names the caller may use that are closest to ``model`` (up to ``most``): the
    near spellings first, else the first names there are."""
    rules = inbound.caller.rules
    catalogue = facade.directory.catalogue
    names: set[str] = set()
    for node in facade.serving():
        names.update(catalogue.public(name) for name in facade.inventory.models(node.id))
    allowed = sorted(n for n in names if rules.models is None or rules.allows(n))
    near = difflib.get_close_matches(model, allowed, n=most, cutoff=0.5)
    return near or allowed[:most]


def _spare_busy_routers(facade: FacadeState, eligible: list[Node], model: str) -> list[Node]:
    """Without the llama.cpp routers that could have to evict a model whose requests are still
    running to load ``model``, while another candidate exists (docs/behaviour.md §17.2)."""
    inventory = facade.inventory
    live: list[Workload] | None = None

    def name_of(node_id: str) -> str:
        return inventory.local_name(node_id, model) or model

    def running(node_id: str) -> frozenset[str]:
        nonlocal live
        if live is None:
            live = [w for w in facade.shared.workloads.live() if w.engine == facade.engine]
        return frozenset(
            inventory.local_name(node_id, w.model) or w.model
            for w in live
            if w.scheduled_on == node_id and not w.terminal
        )

    ids = [node.id for node in eligible]
    kept = set(spare_busy_routers(ids, name_of, inventory, inventory.facts, running))
    return eligible if len(kept) == len(ids) else [n for n in eligible if n.id in kept]


def _speakable(
    facade: FacadeState, path: str, eligible: list[Node], parsed: dict[str, Any] | None
) -> tuple[list[Node], frozenset[str]] | Rejection:
    """The eligible nodes that can take the route, natively or translated (§11.3), decided once
    per node kind, with the ids of those that take it translated (:func:`_needs_speech` reads
    them); 400 ``untranslatable`` (no native candidate, and the request cannot be translated) or
    502 ``no-route-owner`` (no candidate of a kind that serves the route)."""
    by_kind: dict[tuple[str, bool], Reach] = {}
    able: list[Node] = []
    translated = _NONE
    gaps = facade.gaps
    for node in eligible:
        kind = (node.kind_of(facade.profile).name, gaps.lacks(node, path))  # §17.3
        how = by_kind.get(kind)
        if how is None:
            how = by_kind[kind] = reach(facade.profile, node, path, parsed, gaps)
        if how.ok:
            able.append(node)
            if not how.native:
                translated |= {node.id}
    if able or not eligible:
        return able, translated
    field = next((how.field for how in by_kind.values() if how.field), None)
    if field is not None:
        message = f"the request cannot be translated for the nodes that have it: field '{field}'"
        return Rejection(400, "untranslatable", message)
    # a model-routed route (no parsed body) that no owner serves is not found (§17.3)
    status = 502 if parsed is not None else 404
    return Rejection(status, "no-route-owner", "no node of a kind that serves this route")


def _speech(
    facade: FacadeState,
    inbound: Inbound,
    sent: Outlined | bytes,
    parsed: dict[str, Any] | None,
    model: str | None,
    assembly: Assembly | None,
    strip_usage: UsageNoted | None,
) -> Speech:
    """How each candidate is spoken to (§11.3, §11.4), from the body every attempt starts from
    (with where its members are, when known), its parsed value and the assembly planned for it."""
    settings = facade.shared.settings
    body, outline = (sent.body, sent.outline) if isinstance(sent, Outlined) else (sent, None)
    inference = inbound.kind is RouteKind.INFERENCE
    return Speech(
        facade=facade.profile,
        method=inbound.head.method,
        target=inbound.head.target.wire,
        path=inbound.path,
        body=body,
        outline=outline,
        parsed=parsed if inference else None,
        model=model,
        assembly=assembly,
        local_name=facade.inventory.local_name,
        assembles=inference and settings.assembles(facade.engine),
        limit=settings.max_body_size,
        clock=facade.shared.clock.seconds,
        gaps=facade.gaps,
        strip_usage=strip_usage,
    )


def _plan(
    facade: FacadeState,
    inbound: Inbound,
    usage: UsageNoted | None,
    model: str | None,
    candidates: list[Node],
    translated: frozenset[str],
) -> AttemptPlan:
    """How every attempt runs and commits, its timers and what it sends (with the assembly of
    §6.5): the checked body and the normalised target of the one parse (§14.1)."""
    settings = facade.shared.settings
    inference = inbound.kind is RouteKind.INFERENCE
    return AttemptPlan(
        headers=inbound.head.headers,
        sends=_sends(facade, inbound, usage, model, candidates, translated),
        inference=inference or inbound.kind is RouteKind.MODEL_ROUTED,
        gated=inference and facade.first_body_gate,
        header_timeout=settings.response_header_timeout,
        first_body_timeout=settings.first_body_timeout if inference else 0.0,
        first_extra=_cold_allowances(facade, model, candidates) if inference else {},
        busy_max_wait=settings.busy_max_wait,
    )


def _sends(
    facade: FacadeState,
    inbound: Inbound,
    usage: UsageNoted | None,
    model: str | None,
    candidates: list[Node],
    translated: frozenset[str],
) -> Sends:
    """What the attempts send, decided once: the same wire for all when every candidate speaks
    the route natively under the client's name for the model, else a :class:`Speech`
    (``translated``: the candidates that do not speak it, :func:`_speakable`'s)."""
    path = inbound.path
    settings = facade.shared.settings
    inference = inbound.kind is RouteKind.INFERENCE
    body, outline = inbound.body, inbound.outline
    parsed = inbound.doc if inference else None
    if inference and settings.billing_block == "remove":  # §5.3, edited where checked (§14.1)
        body, outline, parsed = without_billing(body, outline, parsed)
    assembly = None
    if inference and settings.assembles(facade.engine):
        assembly = plan_assembly(path, body, parsed, settings.max_body_size, outline)
    strip_usage = None
    if inference:
        body, outline, asked = _asking_usage(path, body, outline, parsed, assembly)
        strip_usage = usage if asked else None
    if _needs_speech(facade, path, model, candidates, translated):
        known = Outlined(body, outline) if outline is not None else body
        return _speech(facade, inbound, known, parsed, model, assembly, strip_usage)
    target = inbound.head.target.wire
    return AsIs.of(inbound.head.method, target, body, assembly, strip_usage, local_model=model)


_USAGE_ROUTES = {
    "/v1/chat/completions": Dialect.OPENAI_CHAT,
    "/v1/completions": Dialect.OPENAI_COMPLETIONS,
}


def _asking_usage(
    path: str,
    body: bytes,
    outline: Outline | None,
    parsed: dict[str, Any] | None,
    assembly: Assembly | None,
) -> tuple[bytes, Outline | None, bool]:
    """An OpenAI stream whose client did not ask for ``stream_options.include_usage`` asks for it
    (the counts of §12.2), and its usage chunk is removed before the client sees it. The body is
    edited where its outline says, never read again (docs/behaviour.md §14.1)."""
    dialect = _USAGE_ROUTES.get(path)
    if dialect is None or parsed is None or outline is None or assembly is not None:
        return body, outline, False
    if parsed.get("stream") is not True or asks_usage(parsed):
        return body, outline, False
    options = parsed.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return body, outline, False
    edited = rewrite_outlined(dialect, Outlined(body, outline))
    return edited.body, edited.outline, True


def _needs_speech(
    facade: FacadeState, path: str, model: str | None, nodes: list[Node], translated: frozenset[str]
) -> bool:
    """Whether any candidate is of another kind or lacks the route (it is among ``translated``,
    as :func:`_speakable` found it), whether a node may be found to lack it during the request
    (§17.3), or the model has other names (§11.3, §11.4)."""
    if may_lack(path):
        return True
    declared = facade.directory.catalogue.by_name.get(model.strip()) if model else None
    if declared is not None and declared.aliases:
        return True
    return bool(translated) and any(node.id in translated for node in nodes)


def _cold_allowances(facade: FacadeState, model: str | None, nodes: list[Node]) -> dict[str, float]:
    """The cold-load allowance for each candidate known not to have ``model`` loaded (§6.4).

    Unknown residency (None) adds nothing.
    """
    if not model:
        return {}
    allowance = facade.shared.settings.cold_load_allowance
    return {n.id: allowance for n in nodes if facade.inventory.resident(n.id, model) is False}
