"""Tests for nvpair_tw.core._headers: hop-by-hop headers stay on their hop, both ways (RFC 9110 §7.6.1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers

from nvpair_tw.core._headers import (
    HOP_BY_HOP,
    LOOP_HEADER,
    PROCESS_NONCE,
    forward_headers,
    header_tokens,
    loop_marks,
    upstream_request_headers,
)
from nvpair_tw.nodes._directory import Node
from nvpair_tw.testing import SimulatedEngine, start_engine, start_proxy
from nvpair_tw.upstream._attempt import ReplayBodyProducer

HOP_HEADERS: dict[bytes, list[bytes]] = {
    b"Connection": [b"keep-alive, X-Secret-Hop", b"x-other-hop"],
    b"Keep-Alive": [b"timeout=5"],
    b"Proxy-Connection": [b"keep-alive"],
    b"Proxy-Authenticate": [b"Basic"],
    b"Proxy-Authorization": [b"Basic c2VjcmV0"],
    b"TE": [b"trailers"],
    b"Trailer": [b"X-Checksum"],
    b"Transfer-Encoding": [b"chunked"],
    b"Upgrade": [b"websocket"],
    b"X-Secret-Hop": [b"1"],
    b"X-Other-Hop": [b"2"],
}
END_TO_END: dict[bytes, list[bytes]] = {
    b"Content-Type": [b"application/json"],
    b"Authorization": [b"Bearer node-token"],
    b"X-Request-Tag": [b"a", b"b"],
    b"Accept": [b"text/event-stream"],
}


def headers(*sources: dict[bytes, list[bytes]]) -> Headers:
    out = Headers()
    for source in sources:
        for name, values in source.items():
            out.setRawHeaders(name, values)
    return out


def names(source: Headers) -> set[bytes]:
    return {name.lower() for name, _ in source.getAllRawHeaders()}


def test_hop_by_hop_and_connection_listed_headers_are_dropped() -> None:
    """Every RFC 9110 hop-by-hop header and every token of every Connection value stay behind."""
    out = forward_headers(headers(HOP_HEADERS, END_TO_END))
    assert names(out) == {name.lower() for name in END_TO_END}
    assert {name.lower() for name in HOP_HEADERS} >= HOP_BY_HOP


def test_header_tokens_are_split_stripped_lowercased_in_order_across_values() -> None:
    headers = Headers({b"Connection": [b"Keep-Alive , Upgrade", b",close,"]})
    assert header_tokens(headers, b"connection") == [b"keep-alive", b"upgrade", b"close"]
    assert header_tokens(headers, b"transfer-encoding") == []


def test_end_to_end_headers_keep_all_their_values() -> None:
    """End-to-end headers pass with every value, in order."""
    out = forward_headers(headers(HOP_HEADERS, END_TO_END))
    for name, values in END_TO_END.items():
        assert out.getRawHeaders(name) == values


def test_response_direction_keeps_content_length() -> None:
    """Responses keep Content-Length (the bytes pass through unchanged) but lose the framing."""
    out = forward_headers(
        headers({b"Content-Length": [b"12"], b"Transfer-Encoding": [b"chunked"], b"Date": [b"x"]})
    )
    assert out.getRawHeaders(b"content-length") == [b"12"]
    assert names(out) == {b"content-length", b"date"}


def test_explicit_drop_set_is_honoured_case_insensitively() -> None:
    """Names in ``drop`` are left out whatever their case on the wire."""
    out = forward_headers(
        headers({b"X-Drop-Me": [b"1"], b"X-Keep": [b"2"]}), frozenset({b"x-drop-me"})
    )
    assert names(out) == {b"x-keep"}


def test_request_headers_lose_host_content_length_and_expect() -> None:
    """The agent sets Host and Content-Length itself; Expect is never forwarded."""
    source = headers(
        {
            b"Host": [b"proxy.example:11434"],
            b"Content-Length": [b"99"],
            b"Expect": [b"100-continue"],
            b"Content-Type": [b"application/json"],
        }
    )
    out = upstream_request_headers(source, "10.0.0.7")
    assert names(out) == {b"content-type", b"x-forwarded-for", LOOP_HEADER}


def test_request_headers_drop_hop_by_hop_too() -> None:
    """The request direction strips hop-by-hop and Connection-listed headers as well."""
    out = upstream_request_headers(headers(HOP_HEADERS, END_TO_END), None)
    assert names(out) == {name.lower() for name in END_TO_END} | {LOOP_HEADER}


def test_the_proxys_own_headers_never_reach_a_node() -> None:
    """Every ``X-NVPair-*`` request header is the proxy's (docs/behaviour.md §14.2): removed,
    whatever its case; only the loop marks go on, this process's own last (§14.3)."""
    source = headers(
        {
            b"X-NVPair-Node": [b"a"],
            b"x-nvpair-anything": [b"1"],
            b"X-NVPAIR-Engine-Identity-Probe": [b"1"],
            b"X-NVPair-Via": [OTHER_PROXY],
            b"Content-Type": [b"application/json"],
        }
    )
    out = upstream_request_headers(source, None)
    assert names(out) == {b"content-type", LOOP_HEADER}
    assert out.getRawHeaders(LOOP_HEADER) == [OTHER_PROXY, PROCESS_NONCE]


OTHER_PROXY = b"0123456789abcdef0123456789abcdef"
"""Another proxy's loop mark: the form of :data:`PROCESS_NONCE`."""


def test_a_request_that_passed_this_process_is_marked_as_a_loop() -> None:
    """The mark this process puts on what it sends is what it refuses to take back (§14.3),
    whether it came alone, among others in one line, or as another header line."""
    sent = upstream_request_headers(headers({b"X-NVPair-Via": [OTHER_PROXY]}), None)
    assert loop_marks(sent)
    assert loop_marks(headers({b"X-NVPair-Via": [OTHER_PROXY + b", " + PROCESS_NONCE]}))
    assert not loop_marks(headers({b"X-NVPair-Via": [OTHER_PROXY]}))
    assert not loop_marks(headers({b"X-NVPair-Via": [PROCESS_NONCE + b"x"]}))
    assert not loop_marks(headers({}))


def test_loop_marks_kept_are_bounded() -> None:
    """A client cannot grow the header without bound: the last seven marks and this process's."""
    marks = [b"%032x" % i for i in range(20)]
    source = headers({b"X-NVPair-Via": marks})
    kept = upstream_request_headers(source, None).getRawHeaders(LOOP_HEADER)
    assert kept == [*marks[13:], PROCESS_NONCE]


@pytest.mark.parametrize(
    "value",
    [
        b"deadbeef",
        b"<script>",
        OTHER_PROXY.upper(),
        OTHER_PROXY + b"0",
        b"",
        b" , ",
    ],
)
def test_a_value_that_is_not_a_proxys_mark_is_dropped(value: bytes) -> None:
    """``X-NVPair-Via`` passes only in its own form (32 lower-case hex digits, docs/behaviour.md
    §14.3): anything else a client wrote there is removed, the marks beside it kept."""
    source = headers({b"X-NVPair-Via": [value, OTHER_PROXY + b"," + value]})
    kept = upstream_request_headers(source, None).getRawHeaders(LOOP_HEADER)
    assert kept == [OTHER_PROXY, PROCESS_NONCE]


@pytest.mark.parametrize(
    ("previous", "expected"),
    [
        (None, [b"10.0.0.7"]),
        ([b"192.0.2.1"], [b"192.0.2.1, 10.0.0.7"]),
        ([b"192.0.2.1", b"198.51.100.2"], [b"192.0.2.1, 198.51.100.2, 10.0.0.7"]),
    ],
)
def test_client_address_is_appended_to_x_forwarded_for(
    previous: list[bytes] | None, expected: list[bytes]
) -> None:
    """The client is appended to any X-Forwarded-For chain, as one header."""
    source = headers({b"X-Forwarded-For": previous} if previous else {})
    assert (
        upstream_request_headers(source, "10.0.0.7").getRawHeaders(b"x-forwarded-for") == expected
    )


def test_unknown_client_address_leaves_x_forwarded_for_alone() -> None:
    """Without a client host (e.g. a UNIX socket) the chain is passed unchanged."""
    source = headers({b"X-Forwarded-For": [b"192.0.2.1"]})
    assert upstream_request_headers(source, None).getRawHeaders(b"x-forwarded-for") == [
        b"192.0.2.1"
    ]


def test_source_headers_are_not_modified() -> None:
    """Forwarding builds a new Headers; the caller's request headers are untouched."""
    source = headers(HOP_HEADERS, END_TO_END)
    before = sorted(source.getAllRawHeaders())
    upstream_request_headers(source, "10.0.0.7")
    assert sorted(source.getAllRawHeaders()) == before


@pytest_twisted.ensureDeferred
async def test_hop_by_hop_request_headers_never_reach_the_engine(reactor: Any) -> None:
    """Through the proxy: the engine sees the end-to-end header and the client in X-Forwarded-For,
    but none of Connection, its listed header, Keep-Alive, TE, Upgrade or Proxy-Authorization."""
    engine = SimulatedEngine(reactor)
    handle = await start_engine(reactor, engine)
    engine_authority = handle.url.removeprefix("http://").encode()
    proxy = await start_proxy(reactor, {"ollama": [Node("n0", handle.url, ("llama3:latest",))]})
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        sent = Headers(
            {
                b"Connection": [b"x-secret-hop"],
                b"X-Secret-Hop": [b"hidden"],
                b"Keep-Alive": [b"timeout=5"],
                b"TE": [b"trailers"],
                b"Upgrade": [b"websocket"],
                b"Proxy-Authorization": [b"Basic c2VjcmV0"],
                b"X-End-To-End": [b"kept"],
                b"Content-Type": [b"application/json"],
            }
        )
        body = json.dumps({"model": "llama3", "stream": False}).encode()
        response = await Agent(reactor, pool=pool).request(
            b"POST",
            proxy.url().encode() + b"/api/chat",
            sent,
            ReplayBodyProducer(body, lambda: None),
        )
        await treq.content(response)
    finally:
        await pool.closeCachedConnections()
        await proxy.stop()
        await handle.stop()
    assert response.code == 200
    [received] = engine.received
    seen = set(received.headers)
    assert not seen & {b"x-secret-hop", b"keep-alive", b"te", b"upgrade", b"proxy-authorization"}
    assert received.headers.get(b"connection", [b"close"]) == [b"close"]
    assert received.headers[b"x-end-to-end"] == [b"kept"]
    assert received.headers[b"x-forwarded-for"] == [b"127.0.0.1"]
    assert received.headers[b"host"] == [engine_authority]
    # the body as sent upstream (a non-streaming chat is rewritten to stream, §6.5)
    assert received.headers[b"content-length"] == [b"%d" % len(received.body)]
    assert received.body == body.replace(b"false", b"true")
