# -*- test-case-name: tests.app.test_summary -*-
"""The start-up summary (docs/operations.md, "Logs"): logged once every listener listens, with
where clients point, the nodes and their kinds, the status page, key names, the state store and
the usage database; never a key, a node's userinfo or the store's password. Over a fake reactor
for every line, and once as ``twistd`` itself, on real ports."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from attrs import evolve
from twisted.application.service import MultiService
from twisted.internet.testing import MemoryReactorClock

from nvpair_tw.app._summary import summary_lines
from nvpair_tw.app._wiring import assemble
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.tap import Options
from tests.app.test_wiring import runtime_of

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-alice-0123456789"
KEYS = f'[[key]]\nname = "alice"\nkey = "{KEY}"\nrole = "admin"\n'
NODES = (
    '[[node]]\nid = "gpu2"\nurl = "http://ops:n0de-secret@10.0.0.7:11434"\n\n'
    '[[node]]\nid = "mac"\nkind = "lmstudio"\nurl = "http://10.0.0.8:1234"\n'
    'models = ["qwen"]\ncordon = true\n'
)
SECRETS = (KEY, "n0de-secret", "st0re-secret", "ops:")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``NVPAIR_*`` variable of the outer shell leaks into option parsing."""
    for name in list(os.environ):
        if name.startswith("NVPAIR_"):
            monkeypatch.delenv(name)


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[str, str]]:
    nodes, keys = tmp_path / "nodes.toml", tmp_path / "keys.toml"
    nodes.write_text(NODES)
    keys.write_text(KEYS)
    keys.chmod(0o600)
    yield str(nodes), str(keys)


def _started(*args: str) -> tuple[MemoryReactorClock, MultiService]:
    options = Options(environ={})
    options.parseOptions([*args, "--usage-db", "none"])
    reactor = MemoryReactorClock()
    top = assemble(cast(IProxyReactor, reactor), options.config)
    return reactor, top


def test_the_summary_comes_once_every_listener_listens(
    files: tuple[str, str], log_lines: list[str]
) -> None:
    """Nothing before the services start; then, after the last listener, the summary: each
    facade's URL and its /v1, its nodes with their kinds (URLs without userinfo), the status
    page, the control channel, key names and count, the redacted store, the usage database."""
    nodes, keys = files
    _reactor, top = _started(
        *("-e", "ollama", "--nodes", nodes, "--keys", keys),
        *("--admin", "tcp:9181:interface=127.0.0.1", "--control", "unix:/tmp/nv-sum.sock"),
        *("--state", "redis://:st0re-secret@10.0.0.2:6379/0"),
    )
    assert not [line for line in log_lines if "is ready" in line]
    top.startService()
    try:
        start = next(i for i, line in enumerate(log_lines) if line.startswith("nvpair-tw "))
        summary = log_lines[start : start + 8]
    finally:
        top.stopService()
    assert re.fullmatch(r"nvpair-tw \S+ is ready", summary[0])
    assert summary[1:] == [  # the fake reactor's ports are on every interface
        "ollama facade: http://127.0.0.1:11435 (every interface); "
        "OpenAI SDKs: http://127.0.0.1:11435/v1",
        "ollama nodes: gpu2 (ollama) http://10.0.0.7:11434, "
        "mac (lmstudio, static list) http://10.0.0.8:1234 [cordoned]",
        "status page: http://127.0.0.1:9181/",
        "control channel: unix:/tmp/nv-sum.sock",
        "keys: 1 (alice)",
        "state store: redis://:***@10.0.0.2:6379/0",
        "usage database: none (usage kept in memory)",
    ]
    listening = [i for i, line in enumerate(log_lines) if " listening on " in line]
    assert max(listening) < start  # after the last listener
    assert not [line for line in log_lines if any(s in line for s in SECRETS)]


def test_the_lines_say_what_is_off_and_where_the_usage_is_kept() -> None:
    """No admin listener, no key, no store: each line says so; a usage database is its path."""
    options = Options(environ={})
    options.parseOptions(["-e", "openai", "--admin", "none", "--usage-db", "none"])
    config = evolve(options.config, usage_db="/var/lib/nvpair/usage.sqlite3")
    runtime = runtime_of(assemble(cast(IProxyReactor, MemoryReactorClock()), config))
    lines = summary_lines(config, runtime, {"openai facade": "http://127.0.0.1:8000"})
    assert lines[3:] == [
        "status page: off (--admin)",
        "keys: none (only local callers are served: docs/behaviour.md §14.2)",
        "state store: none (this proxy alone)",
        "usage database: /var/lib/nvpair/usage.sqlite3",
    ]


@pytest.mark.timeout(60)
def test_twistd_prints_the_summary_with_the_ports_it_bound(files: tuple[str, str]) -> None:
    """``twistd nvpair`` on port 0: the summary names the port the kernel gave, after the
    listener lines; the refused node is ``unreachable: connection refused`` at its URL without
    userinfo; no secret anywhere in the output."""
    nodes, keys = files
    Path(nodes).write_text(NODES.replace("10.0.0.7:11434", "127.0.0.1:1"))
    command = [
        *(sys.executable, "-m", "twisted", "--log-format=text", "nvpair", "-e", "ollama"),
        *("--listen", "ollama=tcp:0:interface=127.0.0.1", "--admin", "none"),
        *("--nodes", nodes, "--keys", keys, "--usage-db", "none"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        for line in process.stdout:
            seen.append(line.rstrip("\n").split("] ", 1)[-1])
            if "node gpu2 unreachable" in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
    seen += rest.splitlines()
    [listening] = [line for line in seen if line.startswith("ollama facade listening on")]
    port = re.search(r"port=(\d+)", listening)
    assert port is not None and port.group(1) != "0"
    url = f"http://127.0.0.1:{port.group(1)}"
    assert f"ollama facade: {url}; OpenAI SDKs: {url}/v1" in seen
    assert "node gpu2 unreachable: connection refused at http://127.0.0.1:1 (ollama facade)" in seen
    assert seen.index(listening) < seen.index(f"ollama facade: {url}; OpenAI SDKs: {url}/v1")
    assert not [line for line in seen if any(s in line for s in SECRETS)]
    assert "Traceback" not in "\n".join(seen)
