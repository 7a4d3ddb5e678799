# -*- test-case-name: tests.nodes.test_catalogue -*-
"""One model, many names (docs/behaviour.md §11.4): the ``[[model]]`` tables of the nodes file.

Engines name the same weights differently (``llama3.1:8b`` in Ollama, ``meta-llama-3.1-8b-instruct``
in LM Studio). A :class:`Catalogue` maps every name a client may send (the public name or any
alias) to its :class:`ModelNames`; routing asks which of those names a node's inventory holds, under
the node kind's own rule, and forwards that local name. A model no table mentions is its own
public name.

A table may also say how its model is run and what serves in its place (docs/behaviour.md §16.1,
§16.2): its :class:`~nvpair_tw.nodes._policy.ModelPolicy`, by public name (:meth:`Catalogue.policy`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import field, frozen

from nvpair_tw.core import did_you_mean
from nvpair_tw.nodes._policy import (
    NO_POLICY,
    POLICY_FIELDS,
    ModelPolicy,
    PolicyError,
    check_fallbacks,
    parse_policy,
)

__all__ = ["Catalogue", "CatalogueError", "ModelNames", "parse_catalogue"]


class CatalogueError(ValueError):
    """A ``[[model]]`` table is invalid; the message is one clear line."""


@frozen
class ModelNames:
    """One model: its public name first, then its aliases, as the file gives them."""

    public: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.public, *self.aliases)


@frozen
class Catalogue:
    """Every declared name (stripped) to its model; empty when the file declares none."""

    by_name: Mapping[str, ModelNames]
    policies: Mapping[str, ModelPolicy] = field(factory=dict)
    """Public name to its table's defaults and fallbacks (§16.1, §16.2); only tables with any."""

    @classmethod
    def empty(cls) -> Catalogue:
        return cls({})

    @classmethod
    def of(
        cls, models: tuple[ModelNames, ...], policies: Mapping[str, ModelPolicy] | None = None
    ) -> Catalogue:
        return cls({name: model for model in models for name in model.names}, policies or {})

    def policy(self, public: str) -> ModelPolicy:
        """The table of the model whose public name is ``public`` (an empty one when none)."""
        return self.policies.get(public, NO_POLICY)

    def lookup(self, requested: str) -> ModelNames:
        """The model a requested name stands for: a declared one, or the name on its own."""
        found = self.by_name.get(requested.strip())
        return found if found is not None else ModelNames(requested.strip())

    def public(self, name: str) -> str:
        """The public name of ``name`` (itself when undeclared)."""
        stripped = name.strip()
        found = self.by_name.get(stripped)
        return stripped if found is None else found.public

    def public_of(self, listed: str, normalise: Callable[[str], str]) -> str | None:
        """The public name of a model a node lists as ``listed``, comparing every declared name
        under the node kind's rule (``smollm2`` is Ollama's ``smollm2:latest``); None when it is
        not declared."""
        found = self.by_name.get(listed.strip())
        if found is not None:
            return found.public
        wanted = normalise(listed.strip())
        for name, model in self.by_name.items():
            if normalise(name) == wanted:
                return model.public
        return None

    def models(self) -> tuple[ModelNames, ...]:
        """The declared models, each once, by public name."""
        unique = {model.public: model for model in self.by_name.values()}
        return tuple(unique[name] for name in sorted(unique))


def parse_catalogue(where: str, entries: Any) -> Catalogue:
    """The catalogue of a nodes file's ``model`` array (absent: empty).

    Raises :class:`CatalogueError` for a table that is not ``name`` + ``aliases`` strings, or a
    name declared under two public names.
    """
    if entries is None:
        return Catalogue.empty()
    if not isinstance(entries, list):
        raise CatalogueError(f"{where}: 'model' must be an array of tables ([[model]])")
    models: list[ModelNames] = []
    policies: dict[str, ModelPolicy] = {}
    owner: dict[str, str] = {}
    for index, entry in enumerate(entries, start=1):
        at = f"{where}: model {index}"
        if not isinstance(entry, dict):
            raise CatalogueError(f"{at}: must be a table")
        unknown = sorted(set(entry) - {"name", "aliases"} - POLICY_FIELDS)
        if unknown:
            hint = did_you_mean(unknown[0], {"name", "aliases"} | POLICY_FIELDS)
            raise CatalogueError(f"{at}: unknown field {unknown[0]!r}{hint}")
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise CatalogueError(f"{at}: name: required, a non-empty string")
        aliases = entry.get("aliases", [])
        if not isinstance(aliases, list) or not all(
            isinstance(a, str) and a.strip() for a in aliases
        ):
            raise CatalogueError(f"{at} ({name!r}): aliases: a list of non-empty strings")
        model = ModelNames(name.strip(), tuple(dict.fromkeys(a.strip() for a in aliases)))
        if any(m.public == model.public for m in models):
            raise CatalogueError(f"{at} ({name!r}): declared twice; give its aliases in one table")
        for each in model.names:
            if owner.get(each, model.public) != model.public:
                raise CatalogueError(
                    f"{at} ({name!r}): {each!r} is already a name of {owner[each]!r};"
                    " a name belongs to one model"
                )
            owner[each] = model.public
        models.append(model)
        if POLICY_FIELDS & set(entry):
            policies[model.public] = _policy(f"{at} ({name!r})", entry)
    catalogue = Catalogue.of(tuple(models), policies)
    try:
        check_fallbacks(where, policies, catalogue.public)
    except PolicyError as error:
        raise CatalogueError(str(error)) from None
    return catalogue


def _policy(at: str, entry: Mapping[str, Any]) -> ModelPolicy:
    try:
        return parse_policy(at, entry)
    except PolicyError as error:
        raise CatalogueError(str(error)) from None
