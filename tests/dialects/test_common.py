"""What the translators share: the errors, time stamps, and the package's purity (SSE splitting
is the core framer's: tests/core/test_framer.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nvpair_tw.dialects
from nvpair_tw.dialects import AnswerTooLarge, MalformedAnswer, StreamCut, Untranslatable
from nvpair_tw.dialects._common import Stamp

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
