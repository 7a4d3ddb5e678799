# -*- test-case-name: tests.core.test_durations -*-
"""Go-style durations: the syntax docs/behaviour.md §6.3 accepts, and what it rejects; and the one
rule every duration setting is read by, with its one sentence shape."""

from __future__ import annotations

import pytest

from nvpair_tw.core._durations import (
    DURATION_HINT,
    Least,
    format_duration,
    parse_duration,
    read_duration,
)


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


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300ms", 0.3),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        (" 10s ", 10.0),
        ("90d", 90 * 86400.0),
        ("1.5d", 1.5 * 86400.0),
        ("1d12h", 1.5 * 86400.0),
        ("1d0s", 86400.0),
    ],
)
def test_a_setting_takes_go_durations_and_leading_days(text: str, seconds: float) -> None:
    """The setting rule is Go's syntax, optionally led by days (``90d``, ``1d12h``)."""
    assert read_duration("--x", text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5", "--x: '5' is not a duration; write 5s, 2m or 1m30s"),
        ("30", "--x: '30' is not a duration; write 30s, 2m or 1m30s"),
        ("1.5", "--x: '1.5' is not a duration; write 1.5s, 2m or 1m30s"),
        ("5x", "--x: '5x' is not a duration; write 5s, 2m or 1m30s"),
        ("", "--x: '' is not a duration; write 5s, 2m or 1m30s"),
        ("0.0", "--x: '0.0' is not a duration; write 5s, 2m or 1m30s"),
        ("1h1d", "--x: '1h1d' is not a duration; write 5s, 2m or 1m30s"),
        ("1d-5h", "--x: '1d-5h' is not a duration; write 5s, 2m or 1m30s"),
        ("d", "--x: 'd' is not a duration; write 5s, 2m or 1m30s"),
        ("0", "--x: '0' must be more than zero; write 5s, 2m or 1m30s"),
        ("-1s", "--x: '-1s' must be more than zero; write 5s, 2m or 1m30s"),
    ],
)
def test_a_setting_that_is_not_a_positive_duration_is_refused_with_the_hint(
    text: str, message: str
) -> None:
    """One sentence shape: what was given, why not, and how to write it (a bare number with
    its missing unit)."""
    with pytest.raises(ValueError) as raised:
        read_duration("--x", text)
    assert str(raised.value) == message
    assert str(raised.value).endswith(DURATION_HINT) or "write " in str(raised.value)


def test_zero_is_a_setting_where_zero_or_more_is_asked() -> None:
    """``Least.ZERO`` admits ``0`` (a timer turned off) and still refuses a negative one."""
    assert read_duration("--x", "0", Least.ZERO) == 0.0
    with pytest.raises(ValueError, match=r"^--x: '-2s' must be zero or more; write 5s"):
        read_duration("--x", "-2s", Least.ZERO)


def test_a_retention_needs_a_minute_and_a_bare_number_reads_as_days() -> None:
    """``Least.MINUTE`` (``--usage-retention``) refuses less than a minute; its hint speaks in
    days and hours, and a bare number is shown as days."""
    assert read_duration("--r", "1m", Least.MINUTE) == 60.0
    with pytest.raises(ValueError) as short:
        read_duration("--r", "59s", Least.MINUTE)
    assert str(short.value) == "--r: '59s' must be a minute or more; write 90d, 720h or 30m"
    with pytest.raises(ValueError) as bare:
        read_duration("--r", "90", Least.MINUTE)
    assert str(bare.value) == "--r: '90' is not a duration; write 90d, 720h or 30m"
