"""The answer rename on native routes: every ``"model":"<local>"`` becomes the client's name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair_tw.dialects import renamer
from tests.dialects.streams import chat_stream

pytestmark = pytest.mark.timeout(60)

NDJSON = (
    b'{"model":"llama3.1:8b","created_at":"2026-12-01T00:36:22.6Z",'
    b'"message":{"role":"assistant","content":"\\"model\\":\\"llama3.1:8b\\""},"done":false}\n'
    b'{"model": "llama3.1:8b","done":true}\n'
)


def test_every_model_member_is_renamed_and_other_bytes_kept() -> None:
    r = renamer("llama3.1:8b", "meta-llama-3.1-8b-instruct", b"application/x-ndjson")
    out = r.feed(NDJSON) + r.end()
    assert out == NDJSON.replace(
        b'{"model":"llama3.1:8b"', b'{"model":"meta-llama-3.1-8b-instruct"'
    )
    assert r.content_type == b"application/x-ndjson"


def test_the_spaced_form_is_renamed_when_it_is_the_nodes_form() -> None:
    r = renamer("m", "client", b"application/json")
    out = r.feed(b'{"id": "x", "model": "m", "choices": []}') + r.end()
    assert out == b'{"id": "x", "model": "client", "choices": []}'


def test_the_first_form_seen_is_the_only_one_tried_afterwards() -> None:
    r = renamer("m", "c", b"application/x-ndjson")
    assert r.feed(b'{"model":"m"}\n') == b'{"model":"c"}\n'
    assert r.feed(b'{"model": "m"}\n') == b'{"model": "m"}\n'


def test_sse_and_whole_documents_are_renamed_too() -> None:
    r = renamer("smollm2", "tiny", b"text/event-stream")
    data = chat_stream("Hi")
    assert r.feed(data) + r.end() == data.replace(b'"model":"smollm2"', b'"model":"tiny"')
    whole = renamer("smollm2", "tiny", None)
    assert whole.content_type == b"application/json; charset=utf-8"
    assert whole.feed(b'{"model":"smollm2","x":1}') + whole.end() == b'{"model":"tiny","x":1}'


def test_a_name_that_is_a_prefix_of_another_is_not_renamed() -> None:
    r = renamer("llama3", "x", b"application/x-ndjson")
    assert r.feed(b'{"model":"llama3.1"}\n') + r.end() == b'{"model":"llama3.1"}\n'


def test_the_same_name_passes_bytes_untouched() -> None:
    r = renamer("a", "a", b"application/x-ndjson")
    data = b'{"model":"a"}\n'
    assert r.feed(data) is data and r.end() == b""


def test_only_a_possible_pattern_start_is_held_back() -> None:
    r = renamer("llama3", "x", b"application/x-ndjson")
    assert r.feed(b'{"done":true}\n') == b'{"done":true}\n'
    assert r.feed(b'{"mod') == b"{"
    assert r.feed(b'el":"llama3"}\n') == b'"model":"x"}\n'


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, len(NDJSON)), max_size=12))
def test_any_split_gives_the_same_renamed_bytes(cuts: list[int]) -> None:
    whole = renamer("llama3.1:8b", "\u00e9", b"application/x-ndjson")
    expected = whole.feed(NDJSON) + whole.end()
    r = renamer("llama3.1:8b", "\u00e9", b"application/x-ndjson")
    points = sorted(set(cuts))
    pieces = [NDJSON[a:b] for a, b in zip([0, *points], [*points, len(NDJSON)], strict=True)]
    assert b"".join(r.feed(p) for p in pieces) + r.end() == expected
