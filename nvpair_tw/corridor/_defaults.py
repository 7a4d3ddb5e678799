# -*- test-case-name: tests.corridor.test_defaults -*-
"""The request as the served model's table wants it (docs/behaviour.md §16.1, §16.2).

:func:`served` gives the :class:`~nvpair_tw.corridor._inbound.Inbound` a model is asked with: the
served model's ``defaults`` set where the client did not set the field (absent, or ``null`` as Go
engines read it), its ``force`` set always, ``options`` merged one level deep, and — for a
fallback — the ``model`` value replaced by the fallback's public name. The body is edited once,
where the one parse's outline says (§14.1), never read again: the new bytes, document and outline
are what the gate, translation and every attempt use. A table's key replaces the client's key that
equals it under ``casefold()`` in place, spelled as the client spelled it, so no duplicate key is
ever made (Go engines would keep the last one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from attrs import evolve

from nvpair_tw.core import Edit, Outlined, RouteKind, set_members
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.nodes import ModelPolicy

__all__ = ["served"]

_OPTIONS = "options"
_MODEL_KEYS = ("model", "name")


class _Wins(Enum):
    """Who keeps a field both the client and the table set."""

    CLIENT = "defaults"
    TABLE = "force"


def served(inbound: Inbound, policy: ModelPolicy, model: str | None = None) -> Inbound:
    """``inbound`` as ``policy``'s model gets it (``model``: the public name it is renamed to, a
    fallback's; None keeps the client's). An inference's body only; any other is unchanged."""
    doc, outline = inbound.doc, inbound.outline
    if doc is None or outline is None or (not policy.edits and model is None):
        return inbound
    spelled = {key.casefold(): key for key, _, _ in outline.members}  # grows as keys are added
    changes: dict[str, Any] = {}
    if inbound.kind is RouteKind.INFERENCE:
        _apply(changes, doc, spelled, policy.defaults, _Wins.CLIENT)
        _apply(changes, doc, spelled, policy.force, _Wins.TABLE)
    if model is not None:
        key = next((spelled[k] for k in _MODEL_KEYS if k in spelled), None)
        if key is not None:
            changes[key] = model
    if not changes:
        return inbound
    edits = {key: _encoded(value) for key, value in changes.items()}
    edited = set_members(Outlined(inbound.body, outline), edits)
    return evolve(
        inbound,
        body=edited.body,
        doc={**doc, **changes},
        outline=edited.outline,
        model=model if model is not None else inbound.model,
    )


def _apply(
    changes: dict[str, Any],
    doc: Mapping[str, Any],
    spelled: dict[str, str],
    table: Mapping[str, Any],
    wins: _Wins,
) -> None:
    """Add ``table``'s fields to ``changes``, under the client's spelling of each key (or the
    spelling a field added before it has: ``defaults`` and ``force`` may spell one differently)."""
    for key, value in table.items():
        folded = key.casefold()
        client_key = spelled.setdefault(folded, key)
        current = changes.get(client_key, doc.get(client_key))
        if folded == _OPTIONS and isinstance(current, dict):
            merged = _merged(current, value, wins)
            if merged != current:
                changes[client_key] = merged
        elif current is None or wins is _Wins.TABLE:
            changes[client_key] = value


def _merged(client: Mapping[str, Any], table: Mapping[str, Any], wins: _Wins) -> dict[str, Any]:
    """The client's ``options`` with the table's entries, one level deep, each entry matched
    under ``casefold()`` and replaced in place."""
    merged = dict(client)
    spelled = {key.casefold(): key for key in client}
    for key, value in table.items():
        client_key = spelled.get(key.casefold(), key)
        if merged.get(client_key) is None or wins is _Wins.TABLE:
            merged[client_key] = value
    return merged


def _encoded(value: Any) -> Edit:
    """The edit that sets a member to ``value`` (compact JSON, UTF-8)."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return lambda old: data
