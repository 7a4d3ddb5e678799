"""Tests for nvpair_tw.upstream._http1: the sans-IO response reader (the head, the body's framing,
chunked decoding under any split of the reads), bytes in and values out."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from twisted.web.iweb import UNKNOWN_LENGTH

from nvpair_tw.core import IllegalCall
from nvpair_tw.upstream._http1 import (
    BadResponse,
    BodyReader,
    ChunkedDecoder,
    HeadParser,
    ResponseHead,
)
from tests.upstream.scripted import (
    chunked_streams,
    split,
)

# ---- chunked decoding under any split -----------------------------------------------------------


@given(chunked_streams())
@settings(max_examples=200, deadline=None)
def test_decoder_returns_the_payload_and_what_follows_the_last_chunk(
    case: tuple[bytes, bytes, list[int]],
) -> None:
    """The decoder alone: any split gives the payload, and the bytes after the end are handed
    back (they make the connection unusable)."""
    stream, payload, cuts = case
    decoder = ChunkedDecoder()
    got = []
    after: bytes | None = None
    for piece in split(stream + b"NEXT", [*cuts, len(stream)]):
        if after is not None:
            break
        data, after = decoder.feed(piece)
        got.append(data)
    assert b"".join(got) == payload
    assert after is not None


def test_a_chunk_size_that_is_not_hex_is_refused() -> None:
    for bad in [b"-1\r\n", b"0x5\r\n", b"\r\n", b"1" * 17 + b"\r\n", b"5\r\nhelloX\r\n"]:
        with pytest.raises(BadResponse):
            ChunkedDecoder().feed(bad)


# ---- the head -----------------------------------------------------------------------------------

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Two: a\r\nX-Two: b\r\n\r\n"


def parse(*reads: bytes) -> ResponseHead | None:
    parser = HeadParser()
    head = None
    for data in reads:
        head = parser.feed(data)
    return head


def test_a_head_in_one_read_is_read_with_what_follows_it() -> None:
    head = parse(HEAD + b"body")
    assert head is not None
    assert (head.version, head.code, head.phrase, head.rest) == (
        (b"HTTP", 1, 1),
        200,
        b"OK",
        b"body",
    )
    assert head.headers.getRawHeaders(b"content-type") == [b"text/plain"]
    assert head.headers.getRawHeaders(b"x-two") == [b"a", b"b"]


def test_a_head_split_byte_by_byte_is_the_same_head() -> None:
    parser = HeadParser()
    heads = [parser.feed(HEAD[i : i + 1]) for i in range(len(HEAD))]
    assert heads[:-1] == [None] * (len(HEAD) - 1)
    whole = parse(HEAD)
    assert heads[-1] is not None and whole is not None
    assert heads[-1].code == whole.code and heads[-1].rest == b""
    assert list(heads[-1].headers.getAllRawHeaders()) == list(whole.headers.getAllRawHeaders())


def test_interim_heads_are_skipped_but_101_is_a_head() -> None:
    head = parse(b"HTTP/1.1 100 Continue\r\nX: 1\r\n\r\nHTTP/1.1 199 Other\r\n\r\n" + HEAD)
    assert head is not None and head.code == 200 and head.headers.getRawHeaders(b"x") is None
    switched = parse(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nframes")
    assert switched is not None and (switched.code, switched.rest) == (101, b"frames")


def test_header_names_in_any_case_are_the_headers_twisted_would_hold() -> None:
    """Names as a node writes them (any case) are held in Twisted's case, found by any case, and
    frame the body: lower-case framing headers are the framing."""
    head = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nCONNECTION: close\r\nx-tWo: a\r\n\r\n")
    assert head is not None
    assert list(head.headers.getAllRawHeaders()) == [
        (b"Content-Length", [b"5"]),
        (b"Connection", [b"close"]),
        (b"X-Two", [b"a"]),
    ]
    reader = BodyReader(b"GET", head)
    assert (reader.length, reader.reusable) == (5, False)
    chunked = parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert chunked is not None
    assert BodyReader(b"GET", chunked).feed(b"2\r\nhi\r\n0\r\n\r\n") == (b"hi", b"")


def test_a_bare_cr_in_a_value_is_a_space_as_twisted_sanitizes_it() -> None:
    head = parse(b"HTTP/1.1 200 OK\r\nX-A: b\rc\r\nX-B: d\r\n\r\n")
    assert head is not None
    assert head.headers.getRawHeaders(b"x-a") == [b"b c"]
    assert head.headers.getRawHeaders(b"x-b") == [b"d"]


def test_lenient_lines_no_phrase_and_http_1_0() -> None:
    head = parse(b"HTTP/1.0 204\nX-Pad:  \tv \t\n\n")
    assert head is not None
    assert (head.version, head.code, head.phrase) == ((b"HTTP", 1, 0), 204, b"")
    assert head.headers.getRawHeaders(b"x-pad") == [b"v"]
    spaced = parse(b"HTTP/1.1 200 Very  Fine\r\n\r\n")
    assert spaced is not None and spaced.phrase == b"Very  Fine"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2.0 200 OK\r\n",
        b"HTTP/1.1 20 OK\r\n",
        b"HTTP/1.1 2000 OK\r\n",
        b"HTTP/1.1 2x0 OK\r\n",
        b"HTTP/1.1\r\n",
        b"HTTP/1.10 200 OK\r\n",
        b"ICY 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nNo colon\r\n",
        b"HTTP/1.1 200 OK\r\nBad name: v\r\n",
        b"HTTP/1.1 200 OK\r\n: empty name\r\n",
    ],
)
def test_malformed_heads_are_refused(raw: bytes) -> None:
    with pytest.raises(BadResponse):
        parse(raw)


def test_line_and_header_limits() -> None:
    """A line of 16384 bytes (its CR included) and 500 headers pass; one more does not."""
    status = b"HTTP/1.1 200 "
    longest = status + b"x" * (16384 - len(status) - 1) + b"\r"
    assert parse(longest + b"\n\r\n") is not None
    with pytest.raises(BadResponse):
        parse(longest + b"x\n\r\n")
    assert HeadParser().feed(b"X" * 16384) is None  # no line end yet: kept
    with pytest.raises(BadResponse):
        HeadParser().feed(b"X" * 16385)
    parser = HeadParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n" + b"X" * 16000)
    assert parser.feed(b"X" * 384) is None  # the cut line counts from its own start
    headers = b"".join(b"H%d: v\r\n" % i for i in range(500))
    head = parse(b"HTTP/1.1 200 OK\r\n" + headers + b"\r\n")
    assert head is not None and head.headers.getRawHeaders(b"h499") == [b"v"]
    with pytest.raises(BadResponse):
        parse(b"HTTP/1.1 200 OK\r\n" + headers + b"H500: v\r\n\r\n")


def test_a_kept_partial_line_is_not_read_twice() -> None:
    parser = HeadParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nA: 1\r\nB:") is None
    head = parser.feed(b" 2\r\n\r\n")
    assert head is not None
    assert list(head.headers.getAllRawHeaders()) == [(b"A", [b"1"]), (b"B", [b"2"])]


@pytest.mark.parametrize("cut", [0, 5, 17, len(HEAD) - 1])
def test_what_follows_a_head_is_handed_back_whole_however_the_head_was_read(cut: int) -> None:
    """The bytes after the head (a whole streamed body, say) come back as they were, whether the
    head started in the same read or was kept from earlier ones."""
    body = b"5\r\nhello\r\n" * 1000
    parser = HeadParser()
    first = parser.feed(HEAD[:cut]) if cut else None
    head = parser.feed(HEAD[cut:] + body)
    assert first is None and head is not None
    assert (head.code, head.rest) == (200, body)
    assert head.headers.getRawHeaders(b"x-two") == [b"a", b"b"]


# ---- the body's framing -------------------------------------------------------------------------


def reader(raw: bytes, method: bytes = b"GET") -> BodyReader:
    head = parse(raw + b"\r\n")
    assert head is not None
    return BodyReader(method, head)


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"),
        (b"GET", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n"),
        (b"GET", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n"),
        (b"GET", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"),
    ],
)
def test_bodyless_answers_are_empty_and_reusable(method: bytes, raw: bytes) -> None:
    made = reader(raw, method)
    assert made.empty and not made.close_delimited and made.reusable and made.length == 0


def test_a_content_length_body_ends_at_its_length() -> None:
    made = reader(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n")
    assert (made.length, made.empty, made.close_delimited, made.reusable) == (5, False, False, True)
    assert made.feed(b"hel") == (b"hel", None)
    assert made.feed(b"loNEXT") == (b"lo", b"NEXT")


def test_a_chunked_body_is_decoded_and_its_length_unknown() -> None:
    made = reader(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9\r\n")
    assert made.length is UNKNOWN_LENGTH and made.reusable and not made.empty
    assert made.feed(b"2\r\nhi\r\n0\r\n\r\nX") == (b"hi", b"X")


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n",
    ],
)
def test_other_bodies_run_to_the_close(raw: bytes) -> None:
    made = reader(raw)
    assert made.close_delimited and not made.empty and not made.reusable
    assert made.length is UNKNOWN_LENGTH
    assert made.feed(b"anything") == (b"anything", None)


@pytest.mark.parametrize(
    "extra",
    [b"Connection: close\r\n", b"Connection: keep-alive, Close\r\n"],
)
def test_connection_close_forbids_reuse(extra: bytes) -> None:
    assert not reader(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n" + extra).reusable


def test_http_1_0_forbids_reuse_and_keep_alive_does_not() -> None:
    assert not reader(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n").reusable
    assert reader(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n").reusable


@pytest.mark.parametrize("value", [b"5, 6", b"-1", b"x", b"5;"])
def test_a_malformed_content_length_is_refused(value: bytes) -> None:
    with pytest.raises(BadResponse):
        reader(b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n")


# ---- chunked framing, the slow path -------------------------------------------------------------


def test_lenient_chunk_lines_sizes_and_trailers() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3 \t;ext\nabc\n") == (b"abc", None)
    assert decoder.feed(b"A") == (b"", None)  # a size cut by the read is kept
    assert decoder.feed(b"\r\n0123456789\r\n0\r\nT: 1\r\n") == (b"0123456789", None)
    assert decoder.feed(b"\r\nNEXT") == (b"", b"NEXT")


def test_the_last_chunk_ends_decoding() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"0\r\n\r\n") == (b"", b"")
    with pytest.raises(IllegalCall):
        decoder.feed(b"1\r\na\r\n")


def test_chunk_lines_and_trailers_are_bounded() -> None:
    """A framing line of 16384 bytes and 500 trailers pass; one more does not."""
    assert ChunkedDecoder().feed(b"1;" + b"e" * 16381 + b"\r") == (b"", None)
    with pytest.raises(BadResponse):
        ChunkedDecoder().feed(b"1;" + b"e" * 16383)
    assert ChunkedDecoder().feed(b"1" * 16 + b"\r\n")[1] is None
    trailers = b"".join(b"T%d: v\r\n" % i for i in range(500))
    assert ChunkedDecoder().feed(b"0\r\n" + trailers + b"\r\n") == (b"", b"")
    with pytest.raises(BadResponse):
        ChunkedDecoder().feed(b"0\r\n" + trailers + b"T: v\r\n")


def test_whole_chunks_and_cut_chunks_join_in_one_payload() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"1\r\na\r\n2\r\nbc\r\n3\r\nde") == (b"abcde", None)
    assert decoder.feed(b"f\r\n1\r\ng\r\n0\r\n\r\n") == (b"fg", b"")


# ---- what mutation testing asked for (issue 20) ------------------------------------------------


def _error(feed: Callable[[], object]) -> str:
    with pytest.raises((BadResponse, IllegalCall)) as raised:
        feed()
    return str(raised.value)


def _done_decoder() -> ChunkedDecoder:
    decoder = ChunkedDecoder()
    decoder.feed(b"0\r\n\r\n")
    return decoder


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        (lambda: HeadParser().feed(b"X" * 16385), "response head line too long"),
        (
            lambda: parse(b"HTTP/1.1 200 OK\r\n" + b"H: v\r\n" * 501),
            "too many response headers",
        ),
        (lambda: parse(b"HTTP/1.1 200 OK\r\nNo colon\r\n"), "malformed response header"),
        (lambda: parse(b"HTTP/1.1\r\n"), "malformed status line"),
        (lambda: parse(b"HTTP/2.0 200 OK\r\n"), "not an HTTP/1.x status line"),
        (lambda: parse(b"HTTP/1.1 20 OK\r\n"), "malformed status code"),
        (lambda: reader(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n"), "malformed Content-Length"),
        (lambda: ChunkedDecoder().feed(b"1;" + b"e" * 16383), "chunk line too long"),
        (lambda: ChunkedDecoder().feed(b"zz\r\n"), "malformed chunk size"),
        (lambda: ChunkedDecoder().feed(b"1\r\naX\r\n"), "chunk data not followed by CRLF"),
        (lambda: ChunkedDecoder().feed(b"0\r\n" + b"T: v\r\n" * 501), "too many trailers"),
        (lambda: _done_decoder().feed(b"0\r\n\r\n"), "feed after the last chunk"),
    ],
)
def test_each_refusal_says_what_was_wrong(feed: Callable[[], object], message: str) -> None:
    """The texts reach logs and records (never the node's bytes): each is pinned."""
    assert _error(feed) == message


def test_head_lines_end_at_any_line_feed_even_the_first_byte_of_a_read() -> None:
    parser = HeadParser()
    assert parser.feed(b"HTTP/1.1 200 OK\nA: 1\n") is None
    head = parser.feed(b"\n")
    assert head is not None and head.headers.getRawHeaders(b"a") == [b"1"]
    with pytest.raises(BadResponse):
        HeadParser().feed(b"\nHTTP/1.1 200 OK\r\n\r\n")


def test_a_long_kept_line_after_others_is_measured_from_its_own_start() -> None:
    assert HeadParser().feed(b"HTTP/1.1 200 OK\r\n" + b"X" * 16380) is None


def test_header_values_keep_colons_and_all_but_spaces_and_tabs() -> None:
    head = parse(b"HTTP/1.1 200 OK\r\nLocation: http://x:1/\r\nA: XvX\x0b\r\n\r\n")
    assert head is not None
    assert head.headers.getRawHeaders(b"location") == [b"http://x:1/"]
    assert head.headers.getRawHeaders(b"a") == [b"XvX\x0b"]


def test_a_status_line_splits_on_single_spaces() -> None:
    with pytest.raises(BadResponse):
        parse(b"HTTP/1.1  200 OK\r\n")
    head = parse(b"HTTP/1.1 200  OK\r\n\r\n")
    assert head is not None and head.phrase == b" OK"


def test_chunked_alone_is_chunked() -> None:
    made = reader(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n")
    assert made.framing.name == "CHUNKED" and not made.close_delimited
    assert made.feed(b"1\r\nz\r\n0\r\n\r\n") == (b"z", b"")
    assert reader(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n").framing.name == "LENGTH"


def test_chunk_sizes_are_hexadecimal_on_the_fast_path() -> None:
    """``40`` is 64, not 68 (a misread would take ``\\r\\n10`` into the first payload)."""
    stream = b"40\r\n" + b"a" * 64 + b"\r\n10\r\n" + b"b" * 16 + b"\r\n0\r\n\r\n"
    assert ChunkedDecoder().feed(stream) == (b"a" * 64 + b"b" * 16, b"")


def test_a_payload_cut_by_a_read_is_never_read_as_framing() -> None:
    """The rest of a cut payload is payload, even when it looks like a whole chunk."""
    decoder = ChunkedDecoder()
    assert decoder.feed(b"8\r\nab") == (b"ab", None)
    assert decoder.feed(b"1\r\nx\r\n\r\n0\r\n\r\n") == (b"1\r\nx\r\n", b"")


def test_slow_path_lines_at_their_limits() -> None:
    """A framing line of 16384 bytes before its line feed passes, 16385 does not; a kept partial
    line is measured from its own start."""
    assert ChunkedDecoder().feed(b"1;" + b"e" * 16381 + b"\r\na") == (b"a", None)
    with pytest.raises(BadResponse):
        ChunkedDecoder().feed(b"1;" + b"e" * 16382 + b"\r\na")
    assert ChunkedDecoder().feed(b"1\r\na\r\n" + b"1" * 16383) == (b"a", None)


def test_a_line_feed_first_in_a_read_ends_a_framing_line() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"1\r\na") == (b"a", None)
    assert decoder.feed(b"\n0\n\n") == (b"", b"")


@pytest.mark.parametrize("size", [b"5\x0b", b"5X", b"5;a;b"])
def test_chunk_sizes_on_the_slow_path(size: bytes) -> None:
    """Only spaces and tabs are stripped, and only the first ``;`` starts the extensions."""
    decoder = ChunkedDecoder()
    if size == b"5;a;b":
        assert decoder.feed(size + b"\r\nhel") == (b"hel", None)
        assert decoder.feed(b"lo\r\n0\r\n\r\n") == (b"lo", b"")
    else:
        with pytest.raises(BadResponse):
            decoder.feed(size + b"\r\nhel")


def _chunk(payload: bytes, size: bytes | None = None) -> bytes:
    return (b"%x" % len(payload) if size is None else size) + b"\r\n" + payload + b"\r\n"


SHORT_EVENTS = [b'data: {"n":%d}\n\n' % n for n in range(40)]  # a read walked chunk by chunk
LONG_EVENTS = [b'data: {"n":%d,"pad":"%s"}\n\n' % (n, b"p" * 80) for n in range(40)]  # split
ODD_CHUNKS = [
    _chunk(b"x" * 4096),  # past the plain sizes' table: the regular-expression loop
    _chunk(b"hello", b"05"),  # a leading zero
    _chunk(b"y" * 26, b"1A"),  # upper case
    _chunk(b"data: a\r\n\r\n"),  # a CRLF inside the payload
    _chunk(b"z", b"1;ext=1"),
]


@pytest.mark.parametrize("events", [SHORT_EVENTS, LONG_EVENTS])
@pytest.mark.parametrize("odd", ODD_CHUNKS)
@pytest.mark.parametrize("where", [0, 1, 2, 20, 39, 40])
def test_one_read_of_plain_chunks_around_any_other_chunk_is_decoded_whole(
    events: list[bytes], odd: bytes, where: int
) -> None:
    """A read of whole chunks decodes to their payloads, and hands back what follows the last
    chunk, wherever a chunk the fast paths do not take stands in it (first, among, last), in a
    read short enough to be walked chunk by chunk or long enough to be split."""
    chunks = [_chunk(event) for event in events]
    chunks.insert(where, odd)
    payload = b"".join(ChunkedDecoder().feed(chunk)[0] for chunk in chunks)
    stream = b"".join(chunks) + b"0\r\n\r\nNEXT"
    assert ChunkedDecoder().feed(stream) == (payload, b"NEXT")
    decoder = ChunkedDecoder()
    assert decoder.feed(b"".join(chunks)) == (payload, None)
    assert decoder.feed(b"0\r\n\r\n") == (b"", b"")


def test_a_read_of_events_ending_in_crlf_is_decoded() -> None:
    """An engine whose events end in CRLF: no chunk is plain, every one is decoded."""
    events = [b"data: {}\r\n\r\n" * (n % 3 + 1) for n in range(30)]
    stream = b"".join(_chunk(event) for event in events) + b"0\r\n\r\n"
    assert ChunkedDecoder().feed(stream) == (b"".join(events), b"")
