"""Shared fixtures: the installed reactor, a loopback listener helper and a leaked-timer check."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import deferLater


@pytest.fixture
def reactor() -> Any:
    """The reactor pytest-twisted installed (tests never import the global one themselves)."""
    from twisted.internet import reactor as installed

    return installed


@pytest.fixture
def listen(reactor: Any) -> Iterator[Callable[[Any], int]]:
    """Listen on 127.0.0.1 port 0 with a factory; return the port number; stop it afterwards."""
    ports: list[IListeningPort] = []

    def start(factory: Any) -> int:
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        ports.append(port)
        return int(port.getHost().port)

    yield start
    pytest_twisted.blockon(
        gatherResults([Deferred.fromCoroutine(_stop(p)) for p in ports])  # type: ignore[arg-type]
    )


async def _stop(port: IListeningPort) -> None:
    await maybeDeferred(port.stopListening)


@pytest.fixture(autouse=True)
def no_leaked_delayed_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a reactor test that leaves a timer behind (pytest-twisted has no dirty-reactor check)."""
    yield
    if "reactor" not in request.fixturenames:
        return
    from twisted.internet import reactor as installed

    pytest_twisted.blockon(deferLater(installed, 0.05, lambda: None))
    leaked = [c for c in installed.getDelayedCalls() if c.active()]
    for call in leaked:
        call.cancel()
    assert not leaked, leaked
