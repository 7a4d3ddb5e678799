"""The twistd services: listeners that bind in the privileged step, remember (and report) their
port or say in one line why they cannot, and the runtime's start/stop."""

from __future__ import annotations

import errno
import traceback
from collections.abc import Callable
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import CannotListenError, ConnectionRefusedError
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import LogEvent, formatEvent

from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.runtime import _service as service_module
from nvpair_tw.runtime._service import CannotListen, ListenerService, RuntimeService


class RecordingReactor:
    """The real reactor, except that ``callWhenRunning`` is only recorded (so nothing stops it)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.when_running: list[Callable[..., Any]] = []

    def callWhenRunning(self, fn: Callable[..., Any], *args: Any) -> None:
        self.when_running.append(fn)

    def stop(self) -> None:
        """Stands in for ``reactor.stop`` (identity is what the test checks)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[LogEvent]:
    """Events of ``nvpair_tw.runtime._service``'s logger."""
    events: list[LogEvent] = []
    monkeypatch.setattr(service_module.log, "observer", events.append)
    return events


@pytest_twisted.ensureDeferred
async def test_listener_on_port_0_reports_the_port_then_stops_listening(
    reactor: Any, logged: list[LogEvent]
) -> None:
    """``ready`` fires with the bound port, which is kept and logged; after stop it refuses."""
    listener = ListenerService(
        reactor, "tcp:0:interface=127.0.0.1", Factory.forProtocol(Protocol), "proxy"
    )
    listener.startService()
    assert listener.ready.called  # a TCP listen binds at once
    port = await listener.ready
    assert listener.port is port
    number = port.getHost().port  # type: ignore[attr-defined]
    assert number != 0
    [event] = logged
    assert formatEvent(event).startswith("proxy listening on IPv4Address(")
    assert f"port={number}" in formatEvent(event)
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", number)
    connected = await endpoint.connect(Factory.forProtocol(Protocol))
    assert isinstance(connected, Protocol) and connected.transport is not None
    connected.transport.loseConnection()
    await listener.stopService()
    assert listener.port is None and not listener.running
    with pytest.raises(ConnectionRefusedError):
        await endpoint.connect(Factory.forProtocol(Protocol))


@pytest_twisted.ensureDeferred
async def test_port_already_taken_fails_ready_and_stops_the_reactor(
    reactor: Any, listen: Callable[[Any], int], logged: list[LogEvent]
) -> None:
    """A bind failure in ``startService`` errbacks ``ready``, logs one line naming the endpoint
    and the error, and schedules ``reactor.stop``."""
    taken = listen(Factory.forProtocol(Protocol))
    recording = RecordingReactor(reactor)
    listener = ListenerService(
        cast(IProxyReactor, recording),
        f"tcp:{taken}:interface=127.0.0.1",
        Factory.forProtocol(Protocol),
        "proxy",
    )
    listener.startService()
    assert listener.ready.called
    with pytest.raises(CannotListenError):
        await listener.ready
    assert recording.when_running == [recording.stop]
    assert listener.port is None
    assert [formatEvent(e) for e in logged] == [
        f"cannot listen on tcp:{taken}:interface=127.0.0.1 (proxy): address already in use"
    ]
    await listener.stopService()


class FakeRuntime:
    """Records start and stop; stop returns a Deferred the test fires."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stopped: Deferred[None] = Deferred()

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> Deferred[None]:
        self.calls.append("stop")
        return self.stopped


def test_runtime_service_starts_and_stops_the_runtime() -> None:
    """Start starts the runtime; stop stops it and waits for its Deferred."""
    runtime = FakeRuntime()
    runtime_service = RuntimeService(runtime)  # type: ignore[arg-type]
    runtime_service.startService()
    assert runtime.calls == ["start"] and runtime_service.running
    stopping = runtime_service.stopService()
    assert runtime.calls == ["start", "stop"] and not runtime_service.running
    assert not stopping.called
    runtime.stopped.callback(None)
    assert stopping.called


def test_stopping_a_listener_that_never_listened_is_a_no_op() -> None:
    """Stop before any port exists returns an already-fired Deferred and touches no reactor."""
    listener = ListenerService(
        cast(IProxyReactor, object()), "tcp:0", Factory.forProtocol(Protocol), "admin"
    )
    assert listener.stopService().called


@pytest_twisted.ensureDeferred
async def test_the_listener_binds_in_the_privileged_step_and_not_again(
    reactor: Any, logged: list[LogEvent]
) -> None:
    """``privilegedStartService`` binds (before twistd sheds privileges or daemonises);
    ``startService`` then keeps that port."""
    listener = ListenerService(
        reactor, "tcp:0:interface=127.0.0.1", Factory.forProtocol(Protocol), "proxy"
    )
    listener.privilegedStartService()
    assert listener.ready.called and listener.port is not None
    port = listener.port
    listener.startService()
    assert listener.port is port
    assert len(logged) == 1
    await listener.stopService()


@pytest_twisted.ensureDeferred
async def test_a_port_taken_at_the_privileged_step_raises_one_line(
    reactor: Any,
    listen: Callable[[Any], int],
    logged: list[LogEvent],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The bind failure is :class:`CannotListen`: one line naming the endpoint, the label and
    the error, written to the terminal, logged once, kept as the note twistd's start-up pipe
    carries, and an exit status of 1 — never a traceback."""
    taken = listen(Factory.forProtocol(Protocol))
    recording = RecordingReactor(reactor)
    listener = ListenerService(
        cast(IProxyReactor, recording),
        f"tcp:{taken}:interface=127.0.0.1",
        Factory.forProtocol(Protocol),
        "ollama facade",
    )
    with pytest.raises(CannotListen) as raised:
        listener.privilegedStartService()
    line = (
        f"nvpair: cannot listen on tcp:{taken}:interface=127.0.0.1 (ollama facade):"
        " address already in use"
    )
    assert raised.value.code == 1
    assert isinstance(raised.value, Exception)
    assert traceback.format_exception_only(CannotListen, raised.value)[-1] == f"{line}\n"
    assert capfd.readouterr().err == f"{line}\n"
    assert [formatEvent(e) for e in logged] == [line.removeprefix("nvpair: ")]
    assert listener.port is None and not listener.ready.called
    assert recording.when_running == []


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            CannotListenError("h", 1, OSError(errno.EACCES, "Permission denied")),
            "permission denied",
        ),
        (CannotListenError(None, b"/x.sock", "Cannot acquire lock"), "cannot acquire lock"),
        (OSError(errno.ENOENT, "No such file or directory"), "no such file or directory"),
        (RuntimeError(), "RuntimeError"),
    ],
)
def test_a_bind_error_is_said_in_a_few_words(error: BaseException, reason: str) -> None:
    """The socket error's own words, lower-cased; a bare exception by its type."""
    assert service_module.reason_of(error) == reason
