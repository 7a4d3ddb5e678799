"""The byte-preserving request rename."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair_tw.core import Outline, Outlined, outline_body
from nvpair_tw.dialects import rename_outlined, rename_request
from nvpair_tw.inbound import Parsed, parse_document
from tests.jsonbodies import bodies
from tests.old_rewriters import old_rename_request

pytestmark = pytest.mark.timeout(60)


def test_only_the_top_level_model_value_changes() -> None:
    body = b'{"options": {"model": "keep"}, "model" :\t"llama3", "z": "\\u00e9"}'
    assert rename_request(body, 'we\u00efrd "name"') == (
        b'{"options": {"model": "keep"}, "model" :\t"we\xc3\xafrd \\"name\\"", "z": "\\u00e9"}'
    )


@pytest.mark.parametrize(
    "body", [b"[1]", b'{"model": "a"} x', b'{"a": 1}', b'{"model": }', b"\xff"]
)
def test_a_body_that_is_not_one_object_naming_a_model_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        rename_request(body, "x")


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    before=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "model"), values, max_size=4),
    after=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "model"), values, max_size=4),
    old=st.text(max_size=10),
    new=st.text(max_size=10),
    indent=st.sampled_from([None, 1, 4]),
    ascii_only=st.booleans(),
)
def test_rename_preserves_every_byte_but_the_model_value(
    before: dict[str, object],
    after: dict[str, object],
    old: str,
    new: str,
    indent: int | None,
    ascii_only: bool,
) -> None:
    document = {**before, "model": old, **{k: v for k, v in after.items() if k not in before}}
    body = json.dumps(document, indent=indent, ensure_ascii=ascii_only).encode()
    renamed = rename_request(body, new)
    old_json = json.dumps(old, ensure_ascii=ascii_only).encode()
    new_json = json.dumps(new, ensure_ascii=False).encode()
    marker = b'"model": ' + old_json
    start = body.index(marker) + len(b'"model": ')
    assert renamed == body[:start] + new_json + body[start + len(old_json) :]
    assert json.loads(renamed) == {**document, "model": new}


# --- the rename on the one parse's spans (docs/behaviour.md §14.1) -------------------------------


@settings(max_examples=300, deadline=None)
@given(body=bodies(), new=st.text(max_size=10))
def test_the_rename_on_the_parses_spans_is_byte_identical_to_the_scanning_one(
    body: bytes, new: str
) -> None:
    parsed = parse_document(body)
    assert isinstance(parsed, Parsed)
    source = Outlined(body, parsed)
    if "model" not in parsed.doc:
        with pytest.raises(ValueError):
            rename_outlined(source, new)
        return
    expected = old_rename_request(body, new)
    renamed = rename_outlined(source, new)
    assert renamed.body == expected == rename_request(body, new)
    assert renamed.outline == outline_body(expected).outline


def test_the_rename_on_spans_reads_nothing_but_the_model_value() -> None:
    body = b'{"x":\xff\xff,"model":"a"}'
    outline = Outline(0, len(body) - 1, (("x", 5, 7), ("model", 16, 19)))
    assert rename_outlined(Outlined(body, outline), "b\u00e9").body == (
        b'{"x":\xff\xff,"model":"b\xc3\xa9"}'
    )
