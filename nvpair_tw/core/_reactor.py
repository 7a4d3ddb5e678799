# -*- test-case-name: tests.core.test_reactor -*-
"""What the proxy needs from a reactor, as one interface, and the one way to cut a connection.

Only ``tap.makeService`` touches the global reactor; everything else is handed an object that
provides :class:`IProxyReactor` (treq's ``_ITreqReactor`` is the model). Tests pass a
``MemoryReactorClock`` or the running reactor.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import (
    IReactorCore,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorTime,
)

__all__ = ["IProxyReactor", "abort", "close"]


class IProxyReactor(IReactorCore, IReactorTime, IReactorTCP, IReactorPluggableNameResolver):
    """Time, TCP, start/stop and name resolution: everything the proxy asks of its reactor."""


def abort(transport: Any) -> None:
    """Reset a connection now (RST): only for a peer that must not see a clean end.

    ``abortConnection`` is on TCP and TLS transports but not on ``ITransport``; a transport
    without it (a test double, stdio) is closed instead.
    """
    if transport is None:
        return
    cut = getattr(transport, "abortConnection", None)
    if cut is not None:
        cut()
    else:
        transport.loseConnection()


def close(transport: Any) -> None:
    """Close a connection after what was written has been sent (FIN, never RST)."""
    if transport is not None:
        transport.loseConnection()
