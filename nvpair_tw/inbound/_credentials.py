# -*- test-case-name: tests.inbound.test_credentials -*-
"""Where a request carries credentials (docs/behaviour.md §14.2): the one credential the proxy
reads, and the proxy's keys wherever else a client put them.

The proxy reads a key in two places only: ``X-Api-Key: KEY`` when present, else ``Authorization:
Bearer KEY`` (:func:`credential`). One of its keys anywhere else — another header (Azure's
``Api-Key``, a cookie), the query (``?key=``), a ``Basic`` credential, a second credential in
``Authorization`` — is :data:`MISPLACED` (400 ``credential-misplaced``): such a request goes
nowhere, so the key cannot reach a node or a log. More than one credential in ``Authorization``
(two lines, or ``Bearer a, Bearer b``) or two ``X-Api-Key`` lines is :data:`SEVERAL` (400): the
proxy and a node could read different ones.

A key is found wherever it stands as a value of its own: a whole header value or query value, an
item between commas, semicolons or spaces, what follows an item's first ``=`` or ``:``, with quotes
removed, and each half of a decoded ``Basic`` credential. Keys are looked up by digest
(:meth:`~nvpair_tw.inbound._keys.KeyBook.holds`); nothing found is kept or shown. A header value
found to hold no key is remembered by its hash (:attr:`~nvpair_tw.inbound._keys.KeyBook.clean`),
so the values every request repeats (``User-Agent``, ``Accept``, an SDK's own headers) are
searched once per key set.
"""

from __future__ import annotations

import binascii
import re
from base64 import b64decode
from collections.abc import Callable
from urllib.parse import parse_qsl

from twisted.web.http_headers import Headers

from nvpair_tw.inbound._keys import CLEAN_VALUES, KeyBook
from nvpair_tw.inbound._rejection import Rejection

__all__ = ["MISPLACED", "SEVERAL", "bearer_token", "credential", "misplaced"]

MISPLACED = Rejection(
    400,
    "credential-misplaced",
    "one of the proxy's keys was sent where keys do not go: send it only as"
    " 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
)
SEVERAL = Rejection(
    400,
    "bad-request",
    "more than one credential: send one, as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
)

_ITEMS = re.compile(rb"[\s,;&]+")
_QUOTES = b"\"'"
_SINGLE = (b"bearer", b"basic")
"""Schemes whose credential is one token: anything after it is a second credential."""


def bearer_token(value: bytes) -> bytes | None:
    """The token of an ``Authorization: Bearer TOKEN`` value (scheme case-insensitive)."""
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def credential(headers: Headers) -> bytes | None:
    """The credential the proxy reads (§14.2): the first non-empty ``X-Api-Key`` when there is
    one, else the first ``Authorization: Bearer`` token; ``None`` when neither is sent."""
    for value in headers.getRawHeaders(b"x-api-key", []):
        if value.strip():
            return value.strip()
    for value in headers.getRawHeaders(b"authorization", []):
        token = bearer_token(value)
        if token is not None:
            return token
    return None


def _basic(token: bytes) -> tuple[bytes, ...]:
    """The halves of a ``Basic`` credential (``user:password``), when ``token`` decodes as one."""
    try:
        decoded = b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return ()
    user, _, password = decoded.partition(b":")
    return (decoded, user, password)


def _candidates(value: bytes) -> set[bytes]:
    """Every piece of ``value`` a key could be (see the module docstring), each once."""
    found = {value.strip()}
    items = [item for item in _ITEMS.split(value) if item]
    for index, item in enumerate(items):
        found.add(item.strip(_QUOTES))
        for mark in (b"=", b":"):
            _, sign, rest = item.partition(mark)
            if sign:
                found.add(rest.strip(_QUOTES))
        if item.lower() == b"basic" and index + 1 < len(items):
            found.update(_basic(items[index + 1]))
    found.discard(b"")
    return found


def _holds_key(value: bytes, book: KeyBook) -> bool:
    """Whether any piece of ``value`` is one of ``book``'s keys; a value that holds none is
    remembered as clean (by its hash)."""
    if any(book.holds(piece) for piece in _candidates(value)):
        return True
    if len(book.clean) >= CLEAN_VALUES:
        book.clean.clear()
    book.clean.add(hash(value))
    return False


def _in_place(name: bytes, value: bytes, is_key: Callable[[bytes], bool]) -> bool:
    """Whether ``value`` of header ``name`` is a key where the proxy reads keys, alone."""
    if name == b"x-api-key":
        return is_key(value.strip())
    if name == b"authorization":
        token = bearer_token(value)
        return token is not None and is_key(token)
    return False


def _several(headers: Headers) -> bool:
    """Whether more than one credential is sent in ``Authorization`` or ``X-Api-Key``."""
    keys = headers.getRawHeaders(b"x-api-key", [])
    authorizations = headers.getRawHeaders(b"authorization", [])
    if len(keys) > 1 or len(authorizations) > 1:
        return True
    if not authorizations:
        return False
    scheme, _, rest = authorizations[0].strip().partition(b" ")
    return scheme.lower() in _SINGLE and bool(_ITEMS.search(rest.strip()))


def misplaced(headers: Headers, query: bytes, book: KeyBook) -> Rejection | None:
    """:data:`MISPLACED` when one of ``book``'s keys is anywhere but where the proxy reads it,
    :data:`SEVERAL` for more than one credential, else None."""
    clean = book.clean
    for name, values in headers.getAllRawHeaders():
        for value in values:
            if hash(value) in clean:
                continue  # searched before: it holds no key, so none in place either
            if not _in_place(name.lower(), value, book.holds) and _holds_key(value, book):
                return MISPLACED
    if query:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
        texts = (text.encode("latin-1") for pair in pairs for text in pair)
        if any(book.holds(piece) for text in texts for piece in _candidates(text)):
            return MISPLACED
    return SEVERAL if _several(headers) else None
