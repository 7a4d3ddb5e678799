"""The JSON object scanner the byte-preserving body edits share (assembly, the catalogue rename)."""

from __future__ import annotations

import pytest

from nvpair_tw.core import (
    Edit,
    Outline,
    Outlined,
    object_members,
    outline_body,
    set_members,
    skip_whitespace,
)

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


def test_an_outline_is_in_the_bodys_utf8_bytes() -> None:
    body = ' {"\u00e9" : "\u4e2d", "b":[1]} '.encode()
    outlined = outline_body(body)
    assert outlined.body is body
    assert outlined.outline == Outline(1, len(body) - 2, (("\u00e9", 9, 14), ("b", 20, 23)))


def _true(old: memoryview | None) -> bytes:
    return b"true"


def _seen(old: memoryview | None) -> bytes:
    return b"null" if old is None else b"[" + old.tobytes() + b"]"


@pytest.mark.parametrize(
    ("body", "edits", "edited"),
    [
        (b'{"a":1, "s" : false}', {"s": _true}, b'{"a":1, "s" : true}'),
        (b'{"s":"\xc3\xa9", "s":2}', {"s": _seen}, b'{"s":["\xc3\xa9"], "s":[2]}'),
        (b" { \n } ", {"s": _true, "o": _seen}, b' {"s":true,"o":null} '),
        (b'{ "a": 1}', {"s": _true, "a": _seen}, b'{"s":true, "a": [1]}'),
        (b'{"a": 1}', {}, b'{"a": 1}'),
    ],
)
def test_set_members_changes_only_the_named_values_and_gives_the_new_outline(
    body: bytes, edits: dict[str, Edit], edited: bytes
) -> None:
    result = set_members(outline_body(body), edits)
    assert result.body == edited
    assert result.outline == outline_body(edited).outline


def test_set_members_reads_nothing_but_the_values_it_changes() -> None:
    # not JSON, nor UTF-8, outside the spans the outline names: nothing there is read
    body = b'{"s":false,\xff\xfe garbage ]]'
    outline = Outline(0, len(body) - 1, (("s", 5, 10), ("x", 11, len(body) - 1)))
    result = set_members(Outlined(body, outline), {"s": _true})
    assert result.body == b'{"s":true,\xff\xfe garbage ]]'
    assert result.outline == Outline(0, len(body) - 2, (("s", 5, 9), ("x", 10, len(body) - 2)))
