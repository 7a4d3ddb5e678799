"""Tests for nvpair_tw.inbound._parse: one strict reading of a request's path, body and model, the
same whether the body is read at once or in slices, and what a Go engine reads from what the
proxy forwards (docs/behaviour.md §14.1)."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from nvpair_tw.core import Outline, outline_body
from nvpair_tw.inbound import (
    Parsed,
    Rejection,
    Target,
    _parse,
    model_rule,
    parse_body,
    parse_document,
    parse_document_large,
    parse_large,
    parse_target,
    read_model,
    read_models,
)
from tests.golike import go_model, go_path
from tests.jsonbodies import bodies

# --- the path -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "wire"),
    [
        (b"/api/chat", "/api/chat", b"/api/chat"),
        (b"/api/%63hat", "/api/chat", b"/api/chat"),
        (b"/api/./chat", "/api/chat", b"/api/chat"),
        (b"//api/chat", "/api/chat", b"/api/chat"),
        (b"/api//chat", "/api/chat", b"/api/chat"),
        (b"/api/chat/", "/api/chat", b"/api/chat"),
        (b"/v1/../api/chat", "/api/chat", b"/api/chat"),
        (b"/../../api/chat", "/api/chat", b"/api/chat"),
        (b"/api/%2e%2E/api/%2E/chat", "/api/chat", b"/api/chat"),
        (b"/caf%c3%a9", "/caf\u00e9", b"/caf%C3%A9"),
        (b"/a%20b/c%3Fd", "/a b/c?d", b"/a%20b/c%3Fd"),
        (b"/api/tags#fragment", "/api/tags", b"/api/tags"),
        (b"/", "/", b"/"),
        (b"/.", "/", b"/"),
    ],
)
def test_a_path_is_decoded_normalised_and_forwarded_in_one_form(
    raw: bytes, path: str, wire: bytes
) -> None:
    assert parse_target(raw) == Target(path, b"", wire, None)


def test_the_query_is_forwarded_as_the_client_sent_it() -> None:
    target = parse_target(b"/api/%63hat?x=%2F&y=%zz&z")
    assert target == Target("/api/chat", b"x=%2F&y=%zz&z", b"/api/chat?x=%2F&y=%zz&z", None)
    assert parse_target(b"/api/tags?") == Target("/api/tags", b"", b"/api/tags", None)


def test_an_absolute_form_target_is_reduced_to_its_path_and_query() -> None:
    target = parse_target(b"http://node:11434/api/%63hat?q=1")
    assert target == Target("/api/chat", b"q=1", b"/api/chat?q=1", None)
    assert parse_target(b"http://node:11434") == Target("/", b"", b"/", None)


@pytest.mark.parametrize(
    ("raw", "path", "wire", "model_id"),
    [
        (
            b"/v1/models/qwen%2Fqwen3-4b",
            "/v1/models/qwen/qwen3-4b",
            b"/v1/models/qwen%2Fqwen3-4b",
            "qwen/qwen3-4b",
        ),
        (
            b"/api/v1/models/qwen%2fqwen3-4b",
            "/api/v1/models/qwen/qwen3-4b",
            b"/api/v1/models/qwen%2Fqwen3-4b",
            "qwen/qwen3-4b",
        ),
        (
            b"/api/v0/models/llama3:latest",
            "/api/v0/models/llama3:latest",
            b"/api/v0/models/llama3:latest",
            "llama3:latest",
        ),
        (
            b"/api/v1/models/qwen/qwen3-4b",
            "/api/v1/models/qwen/qwen3-4b",
            b"/api/v1/models/qwen/qwen3-4b",
            "qwen/qwen3-4b",
        ),
        (b"/v1/models/x%20y%25", "/v1/models/x y%", b"/v1/models/x%20y%25", "x y%"),
        (b"/v1/models/a/../b", "/v1/models/b", b"/v1/models/b", "b"),
        (b"/v1/models", "/v1/models", b"/v1/models", None),
        (b"/v1/models/", "/v1/models", b"/v1/models", None),
        (b"/api/v1/models", "/api/v1/models", b"/api/v1/models", None),
    ],
)
def test_a_model_id_route_keeps_its_encoded_slash_in_the_id(
    raw: bytes, path: str, wire: bytes, model_id: str | None
) -> None:
    assert parse_target(raw) == Target(path, b"", wire, model_id)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"/a%2Fb", "encoded '/'"),
        (b"/api%2fchat", "encoded '/'"),
        (b"/v1%2Fmodels/x", "encoded '/'"),
        (b"/api/v1/models%2Fload", "encoded '/'"),
        (b"http://h/a%2Fb", "encoded '/'"),
        (b"/a\\b", "backslash"),
        (b"/a%5Cb", "backslash"),
        (b"/v1/models/a%5cb", "backslash"),
        (b"/a%00b", "control"),
        (b"/a%0Ab", "control"),
        (b"/a%7fb", "control"),
        (b"/v1/models/a%09", "control"),
        (b"/a\x01b", "control"),
        (b"/a\x7f", "control"),
        (b"http://h/a\tb", "control"),
        (b"/a%zz", "percent-escape"),
        (b"/a%4", "percent-escape"),
        (b"/a%", "percent-escape"),
        (b"/%ff", "UTF-8"),
        (b"/%c3", "UTF-8"),
        (b"/\xc3(", "UTF-8"),
        (b"/v1/models/a%2F..%2Fb", "model id"),
        (b"/v1/models/%2Fa", "model id"),
        (b"/v1/models/a%2F", "model id"),
        (b"/v1/models/a%2F%2Fb", "model id"),
        (b"*", "target"),
        (b"api/chat", "target"),
        (b"", "target"),
    ],
)
def test_a_path_that_cannot_be_read_one_way_is_bad_path(raw: bytes, why: str) -> None:
    refused = parse_target(raw)
    assert isinstance(refused, Rejection)
    assert (refused.status, refused.code) == (400, "bad-path")
    assert why in refused.message


_SEGMENT_PARTS = st.one_of(
    st.sampled_from(["api", "chat", "v1", "v0", "models", "qwen", "a", "Chat", "~x", "llama3:8b"]),
    st.sampled_from([".", "..", "", "%2e", "%2E%2e", "%2F", "%2f", "%5C", "%", "%g1", "+", "@"]),
    st.sampled_from(list("!$&'()*,;=:?#[] \"<>{}|^`")),
    st.integers(0, 255).map(lambda b: f"%{b:02X}"),
    st.integers(0, 255).map(lambda b: f"%{b:02x}"),
    st.characters(codec="utf-8"),  # no surrogates
)
_PATHS = st.lists(st.lists(_SEGMENT_PARTS, max_size=4).map("".join), max_size=6).map(
    lambda segments: ("/" + "/".join(segments)).encode("utf-8")
)


@settings(max_examples=300, deadline=None)
@given(_PATHS, st.sampled_from([b"", b"?", b"?a=%2F&b", b"#f"]))
def test_a_go_server_reads_the_forwarded_path_as_the_proxy_did(raw: bytes, tail: bytes) -> None:
    target = parse_target(raw + tail)
    if isinstance(target, Rejection):
        assert target.code == "bad-path"
        return
    assert go_path(target.wire) == target.path
    assert parse_target(target.wire) == target  # the wire form is its own normal form
    if target.model_id is not None:
        assert target.path.endswith("/" + target.model_id)


# --- the body -------------------------------------------------------------------------------


def _reads(body: bytes) -> dict[str, Any] | Rejection:
    """``parse_body``, after checking ``parse_large`` gives exactly the same."""
    clock = Clock()
    results: list[Any] = []
    parse_large(body, clock).addBoth(results.append)
    clock.advance(0)
    assert results == [parse_body(body)]
    return parse_body(body)


@pytest.mark.parametrize(
    ("body", "doc"),
    [
        (b"{}", {}),
        (b' \t\r\n{ "model" : "a" , "n" : [ 1 , { } ] }\r\n ', {"model": "a", "n": [1, {}]}),
        (b'{"model":"llama3","options":{"k":1,"k":2}}', {"model": "llama3", "options": {"k": 2}}),
        (b'{"e":"\\ud83d\\ude00"}', {"e": "\U0001f600"}),
        (b'{"e":"\\\\ud800"}', {"e": "\\ud800"}),
        (b'{"\\u006dodel":"a"}', {"model": "a"}),
        (b'{"x":1.5e300,"y":-0.0,"z":123456789012345678901234567890}', None),
        ('{"caf\u00e9":"\u4e2d\U0001f600"}'.encode(), {"caf\u00e9": "\u4e2d\U0001f600"}),
        (b'{"a":' + b"[" * 127 + b"]" * 127 + b"}", None),
        (b'{"a":' + b'{"b":' * 127 + b"1" + b"}" * 127 + b"}", None),
    ],
)
def test_one_json_object_is_read(body: bytes, doc: dict[str, Any] | None) -> None:
    assert _reads(body) == (json.loads(body) if doc is None else doc)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'\xef\xbb\xbf{"model":"a"}', _parse.BOM),
        (b'{"model":"\xff"}', _parse.NOT_UTF8),
        (b'{"model":"\xc0\xaf"}', _parse.NOT_UTF8),
        (b'{"model":"\xed\xa0\x80"}', _parse.NOT_UTF8),
        (b'{"model":"a\xe2\x82"}', _parse.NOT_UTF8),
        (b"[]", _parse.NOT_OBJECT),
        (b'"model"', _parse.NOT_OBJECT),
        (b"null", _parse.NOT_OBJECT),
        (b"", _parse.NOT_OBJECT),
        (b"  ", _parse.NOT_OBJECT),
        (b"{", _parse.SYNTAX),
        (b'{"a":1,}', _parse.SYNTAX),
        (b'{"a" 1}', _parse.SYNTAX),
        (b"{'a':1}", _parse.SYNTAX),
        (b'{"a":[1,]}', _parse.SYNTAX),
        (b'{"a":01}', _parse.SYNTAX),
        (b'{"a":"\x01"}', _parse.SYNTAX),
        (b'{"a":"\\x"}', _parse.SYNTAX),
        (b'{"a":NaN}', _parse.NON_FINITE),
        (b'{"a":[Infinity]}', _parse.NON_FINITE),
        (b'{"a":{"b":-Infinity}}', _parse.NON_FINITE),
        (b'{"a":1e400}', _parse.NON_FINITE),
        (b'{"a":"\\ud800"}', _parse.LONE_SURROGATE),
        (b'{"a":"\\udc00x"}', _parse.LONE_SURROGATE),
        (b'{"a":"\\ud800\\u0041"}', _parse.LONE_SURROGATE),
        (b'{"a":"\\ud83d\\ud83d"}', _parse.LONE_SURROGATE),
        (b'{"\\ud800":1}', _parse.LONE_SURROGATE),
        (b'{"a":[{"\\udfff":1}]}', _parse.LONE_SURROGATE),
        (b'{"model":"secret"} x', _parse.TRAILING),
        (b'{"model":"secret"}{}', _parse.TRAILING),
        (b'{"model":"secret"}\x00', _parse.TRAILING),
        (b'{"model":"secret"}\x0c', _parse.TRAILING),
        (b'{"a":' + b"[" * 128 + b"]" * 128 + b"}", _parse.TOO_DEEP),
        (b'{"a":' + b'{"b":' * 128 + b"1" + b"}" * 128 + b"}", _parse.TOO_DEEP),
        (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}", _parse.TOO_DEEP),
        (b'{"a":1,"a":2}', _parse.DUPLICATE),
        (b'{"model":"llama3","MODEL":"secret"}', _parse.DUPLICATE),
        (b'{"model":"llama3","\\u006dodel":"secret"}', _parse.DUPLICATE),
        ('{"stra\u00dfe":1,"STRASSE":2}'.encode(), _parse.DUPLICATE),
        ('{"k":1,"\u212a":2}'.encode(), _parse.DUPLICATE),
    ],
)
def test_anything_else_is_bad_body_saying_what(body: bytes, why: str) -> None:
    refused = _reads(body)
    assert refused == Rejection(400, "bad-body", why)
    assert "secret" not in refused.message


def _turns(body: bytes) -> tuple[list[float], list[Any]]:
    """The delays ``parse_large`` asked the clock for, and what it gave."""
    clock = Clock()
    turns: list[float] = []
    original = clock.callLater

    def counted(delay: float, *args: Any, **kw: Any) -> Any:
        turns.append(delay)
        return original(delay, *args, **kw)

    clock.callLater = counted  # type: ignore[method-assign]
    results: list[Any] = []
    parse_large(body, clock).addBoth(results.append)
    assert results == []
    clock.advance(0)
    return turns, results


def test_large_bodies_yield_to_the_reactor_between_slices() -> None:
    """Big bodies of every shape are read over many reactor turns, never in one."""
    text = "lorem ipsum \\u00e9 dolor " * 40_000
    one_string = b'{"model":"m","messages":[{"role":"user","content":"' + text.encode() + b'"}]}'
    many = b'{"model":"m","messages":[' + b",".join([b'{"role":"user","content":"hi"}'] * 40_000)
    many += b"]}"
    tricky = json.dumps([{"a": 'b,"],c"},'}, [1, {}]], separators=(",", ":"))[1:-1].encode()
    awkward = b'{"model":"m","x":[' + b",".join([tricky] * 20_000) + b"]}"
    for body in (one_string, many, awkward):
        turns, results = _turns(body)
        assert results == [json.loads(body)]
        assert set(turns) == {0}
        assert len(turns) > len(body) // _parse._SLICE


def _sliced(body: bytes) -> Any:
    """``parse_large`` with slices of 16 characters and decoding 3 bytes at a time."""
    with mock.patch.multiple(_parse, _SLICE=16, _SMALL=4, _DECODE_SLICE=3):
        clock = Clock()
        results: list[Any] = []
        parse_large(body, clock).addBoth(results.append)
        clock.advance(0)
    return results[0]


@pytest.mark.parametrize("lead", range(6))
def test_a_surrogate_pair_split_between_slices_is_one_character(lead: int) -> None:
    body = b'{"e":"' + b"a" * lead + b"\\ud83d\\ude00b" * 12 + b'"}'
    assert _sliced(body) == json.loads(body) == {"e": "a" * lead + "\U0001f600b" * 12}


@pytest.mark.parametrize("lead", range(6))
def test_a_high_surrogate_at_the_end_of_a_slice_needs_its_pair(lead: int) -> None:
    body = b'{"e":"' + b"a" * lead + b"\\ud83d\\ude00b" * 2 + b"\\ud83dbbbbbbbbbbbbbbbb" + b'"}'
    assert _sliced(body) == Rejection(400, "bad-body", _parse.LONE_SURROGATE) == parse_body(body)


@pytest.mark.parametrize(
    ("text", "width"),
    [("", 0), ("abc", 0), ("ab\u00e9", 1), ("a\u00e9\u4e2d", 2), ("\u4e2d\U0001f600a", 3)],
)
def test_the_width_of_a_text_is_how_cpython_stores_it(text: str, width: int) -> None:
    """The reader's text starts with a character this wide, so appending never widens it."""
    assert _parse._width(text) == width
    assert _parse._width(_parse._WIDEST[width]) == width


def test_a_body_whose_widest_character_comes_last_is_read() -> None:
    body = b'{"a":"' + b"x" * 50 + '\u00e9\u4e2d\U0001f600"}'.encode()
    assert _sliced(body) == json.loads(body) == parse_body(body)


# --- property tests: the proxy's reading against a Go engine's, and small against sliced ------

_MODEL_KEYS = ["model", "MODEL", "Model", "mODEL", "\\u006dodel", "mod\\u0065l", "\\u004dODEL"]
_OTHER_KEYS = ["name", "messages", "stream", "x", "k", "\\u212a", "stra\u00dfe", "STRASSE", ""]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
).map(lambda value: json.dumps(value, ensure_ascii=False))
_MODELS = st.one_of(
    st.sampled_from(['"llama3"', '"secret"', '""', '"  "', "null", "1", "[]", '"a\\u0000"']),
    st.sampled_from(['"\\ud800"', '"\\ud83d\\ude00"', '"\\\\ud800"', '"' + "x" * 300 + '"']),
    _VALUES,
)
_RAW_VALUES = st.one_of(
    _VALUES,
    st.sampled_from(["NaN", "-Infinity", "1e999", "[" * 129 + "]" * 129, '"\\udc00"', "01"]),
    st.integers(120, 132).map(lambda n: "[" * n + "1" + "]" * n),
)


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """Objects whose members say ``model`` in many ways, sometimes broken in one of many ways."""
    members = draw(
        st.lists(
            st.one_of(
                st.tuples(st.sampled_from(_MODEL_KEYS), _MODELS),
                st.tuples(st.sampled_from(_OTHER_KEYS), _RAW_VALUES),
            ),
            max_size=5,
        )
    )
    space = draw(st.sampled_from(["", " ", "\n\t "]))
    text = "{" + space + ("," + space).join(f'"{k}"{space}:{space}{v}' for k, v in members) + "}"
    body = draw(st.sampled_from(["", "[", "  "])) + text
    body += draw(st.sampled_from(["", " \r\n", " x", "{}", '{"model":"secret"}', "\x00", "]"]))
    raw = body.encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and raw:
        at = draw(st.integers(0, len(raw)))
        raw = (
            raw[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xef\xbb\xbf"]))
            + raw[at:]
        )
    return raw


@settings(max_examples=250, deadline=None)
@given(_bodies())
def test_a_go_engine_reads_the_model_the_proxy_read_or_the_proxy_refused(body: bytes) -> None:
    doc = parse_body(body)
    if isinstance(doc, Rejection):
        assert doc.code == "bad-body"
        return
    model = read_model(doc, ("model",))
    if isinstance(model, Rejection):
        assert model.code == "bad-model"
        return
    seen = go_model(body)
    if model is None:
        assert seen is None or not seen.strip()
    else:
        assert seen == model


@settings(max_examples=150, deadline=None)
@given(_bodies())
def test_the_sliced_reader_gives_what_the_fast_one_gives(body: bytes) -> None:
    """With slices a few characters long, every batch, window and string split is exercised."""
    with mock.patch.multiple(_parse, _SLICE=16, _SMALL=4, _DECODE_SLICE=3):
        clock = Clock()
        results: list[Any] = []
        parse_large(body, clock).addBoth(results.append)
        clock.advance(0)
    assert results == [parse_body(body)]


# --- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "names", "model"),
    [
        ({"model": "llama3", "name": "other"}, ("model", "name"), "llama3"),
        ({"MODEL": "llama3"}, ("model",), "llama3"),
        ({"Name": "llama3"}, ("model", "name"), "llama3"),
        ({"name": "llama3"}, ("model",), None),
        ({"model": None, "name": "llama3"}, ("model", "name"), "llama3"),
        ({"model": " \t", "name": "llama3"}, ("model", "name"), "llama3"),
        ({"model": ""}, ("model",), None),
        ({"model": None}, ("model",), None),
        ({}, ("model", "name"), None),
        ({"model": " llama3 "}, ("model",), " llama3 "),
        (
            {"model": "\u043c\u043e\u0434\u0435\u043b\u044c"},
            ("model",),
            "\u043c\u043e\u0434\u0435\u043b\u044c",
        ),
        ({"model": "x" * 256}, ("model",), "x" * 256),
    ],
)
def test_the_model_is_the_first_name_holding_a_string(
    doc: dict[str, Any], names: tuple[str, ...], model: str | None
) -> None:
    assert read_model(doc, names) == model


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (1, "not a string"),
        (True, "not a string"),
        (["a"], "not a string"),
        ({"a": 1}, "not a string"),
        ("x" * 257, "longer than 256 bytes"),
        ("\u00e9" * 129, "longer than 256 bytes"),
        ("a\x00", "control character"),
        ("a\nb", "control character"),
        ("a\x7f", "control character"),
        ("a\x85", "control character"),
    ],
)
def test_a_model_that_is_not_a_short_plain_string_is_bad_model(value: object, why: str) -> None:
    refused = read_model({"model": value, "name": "fine"}, ("model", "name"))
    assert isinstance(refused, Rejection)
    assert (refused.status, refused.code) == (400, "bad-model")
    assert why in refused.message
    assert "x" * 10 not in refused.message


# --- the outline: the top-level members' spans, from the same one parse ----------------------


def _documents(body: bytes) -> Parsed | Rejection:
    """``parse_document``, after checking that the slice reader, run at once and run by a clock
    (``parse_document_large``), gives exactly the same document and spans."""
    clock = Clock()
    results: list[Any] = []
    parse_document_large(body, clock).addBoth(results.append)
    clock.advance(0)
    parsed = parse_document(body)
    assert results == [parsed]
    assert _parse._drained(_parse._read(body)) == parsed
    return parsed


def _check_outline(body: bytes, parsed: Parsed) -> None:
    """The spans are UTF-8 byte offsets of ``body``: the braces, and each value's exact JSON."""
    assert body[parsed.opening : parsed.opening + 1] == b"{"
    assert body[parsed.closing : parsed.closing + 1] == b"}"
    assert [key for key, _, _ in parsed.members] == list(parsed.doc)
    for key, start, end in parsed.members:
        assert json.loads(body[start:end]) == parsed.doc[key]
    assert outline_body(body).outline == Outline(parsed.opening, parsed.closing, parsed.members)


def test_the_outline_names_each_top_level_value_in_the_bodys_bytes() -> None:
    body = ' \n{ "a" : "\u00e9\\u00e9" ,\t"b":[1, {"c": "\U0001f600"}] , "m" :null }\r\n'.encode()
    parsed = _documents(body)
    assert isinstance(parsed, Parsed)
    assert parsed.opening == 2
    assert [(key, body[s:e]) for key, s, e in parsed.members] == [
        ("a", '"\u00e9\\u00e9"'.encode()),
        ("b", '[1, {"c": "\U0001f600"}]'.encode()),
        ("m", b"null"),
    ]
    assert body[parsed.closing :] == b"}\r\n"
    assert _documents(b"{ }") == Parsed(0, 2, (), {})
    assert parse_body(body) == parsed.doc


def test_a_refused_body_has_no_outline() -> None:
    assert _documents(b'{"a": 1, "A": 2}') == Rejection(400, "bad-body", _parse.DUPLICATE)


@settings(max_examples=300, deadline=None)
@given(body=bodies())
def test_both_readers_give_the_same_spans_of_any_accepted_body(body: bytes) -> None:
    parsed = _documents(body)
    assert isinstance(parsed, Parsed)
    _check_outline(body, parsed)


@pytest.mark.parametrize("wide", ["\u00e9", "\u4e2d", "\U0001f600"])
def test_the_slice_reader_spans_a_body_of_many_slices_in_bytes(wide: str) -> None:
    # values long enough that their offsets are converted a slice of characters at a time
    long = (wide + "x" * 7) * (_parse._DECODE_SLICE // 4)
    doc = {"first": long, "model": "m\u00e9", "messages": [{"c": long}], "last": wide}
    body = json.dumps(doc, ensure_ascii=False, indent=1).encode()
    clock = Clock()
    results: list[Any] = []
    parse_document_large(body, clock).addBoth(results.append)
    while not results:
        clock.advance(0)
    parsed = results[0]
    assert isinstance(parsed, Parsed)
    _check_outline(body, parsed)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("llama3", "llama3"),
        ("<img src=x>", "<img src=x>"),
        ("é" * 128, "é" * 128),
        ("é" * 129, "bad-model"),
        ("a" * 257, "bad-model"),
        ("a\x00", "bad-model"),
        ("a\x85", "bad-model"),
        (5, "bad-model"),
        (["a"], "bad-model"),
    ],
)
def test_the_model_rule_is_one_rule_wherever_a_name_is_written(
    value: object, expected: str | None
) -> None:
    read = model_rule(value)
    assert (read.code if isinstance(read, Rejection) else read) == expected


def test_every_model_a_route_names_is_read_by_the_rule() -> None:
    doc = {"Source": "a", "destination": "b", "from": None, "name": " "}
    assert read_models(doc, ("source", "destination", "from", "name")) == ("a", "b")
    refused = read_models({"source": "a", "destination": 7}, ("source", "destination"))
    assert isinstance(refused, Rejection) and refused.code == "bad-model"
    assert read_models({}, ("model",)) == ()


def test_the_model_rule_says_which_part_failed_and_never_repeats_the_name() -> None:
    messages = [getattr(model_rule(value), "message", None) for value in (5, "a" * 257, "a\x00<b>")]
    assert messages == [
        "bad model: not a string",
        "bad model: longer than 256 bytes",
        "bad model: a control character",
    ]
