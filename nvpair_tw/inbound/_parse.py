# -*- test-case-name: tests.inbound.test_parse -*-
"""One strict reading of a request's body and model (docs/behaviour.md §14.1; the path is
:mod:`nvpair_tw.inbound._target`'s).

Engines written in Go read the first JSON value of a body, replace bad UTF-8 and match field
names case-insensitively (the last match wins). Whatever the proxy reads must therefore be what
the node will read: a body is accepted only when every reader agrees on it — one JSON object per
RFC 8259, nothing after it, no top-level keys equal under ``casefold()``
(:func:`parse_document`). :func:`read_model` takes the model from that one document,
:func:`read_models` every model a route names in it, each by :func:`model_rule`, the one rule for
a model name wherever a caller writes it (a body, a path).

The parse also gives where each top-level member's value lies in the body's bytes (a
:class:`Parsed` is a :class:`~nvpair_tw.core.Outline` with its document), so the rewrites that
follow (``"stream": true``, the model's local name) edit those spans and never read a large body
again. :func:`parse_body` and :func:`parse_large` give the document alone.

Small bodies are read by the C scanner, with a short Python walk over the top-level members;
when that finds anything wrong, the same slice-by-slice reader that :func:`parse_document_large`
runs cooperatively names the fault, so both give the same answers and the same spans. Pure: no
reactor, except the clock :func:`parse_document_large` yields to.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Generator, Iterator
from typing import Any, Final, NoReturn

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Cooperator

from nvpair_tw.core import Outline, Span
from nvpair_tw.inbound._ingress import Rejection

__all__ = [
    "LARGE_BODY",
    "MAX_DEPTH",
    "MAX_MODEL_BYTES",
    "Parsed",
    "model_rule",
    "parse_body",
    "parse_document",
    "parse_document_large",
    "parse_large",
    "read_model",
    "read_models",
]

MAX_DEPTH: Final = 128
MAX_MODEL_BYTES: Final = 256
# Above this size callers use parse_large. parse_body holds the reactor for the whole body: about
# 6 ms per MiB of long strings but 60 ms per MiB of small objects (bench/parse.py), so 256 KiB
# keeps that hold near 15 ms at worst; below it, parse_body is the cheaper of the two.
LARGE_BODY: Final = 256 << 10

# --- the model ------------------------------------------------------------------------------

_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f]")


def _bad_model(why: str) -> Rejection:
    return Rejection(400, "bad-model", f"bad model: {why}")


def model_rule(value: object) -> str | Rejection | None:
    """A caller's model name as the model rule reads it (docs/behaviour.md §14.1): ``None`` for
    null, absent or blank (none named); the name itself when it is a string of at most 256
    UTF-8 bytes without control characters; else 400 ``bad-model``, which never repeats it."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        return _bad_model("not a string")
    if len(value) * 4 > MAX_MODEL_BYTES and len(value.encode("utf-8")) > MAX_MODEL_BYTES:
        return _bad_model(f"longer than {MAX_MODEL_BYTES} bytes")
    if _CONTROL_CHARS.search(value):
        return _bad_model("a control character")
    return value


def read_model(doc: dict[str, Any], names: tuple[str, ...]) -> str | Rejection | None:
    """The model of ``doc``: the first of ``names`` (casefolded keys) that holds a non-blank string.

    Null, absent and blank values fall through to the next name and then to ``None`` (not gated);
    a non-string, a control character or more than 256 UTF-8 bytes is 400 ``bad-model``.
    """
    folded = {key.casefold(): value for key, value in doc.items()}
    for name in names:
        model = model_rule(folded.get(name))
        if model is not None:
            return model
    return None


def read_models(doc: dict[str, Any], names: tuple[str, ...]) -> tuple[str, ...] | Rejection:
    """Every model ``doc`` names under ``names`` (casefolded keys), each by :func:`model_rule`:
    what a key's scope is checked against (docs/behaviour.md §14.2)."""
    folded = {key.casefold(): value for key, value in doc.items()}
    found: list[str] = []
    for name in names:
        model = model_rule(folded.get(name))
        if isinstance(model, Rejection):
            return model
        if model is not None:
            found.append(model)
    return tuple(found)


# --- the body: faults -------------------------------------------------------------------------


class _Fault(Exception):
    """A body refused; ``args[0]`` says why (never echoing the body)."""


class _NonFinite(ValueError):
    """NaN, Infinity or -Infinity, which RFC 8259 does not have."""


BOM: Final = "body starts with a byte order mark"
NOT_UTF8: Final = "body is not UTF-8"
NOT_OBJECT: Final = "body is not a JSON object"
SYNTAX: Final = "body is not valid JSON"
NON_FINITE: Final = "body holds NaN, Infinity or a number beyond a double's range"
LONE_SURROGATE: Final = "body holds a lone surrogate escape"
TOO_DEEP: Final = f"body nests deeper than {MAX_DEPTH}"
DUPLICATE: Final = "body has two top-level keys equal ignoring case"
TRAILING: Final = "body has data after the JSON object"


def _refuse(why: str) -> NoReturn:
    raise _Fault(why)


def _non_finite(name: str) -> NoReturn:
    raise _NonFinite(name)


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one beyond a double's range would be Infinity."""
    value = float(text)
    if value in (_INFINITY, -_INFINITY):
        raise _NonFinite(text)
    return value


_INFINITY: Final = float("inf")
_DECODER = json.JSONDecoder(parse_constant=_non_finite, parse_float=_finite)
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_STRING: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")
_SPACE = frozenset(" \t\n\r")
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UTF8_BOM = b"\xef\xbb\xbf"
_NOT_OPENING = bytes(range(256)).translate(None, b"[{")


def _depth(value: object, limit: int) -> int:
    """How deep containers nest in ``value`` (a scalar is 0), counting no further than ``limit + 1``."""
    level, current = 0, [value]
    while level <= limit:
        containers = [item for item in current if type(item) in _CONTAINERS]
        if not containers:
            break
        level += 1
        current = [
            child
            for item in containers
            for child in (item.values() if type(item) is dict else item)  # type: ignore[attr-defined]
        ]
    return level


_CONTAINERS: Final = (dict, list)


def _has_lone_surrogate(value: object) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _suspect(text: str, start: int, end: int, value: object, outer: int) -> bool:
    """Whether ``value`` (read from ``text[start:end]`` inside ``outer`` containers) breaks a rule."""
    brackets = text.count("[", start, end) + text.count("{", start, end)
    if brackets + outer > MAX_DEPTH and outer + _depth(value, MAX_DEPTH - outer) > MAX_DEPTH:
        return True
    return _MAYBE_SURROGATE.search(text, start, end) is not None and _has_lone_surrogate(value)


# --- the body: small, at C speed ---------------------------------------------------------------


@frozen(slots=False)  # dict-backed, like Outline: built in half the time (the hot path)
class Parsed(Outline):
    """A body's one JSON object (``doc``), and the :class:`~nvpair_tw.core.Outline` of its
    top-level members in the body's bytes: what the rewriters of §6.5 and §11.4 edit without
    reading the body again (``Outlined(body, parsed)``). One value, not two, for the hot path.
    """

    doc: dict[str, Any]


def parse_body(body: bytes) -> dict[str, Any] | Rejection:
    """The document of :func:`parse_document` (the lead's callers that need no outline)."""
    parsed = parse_document(body)
    return parsed if isinstance(parsed, Rejection) else parsed.doc


def parse_document(body: bytes) -> Parsed | Rejection:
    """Exactly one JSON object (RFC 8259, UTF-8, depth ≤ 128, distinct folded top-level keys),
    with the outline of its top-level members (UTF-8 byte offsets of ``body``).

    Anything else is 400 ``bad-body``. Holds the reactor for the whole body: above
    :data:`LARGE_BODY` use :func:`parse_document_large`.
    """
    try:
        text = body.decode("utf-8")  # a BOM is U+FEFF, not "{": _walk refuses it
        parsed = _walk(text)
    except (ValueError, RecursionError, StopIteration, IndexError):
        parsed = None
    if parsed is not None and not _suspect_body(body, text, parsed.doc):
        return parsed if len(text) == len(body) else _drained(_outlined(parsed, text, 0))
    return _drained(_read(body))


def _drained(reader: Generator[None, None, Parsed]) -> Parsed | Rejection:
    """What ``reader`` gives, run to its end at once."""
    try:
        while True:
            next(reader)
    except StopIteration as done:
        result: Parsed = done.value
        return result
    except _Fault as fault:
        return Rejection(400, "bad-body", str(fault))


def _suspect_body(body: bytes, text: str, doc: dict[str, Any]) -> bool:
    """:func:`_suspect` for a whole body, its bracket count taken from the bytes (one C pass)."""
    if len(body.translate(None, _NOT_OPENING)) > MAX_DEPTH and _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        return True
    return _MAYBE_SURROGATE.search(text) is not None and _has_lone_surrogate(doc)


def _walk(text: str) -> Parsed | None:
    """The top-level object of ``text``, each member's value read by the C scanner, with its
    outline in character offsets; or ``None`` when it is not one object with distinct folded keys
    and nothing after it; raises on bad JSON.

    Written like the pure-Python ``json.decoder.JSONObject``: a character test before any regex,
    since a client's JSON is compact or uses single spaces.
    """
    string, scan, ws, space = _STRING, _SCAN, _WS.match, _SPACE
    i = 0 if text[0] == "{" else ws(text, 0).end()  # type: ignore[union-attr]
    if text[i] != "{":
        return None
    opening = i
    spans: list[Span] = []
    note = spans.append
    i = i + 1 if text[i + 1] not in space else ws(text, i + 1).end()  # type: ignore[union-attr]
    doc: dict[str, Any] = {}
    folds = set()
    closing = text[i] == "}"
    while not closing:
        if text[i] != '"':
            return None
        key, i = string(text, i + 1)
        if text[i] != ":":
            i = ws(text, i).end()  # type: ignore[union-attr]
            if text[i] != ":":
                return None
        i += 1
        if text[i] in space:
            i += 1
            if text[i] in space:
                i = ws(text, i).end()  # type: ignore[union-attr]
        doc[key], end = scan(text, i)
        note((key, i, end))
        i = end
        folds.add(key.casefold())
        if text[i] in space:
            i = ws(text, i).end()  # type: ignore[union-attr]
        closing = text[i] == "}"
        if not closing:
            if text[i] != ",":
                return None
            i += 1
            if text[i] in space:
                i += 1
                if text[i] in space:
                    i = ws(text, i).end()  # type: ignore[union-attr]
    end = i + 1
    if end != len(text) and ws(text, end).end() != len(text):  # type: ignore[union-attr]
        return None
    return Parsed(opening, i, tuple(spans), doc) if len(folds) == len(spans) else None


# --- the body: any size, in slices -------------------------------------------------------------

_SLICE: Final = 1 << 16  # characters of work between yields
_DECODE_SLICE: Final = 1 << 20  # bytes decoded between yields
_STRING_PART = re.compile(r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_MISS: Final = object()
_SMALL: Final = 256  # characters: the smallest first window
_RETRIES: Final = 3
_SEPARATORS: Final = {"{": "},", "[": "],", '"': '",'}
_CLOSER: Final = {"[": "]", "{": "}"}
_OVERHEAD: Final = 64  # the Python work of one element or member, counted as characters


def _read(body: bytes) -> Generator[None, None, Parsed]:
    """Decode, then read; yields between slices; raises :class:`_Fault`.

    The text is built by appending slices to one string (CPython grows it in place) that starts
    with one character as wide as the widest in the body, so no append has to widen, and copy, all
    that came before; the reader starts after that character.
    """
    if body.startswith(_UTF8_BOM):
        _refuse(BOM)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pieces, widest = [], 0
    try:
        for start in range(0, len(body), _DECODE_SLICE):
            pieces.append(decoder.decode(body[start : start + _DECODE_SLICE]))
            widest = max(widest, _width(pieces[-1]))
            yield
        decoder.decode(b"", True)
    except UnicodeDecodeError:
        _refuse(NOT_UTF8)
    text = _WIDEST[widest]
    pieces.reverse()
    while pieces:
        text += pieces.pop()
        yield
    parsed = yield from _Reader(text).document()
    return (yield from _outlined(parsed, text, 1))


def _outlined(parsed: Parsed, text: str, base: int) -> Generator[None, None, Parsed]:
    """``parsed``, whose outline is in character offsets of ``text`` from ``base``, with that
    outline in UTF-8 byte offsets; a slice of characters is encoded at a time."""
    outline = parsed
    if text.isascii():  # O(1): CPython knows; the offsets are already the bytes'
        return parsed
    points = [outline.opening] + [at for _, s, e in outline.members for at in (s, e)]
    offsets: list[int] = []
    char, byte, work = base, 0, 0
    for position in [*points, outline.closing]:
        position += base
        while position - char > _DECODE_SLICE:
            byte += len(text[char : char + _DECODE_SLICE].encode("utf-8"))
            char += _DECODE_SLICE
            yield
        byte += len(text[char:position].encode("utf-8"))
        work += position - char + _OVERHEAD
        char = position
        offsets.append(byte)
        if work > _DECODE_SLICE:
            work = 0
            yield
    members = tuple(
        (key, offsets[2 * n + 1], offsets[2 * n + 2])
        for n, (key, _, _) in enumerate(outline.members)
    )
    return Parsed(offsets[0], offsets[-1], members, parsed.doc)


def _width(text: str) -> int:
    """0 for ASCII, 1 for Latin-1, 2 for the BMP, 3 beyond: how wide CPython stores ``text``."""
    if text.isascii():
        return 0
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return 3 if len(text.encode("utf-16-le")) > 2 * len(text) else 2
    return 1


_WIDEST: Final = (" ", "\xff", "\uffff", "\U0010ffff")


class _Reader:
    """A recursive-descent JSON reader that never does more than a slice of work between yields.

    Values are read by the C scanner whole when they fit in a window, array elements and object
    members in batches of a window; only what does not fit is descended into, and a long string is
    decoded a slice at a time. The first fault met, in reading order, is the answer.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.work = 0
        self.window = _SLICE

    def _ws(self, i: int) -> int:
        return _WS.match(self.text, i).end()  # type: ignore[union-attr]

    def _due(self) -> bool:
        """Whether a slice of work has been done since the last yield (then start counting again)."""
        if self.work < _SLICE:
            return False
        self.work = 0
        return True

    def document(self) -> Generator[None, None, Parsed]:
        """The document, its outline in character offsets after the width character (_read)."""
        text, doc, folds = self.text, {}, set()
        spans: list[Span] = []
        i = self._ws(1)  # after the width character (_read)
        if text[i : i + 1] != "{":
            _refuse(NOT_OBJECT)
        opening, note = i - 1, spans.append
        i = self._ws(i + 1)
        closing = text[i : i + 1] == "}"
        while not closing:
            if text[i : i + 1] != '"':
                _refuse(SYNTAX)
            key, i = yield from _string(text, i)
            i = self._ws(i)
            if text[i : i + 1] != ":":
                _refuse(SYNTAX)
            self.i = i + 1
            start = self._ws(i + 1) - 1
            value = yield from self.value(2)
            if key.casefold() in folds:
                _refuse(DUPLICATE)
            note((key, start, self.i - 1))
            folds.add(key.casefold())
            doc[key] = value
            self.work += _OVERHEAD
            if self._due():
                yield
            i = self._ws(self.i)
            closing = text[i : i + 1] == "}"
            if not closing and text[i : i + 1] != ",":
                _refuse(SYNTAX)
            i = i if closing else self._ws(i + 1)
        if self._ws(i + 1) != len(text):
            _refuse(TRAILING)
        return Parsed(opening, i - 1, tuple(spans), doc)

    def value(self, depth: int) -> Generator[None, None, Any]:
        """The value at ``self.i``; a container there would be ``depth`` deep."""
        i = self._ws(self.i)
        first = self.text[i : i + 1]
        if first == '"':
            value, self.i = yield from _string(self.text, i)
            return value
        if first not in ("{", "["):
            return self._scalar(i)
        whole = self._window(i, depth - 1)
        if whole is not _MISS:
            return whole
        yield
        if depth > MAX_DEPTH:
            _refuse(TOO_DEEP)
        return (yield from self.container(i, depth))

    def _scalar(self, i: int) -> Any:
        try:
            value, self.i = _SCAN(self.text, i)
        except _NonFinite:
            _refuse(NON_FINITE)
        except (ValueError, StopIteration):
            _refuse(SYNTAX)
        return value

    def _window(self, i: int, outer: int) -> Any:
        """The container at ``i`` read whole if it ends within a slice and breaks no rule.

        The first try reads a few times the last container's size, so small elements one after
        another cost no more than themselves; then a whole slice.
        """
        for size in (self.window, _SLICE):
            piece = self.text[i : i + size]
            self.work += len(piece)
            try:
                value, end = _SCAN(piece, 0)
            except (ValueError, RecursionError, StopIteration):
                if size == _SLICE or len(piece) < size:
                    return _MISS
                continue
            if _suspect(piece, 0, end, value, outer):
                return _MISS
            self.window = min(_SLICE, max(_SMALL, 4 * end))
            self.i = i + end
            return value
        return _MISS

    def container(self, i: int, depth: int) -> Generator[None, None, Any]:
        """An array or object too large for one window, read element by element in batches."""
        text = self.text
        closer = "]" if text[i] == "[" else "}"
        into: list[Any] | dict[str, Any] = [] if closer == "]" else {}
        i = self._ws(i + 1)
        if text[i : i + 1] == closer:
            self.i = i + 1
            return into
        while True:
            i, scanned = _batch(text, i, depth, into)
            self.work += scanned + _OVERHEAD
            if self._due():
                yield
            if isinstance(into, list):
                self.i = i
                into.append((yield from self.value(depth + 1)))
            else:
                if text[i : i + 1] != '"':
                    _refuse(SYNTAX)
                key, i = yield from _string(text, i)
                i = self._ws(i)
                if text[i : i + 1] != ":":
                    _refuse(SYNTAX)
                self.i = i + 1
                into[key] = yield from self.value(depth + 1)
            i = self._ws(self.i)
            if text[i : i + 1] == closer:
                self.i = i + 1
                return into
            if text[i : i + 1] != ",":
                _refuse(SYNTAX)
            i = self._ws(i + 1)


def _batch(text: str, i: int, depth: int, into: list[Any] | dict[str, Any]) -> tuple[int, int]:
    """Read the elements (members) from ``i`` up to a comma within a slice, if they parse.

    The comma is the last one after the closing character of the first element's kind, else
    the last one; when the batch fails inside an element, the last comma before that point.
    Returns where the reading goes on (``i`` when nothing was read) and how much was scanned.
    """
    opener = "[" if isinstance(into, list) else "{"
    limit = i + _SLICE
    pair = _SEPARATORS.get(text[i : i + 1]) if opener == "[" else None
    comma = text.rfind(pair, i, limit) + 1 if pair else text.rfind(",", i, limit)
    scanned = 0
    for _ in range(_RETRIES):
        if comma <= i:
            break
        scanned += comma - i
        wrapped = opener + text[i:comma] + _CLOSER[opener]
        try:
            value, end = _SCAN(wrapped, 0)
        except json.JSONDecodeError as error:
            comma = text.rfind(",", i, i + error.pos - 1)
            continue
        except (ValueError, RecursionError, StopIteration):
            break
        if end != len(wrapped) or not value or _suspect(wrapped, 0, end, value, depth - 1):
            break
        if isinstance(into, list):
            into.extend(value)
        else:
            into.update(value)
        return _WS.match(text, comma + 1).end(), scanned  # type: ignore[union-attr]
    return i, scanned


def _string(text: str, i: int) -> Generator[None, None, tuple[str, int]]:
    """The string whose opening quote is at ``i``, decoded a slice at a time, and where it ends.

    A surrogate pair split between two slices is put back together; the string grows in place.
    """
    size = len(text)
    value, carry, start = "", "", i + 1
    while True:
        limit = min(start + _SLICE, size)
        end = _STRING_PART.match(text, start, limit).end()  # type: ignore[union-attr]
        final = end < limit and text[end] == '"'
        if not final and not (limit < size and end > limit - 6 and end > start):
            _refuse(SYNTAX)
        piece = _STRING(text[start:end] + '"', 0)[0]
        if carry:
            if not "\udc00" <= piece[:1] <= "\udfff":
                _refuse(LONE_SURROGATE)
            pair = (carry + piece[0]).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
            piece, carry = pair + piece[1:], ""
        if not final and "\ud800" <= piece[-1:] <= "\udbff":
            piece, carry = piece[:-1], piece[-1]
        try:
            piece.encode("utf-8")
        except UnicodeEncodeError:
            _refuse(LONE_SURROGATE)
        value += piece
        if final:
            return value, end + 1
        start = end
        yield


def parse_large(body: bytes, clock: IReactorTime) -> Deferred[dict[str, Any] | Rejection]:
    """What :func:`parse_body` gives, read a slice at a time, yielding to ``clock`` between slices."""
    return parse_document_large(body, clock).addCallback(
        lambda parsed: parsed if isinstance(parsed, Rejection) else parsed.doc
    )


def parse_document_large(body: bytes, clock: IReactorTime) -> Deferred[Parsed | Rejection]:
    """What :func:`parse_document` gives, read a slice at a time, yielding to ``clock`` between
    slices."""
    outcome: list[Parsed | Rejection] = []

    def steps() -> Iterator[None]:
        try:
            outcome.append((yield from _read(body)))
        except _Fault as fault:
            outcome.append(Rejection(400, "bad-body", str(fault)))

    cooperator = Cooperator(
        terminationPredicateFactory=lambda: lambda: True,
        scheduler=lambda work: clock.callLater(0, work),
    )
    done = cooperator.cooperate(steps()).whenDone()
    return done.addCallback(lambda _: outcome[0])
