"""Hypothesis strategies for request bodies the strict parse accepts (docs/behaviour.md §14.1),
written out with arbitrary whitespace, escaped or raw non-ASCII, nested values, and the members
the body rewriters change (``model``, ``stream``, ``stream_options``) present or not."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

_WHITESPACE = st.sampled_from(["", "", " ", "\n", "\t", " \r\n  "])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_RESERVED = ("model", "stream", "stream_options")
_MISSING = object()


@st.composite
def _dump(draw: st.DrawFn, value: Any, ascii_only: bool) -> str:
    """``value`` as JSON text, each gap between tokens a drawn whitespace."""
    if isinstance(value, dict):
        members = [
            draw(_WHITESPACE)
            + json.dumps(key, ensure_ascii=ascii_only)
            + draw(_WHITESPACE)
            + ":"
            + draw(_WHITESPACE)
            + draw(_dump(item, ascii_only))
            + draw(_WHITESPACE)
            for key, item in value.items()
        ]
        return "{" + (",".join(members) if members else draw(_WHITESPACE)) + "}"
    if isinstance(value, list):
        items = [
            draw(_WHITESPACE) + draw(_dump(item, ascii_only)) + draw(_WHITESPACE) for item in value
        ]
        return "[" + (",".join(items) if items else draw(_WHITESPACE)) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """One JSON object, as the strict parse accepts it, with arbitrary whitespace and escapes."""
    others = draw(st.dictionaries(st.text(max_size=6), VALUES, max_size=4))
    doc = {key: value for key, value in others.items() if key.casefold() not in _RESERVED}
    members: tuple[tuple[str, st.SearchStrategy[Any]], ...] = (
        ("model", st.text(max_size=10)),
        ("stream", st.none() | st.booleans()),
        (
            "stream_options",
            st.none()
            | st.dictionaries(st.sampled_from(["include_usage", "x"]), VALUES, max_size=2),
        ),
    )
    for name, values in members:
        value: Any = draw(st.one_of(st.just(_MISSING), values))
        if value is not _MISSING:
            doc[name] = value
    order = draw(st.permutations(list(doc)))
    doc = {key: doc[key] for key in order}
    if len({key.casefold() for key in doc}) != len(doc):
        doc = {key: value for key, value in doc.items() if key == key.casefold()} or {}
    text = draw(_WHITESPACE) + draw(_dump(doc, draw(st.booleans()))) + draw(_WHITESPACE)
    return text.encode("utf-8")
