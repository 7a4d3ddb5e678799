"""Shared fixtures: the installed reactor, a loopback listener helper, a leaked-timer check, proxy
clusters stopped after the test, in-memory clusters checked for leftover timers, a loopback treq
client, per-test timeouts that work with the reactor pytest-twisted runs in a greenlet, and a check
that no test opens a file beside the repository (tests/outside_reads.py)."""

from __future__ import annotations

import faulthandler
import functools
import gc
import os
import signal
import sys
import threading
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import greenlet
import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IReactorFromThreads,
    IStreamClientEndpoint,
)
from twisted.internet.task import deferLater
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.web.client import URI, Agent, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from nvpair_tw.testing import Clusters, MemoryCluster
from nvpair_tw.upstream import make_http_client
from nvpair_tw.upstream._agent import NodeAgent
from tests.outside_reads import install as _record_outside_reads
from tests.outside_reads import pytest_sessionfinish, pytest_terminal_summary  # noqa: F401

_record_outside_reads()  # the session fails if a test opens a file beside the repository

E2E_TIMEOUT = 960.0
"""Seconds a ``real_engine`` test may take (setup included): more than the engine fixture's own 900 s
bound on starting the real engine, so that fixture's clearer message wins."""

STUCK_GRACE = 10.0
"""Seconds a timed-out test gets to unwind before the run is ended (see ``_ReactorAwareTimeout``)."""

_ROOT = Path(__file__).resolve().parent.parent


def _failing_properties_fail_plainly() -> None:
    """Make a failing Hypothesis property a plain test failure, never an ``INTERNALERROR``.

    With libcst installed (mutmut brings it), Hypothesis's pytest plugin builds an "add
    ``@example``" patch for a failing property in ``pytest_runtest_makereport``. libcst's
    transformer calls ``getattr`` on every name ``dir()`` lists, and once Twisted is imported
    zope.interface has put a ``__provides__`` descriptor on ``abc.ABC`` that raises
    ``AttributeError`` on instances (LibCST issue #1458), so the hook raised and pytest reported
    ``INTERNALERROR ... __provides__``. The patch is only a convenience: without it the failure and
    its falsifying example are reported as usual.
    """
    try:
        from hypothesis.extra import _patching
    except ImportError:  # no libcst: Hypothesis makes no patch
        return
    make_patch = _patching.get_patch_for
    if getattr(make_patch, "never_raises", False):
        return

    @functools.wraps(make_patch)
    def get_patch_for(*args: Any, **kwargs: Any) -> Any:
        try:
            return make_patch(*args, **kwargs)
        except Exception:  # the report is what matters, not the patch
            return None

    get_patch_for.never_raises = True  # type: ignore[attr-defined]
    _patching.get_patch_for = get_patch_for


_failing_properties_fail_plainly()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``real_engine`` tests get ``E2E_TIMEOUT`` instead of the default (``timeout`` in setup.cfg),
    unless they carry their own ``timeout`` marker."""
    for item in items:
        if item.get_closest_marker("real_engine") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


# optional only for mutation runs (`-p no:timeout`, mutmut bounds them itself): setup.cfg's
# required_plugins refuses every other run without pytest-timeout
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Replace pytest-timeout's ``signal`` method with one that fails the test, not the reactor.

    pytest-timeout's own ``signal`` handler raises wherever SIGALRM lands, which under
    pytest-twisted is usually the reactor greenlet idling in ``epoll``: the reactor logs
    "Unexpected error in main loop", the test keeps hanging and later tests fail with "illegal
    switch in blockon". Its ``thread`` method ends the whole run with stacks that show only the
    idle reactor. See ``_ReactorAwareTimeout``.
    """
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None
    timer = _ReactorAwareTimeout(item, float(settings.timeout))
    item.cancel_timeout = timer.cancel  # type: ignore[attr-defined]
    timer.start()
    return True


class _ReactorAwareTimeout:
    """SIGALRM after ``timeout`` seconds, then, depending on where the signal lands:

    - in the test's greenlet (the test or a fixture is busy outside the reactor): fail right there;
    - in the reactor greenlet while the reactor is busy (a synchronous test body runs inside the
      reactor under pytest-twisted): fail right there too, so the busy code unwinds;
    - in the reactor greenlet, in any case: on the reactor's next turn, throw the failure into
      the test's greenlet if it is still blocked in the very ``blockon`` it was in at the timeout
      (a test waiting on a Deferred that never fires). The message names the coroutines that
      were waiting.

    If nothing unwinds within ``STUCK_GRACE`` seconds, every stack is dumped and the run exits 1.
    """

    def __init__(self, item: pytest.Item, timeout: float) -> None:
        self._item = item
        self._timeout = timeout
        self._test_greenlet = greenlet.getcurrent()

    def start(self) -> None:
        signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, self._timeout)

    def cancel(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def _message(self) -> str:
        return f"Timeout: {self._item.nodeid} took longer than {self._timeout:g} s"

    def _expired(self, signum: int, frame: types.FrameType | None) -> None:
        __tracebackhide__ = True
        signal.signal(signal.SIGALRM, self._stuck)
        signal.setitimer(signal.ITIMER_REAL, STUCK_GRACE)
        message = self._message()
        if greenlet.getcurrent() is self._test_greenlet:
            pytest.fail(message)
        from twisted.internet import reactor as installed

        blocked_in = self._test_greenlet.gr_frame
        waiting = _waiting_coroutines()
        IReactorFromThreads(installed).callFromThread(
            self._throw_into_test, blocked_in, f"{message}\n{waiting}"
        )
        if not _reactor_idle(frame):
            pytest.fail(message)

    def _throw_into_test(self, blocked_in: types.FrameType | None, message: str) -> None:
        if blocked_in is not None and self._test_greenlet.gr_frame is blocked_in:
            self._test_greenlet.throw(pytest.fail.Exception(message, pytrace=True))

    def _stuck(self, signum: int, frame: types.FrameType | None) -> None:
        capture = self._item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        sys.stderr.write(f"\n{self._message()}, and did not unwind within {STUCK_GRACE:g} s.\n")
        faulthandler.dump_traceback(all_threads=True)
        for each in gc.get_objects():
            if isinstance(each, greenlet.greenlet) and each.gr_frame is not None:
                sys.stderr.write(f"greenlet {each!r}:\n{_frames(each.gr_frame)}\n")
        sys.stderr.flush()
        os._exit(1)


def _reactor_idle(frame: types.FrameType | None) -> bool:
    """True if the interrupted frame is the reactor waiting for I/O (nothing of the test runs)."""
    return frame is not None and frame.f_code.co_name in {"doPoll", "doSelect", "doKEvent"}


def _frames(frame: types.FrameType | None) -> str:
    lines = []
    while frame is not None:
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return "\n".join(reversed(lines))


def _waiting_coroutines() -> str:
    """Where each suspended coroutine of the project or its tests is waiting, outermost first."""
    awaited: set[int] = set()
    coroutines = [c for c in gc.get_objects() if isinstance(c, types.CoroutineType)]
    for coroutine in coroutines:
        inner = coroutine.cr_await
        if isinstance(inner, types.CoroutineType):
            awaited.add(id(inner))
    chains = []
    for coroutine in coroutines:
        if id(coroutine) in awaited or coroutine.cr_frame is None:
            continue
        link: Any = coroutine
        chain = []
        while isinstance(link, types.CoroutineType | types.GeneratorType):
            code = link.gi_code if isinstance(link, types.GeneratorType) else link.cr_code
            frame = link.gi_frame if isinstance(link, types.GeneratorType) else link.cr_frame
            mine = (
                code.co_filename.startswith(str(_ROOT)) and "site-packages" not in code.co_filename
            )
            if frame is not None and mine:
                name = Path(code.co_filename).relative_to(_ROOT)
                chain.append(f"{name}:{frame.f_lineno} in {code.co_name}")
            link = link.gi_yieldfrom if isinstance(link, types.GeneratorType) else link.cr_await
        if chain:
            chains.append("waiting: " + " -> ".join(chain))
    return "\n".join(chains) or "no coroutine of the project was waiting"


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


SETTLE_TURNS = 50
"""Reactor turns the leaked-timer check lets connections finish closing in (see ``_settled``)."""


@pytest.fixture(autouse=True)
def no_leaked_delayed_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a reactor test that leaves a timer behind (pytest-twisted has no dirty-reactor check)."""
    yield
    if "reactor" not in request.fixturenames:
        return
    from twisted.internet import reactor as installed

    leaked = pytest_twisted.blockon(Deferred.fromCoroutine(_settled(installed)))
    for call in leaked:
        call.cancel()
    assert not leaked, leaked


async def _settled(reactor: Any) -> list[IDelayedCall]:
    """The timers still active once the reactor has run the closes the test began.

    A connection the test closed cancels its own timers (an HTTP channel's idle timeout, say) when
    the reactor reports it lost, a turn or two after the test ends: the check waits for that, turn
    by turn, and for nothing else. A timer the test left for later is a leak however short it is:
    still pending after the turns, or run during them (work queued for the very next turn, a
    ``callLater(0)``, is not a timer and may run).
    """
    now = reactor.seconds()
    left = [c for c in reactor.getDelayedCalls() if c.active() and c.getTime() > now]
    for _turn in range(SETTLE_TURNS):
        await deferLater(reactor, 0, lambda: None)
        if not any(c.active() for c in reactor.getDelayedCalls()):
            break
    ran = [c for c in left if c.called]
    return ran + [c for c in reactor.getDelayedCalls() if c.active()]


@pytest.fixture
def log_events() -> Iterator[list[LogEvent]]:
    """Every event published to the global log publisher during the test."""
    events: list[LogEvent] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    yield events
    globalLogPublisher.removeObserver(observer)


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every line logged during the test, formatted."""
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        lines.append(str(formatEvent(event)))

    globalLogPublisher.addObserver(cast(ILogObserver, observe))
    yield lines
    globalLogPublisher.removeObserver(cast(ILogObserver, observe))


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


@pytest.fixture(params=["native", "twisted"])
def http(reactor: Any, request: pytest.FixtureRequest) -> Iterator[HTTPClient]:
    """A cookie-less treq client over each upstream agent (``--upstream-client``): the project's
    NodeAgent, or Twisted's Agent over a persistent pool; idle connections closed afterwards."""
    if request.param == "native":
        native = NodeAgent(reactor, LoopbackEndpoints(reactor))
        yield make_http_client(native)
        pytest_twisted.blockon(native.close())
        return
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.retryAutomatically = False
    yield make_http_client(Agent.usingEndpointFactory(reactor, LoopbackEndpoints(reactor), pool))
    pytest_twisted.blockon(pool.closeCachedConnections())
