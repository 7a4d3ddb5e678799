# -*- test-case-name: tests.dialects.test_rename -*-
"""The answer side of §11.4 on native routes: every ``"model":"<local name>"`` of the node's answer
becomes the name the client sent, every other byte unchanged.

The rewrite is a ``bytes.replace`` of the member's compact form (``"model":"x"``) and of the form
with one space after the colon (``"model": "x"``, Python's and some servers' default), over each
chunk as it arrives, whatever the framing (NDJSON lines, SSE ``data:`` lines, one whole JSON
document). Inside a JSON string a quote is escaped, so the pattern can only match a real member:
a ``model`` member at any depth is renamed (nested ``model`` members name the model too). A chunk
that ends inside a possible pattern keeps only that partial pattern back until the next chunk (or
:meth:`Renamer.end`), so a frame is never delayed unless its last bytes might begin a ``model``
member. A node's serializer writes one form: once a form has matched, only that one is tried
(one search per chunk; a node mixing forms within one answer keeps the other form's name).
Names are compared in their JSON form, unescaped (``ensure_ascii`` off) and with
``\\uXXXX`` escapes; a server that escapes otherwise (``\\/``) is not renamed.
"""

from __future__ import annotations

import json

from nvpair_tw.dialects._common import JSON_TYPE

__all__ = ["Renamer", "renamer"]


def _pairs(local_model: str, client_model: str) -> list[tuple[bytes, bytes]]:
    """(pattern, replacement) for each JSON form of the local name and each colon spacing."""
    client = json.dumps(client_model, ensure_ascii=False)
    forms = sorted({json.dumps(local_model, ensure_ascii=False), json.dumps(local_model)})
    return [
        (f'"model"{colon}{form}'.encode(), f'"model"{colon}{client}'.encode())
        for form in forms
        for colon in (":", ": ")
    ]


class Renamer:
    """Rewrites ``"model":"<local>"`` to ``"model":"<client>"`` in a byte stream.

    :ivar content_type: the node's own ``Content-Type`` (the framing is unchanged).
    """

    __slots__ = ("_hold", "_pairs", "_prefixes", "_tail", "content_type")

    def __init__(self, local_model: str, client_model: str, content_type: bytes) -> None:
        self.content_type = content_type
        self._pairs = _pairs(local_model, client_model)
        self._hold = max(len(old) for old, _ in self._pairs) - 1
        self._prefixes = tuple(old for old, _ in self._pairs)
        self._tail = b""

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        """Not read on native routes: unknown."""
        return (None, None)

    def feed(self, data: bytes) -> bytes:
        if self._tail:
            data = self._tail + data
            self._tail = b""
        pairs = self._pairs
        if len(pairs) == 1:
            data = data.replace(pairs[0][0], pairs[0][1])
        else:
            for old, new in pairs:
                renamed = data.replace(old, new)
                if renamed is not data:  # the node's form: the only one tried from now on
                    self._pairs = [(old, new)]
                    self._prefixes = (old,)
                    self._hold = len(old) - 1
                    data = renamed
                    break
        if data.endswith(b"\n"):  # a whole line or event: no pattern holds a newline
            return data
        # keep back a suffix that may begin a pattern (it starts at a quote)
        size = len(data)
        index = data.find(b'"', max(0, size - self._hold))
        while index >= 0:
            piece = data[index:]
            if any(old.startswith(piece) for old in self._prefixes):
                self._tail = piece
                return data[:index]
            index = data.find(b'"', index + 1)
        return data

    def end(self) -> bytes:
        tail, self._tail = self._tail, b""
        return tail


class Identity:
    """The answer unchanged (the client's name is the node's)."""

    __slots__ = ("content_type",)

    def __init__(self, content_type: bytes) -> None:
        self.content_type = content_type

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return (None, None)

    def feed(self, data: bytes) -> bytes:
        return data

    def end(self) -> bytes:
        return b""


def renamer(local_model: str, client_model: str, content_type: bytes | None) -> Renamer | Identity:
    """The rewrite of a native route's answer for a client that named ``client_model`` where the
    node names ``local_model``; ``content_type`` is the node's (passed on unchanged; none given:
    JSON). With the same name on both sides, the bytes pass untouched."""
    kept = content_type if content_type is not None else JSON_TYPE
    if local_model == client_model:
        return Identity(kept)
    return Renamer(local_model, client_model, kept)
