# -*- test-case-name: tests.nodes.test_policy -*-
"""How the operator wants a model run (docs/behaviour.md §16.1, §16.2): the ``defaults``, ``force``,
``fallbacks`` and ``fallback_after`` of a ``[[model]]`` table, read and checked when the nodes
file loads.

``defaults`` and ``force`` hold top-level request fields (and Ollama ``options`` entries, merged one
level deep); the fields that say what is run and how it is answered (``model``, ``messages``,
``prompt``, ``input``, ``stream``) may not be set, and no two keys of one table may be equal under
``casefold()`` (a request's keys are matched that way, §14.1). ``fallbacks`` are public names in
order; a cycle among them is refused (:func:`check_fallbacks`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from attrs import field, frozen

from nvpair_tw.core import Least, read_duration

__all__ = [
    "NO_POLICY",
    "POLICY_FIELDS",
    "ModelPolicy",
    "PolicyError",
    "check_fallbacks",
    "parse_policy",
]

POLICY_FIELDS = frozenset({"defaults", "force", "fallbacks", "fallback_after"})
"""The fields of a ``[[model]]`` table this module reads."""

RESERVED = ("model", "messages", "prompt", "input", "stream")
"""Request fields a table may not set (docs/behaviour.md §16.1)."""

OPTIONS = "options"
"""The one field merged one level deep rather than replaced."""


class PolicyError(ValueError):
    """A table's ``defaults``/``force``/``fallbacks``/``fallback_after`` is invalid (one line)."""


@frozen(eq=False)
class ModelPolicy:
    """One model's table: request fields set when the client did not (``defaults``) and always
    (``force``), its fallback models (public names, in order) and how long a request may wait in
    the queue before it goes to one (``fallback_after``, seconds; None: never for waiting)."""

    defaults: Mapping[str, Any] = field(factory=dict)
    force: Mapping[str, Any] = field(factory=dict)
    fallbacks: tuple[str, ...] = ()
    fallback_after: float | None = None

    @property
    def edits(self) -> bool:
        """Whether the table changes a request's body."""
        return bool(self.defaults or self.force)


NO_POLICY = ModelPolicy()


def parse_policy(at: str, entry: Mapping[str, Any]) -> ModelPolicy:
    """The policy of one ``[[model]]`` table (``at`` names it in errors); raises
    :class:`PolicyError`."""
    defaults = _fields(f"{at}: defaults", entry.get("defaults", {}))
    force = _fields(f"{at}: force", entry.get("force", {}))
    fallbacks = entry.get("fallbacks", [])
    if not isinstance(fallbacks, list) or not all(
        isinstance(name, str) and name.strip() for name in fallbacks
    ):
        raise PolicyError(f"{at}: fallbacks: a list of non-empty model names")
    after = entry.get("fallback_after")
    seconds: float | None = None
    if after is not None:
        if not isinstance(after, str):
            raise PolicyError(
                f'{at}: fallback_after: a quoted duration such as "30s", not {after!r}'
            )
        try:
            seconds = read_duration(f"{at}: fallback_after", after, Least.ZERO)
        except ValueError as error:
            raise PolicyError(str(error)) from None
    names = tuple(dict.fromkeys(name.strip() for name in fallbacks))
    return ModelPolicy(defaults, force, names, seconds)


def _fields(at: str, table: Any) -> dict[str, Any]:
    """A ``defaults``/``force`` table checked: a table of JSON values, no reserved field, no two
    keys folding alike, ``options`` a table."""
    if not isinstance(table, dict):
        raise PolicyError(f'{at}: must be a table, e.g. {{ keep_alive = "30m" }}')
    seen: dict[str, str] = {}
    for key, value in table.items():
        folded = key.casefold()
        if folded in RESERVED:
            raise PolicyError(
                f"{at}: {key!r} may not be set here (model, messages, prompt, input and stream"
                " are the client's)"
            )
        if folded in seen:
            raise PolicyError(f"{at}: {seen[folded]!r} and {key!r} are the same field")
        seen[folded] = key
        if folded == OPTIONS and not isinstance(value, dict):
            raise PolicyError(f"{at}: options: must be a table, e.g. {{ num_ctx = 16384 }}")
        _json_only(f"{at}: {key}", value)
    return dict(table)


def _json_only(at: str, value: Any) -> None:
    """Refuse a TOML value JSON cannot carry (dates and times)."""
    if isinstance(value, datetime.date | datetime.time):
        raise PolicyError(f"{at}: a date or time is not a JSON value; quote it as a string")
    if isinstance(value, dict):
        for key, inner in value.items():
            _json_only(f"{at}.{key}", inner)
    elif isinstance(value, list):
        for inner in value:
            _json_only(at, inner)


def check_fallbacks(
    where: str, policies: Mapping[str, ModelPolicy], public: Callable[[str], str]
) -> None:
    """Refuse a cycle among the fallbacks (``public``: a declared name to its public name): a
    model that is, through fallbacks, its own fallback (docs/behaviour.md §16.2)."""
    graph = {name: [public(f) for f in policy.fallbacks] for name, policy in policies.items()}
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        _walk(where, graph, start, path, done)


def _walk(
    where: str, graph: Mapping[str, list[str]], name: str, path: list[str], done: set[str]
) -> None:
    if name in path:
        cycle = " -> ".join([*path[path.index(name) :], name])
        raise PolicyError(f"{where}: fallbacks form a cycle: {cycle}")
    if name in done:
        return
    path.append(name)
    for after in graph.get(name, ()):
        _walk(where, graph, after, path, done)
    path.pop()
    done.add(name)
