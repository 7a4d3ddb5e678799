"""A real ``twistd nvpair`` with a control channel, and ``nvpair-ctl`` run against it, each as a
subprocess on the test's reactor (the simulated engine behind the proxy keeps answering while
the command waits)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import treq
from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool

from nvpair_tw.testing import EngineHandle

REPO = Path(__file__).resolve().parents[2]
TWISTD = "from twisted.scripts.twistd import run; run()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any ``NVPAIR_`` variable, the checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Collected(ProcessProtocol):
    """Everything a child writes, and how it ended."""

    def __init__(self) -> None:
        self.out = b""
        self.err = b""
        self.ended: Deferred[None] = Deferred()
        self.status: int | None = None

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err += data

    def processEnded(self, reason: Failure) -> None:
        self.status = getattr(reason.value, "exitCode", None)
        self.ended.callback(None)


@frozen
class Ran:
    """One run of ``nvpair-ctl``: its exit status and what it printed."""

    status: int | None
    out: str
    err: str


@frozen
class Proxy:
    """A running proxy: its facade's URL and its control endpoint."""

    reactor: Any
    facade: str
    control: str

    async def ctl(self, *args: str, env: dict[str, str] | None = None) -> Ran:
        """``nvpair-ctl ARGS`` (``--control`` first unless ``env`` names the channel)."""
        child = Collected()
        given = env if env is not None else environment()
        channel = [] if "NVPAIR_CONTROL" in given else ["--control", self.control]
        argv = [sys.executable, "-m", "nvpair_tw.ctl", *channel, *args]
        self.reactor.spawnProcess(child, sys.executable, argv, env=given, path=str(REPO))
        await child.ended
        return Ran(child.status, child.out.decode(), child.err.decode())


async def _until_ready(reactor: Any, url: str, twistd: Collected) -> None:
    http = treq.client.HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, False)))
    deadline = reactor.seconds() + 30
    while reactor.seconds() < deadline:
        assert not twistd.ended.called, (twistd.out + twistd.err).decode(errors="replace")
        try:
            response = await http.get(url)
            await treq.content(response)
            if response.code == 200:
                return
        except ConnectionRefusedError:
            pass
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError("the proxy never became ready:\n" + twistd.err.decode(errors="replace"))


@asynccontextmanager
async def running_proxy(
    reactor: Any, engine: EngineHandle, directory: Path, control: str, *extra: str
) -> AsyncIterator[Proxy]:
    """``twistd nvpair`` with ``--control CONTROL`` in front of ``engine``, usage kept in
    ``directory``; stopped (SIGTERM) afterwards."""
    facade, admin = free_port(), free_port()
    argv: Sequence[str] = [
        sys.executable,
        "-c",
        TWISTD,
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
        "--control",
        control,
        "--usage-db",
        str(directory / "usage.sqlite3"),
        *extra,
    ]
    twistd = Collected()
    process = reactor.spawnProcess(
        twistd, sys.executable, argv, env=environment(), path=str(directory)
    )
    try:
        await _until_ready(reactor, f"http://127.0.0.1:{admin}/readyz", twistd)
        yield Proxy(reactor, f"http://127.0.0.1:{facade}", control)
    finally:
        if not twistd.ended.called:
            process.signalProcess("TERM")
        await twistd.ended
