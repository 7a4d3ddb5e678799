# -*- test-case-name: tests.nodes.test_self -*-
"""What the self-loop check needs at run time (docs/behaviour.md §14.3): the addresses this process
listens on, learnt from each listening port, and what node host names resolved to.

Names are resolved on the reactor's own resolver (``reactor.nameResolver``; Twisted's default runs
``getaddrinfo`` in the reactor's thread pool), never on the reactor thread, and only for a URL whose
port is one this process listens on (every other URL cannot be this process). IP literals and
``localhost`` are never resolved. The verdict itself is the pure :func:`~nvpair_tw.nodes._self.is_self`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from attrs import define, field
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import (
    IAddress,
    IHostResolution,
    IListeningPort,
    IReactorPluggableNameResolver,
    IReactorTime,
    IResolutionReceiver,
)
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes._self import Listening, is_self, name_to_resolve, port_of

__all__ = ["SelfGuard"]

_log = LevelledLogger(namespace=__name__)


@implementer(IResolutionReceiver)
class _Addresses:
    """Collects one resolution's addresses; ``done`` fires with them."""

    def __init__(self) -> None:
        self.found: set[str] = set()
        self.done: Deferred[frozenset[str]] = Deferred()

    def resolutionBegan(self, resolutionInProgress: IHostResolution) -> None:
        pass

    def addressResolved(self, address: IAddress) -> None:
        host = getattr(address, "host", None)
        if isinstance(host, str):
            self.found.add(host)

    def resolutionComplete(self) -> None:
        self.done.callback(frozenset(self.found))


@define
class SelfGuard:
    """This process's listening addresses and its node names' resolutions, for :meth:`excludes`.

    The runtime keeps one; every listener reports its port to :meth:`listened`. The node code
    calls :meth:`refresh` when a node is added and at each poll, and :meth:`excludes` where
    candidates are chosen (synchronous: it uses the last resolution).
    """

    _reactor: IReactorPluggableNameResolver
    _listening: set[tuple[str, int]] = field(factory=set, init=False)
    _resolved: dict[str, frozenset[str]] = field(factory=dict, init=False)
    _watch: tuple[Callable[[], Iterable[str]], IReactorTime, float] | None = field(
        default=None, init=False
    )
    _loop: LoopingCall | None = field(default=None, init=False)
    _verdicts: dict[str, bool] = field(factory=dict, init=False)
    """:meth:`excludes` per URL, forgotten when a port or a resolution is learnt (it is asked
    for every candidate of every request)."""

    @property
    def listening(self) -> Listening:
        """The ``(interface, port)`` pairs this process listens on now."""
        return frozenset(self._listening)

    def listened(self, port: IListeningPort) -> IListeningPort:
        """Record a listening port (a ``Deferred`` callback: returns ``port``); unix and other
        address families without a TCP port are ignored."""
        address = port.getHost()
        host, number = getattr(address, "host", None), getattr(address, "port", None)
        if isinstance(host, str) and isinstance(number, int):
            self._listening.add((host, number))
            self._verdicts.clear()
            self._start_loop()
        return port

    def watch(self, urls: Callable[[], Iterable[str]], clock: IReactorTime, every: float) -> None:
        """Resolve again, every ``every`` seconds on ``clock``, each of ``urls()`` that could be
        this process (§14.3: names are resolved at each poll); from the first listening port on
        (before it, no URL can be this process) until :meth:`stop`."""
        self._watch = (urls, clock, every)
        self._start_loop()

    def stop(self) -> None:
        """Stop resolving node names again."""
        loop, self._loop, self._watch = self._loop, None, None
        if loop is not None and loop.running:
            loop.stop()

    def _start_loop(self) -> None:
        if self._watch is None or self._loop is not None or not self._listening:
            return
        urls, clock, every = self._watch
        self._loop = LoopingCall(self._check, urls)
        self._loop.clock = clock
        self._loop.start(every, now=False)

    def _check(self, urls: Callable[[], Iterable[str]]) -> None:
        for url in urls():
            if self.must_resolve(url):
                self.refresh(url).addErrback(_unresolved)

    def excludes(self, url: str) -> bool:
        """Whether ``url`` is this process (so never a candidate), by the last resolution."""
        verdict = self._verdicts.get(url)
        if verdict is None:
            name = name_to_resolve(url)
            addresses = self._resolved.get(name, frozenset()) if name is not None else frozenset()
            verdict = self._verdicts[url] = is_self(url, self.listening, addresses)
        return verdict

    def must_resolve(self, url: str) -> bool:
        """Whether telling if ``url`` is this process needs its host name resolved: a name (not
        an IP literal or ``localhost``) on a port this process listens on."""
        port = port_of(url)
        return name_to_resolve(url) is not None and any(p == port for _, p in self._listening)

    def refresh(self, url: str) -> Deferred[bool]:
        """Resolve ``url``'s host name again if it could be this process, then :meth:`excludes`.

        Fires at once when :meth:`must_resolve` is false. A name that does not resolve is not
        this process.
        """
        name = name_to_resolve(url)
        if name is None or not self.must_resolve(url):
            return succeed(self.excludes(url))
        receiver = _Addresses()
        self._reactor.nameResolver.resolveHostName(receiver, name, port_of(url) or 0)

        def resolved(addresses: frozenset[str]) -> bool:
            self._resolved[name] = addresses
            self._verdicts.clear()
            return self.excludes(url)

        return receiver.done.addCallback(resolved)


def _unresolved(failure: Failure) -> None:
    _log.failure("a node name did not resolve", failure)
