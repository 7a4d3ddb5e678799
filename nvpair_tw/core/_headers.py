# -*- test-case-name: tests.core.test_headers -*-
"""End-to-end header forwarding: hop-by-hop headers stripped both ways (RFC 9110 §7.6.1), the
proxy's own ``X-NVPair-*`` request headers never forwarded, and the per-process loop mark every
request to a node carries (docs/behaviour.md §14.2, §14.3)."""

from __future__ import annotations

import re
import secrets

from twisted.web.http_headers import Headers

__all__ = [
    "HOP_BY_HOP",
    "LOOP_HEADER",
    "PROCESS_NONCE",
    "TARGET_HEADER",
    "forward_headers",
    "header_tokens",
    "loop_marks",
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
_PROXY_PREFIX = b"x-nvpair-"

LOOP_HEADER = b"x-nvpair-via"
"""Carries :data:`PROCESS_NONCE` on every request this process sends to a node: a request that
comes back to its sender, by whatever address, is refused (508 ``loop-detected``, §14.3)."""

PROCESS_NONCE = secrets.token_hex(16).encode("ascii")
"""This process's loop mark: random, made once at start-up, never shown to clients."""

_MAX_MARKS = 8
"""Loop marks a request keeps: the proxies it passed through add theirs, so a loop through
several proxies (A → B → A) comes back to A with A's mark."""

_MARK = re.compile(rb"[0-9a-f]{32}")
"""A proxy's loop mark: 32 lower-case hex digits, as :data:`PROCESS_NONCE` is made."""


def _marks(headers: Headers) -> list[bytes]:
    """The loop marks a request carries in their own form, in order (one per ``X-NVPair-Via``
    line or comma-separated item); anything else a client wrote there is not a mark."""
    return [
        token.strip()
        for value in headers.getRawHeaders(LOOP_HEADER, [])
        for token in value.split(b",")
        if _MARK.fullmatch(token.strip())
    ]


def loop_marks(headers: Headers) -> bool:
    """Whether a request came back to the process that sent it (it carries this process's mark)."""
    return PROCESS_NONCE in _marks(headers)


def header_tokens(headers: Headers, name: bytes) -> list[bytes]:
    """The comma-separated tokens of every ``name`` header, in order, stripped and lower-cased."""
    return [
        token.strip().lower()
        for value in headers.getRawHeaders(name, [])
        for token in value.split(b",")
        if token.strip()
    ]


def forward_headers(
    source: Headers, drop: frozenset[bytes] = frozenset(), into: Headers | None = None
) -> Headers:
    """Copy end-to-end headers: hop-by-hop ones, those ``Connection`` lists and ``drop`` are left
    out; into ``into`` (an answer's own headers: copied once, not through another) or new ones."""
    listed = set(header_tokens(source, b"connection"))
    out = Headers() if into is None else into
    for name, values in source.getAllRawHeaders():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in listed or lower in drop:
            continue
        out.setRawHeaders(name, list(values))
    return out


def _without_proxy_headers(source: Headers) -> Headers:
    """``source`` without any ``X-NVPair-*`` header (they are the proxy's, never a node's)."""
    out = forward_headers(source, _REQUEST_DROP)
    for name, _ in list(out.getAllRawHeaders()):
        if name.lower().startswith(_PROXY_PREFIX):
            out.removeHeader(name)
    return out


def upstream_request_headers(source: Headers, client_host: str | None) -> Headers:
    """Headers for an upstream attempt: end-to-end ones without the proxy's own ``X-NVPair-*``,
    ``Host`` left to the agent, XFF appended, and the loop marks: those of the proxies the
    request passed (the last seven in a proxy's form; any other value is dropped) and this
    process's own (§14.3)."""
    marks = _marks(source)[-_MAX_MARKS + 1 :]
    out = _without_proxy_headers(source)
    out.setRawHeaders(LOOP_HEADER, [*marks, PROCESS_NONCE])
    if client_host:
        previous = out.getRawHeaders(b"x-forwarded-for", [])
        joined = b", ".join([*previous, client_host.encode("ascii", "replace")])
        out.setRawHeaders(b"x-forwarded-for", [joined])
    return out
