"""The one tool-call folder: fragments by ``index``, and without one, "an id starts a call"."""

from __future__ import annotations

from typing import Any

import pytest

from nvpair_tw.core import CallOrder, MalformedStream, ToolCalls

pytestmark = pytest.mark.timeout(60)


def folded(*deltas: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    calls = ToolCalls()
    for fragments in deltas:
        calls.add(fragments)
    return calls.calls()


def call(ident: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function = {"name": name, **function}
    return {"id": ident, "function": function} if ident else {"function": function}


def test_fragments_with_an_index_join_the_call_of_that_index() -> None:
    got = folded(
        [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "["}}],
        [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}],
        [
            {"index": 1, "function": {"arguments": "]"}},
            {"index": 0, "function": {"arguments": "}"}},
        ],
    )
    assert got == [
        (0, {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}),
        (1, {"index": 1, "id": "b", "function": {"name": "g", "arguments": "[]"}}),
    ]


def test_without_an_index_an_id_starts_a_call_and_a_fragment_without_one_continues_it() -> None:
    """One fragment per chunk, every one at list position 0: the id tells the calls apart."""
    got = folded(
        [call("c1", "f", "{")],
        [call(arguments='"x":1}')],
        [call("c2", "g", "[")],
        [call(arguments="]")],
    )
    assert got == [
        (0, call("c1", "f", '{"x":1}')),
        (1, call("c2", "g", "[]")),
    ]


def test_whole_calls_in_one_chunk_without_an_index_are_apart_by_their_ids() -> None:
    assert folded([call("c1", "f", "{}"), call("c2", "g", "[]")]) == [
        (0, call("c1", "f", "{}")),
        (1, call("c2", "g", "[]")),
    ]


def test_a_fragment_repeating_its_calls_id_continues_it() -> None:
    assert folded([call("c1", "f", "{")], [call("c1", arguments="}")]) == [
        (0, call("c1", "f", "{}"))
    ]


def test_the_first_fragment_without_an_id_or_index_starts_the_first_call() -> None:
    assert folded([call(name="f", arguments="{")], [call(arguments="}")]) == [
        (0, call(name="f", arguments="{}"))
    ]


def test_a_new_id_without_an_index_starts_after_the_highest_index() -> None:
    got = folded([{"index": 3, "id": "a", "function": {"name": "f"}}], [call("b", "g")])
    assert [index for index, _ in got] == [3, 4]


def test_members_keep_their_last_value_that_is_neither_null_nor_empty() -> None:
    got = folded(
        [{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "extra": 1}}],
        [{"index": 0, "id": "", "type": None, "function": {"name": None, "extra": None}}],
        [{"index": 0, "function": {"extra": 2}}],
    )
    assert got == [
        (0, {"index": 0, "id": "a", "type": "function", "function": {"name": "f", "extra": 2}})
    ]


def test_a_null_first_part_is_replaced_by_a_string() -> None:
    got = folded(
        [{"index": 0, "function": {"name": None}}], [{"index": 0, "function": {"name": "f"}}]
    )
    assert got == [(0, {"index": 0, "function": {"name": "f"}})]


def test_a_function_that_was_not_an_object_is_replaced_by_one() -> None:
    got = folded([{"index": 0, "function": "odd"}], [{"index": 0, "function": {"name": "f"}}])
    assert got == [(0, {"index": 0, "function": {"name": "f"}})]


def test_size_counts_the_string_parts_of_the_functions() -> None:
    calls = ToolCalls()
    calls.add([{"index": 0, "id": "abc", "function": {"name": "fn", "arguments": "{}", "n": 5}}])
    assert calls.size == 4
    calls.add([{"index": 0, "function": {"arguments": "xyz"}}])
    assert calls.size == 7


def test_take_forgets_the_calls_and_a_later_call_starts_afresh() -> None:
    calls = ToolCalls()
    assert not calls
    calls.add([call("c1", "f", "{}")])
    assert calls
    assert calls.take() == [(0, call("c1", "f", "{}"))]
    assert not calls
    assert calls.calls() == []
    calls.add([call(arguments="x")])
    assert calls.take() == [(0, call(arguments="x"))]


def test_a_fragment_that_is_not_an_object_is_malformed() -> None:
    with pytest.raises(MalformedStream, match=r"^a tool call is not an object$"):
        ToolCalls().add(["call"])


def test_every_string_part_of_one_fragment_is_joined() -> None:
    got = folded(
        [{"index": 0, "function": {"name": "f", "arguments": "{"}}],
        [{"index": 0, "function": {"name": "g", "arguments": "}"}}],
    )
    assert got == [(0, {"index": 0, "function": {"name": "fg", "arguments": "{}"}})]


def test_a_later_value_replaces_an_earlier_one_and_a_first_null_is_kept() -> None:
    got = folded(
        [{"index": 0, "id": None, "type": "a"}],
        [{"index": 0, "type": "b"}],
    )
    assert got == [(0, {"index": 0, "id": None, "type": "b"})]


def test_call_order_places_each_fragment_and_says_which_start_a_call() -> None:
    """The rule alone, as a Messages stream uses it to open one block per call."""
    order = CallOrder()
    placed = [
        order.place(fragment)
        for fragment in (
            call("c1", "f", "{"),
            call(arguments="}"),
            call("c1", arguments=""),
            call("c2", "g", "["),
            {"index": 5, "id": "c3"},
            {"index": 5, "id": "other"},  # an index wins over an id (ids that change per chunk)
            call(arguments="]"),
        )
    ]
    assert placed == [
        (0, True),
        (0, False),
        (0, False),
        (1, True),
        (5, True),
        (5, False),
        (5, False),
    ]
    order.forget()
    assert order.place(call("c9")) == (0, True)
