# -*- test-case-name: tests.selection.test_canonical -*-
"""One conversation in one form, whatever the dialect it came in (docs/behaviour.md §5.3).

A coding agent's conversation reaches the proxy as chat completions, Anthropic Messages, Responses
input items, LM Studio's ``/api/v1/chat`` or Ollama's ``/api/chat``. :func:`canonical` reads the
parsed request value (the one parse of §14.1, never the body) into its *preamble* — the system
prompt (``system``, ``instructions``, ``system_prompt``, the leading system or developer messages)
and the tool schema — and its *atoms*, in order: a run of text of one role, an image, a tool call
(name and arguments), a tool result. Each is encoded in one prefix-free form, so the same
conversation gives the same bytes in every dialect: ``"hi"`` and ``[{"type": "text", "text": "hi"}]`` are one
text, a tool call's arguments are the same value whether they came as a JSON string (OpenAI) or an
object (Anthropic, Ollama), a data URL and a base64 source are the same image.

Left out, because they change from turn to turn without changing the conversation: Claude Code's
``x-anthropic-billing-header`` system block (:func:`is_billing_block`), ``cache_control`` markers,
call and message ids, reasoning (templates drop it, and not every dialect sends it back), and every
generation setting. Nothing here keeps or logs a prompt: the atoms are hashed by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import suppress
from itertools import islice
from typing import Any

from attrs import frozen

__all__ = ["BILLING_PREFIX", "Bound", "Canonical", "canonical", "is_billing_block"]

BILLING_PREFIX = "x-anthropic-billing-header:"
"""How Claude Code's per-request attribution block starts (2.1.36 and later): the first block of
``system``, whose ``cch=`` value changes on every request."""

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_IMAGE_PARTS = frozenset({"image", "image_url", "input_image"})
_SKIPPED_PARTS = frozenset({"thinking", "redacted_thinking", "reasoning"})
_SYSTEM_ROLES = frozenset({"system", "developer"})
_RESULT_ROLES = frozenset({"tool", "function", "ipython"})
_CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
_RESULT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
_VOLATILE = frozenset({"cache_control", "id", "call_id", "tool_call_id", "status"})


@frozen
class Bound:
    """How much of a conversation is read: ``text`` bytes of its strings, ``steps`` of the walk
    (a message, a part, a tool, a list or an object), ``atoms`` (the chain's length)."""

    text: int
    steps: int
    atoms: int


@frozen
class Canonical:
    """A conversation in its canonical form: the preamble's bytes, then each atom's."""

    preamble: bytes
    atoms: list[bytes]


class _Spent(Exception):
    """The bound ran out: the conversation is known by what was read before."""


class _Budget:
    """What is left of a :class:`Bound` while one conversation is read."""

    __slots__ = ("steps", "text")

    def __init__(self, bound: Bound) -> None:
        self.text = bound.text
        self.steps = bound.steps

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise _Spent

    def take(self, size: int) -> None:
        self.text -= size
        if self.text < 0:
            raise _Spent


def is_billing_block(block: Any) -> bool:
    """Whether a system block (or system text) is Claude Code's billing block."""
    text = block.get("text") if isinstance(block, dict) else block
    return isinstance(text, str) and text.startswith(BILLING_PREFIX)


def canonical(doc: Mapping[str, Any], bound: Bound) -> Canonical | None:
    """The canonical form of the conversation in ``doc``, or None when it holds none (no
    ``messages`` list or ``input``, nothing in them but system messages, or a preamble past the
    ``bound``). The atoms stop before the one that would pass the ``bound``: a longer
    conversation is known by its beginning, which its later turns share. The walk never goes
    past the bound, whatever the document holds.

    Raises ``TypeError``, ``ValueError`` or ``RecursionError`` for shapes no dialect has."""
    source = _source(doc)
    if source is None:
        return None
    budget = _Budget(bound)
    system: list[Any] = []
    start = 0
    try:
        for name in ("system", "instructions", "system_prompt"):
            system += _pieces(doc.get(name), budget, skip_billing=True)
        for item in source:  # the leading system messages belong to the system prompt
            budget.step()
            if not isinstance(item, dict) or item.get("role") not in _SYSTEM_ROLES:
                break
            system += _pieces(item.get("content"), budget, skip_billing=True)
            start += 1
        preamble = _encode(["s", system, _tools(doc, budget)], budget)
    except _Spent:
        return None
    atoms: list[bytes] = []
    try:  # not contextlib.suppress: this runs on every request
        for item in islice(source, start, None):
            budget.step()
            if not isinstance(item, dict):
                raise TypeError("a message that is not an object")
            for atom in _item(item, item.get("role"), budget):
                if len(atoms) == bound.atoms:
                    raise _Spent
                atoms.append(_atom(atom, budget))
    except _Spent:  # the bound is reached: the atoms read so far are the chain
        pass
    return Canonical(preamble, atoms) if atoms else None


def _source(doc: Mapping[str, Any]) -> list[Any] | None:
    """The messages or input items of ``doc`` (a string input is one user message)."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        return messages
    given = doc.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return given if isinstance(given, list) else None


def _atom(atom: list[Any], budget: _Budget) -> bytes:
    """One atom's bytes; a tool call's JSON arguments read as the value they hold."""
    tag = atom[0]
    if tag == "t":
        return _strings(b"l3:s1:ts%d:%s" % _name(atom[1]), atom[2], budget)
    if tag == "r" and all(type(piece) is str for piece in atom[1]):
        return _strings(b"l2:s1:r", atom[1], budget)
    if tag == "c" and isinstance(atom[2], str):
        arguments = atom[2]
        if len(arguments) > budget.text:
            raise _Spent  # not even read
        with suppress(ValueError):  # not JSON: the string itself
            atom = ["c", atom[1], json.loads(arguments)]
    return _encode(atom, budget)


def _name(text: str) -> tuple[int, bytes]:
    data = text.encode("utf-8")
    return len(data), data


def _strings(head: bytes, run: list[str], budget: _Budget) -> bytes:
    """``head`` and a list of strings as :func:`_encode` would encode them (without its walk:
    the common atoms, a run of text and a tool's text result)."""
    parts = [head, b"l%d:" % len(run)]
    for text in run:
        if len(text) > budget.text:  # characters first: a string past the bound is not encoded
            raise _Spent
        data = text.encode("utf-8")
        budget.take(len(data))
        parts += (b"s%d:" % len(data), data)
    return b"".join(parts)


def _encode(value: Any, budget: _Budget) -> bytes:
    """``value`` (a parsed JSON value) in a prefix-free form: each string as its length and its
    UTF-8 bytes, each list and object with its count (an object's members by key), so no text
    is escaped: the cost is the bytes' copy, not a JSON encoder's pass over them."""
    parts: list[bytes] = []
    _feed(parts, value, budget)
    return b"".join(parts)


def _feed(parts: list[bytes], value: Any, budget: _Budget) -> None:
    if isinstance(value, str):
        if len(value) > budget.text:  # characters first: a string past the bound is not encoded
            raise _Spent
        data = value.encode("utf-8")
        budget.take(len(data))
        parts += (b"s%d:" % len(data), data)
    elif isinstance(value, list):
        budget.step()
        parts.append(b"l%d:" % len(value))
        for item in value:
            _feed(parts, item, budget)
    elif isinstance(value, dict):
        budget.step()
        parts.append(b"d%d:" % len(value))
        for key in sorted(value):
            _feed(parts, key, budget)
            _feed(parts, value[key], budget)
    elif value is None or isinstance(value, bool):
        parts.append(_SCALARS[value])
    elif isinstance(value, int):
        parts.append(b"i%d;" % value)
    elif isinstance(value, float):
        parts.append(b"f%r;" % value)
    else:
        raise TypeError("not a JSON value")


_SCALARS: dict[bool | None, bytes] = {None: b"n", True: b"t", False: b"f"}


def _tools(doc: Mapping[str, Any], budget: _Budget) -> list[Any]:
    """The tool schema, each tool as (name, description, parameters) whatever its dialect."""
    found: list[Any] = []
    for name in ("tools", "functions", "integrations"):
        listed = doc.get(name)
        if isinstance(listed, list):
            for tool in listed:
                budget.step()
                found.append(_tool(tool))
        elif listed is not None:
            found.append(["o", listed])
    return found


def _tool(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return ["o", tool]
    inner = tool.get("function")
    if isinstance(inner, dict):  # chat completions, Ollama
        tool = inner
    elif "input_schema" in tool:  # Anthropic Messages
        return ["f", tool.get("name"), tool.get("description"), tool.get("input_schema")]
    if "name" in tool and (inner is not None or tool.get("type") in (None, "function")):
        return ["f", tool.get("name"), tool.get("description"), tool.get("parameters")]
    return ["o", _stable(tool)]


def _stable(value: dict[str, Any]) -> dict[str, Any]:
    """A block without what changes between turns of the same conversation."""
    return {k: v for k, v in value.items() if k not in _VOLATILE}


def _pieces(value: Any, budget: _Budget, *, skip_billing: bool = False) -> list[Any]:
    """A content value as its pieces: text as strings, anything else as a tagged list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [] if skip_billing and is_billing_block(value) else [value]
    if not isinstance(value, list):
        return [["o", value]]
    pieces: list[Any] = []
    for part in value:
        budget.step()
        if not (skip_billing and is_billing_block(part)):
            pieces += _part(part, budget)
    return pieces


def _part(part: Any, budget: _Budget) -> list[Any]:
    """One content part or block, as pieces (none for reasoning)."""
    if isinstance(part, str):
        return [part]
    if not isinstance(part, dict):
        return [["o", part]]
    kind = part.get("type")
    if kind in _TEXT_PARTS or (kind is None and "text" in part):
        text = part.get("text")
        return [text] if isinstance(text, str) else [["o", text]]
    if kind in _IMAGE_PARTS:
        return [["i", _image(part)]]
    if kind in _SKIPPED_PARTS:
        return []
    if kind == "refusal":
        return [part.get("refusal")]
    if kind == "message":  # an LM Studio input item
        return _pieces(part.get("content"), budget)
    return [["o", _stable(part)]]


def _image(part: dict[str, Any]) -> Any:
    """An image's data (a data URL's payload, a base64 source) or its URL or file id."""
    source = part.get("source")
    if isinstance(source, dict):  # Anthropic
        found = source.get("data", source.get("url", source.get("file_id")))
    else:
        found = part.get("image_url", part.get("data_url", part.get("file_id")))
        if isinstance(found, dict):  # chat completions: {"url": ...}
            found = found.get("url")
    if isinstance(found, str) and found.startswith("data:"):
        return found.partition(",")[2]
    return found


def _item(item: dict[str, Any], role: Any, budget: _Budget) -> list[list[Any]]:
    """The atoms of one message or input item."""
    kind = item.get("type")
    if kind in _CALL_ITEMS:  # Responses
        return [["c", item.get("name"), item.get("arguments", item.get("input"))]]
    if kind in _RESULT_ITEMS:
        return [["r", _pieces(item.get("output"), budget)]]
    if kind in _SKIPPED_PARTS:
        return []
    if role is None:
        if kind in _TEXT_PARTS or kind in _IMAGE_PARTS or kind == "message":
            return _content("user", _part(item, budget))  # LM Studio's role-less input items
        return [["o", _stable(item)]]
    if not isinstance(role, str):
        return [["o", _stable(item)]]
    if role in _RESULT_ROLES:
        return [["r", _pieces(item.get("content"), budget)]]
    role = "system" if role in _SYSTEM_ROLES else role
    atoms = _content(role, _content_pieces(item.get("content"), budget))
    images = item.get("images")  # Ollama
    if isinstance(images, list):
        atoms += [["p", role, ["i", image]] for image in images]
    calls = item.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        budget.step()
        inner = call.get("function") if isinstance(call, dict) else None
        if isinstance(inner, dict):
            atoms.append(["c", inner.get("name"), inner.get("arguments")])
    legacy = item.get("function_call")
    if isinstance(legacy, dict):
        atoms.append(["c", legacy.get("name"), legacy.get("arguments")])
    return atoms


def _content_pieces(content: Any, budget: _Budget) -> list[Any]:
    """A message's content as pieces, its Anthropic tool calls and results as atoms of their own."""
    if not isinstance(content, list):
        return _pieces(content, budget)
    pieces: list[Any] = []
    for block in content:
        budget.step()
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            pieces.append(["c", block.get("name"), block.get("input")])
        elif kind == "tool_result":
            pieces.append(["r", _pieces(block.get("content"), budget)])
        else:
            pieces += _part(block, budget)
    return pieces


def _content(role: str, pieces: list[Any]) -> list[list[Any]]:
    """Atoms from a message's pieces: each run of text one atom of ``role``; images, calls and
    results atoms of their own."""
    atoms: list[list[Any]] = []
    run: list[str] = []
    for piece in pieces:
        if isinstance(piece, str):
            run.append(piece)
            continue
        if run:
            atoms.append(["t", role, run])
            run = []
        atoms.append(piece if piece[0] in ("c", "r") else ["p", role, piece])
    if run:
        atoms.append(["t", role, run])
    return atoms
