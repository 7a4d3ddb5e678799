"""Real engines and a real proxy process for the end-to-end tests (not a test module).

:class:`RealOllama` is one real Ollama (``tests/engines/ollama.py``'s ``up``) on a free loopback port,
with its own server environment (``OLLAMA_NUM_PARALLEL``, ``OLLAMA_KEEP_ALIVE``), that a test can freeze
(SIGSTOP), thaw and kill (SIGKILL) as a whole process group; :class:`RealLlamaServer` is the same for
llama.cpp's ``llama-server`` (``tests/engines/llamacpp.py``, built on first use). :class:`ProxyProcess` is ``twist nvpair``
in a subprocess writing JSON log lines, read back as events. Neither ever skips: an engine that
cannot start fails the test, so a missing dependency shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.engines import llamacpp
from tests.engines import ollama as ollama_engine

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2"


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its new parent counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


class _Group:
    """A real engine on its own loopback port, leading its own process group."""

    def __init__(self, port: int, pid: int) -> None:
        self.port = port
        self.pid = pid
        self.url = f"http://127.0.0.1:{port}"

    def freeze(self) -> None:
        """SIGSTOP the whole process group: connections are accepted, nothing answers."""
        _signal_group(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        _signal_group(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the whole process group: open connections are reset by the kernel."""
        _signal_group(self.pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (after a SIGCONT), then SIGKILL if it outlives 10 s."""
        self.thaw()
        _signal_group(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not gone(self.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill()


class RealOllama(_Group):
    """One real Ollama serving ``smollm2`` on its own port and process group."""

    @property
    def log(self) -> Path:
        """Where the server (and its runner) writes its log: ``logs/serve-PORT.log`` of the
        install, as ``tests.engines.ollama.up`` opens it, new for each start."""
        return ollama_engine.install_dir() / "logs" / f"serve-{self.port}.log"

    @classmethod
    def start(cls, env: Mapping[str, str] | None = None) -> RealOllama:
        (port,) = free_ports(1)
        return cls(port, ollama_engine.up_or_fail(port, env))


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


class RealLlamaServer(_Group):
    """One real ``llama-server`` serving the SmolLM2 GGUF as ``smollm2-llamacpp``
    (:data:`tests.engines.llamacpp.ALIAS`), one thread, on its own port and process group."""

    def __init__(self, port: int, pid: int, log: Path) -> None:
        super().__init__(port, pid)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        slots: int = 2,
        ready_timeout: float = 60.0,
        chat_template: Path | None = None,
        extra: Sequence[str] = (),
    ) -> RealLlamaServer:
        """Build if needed (a missing engine fails the test, never skips), start, wait for
        ``/health`` to answer 200 (the model loaded) within ``ready_timeout`` seconds;
        ``chat_template`` replaces the model's own (:data:`tests.engines.llamacpp.TOOL_TEMPLATE`);
        ``extra`` options follow the others."""
        try:
            directory = llamacpp.install(log=lambda line: print(line, file=sys.stderr))
            model = llamacpp.model_path()
        except (ollama_engine.EngineError, OSError, subprocess.SubprocessError) as error:
            pytest.fail(f"llama-server could not be built or installed: {error}", pytrace=False)
        (port,) = free_ports(1)
        logs = directory / "logs"
        logs.mkdir(exist_ok=True)
        log = logs / f"serve-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                llamacpp.server_command(
                    directory, port, model, slots=slots, chat_template=chat_template, extra=extra
                ),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(port, process.pid, log)
        deadline = time.monotonic() + ready_timeout
        while not _healthy(server.url):
            if process.poll() is not None or time.monotonic() > deadline:
                server.kill()
                process.wait()
                text = log.read_text(errors="replace")[-4000:]
                pytest.fail(f"llama-server did not become healthy on port {port}:\n{text}")
            time.sleep(0.1)
        server.process = process
        return server

    def stop(self) -> None:
        super().stop()
        if self.process is not None:
            self.process.wait(timeout=10)  # reaped, so no zombie outlives the test


@contextlib.contextmanager
def real_nodes(envs: Sequence[Mapping[str, str]]) -> Iterator[list[RealOllama]]:
    """Start one real Ollama per environment (one after another), stop them all afterwards."""
    started: list[RealOllama] = []
    try:
        for env in envs:
            started.append(RealOllama.start(env))
        yield started
    finally:
        for node in started:
            node.stop()


class ProxyProcess:
    """``python -m twisted nvpair`` with JSON logs (``--log-format=json``, one event per record); its
    events are read back from the log."""

    def __init__(self, args: Sequence[str], workdir: Path) -> None:
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "proxy.log"
        command = [
            sys.executable,
            "-m",
            "twisted",
            "--log-format=json",
            "nvpair",
            "--listen",
            f"tcp:{port}:interface=127.0.0.1",
            "--admin",
            "none",
            "--control",
            f"unix:{workdir / 'control.sock'}",
            "--usage-db",
            str(workdir / "usage.sqlite3"),
            *args,
        ]
        self.control = workdir / "control.sock"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, nodes: int, timeout: float = 60.0) -> None:
        """Until ``nodes/list`` shows ``nodes`` nodes advertising the model (or fail with the log)."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the proxy exited with {self.process.returncode}:\n{self.tail()}")
            try:
                listed = self.call("nodes/list")["nodes"]
                ready = [n for n in listed if any(MODEL in m for m in n.get("models") or ())]
                if len(ready) >= nodes:
                    return
                last = f"nodes/list: {listed}"
            except (OSError, ValueError, KeyError) as error:
                last = repr(error)
            time.sleep(0.1)
        pytest.fail(f"the proxy was not ready within {timeout:.0f} s ({last}):\n{self.tail()}")

    def call(self, method: str, params: Mapping[str, Any] | None = None, timeout: float = 5) -> Any:
        """One JSON-RPC call on the control socket; its result (within ``timeout`` seconds)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.control))
            request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": dict(params or {})}
            sock.sendall(json.dumps(request).encode() + b"\n")
            buffer = b""
            while True:
                buffer += sock.recv(65536)
                for line in buffer.split(b"\n")[:-1]:
                    answer = json.loads(line)
                    if answer.get("id") == 1:
                        return answer["result"]

    def events(self, name: str) -> list[dict[str, Any]]:
        """Every JSON log line whose event name (``event`` field) is ``name``."""
        found = []
        for line in self.log.read_text(errors="replace").replace("\x1e", "\n").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == name:
                found.append(entry)
        return found

    def tail(self, limit: int = 6000) -> str:
        text = self.log.read_text(errors="replace")
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def stop(self) -> str:
        """SIGTERM, wait, and return the whole log (failing if the proxy hung)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the proxy ignored SIGTERM for 30 s:\n{self.tail()}")
        return self.log.read_text(errors="replace")
