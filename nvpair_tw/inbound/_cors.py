# -*- test-case-name: tests.inbound.test_cors -*-
"""Browsers on other origins (docs/behaviour.md §13.4, §14.5): ``--cors-origin ORIGIN``, repeatable.

For an allowed origin a preflight (``OPTIONS`` with ``Origin`` and
``Access-Control-Request-Method``) is answered here, without a key and without a node: 204 with
the allowed methods and headers. The request itself still passes the ingress gate (a key where
keys are configured). With the option set, CORS belongs to the proxy (§14.5): as each answer's
head is written (``CorsPolicy.own_head``), every ``Access-Control-*`` header a node sent is
removed, and only an allowed origin gets grants (``Access-Control-Allow-Origin: <origin>``, the
exposed headers, ``Vary: Origin``) -- on the proxy's own errors too (``CorsPolicy.raw_grants``
for those written below the ``Request``). ``Access-Control-Allow-Credentials`` is never sent.
Off by default: without the option a node's CORS headers pass untouched.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import frozen
from twisted.web.http_headers import Headers
from twisted.web.server import Request

__all__ = [
    "ALLOWED_HEADERS",
    "ALLOWED_METHODS",
    "EXPOSED_HEADERS",
    "CorsPolicy",
    "grant",
    "parse_origin",
    "strip_cors",
]

ALLOWED_METHODS = b"GET, POST, PUT, DELETE, HEAD, OPTIONS"
ALLOWED_HEADERS = (
    b"Authorization, Content-Type, X-Api-Key, X-NVPair-Node, X-NVPAIR-Engine-Identity-Probe,"
    b" X-NVPair-Priority"
)
"""What a page may send: the credentials, JSON, and every ``X-NVPair-*`` request header."""
EXPOSED_HEADERS = b"X-NVPair-Node, X-NVPair-Request-Id, X-NVPair-Model, X-NVPair-Stale"
"""What a page's script may read from an answer besides the CORS-safelisted headers: every
``X-NVPair-*`` response header."""
_PREFIX = b"access-control-"
MAX_AGE = b"600"
"""Seconds a browser may reuse a preflight's answer."""


def parse_origin(text: str) -> str:
    """An origin as browsers send it (``scheme://host[:port]``, no path), or ``ValueError``."""
    origin = text.strip().rstrip("/")
    scheme, sep, rest = origin.partition("://")
    if origin == "*":
        raise ValueError("'*' is not accepted: name each origin")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest or " " in rest:
        raise ValueError(f"{text!r} is not an origin such as https://chat.example:8080")
    return origin


@frozen
class CorsPolicy:
    """The origins whose pages may call the facades."""

    origins: frozenset[str]

    @classmethod
    def of(cls, origins: Iterable[str]) -> CorsPolicy | None:
        """The policy for ``origins``; ``None`` (CORS off) when there are none."""
        allowed = frozenset(origins)
        return cls(allowed) if allowed else None

    def origin(self, request: Request) -> bytes | None:
        """The request's ``Origin`` when it is allowed, else ``None``."""
        return self.allowed(request.requestHeaders)

    def allowed(self, request_headers: Headers) -> bytes | None:
        """The one ``Origin`` in ``request_headers`` when it is allowed, else ``None``."""
        values = request_headers.getRawHeaders(b"origin")
        if values is None or len(values) != 1:
            return None
        try:
            origin = values[0].decode("ascii")
        except UnicodeDecodeError:
            return None
        return values[0] if origin in self.origins else None

    @staticmethod
    def is_preflight(request: Request) -> bool:
        return request.method == b"OPTIONS" and request.requestHeaders.hasHeader(
            b"access-control-request-method"
        )

    def preflight_origin(self, method: bytes, request_headers: Headers) -> bytes | None:
        """The allowed origin of a CORS preflight (``OPTIONS`` with
        ``Access-Control-Request-Method``), else None."""
        if method != b"OPTIONS" or not request_headers.hasHeader(b"access-control-request-method"):
            return None
        return self.allowed(request_headers)

    @staticmethod
    def preflight_grants(origin: bytes) -> tuple[tuple[bytes, bytes], ...]:
        """The headers of a preflight's 204 for ``origin``: what a page may send, and the
        grants."""
        return (
            (b"access-control-allow-methods", ALLOWED_METHODS),
            (b"access-control-allow-headers", ALLOWED_HEADERS),
            (b"access-control-max-age", MAX_AGE),
            (b"access-control-allow-origin", origin),
            (b"access-control-expose-headers", EXPOSED_HEADERS),
            (b"vary", b"Origin"),
        )

    def own_head(self, request: Request) -> None:
        """Make the CORS headers of ``request``'s answer the proxy's (§14.5), just before its
        head is written: every ``Access-Control-*`` header already set (a node's, or anyone's)
        is removed; an allowed origin then gets its grants, and its preflight the allowed
        methods and headers."""
        headers = request.responseHeaders
        strip_cors(headers)
        origin = self.origin(request)
        if origin is None:
            return
        if self.is_preflight(request):
            headers.setRawHeaders(b"access-control-allow-methods", [ALLOWED_METHODS])
            headers.setRawHeaders(b"access-control-allow-headers", [ALLOWED_HEADERS])
            headers.setRawHeaders(b"access-control-max-age", [MAX_AGE])
        grant(headers, origin)

    def raw_grants(self, request_headers: Headers | None) -> tuple[tuple[bytes, bytes], ...]:
        """The grant headers of an error written below the ``Request`` (a refused head, a limit)
        to a request with ``request_headers`` (what was read of them): none unless its origin is
        allowed."""
        origin = self.allowed(request_headers) if request_headers is not None else None
        if origin is None:
            return ()
        return (
            (b"Access-Control-Allow-Origin", origin),
            (b"Access-Control-Expose-Headers", EXPOSED_HEADERS),
            (b"Vary", b"Origin"),
        )


def strip_cors(headers: Headers) -> None:
    """Remove every ``Access-Control-*`` header from ``headers``."""
    doomed = [name for name, _ in headers.getAllRawHeaders() if name.lower().startswith(_PREFIX)]
    for name in doomed:
        headers.removeHeader(name)


def grant(headers: Headers, origin: bytes) -> None:
    """``Access-Control-Allow-Origin`` for ``origin`` (replacing a node's), ``Vary: Origin``
    added to any ``Vary`` already there, and the proxy's headers exposed."""
    headers.setRawHeaders(b"access-control-allow-origin", [origin])
    headers.setRawHeaders(b"access-control-expose-headers", [EXPOSED_HEADERS])
    vary = [v.strip() for value in headers.getRawHeaders(b"vary", []) for v in value.split(b",")]
    if not any(v.lower() == b"origin" for v in vary):
        headers.setRawHeaders(b"vary", [b", ".join([v for v in vary if v] + [b"Origin"])])
