# -*- test-case-name: tests.corridor.test_aggregate, tests.e2e.test_frozen_lists -*-
"""Model-list aggregation (docs/behaviour.md §4.3): ask every node at once, merge in candidate order.

A frozen node is paid for once (:class:`Cooling`): a cooling node is not asked, and its part is
what the facade last knew of it (its last good answer to the list, else records made from its
inventory or residency); a node that gives no list within the response-header deadline is cooled
as by a stall, and its part is the same. :attr:`AggregateResult.stale` names those nodes, for the
``X-NVPair-Stale`` header the answer's writer adds.

The answer must not depend on which node is fastest, so records are merged in the order the nodes
were given, the first record of each key winning verbatim. A ``per_node`` list (``/api/ps``) is
never merged across nodes: each record gains ``"nvpair_node": ID``. No client header is ever
forwarded; a node's own credential is sent to it.

A node whose kind does not serve the list (an LM Studio node behind the Ollama facade, §11.3) is
asked for its own list, and its records are synthesised in the facade's shape from what it
reports, with the few fields the engine's own clients cannot do without (§17.6). A record from a
node of the facade's own kind is preferred to a synthesised one whatever the candidate order (it
takes the place where the model first appeared). With a catalogue (§11.4) a record listed under an alias is listed under its public name,
so a public name appears once.

A declared model that no node lists but one of whose fallbacks (§16.2) is listed is served through
that fallback: it is listed too, last, in a synthesised record under its own public name
(``fallbacks``; never for a list of loaded models, nor for one named node's list).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from functools import partial
from typing import Any

from attrs import frozen
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, FirstError, gatherResults, succeed
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.core import EngineProfile, ModelListFormat, format_duration
from nvpair_tw.dialects import ModelFacts, client_fields, facts_from, record_for
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Catalogue, Node
from nvpair_tw.selection import InventoryBook, IStallTracker
from nvpair_tw.upstream import ReadError, ReadTimeout, get_json, join_url

__all__ = ["UNAVAILABLE_BODY", "AggregateResult", "Cooling", "FirstSeen", "aggregate_model_list"]

log = LevelledLogger(namespace=__name__)

UNAVAILABLE_BODY = json.dumps(
    {"error": "model inventory unavailable", "code": "inventory-unavailable"}
).encode()

Keyed = list[tuple[str, dict[str, Any]]]


@frozen
class AggregateResult:
    """The merged answer: 200 with the engine's envelope, or 503 when no node answered well."""

    status: int
    body: bytes
    stale: tuple[str, ...] = ()
    """The nodes whose part is what the facade last knew of them, not a fresh answer: cooling, or
    stalled on this read (``X-NVPair-Stale``, docs/behaviour.md §4.3)."""


@frozen
class Cooling:
    """How a list treats a node that may be frozen (docs/behaviour.md §4.3): a node cooling in
    ``stalls`` is not asked, and its part is its last good answer to the list (``inventory.lists``),
    else records made from its last inventory or residency; a node that gives no answer within
    ``deadline`` (the response-header timeout, where it is shorter than the list's own bound) has
    stalled: it is cooled, and its part is the same."""

    inventory: InventoryBook
    stalls: IStallTracker
    deadline: float


async def aggregate_model_list(
    fmt: ModelListFormat,
    nodes: Sequence[Node],
    path_and_query: str,
    http: HTTPClient,
    clock: IReactorTime,
    *,
    timeout: float = 10.0,
    facade: EngineProfile | None = None,
    catalogue: Catalogue | None = None,
    allows: Callable[[str], bool] | None = None,
    first_seen: FirstSeen | None = None,
    fallbacks: Catalogue | None = None,
    cooling: Cooling | None = None,
) -> AggregateResult:
    """Fan ``path_and_query`` out to every node (in candidate order) and merge the answers.

    With ``allows`` (a key's model scope, §12.1) only the records with a name it allows are listed.
    A synthesised record gets the fields the engine's clients cannot do without (§17.6), its
    ``modified_at`` / ``created`` from ``first_seen`` (a fresh book when None). With
    ``fallbacks``, its models that only a listed fallback serves are listed too (§16.2). With
    ``cooling``, no cooling node is waited on, and each good answer is kept for when it cools.

    Cancelling the coroutine's Deferred cancels every read; it then fails with ``CancelledError``.
    """
    bound = timeout if cooling is None else min(timeout, cooling.deadline)
    now_cooling = frozenset[str]() if cooling is None else cooling.stalls.cooling()
    reads: list[Deferred[_Part]] = []
    for node in nodes:
        ask = _ask(fmt, facade, node, path_and_query)
        if cooling is not None and node.id in now_cooling:
            log.debug("model list: {node} is cooling, not asked", node=node.id)
            reads.append(succeed(_remembered(fmt, ask, node, cooling)))
        else:
            reads.append(Deferred.fromCoroutine(_part(fmt, ask, node, http, clock, bound, cooling)))
    try:
        parts = await gatherResults(reads, consumeErrors=True)
    except FirstError as error:  # only cancellation gets here: _part skips every node fault
        error.subFailure.raiseException()
    stale = tuple(node.id for node, part in zip(nodes, parts, strict=True) if part.stale)
    if all(part.records is None for part in parts):
        return AggregateResult(status=503, body=UNAVAILABLE_BODY, stale=stale)
    merge = _Merge(fmt, facade, catalogue, allows, first_seen, clock.seconds())
    for node, part in zip(nodes, parts, strict=True):
        if part.records is not None:
            merge.add(node, part.records, part.rank)
    if fallbacks is not None and not fmt.per_node:
        merge.add_fallback_only(fallbacks)
    body = json.dumps(fmt.envelope(merge.records())).encode()
    return AggregateResult(status=200, body=body, stale=stale)


class _Rank(IntEnum):
    """Which record of one model wins (docs/behaviour.md §17.6): a node of the facade's own kind,
    else one that speaks the list natively, else a synthesised one; among equals, the first."""

    OWN = 0
    NATIVE = 1
    SYNTHESISED = 2


class FirstSeen:
    """When the proxy first saw each model of a list (clock seconds, by public key): the
    ``modified_at`` / ``created`` of a record that lacks one (§17.6). At most :data:`LIMIT` names
    are kept (node-controlled names cannot grow it without bound); beyond, a new name is "now"."""

    LIMIT = 16384

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def at(self, key: str, now: float) -> float:
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= self.LIMIT:
                return now
            seen = self._seen[key] = now
        return seen


class _Merge:
    """Records merged in candidate order, de-duplicated by key, the best-ranked record of each key
    kept at the place the key first appeared."""

    def __init__(
        self,
        fmt: ModelListFormat,
        facade: EngineProfile | None,
        catalogue: Catalogue | None,
        allows: Callable[[str], bool] | None,
        first_seen: FirstSeen | None,
        now: float,
    ) -> None:
        self._fmt, self._facade, self._catalogue, self._allows = fmt, facade, catalogue, allows
        self._first_seen = first_seen if first_seen is not None else FirstSeen()
        self._now = now
        self._slots: dict[tuple[str, str], tuple[_Rank, dict[str, Any]]] = {}

    def add(self, node: Node, records: Keyed, rank: _Rank) -> None:
        fmt, facade, catalogue = self._fmt, self._facade, self._catalogue
        for key, record in records:
            if catalogue is not None and catalogue.by_name:
                rule = node.kind_of(facade).normalise if facade is not None else str.strip
                key, record = _public(fmt, catalogue, rule, key, record)
            if self._allows is not None and not _allowed(self._allows, key, record):
                continue
            slot = (key, node.id if fmt.per_node else "")
            held = self._slots.get(slot)
            if held is not None and held[0] <= rank:
                continue
            if rank is _Rank.SYNTHESISED:
                first = self._first_seen.at(key, self._now)
                owner = node.kind_of(facade).name if facade is not None else "nvpair"
                record = client_fields(fmt.path, record, public=key, first_seen=first, owner=owner)
            self._slots[slot] = (
                rank,
                {**record, "nvpair_node": node.id} if fmt.per_node else record,
            )

    def add_fallback_only(self, catalogue: Catalogue) -> None:
        """Each model of ``catalogue`` that no record lists, one of whose fallbacks one does
        (docs/behaviour.md §16.2): a record of its own, synthesised, after the others."""
        fmt, allows = self._fmt, self._allows
        rule = self._facade.normalise if self._facade is not None else str.strip
        listed = {rule(key) for key, _ in self._slots}
        for public, policy in catalogue.policies.items():
            served = any(rule(catalogue.public(name)) in listed for name in policy.fallbacks)
            if not served or rule(public) in listed or (allows is not None and not allows(public)):
                continue
            try:
                record = record_for(fmt.path, ModelFacts(public))
            except ValueError:  # a list this module cannot shape
                return
            key = fmt.record_key(record) or public  # normalised as a node's record is
            first = self._first_seen.at(key, self._now)
            record = client_fields(fmt.path, record, public=key, first_seen=first, owner="nvpair")
            self._slots[(key, "")] = (_Rank.SYNTHESISED, record)

    def records(self) -> list[dict[str, Any]]:
        return [record for _, record in self._slots.values()]


@frozen
class _Ask:
    """What one node is asked for a list: ``path`` (its good answer is kept under it), ``target``
    (the path and query sent), how an answer becomes keyed records (``keyed``, ValueError when it
    is not that list) and how its records rank."""

    path: str
    target: str
    keyed: Callable[[Any], Keyed]
    rank: _Rank


@frozen
class _Part:
    """One node's part of the answer: its keyed records, or None (down, bad, unknown); ``stale``
    when they are what the facade last knew rather than a fresh answer."""

    records: Keyed | None
    rank: _Rank = _Rank.SYNTHESISED
    stale: bool = False


def _ask(
    fmt: ModelListFormat, facade: EngineProfile | None, node: Node, path_and_query: str
) -> _Ask | None:
    """The list ``node`` is asked: the facade's own (the client's path and query) where it speaks
    it, else its kind's own list, its records synthesised (§11.3); None when there is nothing to
    ask (what a node of a kind without residency has loaded is unknown)."""
    if facade is None or node.speaks(facade, fmt.path):
        own = facade is None or node.kind_of(facade).name == facade.name
        return _Ask(fmt.path, path_and_query, partial(_native, fmt), _OWN_OR_NATIVE[own])
    kind = node.kind_of(facade)
    if fmt.per_node:
        if kind.residency is None:
            return None
        path = kind.residency.path
    else:
        path = kind.facts_list or kind.inventory.path
    return _Ask(path, path, partial(_from_facts, fmt, path), _Rank.SYNTHESISED)


_OWN_OR_NATIVE = {True: _Rank.OWN, False: _Rank.NATIVE}


async def _part(
    fmt: ModelListFormat,
    ask: _Ask | None,
    node: Node,
    http: HTTPClient,
    clock: IReactorTime,
    bound: float,
    cooling: Cooling | None,
) -> _Part:
    """One node's part, asked now: a fresh answer (kept, with ``cooling``), None when it is down,
    non-200 or malformed; a stall cools it and its part is what was last known (``_remembered``)."""
    if ask is None:
        return _Part([])
    url = join_url(node.public_url, ask.target)
    try:
        document = await get_json(http, clock, url, timeout=bound, authorization=node.authorization)
        records = ask.keyed(document)
    except ReadTimeout as error:
        if cooling is None:
            return _skipped(node, error, ask.rank)
        cooling.stalls.cool(node.id, f"no model list within {format_duration(bound)}")
        return _remembered(fmt, ask, node, cooling)
    except (ReadError, ValueError) as error:
        return _skipped(node, error, ask.rank)
    if cooling is not None:
        cooling.inventory.lists.keep(node, ask.path, document)
    return _Part(records, ask.rank)


def _skipped(node: Node, error: Exception, rank: _Rank) -> _Part:
    log.debug("model list from {node} skipped: {why}", node=node.id, why=str(error))
    return _Part(None, rank)


def _remembered(fmt: ModelListFormat, ask: _Ask | None, node: Node, cooling: Cooling) -> _Part:
    """The part of a node not waited on: its last good answer to the list, else records made
    from its last inventory (for a list of loaded models, its last residency), synthesised
    (§17.6); None when nothing is known of it."""
    if ask is None:
        return _Part([])
    inventory = cooling.inventory
    document = inventory.lists.last(node, ask.path)
    if document is not None:
        try:
            return _Part(ask.keyed(document), ask.rank, stale=True)
        except ValueError:
            pass
    if fmt.per_node:
        names, loaded = inventory.loaded(node.id), True
    else:
        names, loaded = inventory.models(node.id) if inventory.known(node.id) else None, None
    if names is None:
        return _Part(None, stale=True)
    try:
        records = _made(fmt, (ModelFacts(name, loaded=loaded) for name in sorted(names)))
    except ValueError:  # a list this module cannot shape
        return _Part(None, stale=True)
    return _Part(records, _Rank.SYNTHESISED, stale=True)


def _native(fmt: ModelListFormat, document: Any) -> Keyed:
    """A node's answer to the facade's own list, keyed (ValueError: malformed)."""
    listed = document.get(fmt.list_field) if isinstance(document, dict) else None
    if not isinstance(listed, list):
        raise ValueError("malformed list")
    keyed: Keyed = []
    for record in listed:
        key = fmt.record_key(record) if isinstance(record, dict) else None
        if key is not None:
            keyed.append((key, record))
    return keyed


def _from_facts(fmt: ModelListFormat, path: str, document: Any) -> Keyed:
    """A node of another kind's own list at ``path``, as records synthesised in the facade's shape
    (unknown fields absent); for a list of loaded models, only what it reports loaded."""
    return _made(fmt, [f for f in facts_from(path, document) if not fmt.per_node or f.loaded])


def _made(fmt: ModelListFormat, facts: Iterable[ModelFacts]) -> Keyed:
    keyed: Keyed = []
    for each in facts:
        record = record_for(fmt.path, each)
        key = fmt.record_key(record)
        if key is not None:
            keyed.append((key, record))
    return keyed


_NAME_FIELDS = ("name", "model", "id", "key")


def _allowed(allows: Callable[[str], bool], key: str, record: dict[str, Any]) -> bool:
    """Whether a key's scope allows the record: one of the names it is listed under."""
    names = [n for n in (record.get(f) for f in _NAME_FIELDS) if isinstance(n, str)]
    return any(allows(n) for n in [*names, key])


def _public(
    fmt: ModelListFormat,
    catalogue: Catalogue,
    rule: Callable[[str], str],
    key: str,
    record: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """A record listed under one of a declared model's names, renamed to its public name (§11.4);
    others unchanged."""
    names = [n for n in (record.get(f) for f in _NAME_FIELDS) if isinstance(n, str)]
    public = next((p for p in (catalogue.public_of(n, rule) for n in names) if p), None)
    if public is None or all(n == public for n in names):
        return key, record
    renamed = {**record, **{f: public for f in _NAME_FIELDS if isinstance(record.get(f), str)}}
    return fmt.record_key(renamed) or public, renamed
