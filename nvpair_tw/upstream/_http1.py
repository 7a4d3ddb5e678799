# -*- test-case-name: tests.upstream.test_http1 -*-
"""HTTP/1.x response reading without I/O (sans-IO, as h11): bytes in, values out.

:class:`HeadParser` reads a response head from successive reads into a :class:`ResponseHead`
(interim 1xx heads skipped), :class:`BodyReader` frames the body that follows it (``HEAD``, 204,
304, ``Content-Length``, chunked, close-delimited) and :class:`ChunkedDecoder` decodes
``Transfer-Encoding: chunked`` in bulk, every complete chunk of a read at once. Nothing here holds
a transport, a protocol or a clock; a bad answer raises :class:`BadResponse`, whose text never
holds the node's bytes. The node client (``_protocol``) and the WebSocket tunnel
(``corridor._tunnel``) read their heads with these.
"""

from __future__ import annotations

import re
from enum import Enum

from attrs import frozen
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

from nvpair_tw.core import IllegalCall, header_tokens

__all__ = [
    "MAX_HEADERS",
    "MAX_LINE",
    "TOKEN",
    "BadResponse",
    "BodyReader",
    "ChunkedDecoder",
    "HeadParser",
    "ResponseHead",
]

MAX_LINE = 16384
"""Longest status, header, chunk-size or trailer line accepted (Twisted's ``LineReceiver``)."""

MAX_HEADERS = 500
"""Most header (or trailer) lines accepted in one response head (Twisted's server limit)."""

TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
"""An HTTP token (a method, a header name), the whole of the bytes."""
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])\Z")
_HEX = frozenset(b"0123456789abcdefABCDEF")
# A whole chunk-size line as engines send it (size, optional extensions, CRLF): the fast path.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]*)?\r\n")


class BadResponse(Exception):
    """The node's answer is not HTTP/1.x as we can read it; the text never holds its bytes."""


class _Chunk(Enum):
    SIZE = "size"
    DATA = "data"
    DATA_END = "data-end"
    TRAILER = "trailer"
    DONE = "done"


_PLAIN_SIZES = {b"%x" % size: size for size in range(1, 1 << 12)}
"""The size lines engines write (a non-empty chunk's length in lowercase hex alone, below 4 KiB)
to the sizes they state: a chunk's size is one lookup (the chunks of a split read all at once,
in C, ``map``), not a regular-expression match or a formatting in Python. A larger chunk (or any
other size line) is left to the regular-expression loop, one match for its many bytes."""


_WALK = 1 << 10
"""Bytes of whole plain chunks walked one by one; a longer rest of a read is split once."""


def _plain_chunks(data: bytes, pos: int, parts: list[bytes | memoryview]) -> int:
    """The leading run of whole chunks at ``pos`` whose size line is the payload's length in
    lowercase hex alone (what engines write, :data:`_PLAIN_SIZES`): their payloads are appended
    to ``parts``; where the run ends. The regular-expression loop takes whatever follows (any
    other size line, a cut chunk, the last chunk).

    A token stream's read (a chunk or a few) is walked chunk by chunk; once what is left passes
    :data:`_WALK` bytes (a burst) it is split at CRLF at once (:func:`_split_run`), unless the
    chunk just walked held a CRLF (an engine whose events end in CRLF: a split would not line
    up with its chunks, so its bursts are walked)."""
    end = len(data)
    while pos < end:
        eol = data.find(b"\r\n", pos, pos + 5)
        size = _PLAIN_SIZES.get(data[pos:eol]) if eol > pos else None
        if size is None:
            return pos
        start = eol + 2
        stop = start + size
        if data[stop : stop + 2] != b"\r\n":
            return pos
        parts.append(data[start:stop])
        pos = stop + 2
        if end - pos > _WALK and data.find(b"\r\n", start, stop) < 0:
            return _split_run(data, pos, parts)
    return pos


def _split_run(data: bytes, pos: int, parts: list[bytes | memoryview]) -> int:
    """:func:`_plain_chunks` for a long rest of a read: one split at CRLF, the size lines checked
    against the payloads' lengths by a lookup each, in C (``map``), not a formatting each in
    Python; the run ends before the first chunk that is not plain or whose payload holds a CRLF
    (its pieces cannot match its size). Where it ends is found from the few pieces after it."""
    pieces = data[pos:].split(b"\r\n")
    whole = (len(pieces) - 1) // 2  # a size line, a payload and the CRLF after it
    payloads = pieces[1 : 2 * whole : 2]
    lengths = list(map(len, payloads))
    stated = list(map(_PLAIN_SIZES.get, pieces[0 : 2 * whole : 2]))  # None: not plain
    if whole and stated[-1] != lengths[-1]:  # usually the body's last chunk (size 0)
        del stated[-1], lengths[-1]
    run = len(stated)
    if stated != lengths:  # they differ somewhere: the run ends there
        run = 0
        while stated[run] == lengths[run]:
            run += 1
    parts += payloads if run == whole else payloads[:run]
    left = pieces[2 * run :]  # CRLFs between them, and one after the run
    return len(data) - sum(map(len, left)) - 2 * (len(left) - 1)


class ChunkedDecoder:
    """Decodes ``Transfer-Encoding: chunked`` in bulk: :meth:`feed` returns every payload byte found
    in the bytes it is given, joined, however many chunks (or parts of chunks) they hold."""

    def __init__(self) -> None:
        self._state = _Chunk.SIZE
        self._remaining = 0
        self._partial = b""
        self._trailers = 0

    @staticmethod
    def _whole_chunks(data: bytes, pos: int, parts: list[bytes | memoryview]) -> int:
        """Append the payloads of the run of complete, regular, non-empty chunks at ``pos`` to
        ``parts``; where the run ends."""
        pos = _plain_chunks(data, pos, parts)
        end = len(data)
        match = _SIZE_LINE.match
        while pos < end:
            line = match(data, pos)
            if line is None:
                break
            size = int(line.group(1), 16)
            start = line.end()
            stop = start + size
            if not size or data[stop : stop + 2] != b"\r\n":
                break
            parts.append(data[start:stop])
            pos = stop + 2
        return pos

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """The payload in ``data`` and, once the last chunk and the trailers are complete, the
        bytes after them (``None`` while the body goes on). Raises :class:`BadResponse`.

        Runs of whole, regular chunks (a token stream's usual read) go through
        :meth:`_whole_chunks`, one regular-expression match each; anything else (a chunk cut by
        the read, the last chunk and trailers, lenient or bad framing) line by line, after which
        the next chunk boundary goes back to the fast path.
        """
        if self._state is _Chunk.DONE:
            raise IllegalCall("feed after the last chunk")
        if self._partial:
            data, self._partial = self._partial + data, b""
        view = memoryview(data)
        parts: list[bytes | memoryview] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._state is _Chunk.SIZE:
                pos = self._whole_chunks(data, pos, parts)
                if pos >= end:
                    break
            if self._state is _Chunk.DATA:
                take = min(self._remaining, end - pos)
                parts.append(view[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _Chunk.DATA_END
                continue
            eol = data.find(b"\n", pos, pos + MAX_LINE + 1)
            if eol < 0:
                if end - pos > MAX_LINE:
                    raise BadResponse("chunk line too long")
                self._partial = data[pos:]
                break
            line = data[pos:eol]
            pos = eol + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if self._line(line):
                return b"".join(parts), data[pos:]
        return b"".join(parts), None

    def _line(self, line: bytes) -> bool:
        """One framing line; whether it ended the body."""
        if self._state is _Chunk.SIZE:
            size = line.split(b";", 1)[0].strip(b" \t")
            if not size or len(size) > 16 or not _HEX.issuperset(size):
                raise BadResponse("malformed chunk size")
            self._remaining = int(size, 16)
            self._state = _Chunk.DATA if self._remaining else _Chunk.TRAILER
        elif self._state is _Chunk.DATA_END:
            if line:
                raise BadResponse("chunk data not followed by CRLF")
            self._state = _Chunk.SIZE
        elif line:  # a trailer: read past, bounded
            self._trailers += 1
            if self._trailers > MAX_HEADERS:
                raise BadResponse("too many trailers")
        else:
            self._state = _Chunk.DONE
            return True
        return False


class _Framing(Enum):
    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    CLOSE = "close"


@frozen
class ResponseHead:
    """A complete response head (interim 1xx heads skipped) and the bytes that followed it."""

    version: tuple[bytes, int, int]
    code: int
    phrase: bytes
    headers: Headers
    rest: bytes


class HeadParser:
    """Reads one response head from successive reads; raises :class:`BadResponse` on a bad one
    (line or header count over the limits, a malformed status line or header)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._status: tuple[tuple[bytes, int, int], int, bytes] | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []

    def feed(self, data: bytes) -> ResponseHead | None:
        """The head once it is complete, else None (the bytes are kept for the next read).

        A head that starts in this read is parsed from it as it is: a read that brings the head
        and a whole streamed body with it (an engine's burst) is not copied into the buffer and
        out again; only an unfinished head is kept."""
        buffer = self._buffer
        text: bytes | bytearray = data
        if buffer:
            buffer += data
            text = buffer
        start = 0
        while True:
            eol = text.find(b"\n", start, start + MAX_LINE + 1)
            if eol < 0:
                if len(text) - start > MAX_LINE:
                    raise BadResponse("response head line too long")
                if text is buffer:
                    del buffer[:start]
                else:
                    buffer += data[start:]
                return None
            line = bytes(text[start:eol]).removesuffix(b"\r")
            start = eol + 1
            if self._status is None:
                self._status = _status_line(line)
            elif line:
                self._header_line(line)
            elif 100 <= self._status[1] < 200 and self._status[1] != 101:
                self._status, self._raw_headers = None, []  # interim: skip
            else:
                version, code, phrase = self._status
                headers = Headers()
                for name, value in self._raw_headers:
                    headers.addRawHeader(name, value)
                return ResponseHead(version, code, phrase, headers, bytes(text[start:]))

    def _header_line(self, line: bytes) -> None:
        if len(self._raw_headers) >= MAX_HEADERS:
            raise BadResponse("too many response headers")
        name, colon, value = line.partition(b":")
        if not colon or not TOKEN.match(name):
            raise BadResponse("malformed response header")
        self._raw_headers.append((name, value.strip(b" \t")))


class BodyReader:
    """The framing of one response body: what :meth:`feed` returns is the payload of a read and,
    once the body is complete, the bytes after it (None while it goes on).

    :ivar framing: How the body is delimited (none, ``Content-Length``, chunked, the close).
    :ivar length: ``IResponse.length``: an int, or ``UNKNOWN_LENGTH``.
    :ivar reusable: Whether the framing and the head allow the connection to be reused.
    """

    def __init__(self, method: bytes, head: ResponseHead) -> None:
        """Raises :class:`BadResponse` on a malformed ``Content-Length``."""
        headers = head.headers
        self._chunks: ChunkedDecoder | None = None
        self._remaining = 0
        self.length: int | object = UNKNOWN_LENGTH
        if method == b"HEAD" or head.code in (204, 304):
            self.framing, self.length = _Framing.NONE, 0
        elif headers.hasHeader(b"transfer-encoding"):
            if header_tokens(headers, b"transfer-encoding")[-1:] == [b"chunked"]:
                self.framing = _Framing.CHUNKED
                self._chunks = ChunkedDecoder()
            else:
                self.framing = _Framing.CLOSE
        elif headers.hasHeader(b"content-length"):
            lengths = set(header_tokens(headers, b"content-length"))
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                raise BadResponse("malformed Content-Length")
            self._remaining = self.length = int(next(iter(lengths)))
            self.framing = _Framing.LENGTH if self.length else _Framing.NONE
        else:
            self.framing = _Framing.CLOSE
        self.reusable = not (
            head.version[1:] != (1, 1)
            or self.framing is _Framing.CLOSE
            or b"close" in header_tokens(headers, b"connection")
        )

    @property
    def empty(self) -> bool:
        """No body at all (HEAD, 204, 304, ``Content-Length: 0``)."""
        return self.framing is _Framing.NONE

    @property
    def close_delimited(self) -> bool:
        """The body ends when the connection does."""
        return self.framing is _Framing.CLOSE

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """Raises :class:`BadResponse` on bad chunk framing."""
        if self._chunks is not None:
            return self._chunks.feed(data)
        if self.framing is _Framing.LENGTH:
            take = data[: self._remaining]
            self._remaining -= len(take)
            return take, (data[len(take) :] if not self._remaining else None)
        return data, None


def _status_line(line: bytes) -> tuple[tuple[bytes, int, int], int, bytes]:
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        raise BadResponse("malformed status line")
    version = _VERSION.match(parts[0])
    if version is None or version.group(1) != b"1":
        raise BadResponse("not an HTTP/1.x status line")
    if len(parts[1]) != 3 or not parts[1].isdigit():
        raise BadResponse("malformed status code")
    phrase = parts[2] if len(parts) == 3 else b""
    return (b"HTTP", 1, int(version.group(2))), int(parts[1]), phrase
