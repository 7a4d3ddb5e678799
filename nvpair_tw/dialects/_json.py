# -*- test-case-name: tests.dialects.test_json -*-
"""Byte-preserving edits of a JSON request body: the top-level members of an object and their
spans (core's scanner), and :func:`rename_request`, which replaces the ``model`` value and nothing
else."""

from __future__ import annotations

import json

from nvpair_tw.core import object_members, skip_whitespace

__all__ = ["members", "rename_request"]


def members(text: str) -> list[tuple[str, int, int]]:
    """The top-level members of the one JSON object ``text`` is: (key, value start, value end).

    Raises ``ValueError`` when ``text`` is not exactly one JSON object (whitespace around it
    allowed).
    """
    found, end = object_members(text, skip_whitespace(text, 0))
    if skip_whitespace(text, end) != len(text):
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
