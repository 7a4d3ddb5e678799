"""Shared fixtures: the installed reactor, a loopback listener helper, a leaked-timer check, proxy
clusters stopped after the test, in-memory clusters checked for leftover timers and a loopback treq
client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import IListeningPort, IStreamClientEndpoint
from twisted.internet.task import deferLater
from twisted.web.client import URI, Agent, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from nvpair_tw.inventory import make_http_client
from nvpair_tw.testing import Clusters, MemoryCluster


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


@pytest_twisted.async_yield_fixture()
async def clusters(reactor: Any) -> AsyncIterator[Clusters]:
    """Makes proxy clusters; each is stopped (proxy, then engines) after the test."""
    made = Clusters(reactor)
    yield made
    await made.stop()


@pytest.fixture
def memory_cluster() -> Iterator[Callable[..., MemoryCluster]]:
    """Makes ``MemoryCluster``s; stops them after the test and fails it if a timer is left behind."""
    made: list[MemoryCluster] = []

    def make(*args: Any, **kw: Any) -> MemoryCluster:
        cluster = MemoryCluster(*args, **kw)
        made.append(cluster)
        return cluster

    yield make
    for cluster in reversed(made):
        cluster.stop()
    leftover = [call for c in made for call in c.clock.getDelayedCalls() if call.active()]
    for call in leftover:
        call.cancel()
    assert not leftover, leftover


@implementer(IAgentEndpointFactory)
class LoopbackEndpoints:
    """Plain TCP4 endpoints, so a refused connection fails at once (no 0.3 s happy-eyeballs)."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        return TCP4ClientEndpoint(self._reactor, uri.host.decode(), uri.port, timeout=5)


@pytest.fixture
def http(reactor: Any) -> Iterator[HTTPClient]:
    """A cookie-less treq client over a persistent pool that is closed afterwards."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.retryAutomatically = False
    yield make_http_client(Agent.usingEndpointFactory(reactor, LoopbackEndpoints(reactor), pool))
    pytest_twisted.blockon(pool.closeCachedConnections())
