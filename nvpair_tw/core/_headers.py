# -*- test-case-name: tests.core.test_headers -*-
"""End-to-end header forwarding: hop-by-hop headers stripped both ways (RFC 9110 §7.6.1)."""

from __future__ import annotations

from twisted.web.http_headers import Headers

__all__ = [
    "HOP_BY_HOP",
    "TARGET_HEADER",
    "forward_headers",
    "header_tokens",
    "upstream_request_headers",
]

TARGET_HEADER = b"x-nvpair-node"
"""Chooses the one node a request goes to (docs/behaviour.md §2.1); never forwarded."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_REQUEST_DROP = frozenset({b"host", b"content-length", b"expect", TARGET_HEADER})


def header_tokens(headers: Headers, name: bytes) -> list[bytes]:
    """The comma-separated tokens of every ``name`` header, in order, stripped and lower-cased."""
    return [
        token.strip().lower()
        for value in headers.getRawHeaders(name, [])
        for token in value.split(b",")
        if token.strip()
    ]


def forward_headers(source: Headers, drop: frozenset[bytes] = frozenset()) -> Headers:
    """Copy end-to-end headers: hop-by-hop ones, those ``Connection`` lists and ``drop`` are left out."""
    listed = set(header_tokens(source, b"connection"))
    out = Headers()
    for name, values in source.getAllRawHeaders():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in listed or lower in drop:
            continue
        out.setRawHeaders(name, list(values))
    return out


def upstream_request_headers(source: Headers, client_host: str | None) -> Headers:
    """Headers for an upstream attempt: end-to-end ones, ``Host`` left to the agent, XFF appended."""
    out = forward_headers(source, _REQUEST_DROP)
    if client_host:
        previous = out.getRawHeaders(b"x-forwarded-for", [])
        joined = b", ".join([*previous, client_host.encode("ascii", "replace")])
        out.setRawHeaders(b"x-forwarded-for", [joined])
    return out
