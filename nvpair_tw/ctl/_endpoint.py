# -*- test-case-name: tests.ctl.test_endpoint -*-
"""Where ``nvpair-ctl`` connects: the ``--control`` endpoint string, read as the client side.

The same string the proxy was given works (``unix:/run/nvpair/ctl.sock:mode=660``,
``tcp:7070:interface=127.0.0.1``), so an operator can copy it from the unit or the start-up log;
a client form (``tcp:HOST:PORT``, ``tcp:host=HOST:port=PORT``) and a bare socket path work too.
A server bound to every interface (no ``interface``, ``0.0.0.0``, ``::``) is reached on loopback.
``stdio``, ``ssl:`` and ``systemd:`` channels cannot be reached by address: they are refused
with the reason, as is anything else that is not a unix socket or TCP.
"""

from __future__ import annotations

import re

from attrs import frozen

__all__ = ["DEFAULT_CONTROL", "TcpAddress", "UnixAddress", "parse_endpoint"]

DEFAULT_CONTROL = "unix:/run/nvpair/ctl.sock"
"""The control socket of docs/deploy/nvpair.service (its ``RuntimeDirectory=nvpair``)."""

_UNESCAPED_COLON = re.compile(r"(?<!\\):")
_LOOPBACK = {"tcp": "127.0.0.1", "tcp4": "127.0.0.1", "tcp6": "::1"}
_EVERYWHERE = {"", "0.0.0.0", "::"}
_UNREACHABLE = {
    "stdio": "a stdio channel belongs to the process that started the proxy",
    "ssl": "nvpair-ctl speaks plain TCP or a unix socket; put TLS in front with a tunnel",
    "systemd": "give the address of the socket systemd passes instead",
}


@frozen
class UnixAddress:
    """A unix socket: a file system path, or a Linux abstract name (``@name``)."""

    path: str

    def address(self) -> str:
        """What :meth:`socket.socket.connect` takes (an abstract name starts with NUL)."""
        return "\0" + self.path[1:] if self.path.startswith("@") else self.path

    def __str__(self) -> str:
        return f"unix:{self.path}"


@frozen
class TcpAddress:
    """A TCP host and port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"tcp:{self.host}:{self.port}"


def _fields(rest: list[str]) -> tuple[list[str], dict[str, str]]:
    named = dict(p.split("=", 1) for p in rest if "=" in p)
    return [p for p in rest if "=" not in p], named


def _unix(text: str, rest: list[str]) -> UnixAddress:
    positional, named = _fields(rest)
    path = named.get("address", positional[0] if positional else "")
    if not path:
        raise ValueError(f"{text!r} names no socket path (write unix:/run/nvpair/ctl.sock)")
    return UnixAddress(path)


def _tcp(text: str, kind: str, rest: list[str]) -> TcpAddress:
    positional, named = _fields(rest)
    if len(positional) == 2:  # the client form tcp:HOST:PORT
        host, port = positional
    elif len(positional) <= 1:  # the server form tcp:PORT:interface=HOST, or port=/host=
        port = named.get("port", positional[0] if positional else "")
        host = named.get("host", named.get("interface", ""))
    else:
        raise ValueError(f"{text!r}: write {kind}:PORT:interface=HOST or {kind}:HOST:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    host = host.strip("[]")
    return TcpAddress(_LOOPBACK[kind] if host in _EVERYWHERE else host, int(port))


def parse_endpoint(text: str) -> UnixAddress | TcpAddress:
    """The address behind a ``--control`` endpoint string; :class:`ValueError` (one line, naming
    the string) when there is none to connect to."""
    raw = text.strip()
    if raw.startswith("/"):
        return UnixAddress(raw)
    parts = [p.replace("\\:", ":") for p in _UNESCAPED_COLON.split(raw)]
    kind, rest = parts[0].lower(), parts[1:]
    if kind == "unix":
        return _unix(raw, rest)
    if kind in _LOOPBACK:
        return _tcp(raw, kind, rest)
    if kind in _UNREACHABLE:
        raise ValueError(f"{raw!r} cannot be reached from outside the proxy: {_UNREACHABLE[kind]}")
    raise ValueError(
        f"{raw!r} is not a unix socket or TCP endpoint (write unix:PATH or tcp:HOST:PORT)"
    )
