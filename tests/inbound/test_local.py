"""The ``local`` test (docs/behaviour.md §14.2): a loopback peer, a local ``Host``, no foreign
``Origin``; pure, on addresses and headers."""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IAddress
from twisted.web.http_headers import Headers

from nvpair_tw.inbound import Locality, LocalNames, locality
from nvpair_tw.inbound._local import check_host_name

LOOP = IPv4Address("TCP", "127.0.0.1", 5000)
LOOP6 = IPv6Address("TCP", "::1", 5000)
LAN = IPv4Address("TCP", "192.0.2.10", 5000)


def names() -> LocalNames:
    """Built per use, not at import: a mutant of ``LocalNames.of`` must run under the tests."""
    return LocalNames.of(
        hosts=["Proxy.LAN."], origins=["https://chat.example:8080"], hostname="Studio.Local."
    )


def head(host: str | None = None, origin: str | None = None) -> Headers:
    headers = Headers()
    if host is not None:
        headers.addRawHeader(b"host", host.encode())
    if origin is not None:
        headers.addRawHeader(b"origin", origin.encode())
    return headers


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.0.0.1:11434",
        "127.8.9.10:1",
        "[::1]",
        "[::1]:11434",
        "[::ffff:127.0.0.1]:80",
        "192.168.1.20:8080",
        "localhost",
        "LOCALHOST:11434",
        "localhost.",
        "app.localhost:3000",
        "studio.local",
        "STUDIO.LOCAL:11434",
        "proxy.lan",
        "Proxy.LAN:443",
    ],
)
def test_a_loopback_caller_with_a_local_host_is_local(host: str) -> None:
    for peer in (LOOP, LOOP6, UNIXAddress(b"/run/nvpair.sock")):
        assert locality(peer, head(host), names()) is Locality.LOCAL, (peer, host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:11434",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "studio.local.evil.example",
        "lan",
        "",
        "localhost:http",
        "[::1",
        "[::1]x",
        "::1",
        "local host",
        "localhost\xe9",
        "2130706433",
    ],
)
def test_a_loopback_caller_with_another_host_is_foreign(host: str) -> None:
    """A page whose name resolves to 127.0.0.1 (DNS rebinding) sends its own name as Host."""
    headers = Headers({b"host": [host.encode("latin-1")]})
    assert locality(LOOP, headers, names()) is Locality.LOOPBACK_FOREIGN


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1",
        "http://127.0.0.1:3000",
        "https://127.5.6.7:8443",
        "http://[::1]:5173",
        "http://localhost",
        "http://localhost:5173",
        "https://app.localhost",
        "https://chat.example:8080",
    ],
)
def test_a_loopback_or_allowed_origin_keeps_the_caller_local(origin: str) -> None:
    assert locality(LOOP, head("localhost", origin), names()) is Locality.LOCAL


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://evil.example:11434",
        "null",
        "https://chat.example",
        "https://chat.example:8080/",
        "http://localhost.evil.example",
        "ftp://127.0.0.1",
        "http://user@127.0.0.1",
        "http://192.168.1.20:8080",
        "http://studio.local:3000",
        "",
    ],
)
def test_a_foreign_origin_makes_a_loopback_caller_foreign(origin: str) -> None:
    """Any page's simple POST carries its Origin: it must not become local."""
    assert locality(LOOP, head("127.0.0.1:11434", origin), names()) is Locality.LOOPBACK_FOREIGN


def test_two_origin_headers_are_foreign_and_two_host_headers_ambiguous() -> None:
    two_origins = Headers({b"origin": [b"http://localhost", b"http://localhost"]})
    assert locality(LOOP, two_origins, names()) is Locality.LOOPBACK_FOREIGN
    two_hosts = Headers({b"host": [b"localhost", b"evil.example"]})
    for peer in (LOOP, LAN):
        assert locality(peer, two_hosts, names()) is Locality.AMBIGUOUS


def test_no_host_header_passes_the_host_test() -> None:
    """No browser omits Host; a raw HTTP/1.0 client on this machine may."""
    assert locality(LOOP, Headers(), names()) is Locality.LOCAL


@pytest.mark.parametrize(
    "peer",
    [
        LAN,
        IPv6Address("TCP", "2001:db8::1", 1),
        IPv6Address("TCP", "::ffff:192.0.2.1", 1),
        IPv4Address("TCP", "bogus", 1),
    ],
)
def test_any_other_peer_is_remote_whatever_its_headers(peer: IAddress) -> None:
    assert locality(peer, head("localhost"), names()) is Locality.REMOTE
    forwarded = Headers({b"x-forwarded-for": [b"127.0.0.1"], b"host": [b"127.0.0.1"]})
    assert locality(peer, forwarded, names()) is Locality.REMOTE


def test_the_host_name_defaults_to_this_machines() -> None:
    import socket

    names = LocalNames.of()
    assert names.hostname == socket.gethostname().lower()
    assert locality(LOOP, head(socket.gethostname().upper()), names) is Locality.LOCAL


def test_allow_host_names_are_checked_and_lower_cased() -> None:
    assert check_host_name(" Proxy.LAN. ") == "proxy.lan"
    for bad in ("proxy.lan:80", "", "a b", "-x.lan", "http://proxy.lan", "[::1]"):
        with pytest.raises(ValueError, match="not a host name"):
            check_host_name(bad)


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost@evil.example",
        "http://127.0.0.1/x",
        "http://evil.example://127.0.0.1",
        "http://l\u00f6calhost",
    ],
)
def test_an_origin_that_only_looks_local_is_foreign(origin: str) -> None:
    headers = Headers()
    headers.addRawHeader(b"host", b"localhost")
    headers.addRawHeader(b"origin", origin.encode("utf-8"))
    assert locality(LOOP, headers, names()) is not Locality.LOCAL, origin


def test_a_host_name_is_at_most_253_characters() -> None:
    longest = ".".join(["a" * 63] * 3 + ["a" * 61])
    assert len(longest) == 253
    assert check_host_name(longest) == longest
    with pytest.raises(ValueError):
        check_host_name(longest + "a")


def fetched(site: bytes | list[bytes], origin: str | None = None) -> Headers:
    headers = head("127.0.0.1:11435", origin)
    headers.setRawHeaders(b"sec-fetch-site", site if isinstance(site, list) else [site])
    return headers


@pytest.mark.parametrize(
    "site", [b"cross-site", b"same-site", b"CROSS-SITE ", b"anything-else", [b"none", b"none"]]
)
def test_another_sites_request_without_an_origin_is_foreign(site: bytes | list[bytes]) -> None:
    """A page's cross-site ``GET`` sends no ``Origin``; its ``Sec-Fetch-Site`` says it is not the
    user's own: from loopback it is not ``local`` (docs/behaviour.md §14.2)."""
    assert locality(LOOP, fetched(site), names()) is Locality.LOOPBACK_FOREIGN


@pytest.mark.parametrize(
    ("site", "origin"),
    [
        (b"none", None),
        (b"same-origin", None),
        (b" Same-Origin", None),
        (b"cross-site", "http://localhost:5173"),
        (b"same-site", "https://chat.example:8080"),
    ],
)
def test_the_users_own_request_or_a_local_origins_stays_local(
    site: bytes, origin: str | None
) -> None:
    assert locality(LOOP, fetched(site, origin), names()) is Locality.LOCAL


def test_a_cross_site_request_with_a_foreign_origin_stays_foreign() -> None:
    headers = fetched(b"cross-site", "https://evil.example")
    assert locality(LOOP, headers, names()) is Locality.LOOPBACK_FOREIGN
    assert locality(LAN, fetched(b"none"), names()) is Locality.REMOTE
