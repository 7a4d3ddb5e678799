"""Tests for nvpair_tw.inbound._sources and the per-source connection cap of
nvpair_tw.inbound._limits (docs/behaviour.md §14.4)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IAddress
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.internet.threads import deferToThread
from twisted.python.usage import UsageError

from nvpair_tw.core import Settings
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.inbound._limits import make_site
from nvpair_tw.inbound._sources import SourceCounts, source_of
from nvpair_tw.runtime import build_runtime
from nvpair_tw.tap import Options
from tests.inbound.channel_kit import Ok, connect


def _v4(host: str) -> IPv4Address:
    return IPv4Address("TCP", host, 40000)


def _v6(host: str) -> IPv6Address:
    return IPv6Address("TCP", host, 40000)


@pytest.mark.parametrize(
    ("peer", "source"),
    [
        (_v4("203.0.113.7"), "203.0.113.7"),
        (_v6("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64"),
        (_v6("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::/64"),
        (_v6("2001:db8:1:3::1"), "2001:db8:1:3::/64"),
        (_v6("::ffff:203.0.113.7"), "203.0.113.7"),
        (_v6("fe80::1%eth0"), "fe80::/64"),
        (_v4("127.0.0.1"), None),
        (_v4("127.9.9.9"), None),
        (_v6("::1"), None),
        (_v6("::ffff:127.0.0.1"), None),
        (UNIXAddress(b"/run/nvpair.sock"), None),
        (_v4("not-an-ip"), None),
    ],
)
def test_a_source_is_an_ipv4_address_or_an_ipv6_slash_64_and_loopback_is_none(
    peer: IAddress, source: str | None
) -> None:
    assert source_of(peer) == source


def test_source_counts_admit_up_to_the_cap_and_forget_a_source_with_none_open() -> None:
    counts = SourceCounts(2)
    assert counts.admit("a") and counts.admit("a")
    assert not counts.admit("a")
    assert counts.admit("b")
    assert (counts.open("a"), counts.open("b"), len(counts)) == (2, 1, 2)
    counts.release("a")
    assert counts.admit("a")
    counts.release("b")
    assert len(counts) == 1


def _refused(transport: StringTransportWithDisconnection) -> dict[str, str]:
    head, _, body = transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nServer: nvpair-tw" in head
    assert not transport.connected
    return cast(dict[str, str], json.loads(body))


def test_a_remote_source_beyond_its_cap_gets_503_and_only_that_source() -> None:
    """The third connection of one address (or one IPv6 /64) is refused; another source, and
    the same source once one of its connections closed, are admitted."""
    site = make_site(Ok(), clock=Clock(), max_connections_per_source=2)
    held = [connect(site, _v4("203.0.113.7")) for _ in range(2)]
    refused = connect(site, _v4("203.0.113.7"))
    assert _refused(refused) == {
        "error": "too many connections from this source",
        "code": "too-many-connections",
    }
    other = connect(site, _v4("198.51.100.1"))
    assert other.connected and other.value() == b""
    held[0].loseConnection()
    again = connect(site, _v4("203.0.113.7"))
    assert again.connected
    v6 = [connect(site, _v6(f"2001:db8::{n}")) for n in (1, 2, 3)]
    assert [t.connected for t in v6] == [True, True, False]
    assert site.open_connections == 5
    for transport in (held[1], other, again, *v6):
        transport.loseConnection()
    assert (site.open_connections, len(site.sources)) == (0, 0)


def test_loopback_and_unix_peers_share_only_the_overall_cap() -> None:
    """Without a share kept for remote callers (no keys), local peers may fill the site."""
    site = make_site(Ok(), clock=Clock(), max_connections_per_source=1, max_connections=4)
    local = [connect(site, _v4("127.0.0.1")) for _ in range(3)]
    local.append(connect(site, UNIXAddress(b"/run/nvpair.sock")))
    assert all(t.connected for t in local)
    assert _refused(connect(site, _v4("127.0.0.1")))["code"] == "too-many-connections"
    assert _refused(connect(site, _v4("203.0.113.7"))) == {
        "error": "too many connections",
        "code": "too-many-connections",
    }
    for transport in local:
        transport.loseConnection()
    assert (site.open_connections, site.local_connections) == (0, 0)


def test_loopback_cannot_take_the_share_kept_for_remote_callers() -> None:
    """With ``remote_share`` 2 of 8, loopback and unix peers together hold at most 6; remote
    sources still get in, up to the overall cap (docs/behaviour.md §14.4)."""
    site = make_site(Ok(), clock=Clock(), max_connections=8, remote_share=2)
    local = [connect(site, _v4("127.0.0.1")) for _ in range(5)]
    local.append(connect(site, UNIXAddress(b"/run/nvpair.sock")))
    assert all(t.connected for t in local) and site.local_connections == 6
    refused = _refused(connect(site, _v4("127.0.0.2")))
    assert refused["code"] == "too-many-connections" and "remote callers" in refused["error"]
    remote = [connect(site, _v4("203.0.113.7")), connect(site, _v6("2001:db8::1"))]
    assert all(t.connected for t in remote) and site.open_connections == 8
    assert _refused(connect(site, _v4("203.0.113.8")))["error"] == "too many connections"
    local.pop().loseConnection()
    again = connect(site, _v4("127.0.0.1"))
    assert again.connected and site.local_connections == 6
    for transport in (*local, *remote, again):
        transport.loseConnection()
    assert (site.open_connections, site.local_connections, len(site.sources)) == (0, 0, 0)


@pytest.mark.parametrize("share", [-1, 8, 9])
def test_the_share_is_less_than_the_cap(share: int) -> None:
    with pytest.raises(ValueError, match="remote_share"):
        make_site(Ok(), clock=Clock(), max_connections=8, remote_share=share)


def test_with_keys_each_facade_keeps_a_quarter_for_remote_callers(tmp_path: Any) -> None:
    clock = cast(IProxyReactor, MemoryReactorClock())
    settings = Settings(max_connections=10)
    plain = build_runtime(clock, settings, ["ollama"], nodes={"ollama": []})
    keyed = build_runtime(
        clock,
        settings,
        ["ollama"],
        nodes={"ollama": []},
        environ={"NVPAIR_PROXY_API_KEYS": "sk-0123456789"},
    )
    assert plain.site_for("ollama").limits.remote_share == 0
    assert keyed.site_for("ollama").limits.remote_share == 2
    assert keyed.site_for("ollama").limits.local_cap == 8


def test_the_option_reaches_each_facades_site() -> None:
    """``--max-connections-per-source`` (default 64) is the cap of every facade's site."""
    options = Options()
    options.parseOptions(["--engine", "ollama"])
    assert options.config.settings.max_connections_per_source == 64
    options = Options()
    options.parseOptions(["--engine", "ollama", "--max-connections-per-source", "3"])
    settings = options.config.settings
    assert settings.max_connections_per_source == 3
    clock = cast(IProxyReactor, MemoryReactorClock())
    runtime = build_runtime(clock, settings, ["ollama"], nodes={"ollama": []})
    assert runtime.site_for("ollama").limits.max_connections_per_source == 3
    with pytest.raises(UsageError, match="max-connections-per-source"):
        Options().parseOptions(["--engine", "ollama", "--max-connections-per-source", "0"])


def _open_many(port: int, count: int) -> list[bytes]:
    """Open ``count`` connections at once, then send one request on each."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
    answers = []
    try:
        for sock in socks:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        for sock in socks:
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            answers.append(b"".join(chunks))
    finally:
        for sock in socks:
            sock.close()
    return answers


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_loopback_connections_are_not_capped_per_source(
    reactor: Any, listen: Callable[[Any], int]
) -> None:
    """Over real sockets every local app arrives from 127.0.0.1: a per-source cap of 1 does not
    refuse its second connection; only the site's overall cap does."""
    site = make_site(Ok(), clock=reactor, max_connections_per_source=1, max_connections=3)
    port = listen(site)
    answers = await deferToThread(_open_many, port, 4)
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 3 + [
        b"HTTP/1.1 503 Service Unavailable"
    ]
    assert site.open_connections == 0
