"""Tests for nvpair_tw.upstream._http1: the sans-IO response reader (chunked decoding under any
split of the reads)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from nvpair_tw.upstream._http1 import BadResponse, ChunkedDecoder
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
