# -*- test-case-name: tests.selection.test_contexts -*-
"""Context fit (docs/behaviour.md §15.3): what context each node serves a model with, and which
candidates a request fits.

The readings are what the engines say today: Ollama's ``/api/ps`` ``context_length`` of each
loaded model (where its version gives it), llama.cpp's ``/props`` (one model per server: the
per-slot context, ``n_ctx`` divided by ``total_slots``, or the slot's own
``default_generation_settings.n_ctx``). :data:`ANY_MODEL` keys a context that holds for whatever
the node serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from attrs import frozen

__all__ = ["ANY_MODEL", "Fit", "fit", "props_context", "ps_contexts", "shown_contexts"]

ANY_MODEL = "*"


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def ps_contexts(document: Any) -> dict[str, int]:
    """Each loaded model's context length from an Ollama ``/api/ps`` answer, by the name its
    residency is read by (``model``, else ``name``); models without one are left out."""
    models = document.get("models") if isinstance(document, dict) else None
    found: dict[str, int] = {}
    for entry in models if isinstance(models, list) else ():
        if not isinstance(entry, dict):
            continue
        name = entry.get("model") or entry.get("name")
        length = _positive(entry.get("context_length"))
        if isinstance(name, str) and name and length is not None:
            found[name] = length
    return found


def props_context(document: Any) -> dict[str, int]:
    """llama.cpp's per-slot context from its ``/props`` answer ({} when it does not say)."""
    if not isinstance(document, dict):
        return {}
    total, slots = _positive(document.get("n_ctx")), _positive(document.get("total_slots"))
    if total is not None:
        return {ANY_MODEL: total // (slots or 1)}
    settings = document.get("default_generation_settings")
    per_slot = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return {} if per_slot is None else {ANY_MODEL: per_slot}


@frozen
class Fit:
    """The candidates a request fits, in their order, and whether any does (else: the largest)."""

    nodes: list[str]
    fits: bool


def fit(nodes: Sequence[str], needed: int, context: Callable[[str], int | None]) -> Fit:
    """The nodes whose known context holds ``needed`` tokens, or whose context is unknown; when
    none does, the one with the largest context (§15.3)."""
    lengths = {n: context(n) for n in nodes}
    fitting = [n for n in nodes if (length := lengths[n]) is None or length >= needed]
    if fitting or not nodes:
        return Fit(fitting, True)
    return Fit([max(nodes, key=lambda n: lengths[n] or 0)], False)


def shown_contexts(said: Mapping[str, int], models: Iterable[str]) -> dict[str, int]:
    """Per model, as the node names it, the context it serves the model with, for ``nodes/list``
    and the status page: what the node ``said`` (``NodeFacts.contexts``), a context stated for
    whatever it serves (:data:`ANY_MODEL`, llama.cpp's ``/props``) being each of its ``models``'s;
    {} when the node says none."""
    if ANY_MODEL not in said:
        return dict(sorted(said.items()))
    return {name: said[ANY_MODEL] for name in sorted(models)}
