"""The admin listener's gate (docs/behaviour.md §14.2, §14.4): the ``local`` test on every request,
the facades' header timeout and a 1 MiB body cap, over real loopback sockets."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.inbound import IngressConfig
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import MAX_BODY_SIZE, AdminService
from nvpair_tw.runtime._process import build_runtime
from nvpair_tw.testing import start_proxy
from tests.helpers import send_raw

pytestmark = pytest.mark.timeout(30)


async def _send(reactor: Any, port: int, raw: bytes) -> tuple[int, bytes]:
    data = await send_raw(reactor, port, raw)
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def _get(path: str, *lines: str) -> bytes:
    head = [f"GET {path} HTTP/1.1", *lines, "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


@pytest_twisted.ensureDeferred
async def test_only_local_callers_reach_the_admin_listener(reactor: Any) -> None:
    """Host 127.0.0.1 or localhost is served; a rebinding name, a foreign Origin, and two Host
    headers are refused with JSON, on every path."""
    proxy = await start_proxy(reactor, {"ollama": [Node("a", "http://127.0.0.1:1")]})
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        for host in (f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
            status, body = await _send(reactor, port, _get("/healthz", f"Host: {host}"))
            assert status == 200 and json.loads(body) == {"status": "ok"}
        refusals = [
            _get("/metrics", f"Host: evil.example:{port}"),
            _get("/api/state", "Host: 127.0.0.1", "Origin: https://evil.example"),
            _get("/events", "Host: rebind.127.0.0.1.nip.io"),
            _get("/", "Host: evil.example"),
        ]
        for raw in refusals:
            status, body = await _send(reactor, port, raw)
            assert status == 403, raw
            assert json.loads(body)["code"] == "host-not-allowed"
        two = _get("/healthz", "Host: localhost", "Host: evil.example")
        status, body = await _send(reactor, port, two)
        assert status == 400 and json.loads(body)["code"] == "bad-request"
    finally:
        await admin.stopService()
        await proxy.stop()


@pytest_twisted.ensureDeferred
async def test_the_admin_listener_caps_bodies_at_one_mib(reactor: Any) -> None:
    proxy = await start_proxy(reactor, {"ollama": [Node("a", "http://127.0.0.1:1")]})
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        big = (
            f"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {MAX_BODY_SIZE + 1}"
            "\r\n\r\n"
        ).encode()
        status, body = await _send(reactor, port, big)
        assert status == 413 and json.loads(body)["code"] == "body-too-large"
        assert MAX_BODY_SIZE == 1024 * 1024
    finally:
        await admin.stopService()
        await proxy.stop()


def test_the_admin_listener_has_the_facades_header_timeout() -> None:
    """A head not finished within the facades' header timeout (10 s, not the response-header
    timeout) is 408; a caller from elsewhere is refused before any handler runs."""
    clock = MemoryReactorClock()
    runtime = build_runtime(
        cast(IProxyReactor, clock),
        Settings(response_header_timeout=300.0),
        ["ollama"],
        ingress=IngressConfig(),
    )
    admin = AdminService(cast(IProxyReactor, clock), runtime, "tcp:0:interface=127.0.0.1")
    facade_timeout = runtime.site_for("ollama").limits.header_timeout
    assert admin.site.limits.header_timeout == facade_timeout == 10.0
    peer = IPv4Address("TCP", "127.0.0.1", 40000)
    channel = admin.site.buildProtocol(peer)
    transport = StringTransport(peerAddress=peer)
    channel.makeConnection(transport)
    channel.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    clock.advance(facade_timeout - 0.1)
    assert transport.value() == b""
    clock.advance(0.2)
    assert transport.value().startswith(b"HTTP/1.1 408")
    remote = IPv4Address("TCP", "192.0.2.7", 40001)
    channel = admin.site.buildProtocol(remote)
    transport = StringTransport(peerAddress=remote)
    channel.makeConnection(transport)
    channel.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 403")
    assert b'"code":"host-not-allowed"' in transport.value()
