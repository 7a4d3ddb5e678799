# -*- test-case-name: tests.dialects.test_json -*-
"""Byte-preserving edits of a JSON request body: :func:`rename_request`, which replaces the
top-level ``model`` value and nothing else (docs/behaviour.md §11.4), on core's outline of the
body's members — the one parse's (:func:`rename_outlined`) or a scan of the body."""

from __future__ import annotations

import json

from nvpair_tw.core import Outlined, outline_body, set_members

__all__ = ["rename_outlined", "rename_request"]


def rename_request(body: bytes, local_model: str) -> bytes:
    """The client's ``body`` with only the top-level ``model`` member's value replaced by
    ``local_model`` (as a JSON string; every duplicate member too); every other byte unchanged.

    Raises ``ValueError`` when ``body`` is not one UTF-8 JSON object or has no top-level
    ``model`` member (the capability gate routes only requests that name a model). Reads the
    whole body: given its outline, use :func:`rename_outlined`.
    """
    return rename_outlined(outline_body(body), local_model).body


def rename_outlined(doc: Outlined, local_model: str) -> Outlined:
    """:func:`rename_request` of ``doc.body``, reading none of it, with the outline of the result."""
    if not any(key == "model" for key, _, _ in doc.outline.members):
        raise ValueError("the body has no top-level model member")
    value = json.dumps(local_model, ensure_ascii=False).encode("utf-8")
    return set_members(doc, {"model": lambda old: value})
