"""Tests for CORS owned by the proxy (nvpair_tw.inbound._cors with nvpair_tw.inbound._limits'
site): a node's ``Access-Control-*`` headers removed, grants for allowed origins only, on the
proxy's own errors too, never credentials (docs/behaviour.md §14.5)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.core import ErrorShape
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.inbound import CorsPolicy, Rejection
from nvpair_tw.inbound._cors import ALLOWED_HEADERS, EXPOSED_HEADERS
from nvpair_tw.inbound._limits import LimitedRequest, LimitedSite, make_site
from tests.helpers import exchange

OK = b"https://ok.example"
EVIL = b"https://evil.example"
_POLICY = CorsPolicy.of([OK.decode()])
_NODE_CORS = {
    b"access-control-allow-origin": b"*",
    b"access-control-allow-credentials": b"true",
    b"access-control-allow-methods": b"PUT, PATCH",
    b"access-control-expose-headers": b"X-Secret",
}


class _Node(Resource):
    """Answers as a permissive node would, or with the proxy's own answers on some paths."""

    isLeaf = True

    def render(self, request: Request) -> bytes | int:
        if request.path == b"/limited":
            Writer(request, ErrorShape.PROXY).refuse(
                Rejection(429, "rate-limited", "too many requests")
            )
            return NOT_DONE_YET
        if request.path == b"/preflight":
            assert _POLICY is not None
            Writer(request, ErrorShape.PROXY).preflight(_POLICY.preflight_grants(OK))
            return NOT_DONE_YET
        for name, value in _NODE_CORS.items():
            request.setHeader(name, value)
        request.setHeader(b"vary", b"Accept-Encoding")
        return b"ok"


def _refuse_no(request: LimitedRequest) -> Rejection | None:
    if request.uri == b"/no":
        return Rejection(403, "source-not-allowed", "source address not allowed")
    return None


def _site(policy: CorsPolicy | None = _POLICY, /, **limits: int) -> LimitedSite:
    site = make_site(_Node(), clock=Clock(), cors=policy, **limits)
    site.head_gate = _refuse_no
    return site


def _ask(site: LimitedSite, raw: bytes) -> dict[bytes, list[bytes]]:
    """The headers of the answer to ``raw`` (names lower-cased, every value kept)."""
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransportWithDisconnection()
    transport.protocol = channel
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    transport.loseConnection()
    return _headers(transport.value())


def _headers(raw: bytes) -> dict[bytes, list[bytes]]:
    head = raw.partition(b"\r\n\r\n")[0]
    headers: dict[bytes, list[bytes]] = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b": ")
        headers.setdefault(name.lower(), []).append(value)
    return headers


def _cors(headers: dict[bytes, list[bytes]]) -> dict[bytes, list[bytes]]:
    return {k: v for k, v in headers.items() if k.startswith(b"access-control-")}


def _get(path: bytes, origin: bytes | None, *extra: bytes, method: bytes = b"GET") -> bytes:
    lines = [method + b" " + path + b" HTTP/1.1", b"Host: a"]
    if origin is not None:
        lines.append(b"Origin: " + origin)
    return b"\r\n".join([*lines, *extra]) + b"\r\n\r\n"


_GRANTS = {
    b"access-control-allow-origin": [OK],
    b"access-control-expose-headers": [EXPOSED_HEADERS],
}


@pytest.mark.parametrize("origin", [EVIL, None, b"https://ok.example.evil.example"])
def test_a_nodes_cors_headers_are_removed_for_any_origin_not_allowed(origin: bytes | None) -> None:
    """The finding: ``Origin: https://evil.example`` got the node's ``Allow-Origin`` and
    ``Allow-Credentials: true``. Now nothing CORS reaches it."""
    assert _cors(_ask(_site(), _get(b"/", origin))) == {}


def test_an_allowed_origin_gets_the_proxys_grants_and_never_credentials() -> None:
    headers = _ask(_site(), _get(b"/", OK))
    assert _cors(headers) == _GRANTS
    assert headers[b"vary"] == [b"Accept-Encoding, Origin"]


def test_without_cors_origin_a_nodes_cors_headers_pass_as_before() -> None:
    headers = _ask(_site(None), _get(b"/", EVIL))
    assert _cors(headers) == {name: [value] for name, value in _NODE_CORS.items()}


def test_the_proxys_preflight_keeps_its_grants_and_allows_every_nvpair_header() -> None:
    raw = _get(b"/preflight", OK, b"Access-Control-Request-Method: POST", method=b"OPTIONS")
    headers = _ask(_site(), raw)
    assert headers[b"access-control-allow-origin"] == [OK]
    assert b"X-NVPair-Node" in headers[b"access-control-allow-headers"][0]
    assert b"X-NVPair-Node" in ALLOWED_HEADERS
    assert b"X-NVPair-Priority" in headers[b"access-control-allow-headers"][0]  # §16.3
    assert b"X-NVPair-Request-Id" in EXPOSED_HEADERS and b"X-NVPair-Node" in EXPOSED_HEADERS
    assert b"X-NVPair-Model" in EXPOSED_HEADERS  # the model that served (§16.2)
    assert b"X-NVPair-Stale" in EXPOSED_HEADERS  # the nodes a list did not wait on (§4.3)
    assert b"access-control-allow-credentials" not in headers


def test_a_relayed_preflight_for_an_origin_not_allowed_carries_nothing_cors() -> None:
    raw = _get(b"/", EVIL, b"Access-Control-Request-Method: POST", method=b"OPTIONS")
    assert _cors(_ask(_site(), raw)) == {}


_OWN_ERRORS = [
    pytest.param(b"/limited", (), {}, id="429 written by the facade"),
    pytest.param(b"/no", (), {}, id="the head gate's 403"),
    pytest.param(b"/", (b"Content-Length: 2048",), {"max_body_size": 1024}, id="413"),
    pytest.param(b"/", (b"X-A: 1", b"X-B: 2"), {"max_headers": 2}, id="431 after the Origin"),
]


@pytest.mark.parametrize(("path", "extra", "limits"), _OWN_ERRORS)
def test_the_proxys_own_errors_grant_an_allowed_origin_only(
    path: bytes, extra: tuple[bytes, ...], limits: dict[str, int]
) -> None:
    allowed = _ask(_site(**limits), _get(path, OK, *extra))
    assert _cors(allowed) == _GRANTS
    assert b"Origin" in allowed[b"vary"][0]
    assert allowed[b"server"] == [b"nvpair-tw"]
    refused = _ask(_site(**limits), _get(path, EVIL, *extra))
    assert _cors(refused) == {}
    assert b"vary" not in refused


def test_without_cors_origin_the_proxys_errors_carry_no_grant() -> None:
    assert _cors(_ask(_site(None), _get(b"/no", OK))) == {}


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_an_origin_not_allowed_gets_nothing_cors(reactor: Any, listen: Any) -> None:
    site = make_site(_Node(), clock=reactor, cors=_POLICY)
    port = listen(site)
    evil = await deferToThread(exchange, port, _get(b"/", EVIL, b"Connection: close"))
    assert evil.startswith(b"HTTP/1.1 200 OK")
    assert _cors(_headers(evil)) == {}
    ok = await deferToThread(exchange, port, _get(b"/", OK, b"Connection: close"))
    assert _cors(_headers(ok)) == _GRANTS
