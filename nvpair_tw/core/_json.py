# -*- test-case-name: tests.core.test_json -*-
"""Byte-preserving JSON edits start here: the members of a JSON object in a text, with the span of
each value, so a body can be changed in one member and left as the client sent it everywhere else
(the assembly's ``"stream": true``, the catalogue's ``model`` rename).

A body the proxy parsed comes with its :class:`Outline` (docs/behaviour.md §14.1: the one strict
parse records where each top-level member's value lies), so :func:`set_members` edits it without
reading the body again; :func:`outline_body` scans a body that came without one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias

from attrs import frozen

__all__ = [
    "Edit",
    "Outline",
    "Outlined",
    "Span",
    "byte_offsets",
    "object_members",
    "outline_body",
    "set_members",
    "skip_whitespace",
]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()

Span: TypeAlias = tuple[str, int, int]
"""A top-level member: its key, and where its value starts and ends (UTF-8 byte offsets)."""


@frozen(slots=False)  # a dict-backed frozen class is built in half the time (hot path)
class Outline:
    """Where a body's top-level JSON object lies, in UTF-8 byte offsets of the body: its opening
    ``{``, its closing ``}``, and each member's value, in the body's order."""

    opening: int
    closing: int
    members: tuple[Span, ...]


@frozen
class Outlined:
    """A JSON body and the :class:`Outline` of its top-level object."""

    body: bytes
    outline: Outline


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


def byte_offsets(text: str, positions: Iterable[int]) -> list[int]:
    """The UTF-8 byte offsets of ``positions`` (ascending character offsets) in ``text``."""
    offsets: list[int] = []
    char = byte = 0
    for position in positions:
        byte += len(text[char:position].encode("utf-8"))
        char = position
        offsets.append(byte)
    return offsets


def outline_body(body: bytes) -> Outlined:
    """``body`` with the outline of the one JSON object it is, found by scanning it whole.

    Raises ``ValueError`` when ``body`` is not UTF-8 or not exactly one JSON object (whitespace
    around it allowed).
    """
    text = body.decode("utf-8")
    opening = skip_whitespace(text, 0)
    found, end = object_members(text, opening)
    if skip_whitespace(text, end) != len(text):
        raise ValueError("trailing data after the JSON object")
    chars = [opening] + [at for _, start, stop in found for at in (start, stop)] + [end - 1]
    offsets = chars if len(text) == len(body) else byte_offsets(text, chars)
    members = tuple(
        (key, offsets[2 * n + 1], offsets[2 * n + 2]) for n, (key, _, _) in enumerate(found)
    )
    return Outlined(body, Outline(offsets[0], offsets[-1], members))


Edit: TypeAlias = Callable[[memoryview | None], bytes]
"""A member's new raw JSON value from its old one (``None``: the object lacks the member)."""


def set_members(doc: Outlined, edits: Mapping[str, Edit]) -> Outlined:
    """``doc`` with each member named in ``edits`` given the value its edit makes, and its outline.

    A member the object has is replaced where it stands (each duplicate of it, from its own old
    value); those it lacks are inserted right after the ``{``, in the order of ``edits``
    (replacing the whitespace of an empty object). Every other byte is the body's; no more of
    the body is read than the edits read of their old values.
    """
    body, outline = doc.body, doc.outline
    view = memoryview(body)
    present = {key for key, _, _ in outline.members}
    missing = [(key, edit(None)) for key, edit in edits.items() if key not in present]
    inserted, spans = _inserted(outline, missing)
    after = outline.opening + 1
    last = after if outline.members else outline.closing
    pieces: list[bytes | memoryview] = [view[:after], inserted]
    shift = len(inserted) - (last - after)
    for key, start, end in outline.members:
        edit = edits.get(key)
        if edit is None:
            spans.append((key, start + shift, end + shift))
            continue
        value = edit(view[start:end])
        pieces += (view[last:start], value)
        spans.append((key, start + shift, start + shift + len(value)))
        shift += len(value) - (end - start)
        last = end
    pieces.append(view[last:])
    closing = outline.closing + shift
    return Outlined(b"".join(pieces), Outline(outline.opening, closing, tuple(spans)))


def _inserted(outline: Outline, missing: list[tuple[str, bytes]]) -> tuple[bytes, list[Span]]:
    """The text inserted after the ``{`` for the ``missing`` members, and their spans there."""
    pieces: list[bytes] = []
    spans: list[Span] = []
    at = outline.opening + 1
    for key, value in missing:
        name = json.dumps(key).encode("utf-8") + b":"
        spans.append((key, at + len(name), at + len(name) + len(value)))
        pieces.append(name + value)
        at += len(name) + len(value) + 1
    text = b",".join(pieces)
    return (text + b"," if text and outline.members else text), spans
