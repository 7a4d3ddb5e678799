"""What the translators share: the errors, SSE splitting, time stamps, and the package's purity."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nvpair_tw.dialects
from nvpair_tw.dialects import AnswerTooLarge, MalformedAnswer, StreamCut, Untranslatable
from nvpair_tw.dialects._common import SseEvents, Stamp

pytestmark = pytest.mark.timeout(60)


def test_untranslatable_names_its_field_in_one_sentence() -> None:
    error = Untranslatable("context", "it holds tokens")
    assert error.field == "context"
    assert str(error) == (
        "the request's 'context' field cannot be translated for a node of another kind: "
        "it holds tokens"
    )


def test_every_transducer_error_is_a_stream_cut() -> None:
    assert issubclass(AnswerTooLarge, StreamCut)
    assert issubclass(MalformedAnswer, StreamCut)


def test_sse_events_join_data_lines_and_skip_everything_else() -> None:
    events = SseEvents(1000)
    got = list(events.feed(b"retry: 5\n:c\ndata: a\ndata:b\r\nevent: x\n\ndata: tail"))
    assert got == [b"a\nb"]
    assert list(events.rest()) == [b"tail"]


def test_an_unfinished_line_past_the_limit_is_too_large() -> None:
    with pytest.raises(AnswerTooLarge):
        list(SseEvents(10).feed(b"data: " + b"x" * 20))


def test_stamps_are_formatted_per_second_with_nanoseconds() -> None:
    readings = iter([0.000000001, 0.5, 86400.25])
    stamp = Stamp(lambda: next(readings))
    assert stamp.now()[1] == "1970-01-01T00:00:00.000000001Z"
    assert stamp.now()[1] == "1970-01-01T00:00:00.500000000Z"
    assert stamp.now()[1] == "1970-01-02T00:00:00.250000000Z"


def test_the_package_is_pure_no_twisted_no_io_and_no_other_room() -> None:
    allowed = {"nvpair_tw.dialects", "nvpair_tw.core", "nvpair_tw.logs"}
    forbidden = {"twisted", "socket", "os", "io", "asyncio", "threading", "subprocess"}
    for path in Path(nvpair_tw.dialects.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, (path.name, name)
                if name.startswith("nvpair_tw"):
                    assert any(name == a or name.startswith(a + ".") for a in allowed), name
