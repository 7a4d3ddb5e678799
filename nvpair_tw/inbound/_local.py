# -*- test-case-name: tests.inbound.test_local -*-
"""Who is ``local`` (docs/behaviour.md §14.2): the loopback peer, its ``Host`` and its ``Origin``.

A caller is ``local`` when all three hold: it connects from loopback (or a UNIX socket); its
``Host`` is an IP literal (``127.0.0.1``, ``[::1]``, with or without a port), ``localhost``,
``*.localhost``, this machine's host name or an ``--allow-host`` name; and its ``Origin``, if it
sends one, is a loopback origin (``http(s)://`` ``127.x.x.x``, ``[::1]``, ``localhost`` or
``*.localhost``, any port) or one allowed by ``--cors-origin``. A page whose name resolves to
127.0.0.1 (DNS rebinding) fails the ``Host`` test, and any page's simple POST the ``Origin`` one.
A browser's cross-site ``GET`` (an ``<img>``, a link) sends no ``Origin`` but says where it came
from in ``Sec-Fetch-Site``: a request whose ``Sec-Fetch-Site`` is anything but ``none`` or
``same-origin`` (``cross-site``, ``same-site``) is ``local`` only with an ``Origin`` that passes.
A request without ``Host`` passes that test (no browser omits it); two ``Host`` headers are
:attr:`Locality.AMBIGUOUS` (400). Decided from the TCP peer and these three headers only, never
from forwarding headers.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from enum import Enum

from attrs import frozen
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IAddress
from twisted.web.http_headers import Headers

__all__ = [
    "LocalNames",
    "Locality",
    "check_host_name",
    "ip_of",
    "is_loopback",
    "locality",
]

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{0,5}")
_OWN_SITE = frozenset({b"none", b"same-origin"})
"""``Sec-Fetch-Site`` values of a request a browser's user or the page's own origin made."""


class Locality(Enum):
    """Where a caller stands for the ``local`` test (docs/behaviour.md §14.2)."""

    LOCAL = "local"
    """Loopback peer, a local ``Host`` and no foreign ``Origin``: every right."""
    LOOPBACK_FOREIGN = "loopback-foreign"
    """Loopback peer failing the ``Host`` or ``Origin`` test: treated as a remote caller."""
    REMOTE = "remote"
    """Any other peer."""
    AMBIGUOUS = "ambiguous"
    """More than one ``Host`` header: 400 whoever sends it."""


@frozen
class LocalNames:
    """What the ``local`` test accepts beyond IP literals and ``localhost``: this machine's host
    name, the ``--allow-host`` names (all lower case) and the ``--cors-origin`` origins."""

    hostname: str
    hosts: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        hosts: Iterable[str] = (),
        origins: Iterable[str] = (),
        hostname: str | None = None,
    ) -> LocalNames:
        """The names for ``hosts`` and ``origins``; ``hostname`` defaults to
        ``socket.gethostname()``."""
        name = socket.gethostname() if hostname is None else hostname
        return cls(
            hostname=name.lower().rstrip("."),
            hosts=frozenset(h.lower().rstrip(".") for h in hosts),
            origins=frozenset(origins),
        )

    def host_allowed(self, value: bytes) -> bool:
        """Whether a ``Host`` value names this machine (see the module docstring)."""
        host = _host_of(value)
        if host is None:
            return False
        if isinstance(host, ipaddress.IPv4Address | ipaddress.IPv6Address):
            return True
        return _is_localhost(host) or host == self.hostname or host in self.hosts

    def origin_allowed(self, value: bytes) -> bool:
        """Whether an ``Origin`` value is a loopback origin or a ``--cors-origin`` one."""
        try:
            text = value.decode("ascii").strip()
        except UnicodeDecodeError:
            return False
        return text in self.origins or _loopback_origin(text)


def check_host_name(text: str) -> str:
    """An ``--allow-host`` name, lower-cased, or ``ValueError`` (a DNS name, no port, no IP)."""
    name = text.strip().lower().rstrip(".")
    if not _HOST_NAME.fullmatch(name) or len(name) > 253:
        raise ValueError(f"{text!r} is not a host name such as proxy.lan")
    return name


def ip_of(peer: IAddress) -> _IPAddress | None:
    """The peer's IP (IPv4-mapped IPv6 unwrapped), or ``None`` if it has none that parses."""
    if not isinstance(peer, IPv4Address | IPv6Address):
        return None
    return _parse_ip(peer.host)


@functools.lru_cache(maxsize=1024)
def _parse_ip(host: str) -> _IPAddress | None:
    """Parse once per distinct host: this runs on every request."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback(peer: IAddress) -> bool:
    """Whether ``peer`` is local: a loopback IP or a UNIX socket; anything unparseable is not."""
    if isinstance(peer, UNIXAddress):
        return True
    ip = ip_of(peer)
    return ip is not None and ip.is_loopback


def _is_localhost(name: str) -> bool:
    return name == "localhost" or name.endswith(".localhost")


@functools.lru_cache(maxsize=1024)
def _host_of(value: bytes) -> _IPAddress | str | None:
    """The host of a ``Host`` value (``name``, ``a.b.c.d`` or ``[v6]``, each with an optional
    ``:port``): an IP, a lower-case name without its trailing dot, or ``None`` if malformed."""
    try:
        text = value.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    if text.startswith("["):
        inside, sep, port = text[1:].partition("]")
        if not sep or (port and not (port[0] == ":" and _PORT.fullmatch(port[1:]))):
            return None
        ip = _parse_ip(inside)
        return ip if isinstance(ip, ipaddress.IPv6Address | ipaddress.IPv4Address) else None
    name, _, port = text.partition(":")
    if not _PORT.fullmatch(port):
        return None
    name = name[:-1] if name.endswith(".") else name
    try:
        return ipaddress.IPv4Address(name)
    except ValueError:
        pass
    return name if _HOST_NAME.fullmatch(name) else None


def _loopback_origin(text: str) -> bool:
    """``http(s)://`` with a loopback IP, ``localhost`` or ``*.localhost`` host, any port."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or "/" in rest or "@" in rest:
        return False
    host = _host_of(rest.encode("ascii"))
    if isinstance(host, str):
        return _is_localhost(host)
    return host is not None and host.is_loopback


def locality(peer: IAddress, headers: Headers, names: LocalNames) -> Locality:
    """Where the caller at ``peer`` with ``headers`` stands (docs/behaviour.md §14.2)."""
    hosts = headers.getRawHeaders(b"host")
    if hosts is not None and len(hosts) > 1:
        return Locality.AMBIGUOUS
    if not is_loopback(peer):
        return Locality.REMOTE
    if hosts is not None and not names.host_allowed(hosts[0]):
        return Locality.LOOPBACK_FOREIGN
    origins = headers.getRawHeaders(b"origin")
    if origins is not None and (len(origins) > 1 or not names.origin_allowed(origins[0])):
        return Locality.LOOPBACK_FOREIGN
    if origins is None and not _own_site(headers.getRawHeaders(b"sec-fetch-site")):
        return Locality.LOOPBACK_FOREIGN  # another site's page, which sent no Origin
    return Locality.LOCAL


def _own_site(values: Sequence[bytes] | None) -> bool:
    """Whether ``Sec-Fetch-Site`` is absent, or one value saying the request is the user's own
    or its page's origin's (``none``, ``same-origin``)."""
    if values is None:
        return True
    return len(values) == 1 and values[0].strip().lower() in _OWN_SITE
