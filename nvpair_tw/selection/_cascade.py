# -*- test-case-name: tests.selection.test_holdings -*-
"""Reading what a node holds: its kind's lists (:data:`~nvpair_tw.selection._holdings.HOLDINGS`)
tried in order until one answers, then, where that list does not say, the context length of each
loaded model asked one model at a time (docs/behaviour.md §17.1, §17.2). Every read is the bounded
control-plane read the inventory poll uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from treq.client import HTTPClient
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.core import EngineProfile
from nvpair_tw.nodes import Node
from nvpair_tw.selection._holdings import HOLDINGS, ContextQuery, Holdings, HoldingsSource
from nvpair_tw.upstream import ReadError, get_json, join_url

__all__ = ["read_contexts", "read_holdings", "sources_of"]


def sources_of(kind: EngineProfile) -> tuple[HoldingsSource, ...]:
    """The lists a node of ``kind`` is asked, richest first: its row of ``HOLDINGS``, else its
    profile's inventory list alone (names only)."""
    listed = HOLDINGS.get(kind.name)
    if listed is not None:
        return listed
    names = kind.inventory.names
    return (
        HoldingsSource(kind.inventory.path, lambda document: Holdings(frozenset(names(document)))),
    )


async def read_holdings(
    http: HTTPClient,
    clock: IReactorTime,
    node: Node,
    sources: Sequence[HoldingsSource],
    timeout: float,
) -> tuple[HoldingsSource, Holdings, Any]:
    """The first of ``sources`` the node answers with a list of its shape, what it says, and the
    answer itself (parsed JSON). Raises the last ``ReadError`` or ``ValueError`` when none does."""
    failure: ReadError | ValueError = ReadError("no model list to read")
    for source in sources:
        try:
            document = await get_json(
                http,
                clock,
                join_url(node.public_url, source.path),
                timeout=timeout,
                authorization=node.authorization,
            )
            return source, source.read(document), document
        except (ReadError, ValueError) as error:
            failure = error
    raise failure


async def read_contexts(
    http: HTTPClient,
    clock: IReactorTime,
    node: Node,
    query: ContextQuery,
    loaded: frozenset[str],
    timeout: float,
) -> Mapping[str, int]:
    """The context length of each of ``loaded``, asked side by side; a model whose answer fails
    or says nothing is left out (its context is unknown)."""
    names = sorted(loaded)

    async def one(name: str) -> int | None:
        try:
            document = await get_json(
                http,
                clock,
                join_url(node.public_url, query.path(name)),
                timeout=timeout,
                authorization=node.authorization,
            )
            return query.read(document)
        except (ReadError, ValueError):
            return None

    found = await gatherResults([Deferred.fromCoroutine(one(name)) for name in names])
    return {name: length for name, length in zip(names, found, strict=True) if length is not None}
