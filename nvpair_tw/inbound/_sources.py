# -*- test-case-name: tests.inbound.test_limits_sources -*-
"""Open connections counted per remote source (docs/behaviour.md §14.4).

A remote source is one IPv4 address, or one IPv6 /64 (a host picks any address of its /64, so
counting single IPv6 addresses would count nothing). IPv4-mapped IPv6 peers count as their IPv4
address. Loopback peers and filesystem sockets are not a remote source: every local app and a
same-host reverse proxy arrive from 127.0.0.1, so they share only the site's overall cap.
"""

from __future__ import annotations

import functools
import ipaddress

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IAddress

__all__ = ["SourceCounts", "source_of"]

_IPV6_SOURCE_PREFIX = 64


def source_of(peer: IAddress | None) -> str | None:
    """The remote source ``peer`` counts against, or ``None`` when it is local (or has no IP)."""
    if not isinstance(peer, IPv4Address | IPv6Address):
        return None
    return _source_of_host(peer.host)


@functools.lru_cache(maxsize=4096)
def _source_of_host(host: str) -> str | None:
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, _IPV6_SOURCE_PREFIX), strict=False))
    return str(ip)


class SourceCounts:
    """How many connections each remote source has open on one site, up to ``per_source``."""

    def __init__(self, per_source: int) -> None:
        self.per_source = per_source
        self._open: dict[str, int] = {}

    def admit(self, source: str) -> bool:
        """Count one more connection of ``source``, or refuse it (False) at the cap."""
        count = self._open.get(source, 0)
        if count >= self.per_source:
            return False
        self._open[source] = count + 1
        return True

    def release(self, source: str) -> None:
        """One connection of ``source`` closed (its entry goes when none is left)."""
        count = self._open.get(source, 0) - 1
        if count > 0:
            self._open[source] = count
        else:
            self._open.pop(source, None)

    def open(self, source: str) -> int:
        """Connections of ``source`` open now."""
        return self._open.get(source, 0)

    def __len__(self) -> int:
        """Remote sources with a connection open."""
        return len(self._open)
