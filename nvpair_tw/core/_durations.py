# -*- test-case-name: tests.core.test_durations -*-
"""Durations: Go's syntax (``300ms``, ``1.5h``, ``2h45m``, ``1m30s``, ``10us``, ``10µs``, ``0``) in
seconds, and the one rule every duration setting is read by (docs/behaviour.md §6.3)."""

from __future__ import annotations

import re
from enum import Enum

__all__ = ["DURATION_HINT", "Least", "format_duration", "parse_duration", "read_duration"]

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DAYS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)d")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")

DURATION_HINT = "write 5s, 2m or 1m30s"
"""What a refused duration setting's message ends with (a bare number ``N`` gets ``Ns``)."""
_LONG_HINT = "write 90d, 720h or 30m"


def parse_duration(text: str) -> float:
    """Parse a Go duration into seconds; raise ``ValueError`` on anything else.

    A leading sign is accepted as Go does (``-1s`` parses to a negative value, so callers can
    reject it with their own message). A bare ``0`` is zero; other unitless numbers are errors.
    """
    raw = text.strip()
    if not raw:
        raise ValueError("empty duration")
    sign = 1.0
    if raw[0] in "+-":
        sign = -1.0 if raw[0] == "-" else 1.0
        raw = raw[1:]
    if raw == "0":
        return 0.0
    position = 0
    total = 0.0
    while position < len(raw):
        match = _PART.match(raw, position)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position == 0:
        raise ValueError(f"invalid duration {text!r}")
    return sign * total


class Least(Enum):
    """The least value a setting takes; the value is how its refusal says so."""

    ABOVE_ZERO = "more than zero"
    ZERO = "zero or more"
    MINUTE = "a minute or more"

    def admits(self, value: float) -> bool:
        """Whether ``value`` (seconds, or a count) is at least this."""
        if self is Least.ABOVE_ZERO:
            return value > 0
        return value >= (60.0 if self is Least.MINUTE else 0.0)

    def hint(self, raw: str = "") -> str:
        """How a refusal ends: examples of this bound, the first one ``raw`` with its missing
        unit when ``raw`` is a bare number (``5`` → ``write 5s, 2m or 1m30s``)."""
        hint, unit = (_LONG_HINT, "d") if self is Least.MINUTE else (DURATION_HINT, "s")
        if _NUMBER.fullmatch(raw) and raw.strip("0."):
            _, rest = hint.split(", ", 1)
            return f"write {raw}{unit}, {rest}"
        return hint


def read_duration(where: str, text: str, least: Least = Least.ABOVE_ZERO) -> float:
    """A duration setting (a flag or an environment variable, named by ``where``) in seconds.

    The one rule: Go's syntax, optionally led by whole or decimal days (``90d``, ``1d12h``), at
    least ``least``. Anything else is a ``ValueError`` of one sentence shape, ending with
    :data:`DURATION_HINT`; nothing falls back to a default.
    """
    raw = text.strip()
    days = _DAYS.match(raw)
    rest = raw[days.end() :] if days else raw
    try:
        if days and rest[:1] in ("+", "-"):
            raise ValueError(rest)
        seconds = parse_duration(rest or "0") if days else parse_duration(raw)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a duration; {least.hint(raw)}") from None
    if days:
        seconds += float(days.group(1)) * 86400.0
    if not least.admits(seconds):
        raise ValueError(f"{where}: {text!r} must be {least.value}; {least.hint()}")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds compactly for logs (``120s``, ``1.5s``, ``300ms``)."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
