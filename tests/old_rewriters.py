"""The body rewriters as they were before the one parse gave the members' spans: whole-body
scans, kept as the oracle that the span-based rewriters give byte-identical results."""

from __future__ import annotations

import json

from nvpair_tw.assembly import Dialect
from nvpair_tw.core import object_members, skip_whitespace


def _members(text: str) -> list[tuple[str, int, int]]:
    found, end = object_members(text, skip_whitespace(text, 0))
    if skip_whitespace(text, end) != len(text):
        raise ValueError("trailing data after the JSON object")
    return found


def old_rename_request(body: bytes, local_model: str) -> bytes:
    text = body.decode("utf-8")
    spans = [(s, e) for key, s, e in _members(text) if key == "model"]
    if not spans:
        raise ValueError("the body has no top-level model member")
    value = json.dumps(local_model, ensure_ascii=False)
    out: list[str] = []
    last = 0
    for start, end in spans:
        out += (text[last:start], value)
        last = end
    out.append(text[last:])
    return "".join(out).encode("utf-8")


def old_rewrite_body(dialect: Dialect, body: bytes) -> bytes:
    text = body.decode("utf-8")
    start = skip_whitespace(text, 0)
    members, end = object_members(text, start)
    if skip_whitespace(text, end) != len(text):
        raise ValueError("trailing data after the JSON object")
    wanted = {"stream": "true"}
    edits: list[tuple[int, int, str]] = []
    if dialect.sse:
        options = [(s, e) for key, s, e in members if key == "stream_options"]
        if not options:
            wanted["stream_options"] = '{"include_usage":true}'
        for value_start, value_end in options:
            if text[value_start] == "{":
                nested, _ = object_members(text, value_start)
                edits.extend(_assign(text, value_start, nested, {"include_usage": "true"}))
            else:
                edits.append((value_start, value_end, '{"include_usage":true}'))
    edits.extend(_assign(text, start, members, wanted))
    out = text
    for s, e, replacement in sorted(edits, key=lambda edit: edit[0], reverse=True):
        out = out[:s] + replacement + out[e:]
    return out.encode("utf-8")


def _assign(
    text: str, start: int, members: list[tuple[str, int, int]], values: dict[str, str]
) -> list[tuple[int, int, str]]:
    edits: list[tuple[int, int, str]] = []
    missing: list[str] = []
    for key, value in values.items():
        spans = [(s, e) for k, s, e in members if k == key]
        edits.extend((s, e, value) for s, e in spans)
        if not spans:
            missing.append(json.dumps(key) + ":" + value)
    if missing:
        inserted = ",".join(missing)
        if members:
            edits.append((start + 1, start + 1, inserted + ","))
        else:
            edits.append((start + 1, text.index("}", start), inserted))
    return edits
