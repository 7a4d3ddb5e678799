"""Endpoint strings: a TCP listener's interface and port, the URLs that reach it (self-guard), the
owner-only mode of a unix socket that names none; and the URL a client uses for a listener."""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress

from nvpair_tw.nodes._directory import url_key
from nvpair_tw.runtime._endpoints import (
    TCPListener,
    client_url,
    openai_url,
    own_urls,
    owner_only,
    tcp_listener,
)

LOOPBACK_11435 = ["http://127.0.0.1:11435", "http://[::1]:11435", "http://localhost:11435"]


@pytest.mark.parametrize(
    "description",
    [
        "tcp:11435:interface=127.0.0.1",
        "tcp:port=11435:interface=127.0.0.1",
        "tcp:port=11435:interface=127.0.0.1:backlog=50",
        "tcp:11435:interface=localhost",
    ],
)
def test_own_urls_of_a_loopback_listener(description: str) -> None:
    """A loopback listener is reachable as 127.0.0.1, [::1] and localhost, in positional or port= form."""
    assert sorted(own_urls(description)) == LOOPBACK_11435


def test_own_urls_of_a_wildcard_listener_include_loopback() -> None:
    """Listening on every interface also means every loopback name reaches this proxy."""
    urls = own_urls("tcp:1235")
    assert {"http://127.0.0.1:1235", "http://[::1]:1235", "http://localhost:1235"} <= set(urls)
    assert {url_key(u) for u in urls} == {("http", "<loopback>", 1235)}


def test_own_urls_of_a_specific_interface() -> None:
    """A listener on one LAN address is reached only there."""
    assert own_urls("tcp:8001:interface=10.0.0.5") == ["http://10.0.0.5:8001"]


def test_own_urls_of_ipv6_listeners_are_valid_urls() -> None:
    """tcp6 interfaces (colons escaped) become bracketed hosts a node URL can be compared with."""
    loopback = own_urls(r"tcp6:1235:interface=\:\:1")
    assert "http://[::1]:1235" in loopback
    assert None not in [url_key(u) for u in loopback]
    lan = own_urls(r"tcp6:port=1235:interface=2001\:db8\:\:5")
    assert [url_key(u) for u in lan] == [url_key("http://[2001:db8::5]:1235")]


@pytest.mark.parametrize("description", ["unix:/run/nvpair.sock", "stdio", ""])
def test_own_urls_of_non_tcp_listeners_are_empty(description: str) -> None:
    """A listener no node URL can point at has no own URLs."""
    assert own_urls(description) == []


@pytest.mark.parametrize(
    ("description", "listener"),
    [
        ("tcp:11435:interface=127.0.0.1", TCPListener("127.0.0.1", 11435)),
        ("tcp:port=0", TCPListener("0.0.0.0", 0)),
        (r"tcp6:8001:interface=\:\:1", TCPListener("::1", 8001)),
        ("unix:/run/nvpair.sock", None),
    ],
)
def test_tcp_listener_reads_interface_and_port(
    description: str, listener: TCPListener | None
) -> None:
    """Positional and port= forms, tcp6 escaped colons; other endpoint types are not TCP listeners."""
    assert tcp_listener(description) == listener


@pytest.mark.parametrize("description", ["tcp:70000", "tcp:port=x", "tcp:interface=127.0.0.1"])
def test_impossible_tcp_ports_are_value_errors(description: str) -> None:
    """A port outside 0-65535, or none at all, is refused before anything tries to bind it."""
    with pytest.raises(ValueError, match="port must be"):
        tcp_listener(description)


@pytest.mark.parametrize(
    ("description", "made"),
    [
        ("unix:/run/nvpair/ctl.sock", "unix:/run/nvpair/ctl.sock:mode=600"),
        ("unix:address=/run/ctl.sock", "unix:address=/run/ctl.sock:mode=600"),
        ("unix:/run/ctl.sock:lockfile=0", "unix:/run/ctl.sock:lockfile=0:mode=600"),
        ("unix:/run/a\\:b.sock", "unix:/run/a\\:b.sock:mode=600"),
        (" unix:/run/ctl.sock ", "unix:/run/ctl.sock:mode=600"),
    ],
)
def test_a_unix_socket_without_a_mode_is_made_owner_only(description: str, made: str) -> None:
    """A filesystem unix socket that names no mode gets 600 (Twisted would make it 666)."""
    assert owner_only(description) == made


@pytest.mark.parametrize(
    "description",
    [
        "unix:/run/ctl.sock:mode=660",
        "unix:address=/run/ctl.sock:mode=666",
        "unix:@abstract",
        "tcp:7070:interface=127.0.0.1",
        "stdio",
    ],
)
def test_a_given_mode_or_another_endpoint_is_kept(description: str) -> None:
    """A mode the operator gave, an abstract socket (no file) and other endpoints are unchanged."""
    assert owner_only(description) == description


@pytest.mark.parametrize(
    ("address", "description", "url", "sdk"),
    [
        (IPv4Address("TCP", "127.0.0.1", 11435), "tcp:11435", "http://127.0.0.1:11435",
         "http://127.0.0.1:11435/v1"),
        (IPv4Address("TCP", "0.0.0.0", 80), "tcp:80", "http://127.0.0.1:80 (every interface)",
         "http://127.0.0.1:80/v1"),
        (IPv6Address("TCP", "::", 8080), "tcp6:8080", "http://[::1]:8080 (every interface)",
         "http://[::1]:8080/v1"),
        (IPv6Address("TCP", "fe80::1", 443), "ssl:443", "https://[fe80::1]:443",
         "https://[fe80::1]:443/v1"),
        (UNIXAddress(b"/run/nvpair/ctl.sock"), "unix:/run/nvpair/ctl.sock",
         "unix:/run/nvpair/ctl.sock", "unix:/run/nvpair/ctl.sock/v1"),
    ],
)  # fmt: skip
def test_a_listener_is_shown_as_the_url_a_client_uses_and_its_v1(
    address: IPv4Address, description: str, url: str, sdk: str
) -> None:
    """The URL a client on this machine uses (loopback for a listener on every interface, which
    says so), and where OpenAI-style clients point: its ``/v1``."""
    assert client_url(address, description) == url
    assert openai_url(url) == sdk
