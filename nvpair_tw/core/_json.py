# -*- test-case-name: tests.core.test_json -*-
"""Byte-preserving JSON edits start here: the members of a JSON object in a text, with the span of
each value, so a body can be changed in one member and left as the client sent it everywhere else
(the assembly's ``"stream": true``, the catalogue's ``model`` rename)."""

from __future__ import annotations

import json
import re

__all__ = ["object_members", "skip_whitespace"]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def skip_whitespace(text: str, index: int) -> int:
    """The index of the first non-whitespace character at or after ``index``."""
    match = _WS.match(text, index)
    return match.end() if match is not None else index


def object_members(text: str, start: int) -> tuple[list[tuple[str, int, int]], int]:
    """The members of the JSON object at ``start``: (key, value start, value end); and its end.

    Raises ``ValueError`` (``json.JSONDecodeError`` is one) for anything that is not an object.
    """
    if text[start : start + 1] != "{":
        raise ValueError("not a JSON object")
    members: list[tuple[str, int, int]] = []
    index = skip_whitespace(text, start + 1)
    if text[index : index + 1] == "}":
        return members, index + 1
    while True:
        if text[index : index + 1] != '"':
            raise ValueError("expected a member name")
        key, index = json.decoder.scanstring(text, index + 1)  # type: ignore[attr-defined]
        index = skip_whitespace(text, index)
        if text[index : index + 1] != ":":
            raise ValueError("expected ':'")
        value_start = skip_whitespace(text, index + 1)
        try:
            _, value_end = _DECODER.raw_decode(text, value_start)
        except (json.JSONDecodeError, RecursionError) as error:
            raise ValueError("bad member value") from error
        members.append((key, value_start, value_end))
        index = skip_whitespace(text, value_end)
        separator = text[index : index + 1]
        if separator == "}":
            return members, index + 1
        if separator != ",":
            raise ValueError("expected ',' or '}'")
        index = skip_whitespace(text, index + 1)
