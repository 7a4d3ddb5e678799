"""Tests for nvpair_tw.ctl._endpoint: the proxy's own ``--control`` strings, read as a client."""

from __future__ import annotations

import pytest

from nvpair_tw.ctl._endpoint import DEFAULT_CONTROL, TcpAddress, UnixAddress, parse_endpoint


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("unix:/run/nvpair/ctl.sock", UnixAddress("/run/nvpair/ctl.sock")),
        ("unix:/run/nvpair/ctl.sock:mode=660", UnixAddress("/run/nvpair/ctl.sock")),
        ("unix:address=/tmp/c.sock:mode=600:lockfile=1", UnixAddress("/tmp/c.sock")),
        ("unix:/tmp/a\\:b.sock", UnixAddress("/tmp/a:b.sock")),
        ("unix:@nvpair", UnixAddress("@nvpair")),
        ("/run/nvpair/ctl.sock", UnixAddress("/run/nvpair/ctl.sock")),
        ("tcp:7070:interface=127.0.0.1", TcpAddress("127.0.0.1", 7070)),
        ("tcp:7070", TcpAddress("127.0.0.1", 7070)),
        ("tcp:7070:interface=0.0.0.0", TcpAddress("127.0.0.1", 7070)),
        ("tcp:port=7070:interface=10.0.0.5", TcpAddress("10.0.0.5", 7070)),
        ("tcp:proxy.lan:7070", TcpAddress("proxy.lan", 7070)),
        ("tcp:host=proxy.lan:port=7070", TcpAddress("proxy.lan", 7070)),
        ("tcp6:7070:interface=\\:\\:1", TcpAddress("::1", 7070)),
        ("tcp6:7070", TcpAddress("::1", 7070)),
        (" TCP:7070 ", TcpAddress("127.0.0.1", 7070)),
    ],
)
def test_the_server_and_client_forms_name_the_address(
    text: str, address: UnixAddress | TcpAddress
) -> None:
    assert parse_endpoint(text) == address


def test_the_default_is_the_units_socket() -> None:
    """docs/deploy/nvpair.service's RuntimeDirectory=nvpair and nvpair.env.example's socket."""
    assert parse_endpoint(DEFAULT_CONTROL) == UnixAddress("/run/nvpair/ctl.sock")


def test_an_abstract_socket_is_connected_to_by_its_nul_name() -> None:
    assert UnixAddress("@nvpair").address() == "\0nvpair"
    assert UnixAddress("/run/x.sock").address() == "/run/x.sock"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("stdio", "cannot be reached from outside the proxy: a stdio channel belongs"),
        ("ssl:7070", "cannot be reached from outside the proxy: nvpair-ctl speaks plain TCP"),
        ("systemd:domain=UNIX:index=0", "cannot be reached from outside the proxy"),
        ("pipe:x", "is not a unix socket or TCP endpoint (write unix:PATH or tcp:HOST:PORT)"),
        ("unix:", "names no socket path"),
        ("unix:mode=600", "names no socket path"),
        ("tcp:", "the port must be a number from 1 to 65535"),
        ("tcp:70000", "the port must be a number from 1 to 65535"),
        ("tcp:0", "the port must be a number from 1 to 65535"),
        ("tcp:http", "the port must be a number from 1 to 65535"),
        ("tcp:a:b:c", "write tcp:PORT:interface=HOST or tcp:HOST:PORT"),
    ],
)
def test_what_cannot_be_connected_to_is_refused_naming_the_string(text: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_endpoint(text)
    message = str(refused.value)
    assert message.startswith(repr(text.strip())) and why in message
    assert "\n" not in message
