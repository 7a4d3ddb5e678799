# -*- test-case-name: tests.core.test_reactor -*-
"""What the proxy needs from a reactor, as one interface, the one way to cut a connection, and
the one way to send a step's writes together.

Only ``tap.makeService`` touches the global reactor; everything else is handed an object that
provides :class:`IProxyReactor` (treq's ``_ITreqReactor`` is the model). Tests pass a
``MemoryReactorClock`` or the running reactor.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from twisted.internet.interfaces import (
    IReactorCore,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorTime,
)
from zope.interface import Interface

__all__ = ["IProxyReactor", "IWriteHolding", "abort", "close", "one_send"]


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


class IWriteHolding(Interface):
    """A transport that can hold the writes of one synchronous step and send them as one.

    ``runtime.EagerServer`` sends each write at once; a response's head and its body, written
    one after the other in the same call, would otherwise cost two system calls and two packets.
    """

    def hold() -> None:
        """Keep every write from now on, in order, until :meth:`send_held`."""

    def send_held() -> None:
        """Write what was held as one sequence, and write directly again."""


def one_send(transport: Any) -> AbstractContextManager[None]:
    """The writes made to ``transport`` inside the block leave as one write at its end (a
    transport that cannot hold writes sends each as usual). Nothing waits past the block."""
    if not IWriteHolding.providedBy(transport):
        return _NOTHING_HELD
    return _Held(transport)


_NOTHING_HELD = nullcontext()


class _Held:
    """:func:`one_send`'s block on a transport that holds writes (a class, not a generator:
    every answer's head goes through it)."""

    __slots__ = ("_transport",)

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def __enter__(self) -> None:
        self._transport.hold()

    def __exit__(self, *_: object) -> None:
        self._transport.send_held()
