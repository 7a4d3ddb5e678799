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


def _canonical(name: bytes) -> bytes:
    """``name`` as Twisted's ``Headers`` keeps it (Header-Case), asked of ``Headers`` once."""
    probe = Headers()
    probe.setRawHeaders(name, [b""])
    return next(iter(probe.getAllRawHeaders()))[0]


_LOOP_NAME = _canonical(LOOP_HEADER)
_XFF_NAME = _canonical(b"x-forwarded-for")


def _copy(source: Headers, into: Headers, drop: frozenset[bytes], prefix: bytes) -> None:
    """Put ``source``'s end-to-end headers into ``into``: not hop-by-hop, not listed by
    ``Connection``, not in ``drop``, not starting with ``prefix`` (``b""``: none starts so).

    Written into ``into``'s own table (``Headers._rawHeaders``, Twisted's private name/values
    dict), not through ``setRawHeaders``: the names are ``source``'s, already in
    Twisted's canonical case, and the values already passed its sanitizing, so encoding and
    sanitizing them again (a call each per name and value, on every request) would change
    nothing."""
    listed = set(header_tokens(source, b"connection")) if source.hasHeader(b"connection") else ()
    table = into._rawHeaders
    for name, values in source.getAllRawHeaders():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in listed or lower in drop:
            continue
        if prefix and lower.startswith(prefix):
            continue
        table[name] = list(values)


def forward_headers(
    source: Headers, drop: frozenset[bytes] = frozenset(), into: Headers | None = None
) -> Headers:
    """Copy end-to-end headers: hop-by-hop ones, those ``Connection`` lists and ``drop`` are left
    out; into ``into`` (an answer's own headers: copied once, not through another) or new ones."""
    out = Headers() if into is None else into
    _copy(source, out, drop, b"")
    return out


def upstream_request_headers(source: Headers, client_host: str | None) -> Headers:
    """Headers for an upstream attempt: end-to-end ones without the proxy's own ``X-NVPair-*``,
    ``Host`` left to the agent, XFF appended, and the loop marks: those of the proxies the
    request passed (the last seven in a proxy's form; any other value is dropped) and this
    process's own (§14.3)."""
    marks = _marks(source)[-_MAX_MARKS + 1 :]
    out = Headers()
    _copy(source, out, _REQUEST_DROP, _PROXY_PREFIX)
    # Into the table as _copy writes: the marks matched _MARK (no line break can be in them);
    # the addresses joined are sanitized here as setRawHeaders would (a line break, a space).
    table = out._rawHeaders
    table[_LOOP_NAME] = [*marks, PROCESS_NONCE]
    if client_host:
        previous = table.get(_XFF_NAME, [])
        joined = b", ".join([*previous, client_host.encode("ascii", "replace")])
        table[_XFF_NAME] = [b" ".join(joined.splitlines())]
    return out
