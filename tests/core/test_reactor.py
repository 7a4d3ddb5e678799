"""Tests for nvpair_tw.core._reactor: what a reactor must provide, and cutting or closing a transport."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.interfaces import (
    IReactorCore,
    IReactorPluggableNameResolver,
    IReactorTCP,
    IReactorTime,
)
from twisted.internet.testing import MemoryReactorClock, StringTransport
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nvpair_tw.core._reactor import IProxyReactor, IWriteHolding, abort, close, one_send

PARTS = (IReactorCore, IReactorTime, IReactorTCP, IReactorPluggableNameResolver)


class Closable:
    """A transport with ``loseConnection`` only (stdio, a pipe, a test double)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def loseConnection(self) -> None:
        self.calls.append("loseConnection")


class Abortable(Closable):
    """A transport that can also reset (TCP, TLS)."""

    def abortConnection(self) -> None:
        self.calls.append("abortConnection")


def test_abort_resets_with_abort_connection_when_the_transport_has_it() -> None:
    """A TCP-like transport is reset, not closed."""
    transport = Abortable()
    abort(transport)
    assert transport.calls == ["abortConnection"]


def test_abort_falls_back_to_lose_connection() -> None:
    """A transport without ``abortConnection`` is closed instead of raising."""
    transport = Closable()
    abort(transport)
    assert transport.calls == ["loseConnection"]


def test_close_uses_lose_connection_even_when_abort_is_available() -> None:
    """``close`` lets written bytes go out (FIN), never a reset."""
    transport = Abortable()
    close(transport)
    assert transport.calls == ["loseConnection"]


def test_abort_and_close_ignore_a_missing_transport() -> None:
    """A protocol that never connected has no transport: nothing to do, nothing raised."""
    assert abort(None) is None  # type: ignore[func-returns-value]
    assert close(None) is None  # type: ignore[func-returns-value]


def test_string_transport_is_aborted_or_closed() -> None:
    """On Twisted's test transport ``abort`` takes the abort path and ``close`` the clean one."""
    cut, closed = StringTransport(), StringTransport()
    abort(cut)
    close(closed)
    assert cut.disconnecting and cut.disconnected
    assert closed.disconnecting and not closed.disconnected


def test_the_interface_is_exactly_its_parts() -> None:
    """``IProxyReactor`` adds nothing of its own: it is time, TCP, start/stop and resolution."""
    assert set(IProxyReactor.__bases__) == set(PARTS)
    assert list(IProxyReactor.names()) == []


def test_the_running_reactor_provides_every_part_of_the_interface(reactor: Any) -> None:
    """The installed reactor has every method and attribute ``IProxyReactor`` names."""
    assert verifyObject(IProxyReactor, reactor, tentative=True)
    for part in PARTS:
        assert part.providedBy(reactor), part


def test_the_memory_reactor_tests_cast_is_honest() -> None:
    """``MemoryReactorClock``, which tests cast to ``IProxyReactor``, really has all of it."""
    fake = MemoryReactorClock()
    assert verifyObject(IProxyReactor, fake, tentative=True)
    for part in PARTS:
        assert part.providedBy(fake), part


@implementer(IWriteHolding)
class Holding(Closable):
    """A transport that can hold writes: records the calls."""

    def hold(self) -> None:
        self.calls.append("hold")

    def send_held(self) -> None:
        self.calls.append("send_held")


def test_one_send_holds_a_holding_transport_around_the_block_even_when_it_raises() -> None:
    """The block's writes are held and sent at its end, also when the block fails."""
    transport = Holding()
    with pytest.raises(KeyError), one_send(transport):
        transport.calls.append("write")
        raise KeyError("boom")
    assert transport.calls == ["hold", "write", "send_held"]


def test_one_send_leaves_any_other_transport_alone() -> None:
    """A transport without holding (a test double, TLS, ``None``) is written to as usual."""
    transport = Closable()
    with one_send(transport):
        transport.calls.append("write")
    with one_send(None):
        pass
    assert transport.calls == ["write"]
