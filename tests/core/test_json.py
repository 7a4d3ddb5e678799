"""The JSON object scanner the byte-preserving body edits share (assembly, the catalogue rename)."""

from __future__ import annotations

import pytest

from nvpair_tw.core import object_members, skip_whitespace

pytestmark = pytest.mark.timeout(10)


def test_members_carry_the_spans_of_their_values() -> None:
    text = ' {"model" : "m", "options": {"a": [1, 2]}} '
    start = skip_whitespace(text, 0)
    found, end = object_members(text, start)
    assert [(k, text[s:e]) for k, s, e in found] == [
        ("model", '"m"'),
        ("options", '{"a": [1, 2]}'),
    ]
    assert text[end:] == " "
    assert object_members("{ }", 0) == ([], 3)


@pytest.mark.parametrize("text", ["[1]", '{"a" 1}', '{"a": }', '{"a": 1 "b": 2}', "{1: 2}", '{"a'])
def test_anything_but_an_object_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        object_members(text, 0)
