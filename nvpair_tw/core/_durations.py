# -*- test-case-name: tests.core.test_durations -*-
"""Go-style durations (``300ms``, ``1.5h``, ``2h45m``, ``1m30s``, ``10us``, ``10µs``, ``0``) in seconds."""

from __future__ import annotations

import re

__all__ = ["format_duration", "parse_duration"]

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


def format_duration(seconds: float) -> str:
    """Render seconds compactly for logs (``120s``, ``1.5s``, ``300ms``)."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
