# -*- test-case-name: tests.nodes.test_self -*-
"""The static self-loop check (docs/behaviour.md §14.3): is a node URL this very process?

Pure functions over a URL, the addresses this process listens on and, for a host name, the
addresses the name resolved to (resolving is :class:`nvpair_tw.nodes.SelfGuard`'s job, on the
reactor's resolver). A node is this process when its port is one this process listens on and its
address is a loopback or unspecified address (``127.0.0.0/8``, ``::1``, ``0.0.0.0``, ``::``, an
IPv4-mapped form of them), or the very interface a listener is bound to. ``localhost`` and
``*.localhost`` are loopback without asking a resolver (RFC 6761).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from urllib.parse import urlsplit

__all__ = ["Listening", "is_self", "name_to_resolve", "port_of"]

Listening = frozenset[tuple[str, int]]
"""The ``(interface address, port)`` pairs this process listens on (``0.0.0.0``/``::`` for all)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK = "127.0.0.1"


def _host_port(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower().rstrip(".")
    scheme = parts.scheme.lower()
    if not host or scheme not in _DEFAULT_PORTS:
        return None
    return host, port if port is not None else _DEFAULT_PORTS[scheme]


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_local_name(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def name_to_resolve(url: str) -> str | None:
    """The host name in ``url`` that must be resolved to tell whether it is this process, or
    ``None``: an IP literal, ``localhost`` / ``*.localhost``, or not a URL with a host."""
    found = _host_port(url)
    if found is None:
        return None
    host, _ = found
    if _address(host) is not None or _is_local_name(host):
        return None
    return host


def port_of(url: str) -> int | None:
    """The port ``url`` reaches (the scheme's default when absent), or ``None``."""
    found = _host_port(url)
    return None if found is None else found[1]


def is_self(url: str, listening: Listening, addresses: Collection[str] = ()) -> bool:
    """Whether ``url`` reaches this process: its port is in ``listening`` and its host (an IP
    literal, ``localhost``, or a name resolved to ``addresses``) is loopback, unspecified, or the
    interface a listener on that port is bound to. A name without ``addresses`` is not self."""
    found = _host_port(url)
    if found is None:
        return False
    host, port = found
    interfaces = {_address(i) for i, p in listening if p == port}
    if not interfaces:
        return False
    if _is_local_name(host):
        candidates = [_LOOPBACK]
    elif _address(host) is not None:
        candidates = [host]
    else:
        candidates = list(addresses)
    for text in candidates:
        address = _address(text)
        if address is None:
            continue
        if address.is_loopback or address.is_unspecified or address in interfaces:
            return True
    return False
