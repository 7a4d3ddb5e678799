# -*- test-case-name: tests.corridor.test_decoding -*-
"""Compressed request bodies (docs/behaviour.md §17.5), decoded before §14.1's one parse.

A body with ``Content-Encoding: gzip``, ``deflate`` or ``zstd`` (coding agents send zstd; several
codings are undone last first, ``identity`` is nothing) is decoded here, and every later stage —
the parse, the scope check, translation, the node — sees the decoded body, which is forwarded
without the header. The size cap applies to the decoded size: decoding stops with **413**
``body-too-large`` as soon as the output passes it, however small the compressed body was
(nothing is ever inflated without that bound). Any other coding is **415**
``unsupported-encoding``; a body that is not what its coding says is **400** ``bad-body``.

Decoding never holds the reactor long: the output comes in slices of :data:`SLICE` bytes, and
after each slice the decode yields to the reactor for a turn (docs/performance.md has the
figures: one slice takes well under the 10 ms a turn may hold it).
"""

from __future__ import annotations

import zlib
from collections.abc import Generator, Iterator
from enum import Enum

import zstandard
from attrs import evolve
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers

from nvpair_tw.corridor._head import Head
from nvpair_tw.inbound import Rejection

__all__ = ["SLICE", "Coding", "codings", "decode_body"]

SLICE = 1 << 18
"""Bytes of decoded output made per reactor turn (256 KiB: about 7 ms of gzip, 1.5 ms of zstd on
the project's 2-core test machine)."""


class Coding(Enum):
    """A content coding the proxy decodes (RFC 9110 §8.4.1)."""

    GZIP = "gzip"
    DEFLATE = "deflate"
    ZSTD = "zstd"
    IDENTITY = "identity"


_CODINGS = {
    "gzip": Coding.GZIP,
    "x-gzip": Coding.GZIP,
    "deflate": Coding.DEFLATE,
    "zstd": Coding.ZSTD,
    "identity": Coding.IDENTITY,
}
_HEADER = b"content-encoding"


class _Bad(Exception):
    """The body is not what its coding says."""


def codings(headers: Headers) -> list[Coding] | Rejection:
    """The codings ``Content-Encoding`` lists, in the order they were applied, or 415."""
    found: list[Coding] = []
    for line in headers.getRawHeaders(_HEADER) or ():
        for token in line.decode("latin-1").split(","):
            name = token.strip().lower()
            if not name:
                continue
            coding = _CODINGS.get(name)
            if coding is None:
                shown = name[:40]
                message = f"request body coding '{shown}' is not supported (gzip, deflate, zstd)"
                return Rejection(415, "unsupported-encoding", message)
            found.append(coding)
    return found


def _zlib_stream(data: bytes, wbits: int) -> Generator[bytes, None, bytes]:
    """Output of one zlib-family stream at the start of ``data``, at most :data:`SLICE` bytes a
    piece; returns the bytes after its end."""
    decoder = zlib.decompressobj(wbits)
    chunk = data
    while not decoder.eof:
        try:
            out = decoder.decompress(chunk, SLICE)
        except zlib.error as error:
            raise _Bad(str(error)) from None
        if out:
            yield out
        chunk = decoder.unconsumed_tail
        if not chunk and not out and not decoder.eof:
            raise _Bad("the compressed body ends early")
    return decoder.unused_data


def _gzip_pieces(data: bytes) -> Iterator[bytes]:
    """gzip members one after the other (RFC 1952 allows several)."""
    while data:
        data = yield from _zlib_stream(data, 16 + zlib.MAX_WBITS)


def _deflate_pieces(data: bytes) -> Iterator[bytes]:
    """HTTP's ``deflate`` is the zlib format (RFC 1950); a raw deflate stream, which some clients
    send instead, is taken too."""
    zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    rest = yield from _zlib_stream(data, zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
    if rest:
        raise _Bad("bytes after the end of the compressed body")


def _zstd_pieces(data: bytes) -> Iterator[bytes]:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        while out := reader.read(SLICE):
            yield out
    except zstandard.ZstdError as error:
        raise _Bad(str(error)) from None


def _pieces(coding: Coding, data: bytes) -> Iterator[bytes]:
    if coding is Coding.GZIP:
        return _gzip_pieces(data)
    if coding is Coding.DEFLATE:
        return _deflate_pieces(data)
    if coding is Coding.ZSTD:
        return _zstd_pieces(data)
    return iter((data,))


def _turn(clock: IReactorTime) -> Deferred[None]:
    """Fires on the reactor's next turn."""
    turn: Deferred[None] = Deferred()
    clock.callLater(0, turn.callback, None)
    return turn


def _too_large(limit: int) -> Rejection:
    return Rejection(
        413, "body-too-large", f"request body exceeds the {limit}-byte limit once decoded"
    )


async def _decode(coding: Coding, data: bytes, limit: int, clock: IReactorTime) -> bytes:
    """``data`` decoded, a slice per reactor turn; raises ``_TooLarge`` past ``limit``."""
    parts: list[bytes] = []
    size = since = 0
    for piece in _pieces(coding, data):
        size += len(piece)
        if size > limit:
            raise _TooLarge()
        parts.append(piece)
        since += len(piece)
        if since >= SLICE:
            since = 0
            await _turn(clock)
    return b"".join(parts)


class _TooLarge(Exception):
    """The decoded body passed the cap."""


async def decode_body(
    head: Head, body: bytes, limit: int, clock: IReactorTime
) -> tuple[Head, bytes] | Rejection:
    """The head without ``Content-Encoding`` and the body decoded (unchanged when it names no
    coding), or the refusal: 415, 413 past ``limit`` decoded bytes, 400 for a corrupt body."""
    listed = codings(head.headers)
    if isinstance(listed, Rejection):
        return listed
    if not listed:
        return head, body
    try:
        for coding in reversed(listed):
            body = await _decode(coding, body, limit, clock)
    except _TooLarge:
        return _too_large(limit)
    except _Bad as error:
        message = f"the request body is not valid {coding.value}: {error}"[:300]
        return Rejection(400, "bad-body", message)
    headers = head.headers.copy()
    headers.removeHeader(_HEADER)
    return evolve(head, headers=headers), body
