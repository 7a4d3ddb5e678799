# -*- test-case-name: tests.dialects.test_json -*-
"""Byte-preserving edits of a JSON request body: the top-level members of an object and their
spans, and :func:`rename_request`, which replaces the ``model`` value and nothing else (the same
scanner idea as the assembly room's body rewrite, kept here because rooms share only faces)."""

from __future__ import annotations

import json
import re

__all__ = ["members", "rename_request"]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, index: int) -> int:
    match = _WS.match(text, index)
    return match.end() if match is not None else index


def members(text: str) -> list[tuple[str, int, int]]:
    """The top-level members of the one JSON object ``text`` is: (key, value start, value end).

    Raises ``ValueError`` when ``text`` is not exactly one JSON object (whitespace around it
    allowed).
    """
    start = _skip(text, 0)
    if text[start : start + 1] != "{":
        raise ValueError("not a JSON object")
    found: list[tuple[str, int, int]] = []
    index = _skip(text, start + 1)
    if text[index : index + 1] == "}":
        end = index + 1
    else:
        while True:
            if text[index : index + 1] != '"':
                raise ValueError("expected a member name")
            try:
                key, index = json.decoder.scanstring(text, index + 1)  # type: ignore[attr-defined]
            except json.JSONDecodeError as error:
                raise ValueError("bad member name") from error
            index = _skip(text, index)
            if text[index : index + 1] != ":":
                raise ValueError("expected ':'")
            value_start = _skip(text, index + 1)
            try:
                _, value_end = _DECODER.raw_decode(text, value_start)
            except (json.JSONDecodeError, RecursionError) as error:
                raise ValueError("bad member value") from error
            found.append((key, value_start, value_end))
            index = _skip(text, value_end)
            separator = text[index : index + 1]
            if separator == "}":
                end = index + 1
                break
            if separator != ",":
                raise ValueError("expected ',' or '}'")
            index = _skip(text, index + 1)
    if _skip(text, end) != len(text):
        raise ValueError("trailing data after the JSON object")
    return found


def rename_request(body: bytes, local_model: str) -> bytes:
    """The client's ``body`` with only the top-level ``model`` member's value replaced by
    ``local_model`` (as a JSON string; every duplicate member too); every other byte unchanged.

    Raises ``ValueError`` when ``body`` is not one UTF-8 JSON object or has no top-level
    ``model`` member (the capability gate routes only requests that name a model).
    """
    text = body.decode("utf-8")
    spans = [(s, e) for key, s, e in members(text) if key == "model"]
    if not spans:
        raise ValueError("the body has no top-level model member")
    value = json.dumps(local_model, ensure_ascii=False)
    out = []
    last = 0
    for start, end in spans:
        out.append(text[last:start])
        out.append(value)
        last = end
    out.append(text[last:])
    return "".join(out).encode("utf-8")
