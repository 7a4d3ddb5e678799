"""Tests for nvpair_tw.ops._drain: listeners first, a grace period, then every survivor cancelled once."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
import treq
from twisted.application import service
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory, ProcessProtocol, Protocol, connectionDone
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    FileBodyProducer,
    HTTPConnectionPool,
    ResponseFailed,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.corridor._workloads import Workload
from nvpair_tw.events import Event
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._drain import SHUTDOWN_REASON, DrainService, DrainState, adopt_all
from nvpair_tw.runtime._process import Runtime, build_runtime
from nvpair_tw.runtime._service import ListenerService
from nvpair_tw.testing import SimulatedEngine, start_engine

REPO = Path(__file__).resolve().parents[2]
STREAM = json.dumps(
    {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()
TERMINAL = ("workload:completed", "workload:errored")

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


class FakeListener(service.Service):
    """Records when it was stopped, relative to what the drain did."""

    def __init__(self, log: list[str]) -> None:
        self._log = log

    def stopService(self) -> Deferred[None]:
        super().stopService()
        self._log.append("listener stopped")
        return succeed(None)


def _runtime() -> tuple[MemoryReactorClock, Runtime]:
    clock = MemoryReactorClock()
    runtime = build_runtime(
        cast(IProxyReactor, clock),
        Settings(),
        ["ollama"],
        nodes={"ollama": [Node("a", "http://127.0.0.1:1")]},
    )
    return clock, runtime


def _terminals(runtime: Runtime) -> Counter[int]:
    ends: Counter[int] = Counter()

    def sink(event: Event) -> None:
        if event.name in TERMINAL:
            ends[event.payload["workload"]["id"]] += 1

    runtime.shared.bus.subscribe(sink, name="test-terminals")
    return ends


def _call_hook(hook: Callable[[Workload, str], object], workload: Workload, reason: str) -> None:
    hook(workload, reason)


def _running(
    runtime: Runtime, count: int, hook: Callable[[Workload, str], object]
) -> list[Workload]:
    workloads = []
    for _ in range(count):
        workload = runtime.shared.workloads.create("ollama", "llama3")
        workload.running("a")
        workload.cancel_hook = partial(_call_hook, hook, workload)
        workloads.append(workload)
    return workloads


def test_listeners_stop_before_the_grace_period_starts() -> None:
    """The listeners are stopped first; only then does the drain wait for workloads."""
    clock, runtime = _runtime()
    log: list[str] = []
    _running(runtime, 1, lambda w, reason: w.cancel(reason))
    drain = DrainService(clock, runtime, [FakeListener(log)], grace=5)
    drain.startService()
    done = drain.stopService()
    assert log == ["listener stopped"]
    assert drain.state is DrainState.DRAINING
    assert not done.called
    clock.advance(5)
    assert done.called and drain.state is DrainState.STOPPED


def test_grace_expiry_cancels_each_survivor_with_proxy_shutdown() -> None:
    """At the end of the grace the cancel hook of every live workload gets "proxy shutdown"."""
    clock, runtime = _runtime()
    ends = _terminals(runtime)
    reasons: list[str] = []

    def hook(workload: Workload, reason: str) -> None:
        reasons.append(reason)
        workload.cancel(reason)

    workloads = _running(runtime, 3, hook)
    drain = DrainService(clock, runtime, [], grace=2)
    done = drain.stopService()
    clock.advance(1.9)
    assert reasons == [] and not done.called
    clock.advance(0.1)
    assert reasons == [SHUTDOWN_REASON] * 3
    assert done.called
    assert ends == Counter({w.id: 1 for w in workloads})
    assert [w.info()["error"] for w in workloads] == [SHUTDOWN_REASON] * 3
    assert clock.getDelayedCalls() == []


def test_workloads_ending_within_grace_end_the_drain_early() -> None:
    """When the last workload completes the drain is done at once, nothing cancelled, no timer."""
    clock, runtime = _runtime()
    cancelled: list[str] = []
    workloads = _running(runtime, 2, lambda w, reason: cancelled.append(reason))
    drain = DrainService(clock, runtime, [], grace=10)
    done = drain.stopService()
    workloads[0].complete()
    assert not done.called
    clock.advance(1)
    workloads[1].complete()
    assert done.called and cancelled == []
    assert clock.getDelayedCalls() == []


def test_a_workload_its_hook_does_not_end_is_cancelled_after_the_abort_wait() -> None:
    """A hook that does not end its workload (request already gone): cancelled directly, once."""
    clock, runtime = _runtime()
    ends = _terminals(runtime)
    [workload] = _running(runtime, 1, lambda w, reason: None)
    drain = DrainService(clock, runtime, [], grace=1, abort_wait=0.5)
    done = drain.stopService()
    clock.advance(1)
    assert not done.called and drain.state is DrainState.CANCELLING
    clock.advance(0.5)
    assert done.called
    assert ends == Counter({workload.id: 1})
    assert workload.info()["state"] == "cancelled"


def test_no_live_workload_means_no_wait() -> None:
    """With nothing in flight the drain finishes as soon as the listeners are stopped."""
    clock, runtime = _runtime()
    drain = DrainService(clock, runtime, [], grace=10)
    done = drain.stopService()
    assert done.called and clock.getDelayedCalls() == []


class SlowChild(service.Service):
    """A child whose stop finishes only when the test says so."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self._log = log
        self.stopping: Deferred[None] = Deferred()

    def stopService(self) -> Deferred[None]:
        super().stopService()
        self._log.append(f"{self.name} stopping")
        return self.stopping


def test_children_stop_one_at_a_time_after_the_drain_last_added_first() -> None:
    """Children (admin, control, runtime...) stop only after the drain, sequentially, in reverse."""
    clock, runtime = _runtime()
    log: list[str] = []
    [workload] = _running(runtime, 1, lambda w, reason: w.cancel(reason))
    drain = DrainService(clock, runtime, [], grace=5)
    first, second = SlowChild("runtime", log), SlowChild("admin", log)
    first.setServiceParent(drain)
    second.setServiceParent(drain)
    drain.startService()
    done = drain.stopService()
    assert log == []
    workload.complete()
    assert log == ["admin stopping"]
    second.stopping.callback(None)
    assert log == ["admin stopping", "runtime stopping"]
    assert not done.called
    first.stopping.callback(None)
    assert done.called


def test_adopt_all_puts_every_service_under_the_drain_in_order() -> None:
    """adopt_all moves the children (order kept) and leaves the drain as the only child."""
    clock, runtime = _runtime()
    top = service.MultiService()
    children = [SlowChild(name, []) for name in ("runtime", "facade", "admin")]
    for child in children:
        child.setServiceParent(top)
    drain = DrainService(clock, runtime, [], grace=1)
    adopt_all(top, drain)
    assert list(top) == [drain]
    assert list(drain) == children


class _Body(Protocol):
    """Reads a streamed body; ``lost`` fires with the reason the stream ended."""

    def __init__(self) -> None:
        self.lost: Deferred[None] = Deferred()
        self.reason: Failure | None = None

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.reason = reason
        self.lost.callback(None)


async def _open_streams(reactor: Any, url: str, count: int) -> tuple[list[_Body], Any]:
    pool = HTTPConnectionPool(reactor, persistent=False)
    agent = Agent(reactor, pool=pool)
    headers = Headers({b"content-type": [b"application/json"]})
    responses: list[IResponse] = await gatherResults(
        [
            agent.request(
                b"POST",
                f"{url}/api/chat".encode(),
                headers,
                FileBodyProducer(io.BytesIO(STREAM)),
            )
            for _ in range(count)
        ]
    )
    bodies = []
    for response in responses:
        assert response.code == 200
        body = _Body()
        response.deliverBody(body)
        bodies.append(body)
    return bodies, pool


async def _proxy(
    reactor: Any, engine_url: str
) -> tuple[Runtime, ListenerService, int, Counter[int]]:
    runtime = build_runtime(
        reactor,
        Settings(),
        ["ollama"],
        nodes={"ollama": [Node("sim", engine_url, ("llama3:latest",))]},
    )
    runtime.start()
    site: Any = runtime.site_for("ollama")
    listener = ListenerService(reactor, "tcp:0:interface=127.0.0.1", site, "ollama facade")
    listener.startService()
    port = (await listener.ready).getHost().port  # type: ignore[attr-defined]
    return runtime, listener, port, _terminals(runtime)


class GraceClock(Clock):
    """A ``task.Clock`` for the drain's timers; ``armed`` fires when the first one is scheduled."""

    def __init__(self) -> None:
        super().__init__()
        self.armed: Deferred[None] = Deferred()

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> IDelayedCall:
        call = super().callLater(delay, callable, *args, **kw)
        if not self.armed.called:
            self.armed.callback(None)
        return call


def state(drain: DrainService) -> DrainState:
    """The drain's state now (a call, so mypy does not keep an earlier narrowing)."""
    return drain.state


@on_reactor
async def test_twenty_open_streams_each_end_once_at_the_grace_deadline(reactor: Any) -> None:
    """20 long streams, grace 0.5 s (on an injected clock): new connections are refused at once,
    the streams go on until the grace ends, then every workload ends with exactly one terminal
    event (cancelled, "proxy shutdown") without needing the forced abort that follows."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=400, chunk_delay=0.05))
    runtime, listener, port, ends = await _proxy(reactor, engine.url)
    try:
        bodies, _pool = await _open_streams(reactor, f"http://127.0.0.1:{port}", 20)
        assert len(runtime.shared.workloads.live()) == 20
        clock = GraceClock()
        drain = DrainService(clock, runtime, [listener], grace=0.5)
        drain.startService()
        done = drain.stopService()
        with pytest.raises(ConnectionRefusedError):
            await TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(
                Factory.forProtocol(Protocol)
            )
        await clock.armed
        assert state(drain) is DrainState.DRAINING
        clock.advance(0.499)
        assert len(runtime.shared.workloads.live()) == 20  # still streaming during the grace
        assert not done.called
        clock.advance(0.001)
        assert state(drain) is DrainState.CANCELLING
        await done
        assert clock.seconds() == 0.5  # ended at the grace: the abort wait never expired
        assert clock.getDelayedCalls() == []
        assert runtime.shared.workloads.live() == []
        assert len(ends) == 20 and set(ends.values()) == {1}
        await gatherResults([body.lost for body in bodies])
        assert all(body.reason and body.reason.check(ResponseFailed) for body in bodies)
    finally:
        await engine.stop()
        await runtime.stop()


@on_reactor
async def test_streams_that_finish_within_grace_complete_normally(reactor: Any) -> None:
    """Short streams and a long grace: every workload completes; the drain ends when they do,
    its grace timer (on an injected clock that never moves) cancelled."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=5, chunk_delay=0.05))
    runtime, listener, port, ends = await _proxy(reactor, engine.url)
    completed: list[str] = []
    runtime.shared.bus.subscribe(
        lambda e: completed.append(e.name) if e.name in TERMINAL else None, name="test"
    )
    try:
        bodies, _pool = await _open_streams(reactor, f"http://127.0.0.1:{port}", 20)
        clock = Clock()
        drain = DrainService(clock, runtime, [listener], grace=10)
        await drain.stopService()
        assert clock.seconds() == 0 and clock.getDelayedCalls() == []
        assert completed == ["workload:completed"] * 20
        assert len(ends) == 20 and set(ends.values()) == {1}
        await gatherResults([body.lost for body in bodies])
    finally:
        await engine.stop()
        await runtime.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Twistd(ProcessProtocol):
    def __init__(self) -> None:
        self.output = b""
        self.ended: Deferred[None] = Deferred()
        self.reason: Failure | None = None

    def outReceived(self, data: bytes) -> None:
        self.output += data

    def errReceived(self, data: bytes) -> None:
        self.output += data

    def processEnded(self, reason: Failure) -> None:
        self.reason = reason
        self.ended.callback(None)


async def _until_ready(reactor: Any, url: str, twistd: _Twistd, deadline: float) -> None:
    """Poll the admin readiness probe (as a load balancer would) until it answers 200."""
    http = treq.client.HTTPClient(
        Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
    )
    while reactor.seconds() < deadline:
        assert not twistd.ended.called, twistd.output.decode(errors="replace")
        try:
            response = await http.get(url)
            await treq.content(response)
            if response.code == 200:
                return
        except ConnectionRefusedError:
            pass
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError("proxy never became ready:\n" + twistd.output.decode(errors="replace"))


@on_reactor
async def test_sigterm_drains_a_real_twistd_through_the_grace(reactor: Any) -> None:
    """twistd nvpair with 20 open streams: SIGTERM → the grace runs out, every workload is
    cancelled once with "proxy shutdown", the process exits by SIGTERM with no traceback."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=400, chunk_delay=0.05))
    facade, admin = _free_port(), _free_port()
    grace = 1.0
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    twistd = _Twistd()
    args = [
        sys.executable,
        "-c",
        "from twisted.scripts.twistd import run; run()",
        "--nodaemon",
        "--pidfile=",
        "nvpair",
        "--engine",
        "ollama",
        "--listen",
        f"tcp:{facade}:interface=127.0.0.1",
        "--admin",
        f"tcp:{admin}:interface=127.0.0.1",
        "--node",
        f"sim={engine.url}",
        "--shutdown-grace",
        f"{grace}s",
        "--usage-db",
        "none",  # it runs in the repository: leave no usage file there
    ]
    process = reactor.spawnProcess(twistd, sys.executable, args, env=env, path=str(REPO))
    try:
        await _until_ready(
            reactor, f"http://127.0.0.1:{admin}/readyz", twistd, reactor.seconds() + 20
        )
        bodies, _pool = await _open_streams(reactor, f"http://127.0.0.1:{facade}", 20)
        process.signalProcess("TERM")
        await twistd.ended
        output = twistd.output.decode(errors="replace")
        # the streams (20 s each) ended because the grace did: bench/timings.py measures how long
        # SIGTERM → exit takes; the clock-driven tests above pin the grace deadline itself
        assert "shutdown grace over: cancelling 20 workload(s)" in output, output
        # twistd re-raises the signal after a clean shutdown, so the exit status says "SIGTERM"
        # (systemd counts that as a clean stop)
        assert twistd.reason is not None and twistd.reason.check(ProcessTerminated), output
        assert cast(Any, twistd.reason.value).signal == signal.SIGTERM, output
        assert "Server Shut Down." in output, output
        assert "Traceback" not in output, output
        assert output.count("cancelled: proxy shutdown") == 20, output
        await gatherResults([body.lost for body in bodies])
        assert all(body.reason and body.reason.check(ResponseFailed) for body in bodies)
    finally:
        if not twistd.ended.called:
            process.signalProcess("KILL")
            await twistd.ended
        await engine.stop()
