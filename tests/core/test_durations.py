# -*- test-case-name: tests.core.test_durations -*-
"""Go-style durations: the syntax docs/behaviour.md §6.3 accepts, and what it rejects."""

from __future__ import annotations

import pytest

from nvpair_tw.core._durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        ("2h45m", 9900.0),
        ("1m30s", 90.0),
        ("10us", 10e-6),
        ("10\u00b5s", 10e-6),  # MICRO SIGN
        ("10\u03bcs", 10e-6),  # GREEK SMALL LETTER MU
        ("5ns", 5e-9),
        ("120s", 120.0),
        (".5s", 0.5),
        ("0", 0.0),
        ("0s", 0.0),
        (" 2s ", 2.0),
        ("+3s", 3.0),
    ],
)
def test_go_durations_parse_to_seconds(text: str, seconds: float) -> None:
    """Every unit and compound form of Go's syntax converts to seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


def test_a_leading_minus_gives_a_negative_value() -> None:
    """``-1s`` parses (as Go does) to a negative number the caller can reject."""
    assert parse_duration("-1s") == -1.0
    assert parse_duration("-1m30s") == -90.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-",
        "5",
        "1.5",
        "10",
        "abc",
        "5x",
        "s",
        "1h 30m",
        "1d",
        "ms5",
        "5s!",
        "1e3s",
        "0x",
    ],
)
def test_garbage_empty_and_unitless_numbers_are_rejected(text: str) -> None:
    """Anything but a bare ``0`` needs a unit; junk and empty strings raise ValueError."""
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0s"), (0.3, "300ms"), (1.5, "1.5s"), (120.0, "120s"), (5400.0, "5400s")],
)
def test_format_duration_is_compact(seconds: float, text: str) -> None:
    """Logs show ``0s``, milliseconds below one second, and plain seconds above."""
    assert format_duration(seconds) == text


def test_formatted_durations_parse_back() -> None:
    """What ``format_duration`` writes, ``parse_duration`` reads back."""
    for seconds in (0.0, 0.25, 2.0, 90.0):
        assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
