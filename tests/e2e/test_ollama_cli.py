"""The Ollama CLI itself as a client of the ollama facade (docs/behaviour.md §17.6), end to end.

The real ``ollama`` 0.9.3 binary (the one ``tests/engines/ollama.py`` installs, which is also the
CLI) runs ``list``, ``ps``, ``show`` and ``run`` with ``OLLAMA_HOST`` set to a ``twist nvpair``
subprocess in front of a real Ollama (kind ``ollama``) and a simulated OpenAI-compatible node
(kind ``openai``, a subprocess), both owning ``smollm2``. Then the real Ollama is frozen (SIGSTOP,
thawed in teardown): the CLI's heartbeat (``HEAD /``) is the facade's own answer, ``list`` and
``show`` still work from the openai node's synthesised records, and ``run`` and ``ps`` too (the merged ``/api/tags`` record once
lacked ``digest`` and the CLI panicked on ``digest[:12]``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.realnodes import REPO, ProxyProcess, RealOllama, free_ports
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

MODEL = "smollm2"
BOUND = pytest.mark.timeout(180, func_only=True)

SIMULATED = """
import sys
from twisted.internet import reactor
from nvpair_tw.simulated._engine import SimulatedEngine
engine = SimulatedEngine(reactor, ("smollm2",), kind="openai")
reactor.listenTCP(int(sys.argv[1]), engine.site(), interface="127.0.0.1")
reactor.run()
"""


@pytest.fixture(scope="module")
def real_ollama() -> Iterator[RealOllama]:
    node = RealOllama.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def simulated() -> Iterator[str]:
    """A simulated openai-kind node serving ``smollm2``, in its own process group; its URL."""
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", SIMULATED, str(port)], cwd=REPO, env=env, start_new_session=True
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def proxy(
    real_ollama: RealOllama, simulated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("cli")
    nodes = workdir / "nodes.toml"
    nodes.write_text(
        f'[[node]]\nid = "o"\nurl = "{real_ollama.url}"\nkind = "ollama"\n\n'
        f'[[node]]\nid = "s"\nurl = "{simulated}"\nkind = "openai"\n'
    )
    args = ["--engine", "ollama", "--nodes", str(nodes), "--response-header-timeout", "3s"]
    process = ProxyProcess(args, workdir)
    try:
        process.wait_ready(2)
        yield process
    finally:
        output = process.stop()
        assert "Traceback" not in output, output


def cli(proxy: ProxyProcess, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real ``ollama`` CLI with ``OLLAMA_HOST`` naming the proxy."""
    where = ollama_engine.install_dir()
    env = ollama_engine.server_env(where, 0)
    env["OLLAMA_HOST"] = proxy.url.removeprefix("http://")
    return subprocess.run(
        [str(where / "run" / "ollama-lib"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "panic" not in done.stderr, done.stderr
    return done.stdout


@BOUND
def test_list_ps_show_and_run_through_a_mixed_fleet(proxy: ProxyProcess) -> None:
    listed = ok(cli(proxy, "list"))
    rows = [line.split() for line in listed.splitlines()[1:] if line.strip()]
    assert [row[0] for row in rows] == [f"{MODEL}:latest"]  # one record: the Ollama node's own
    assert len(rows[0][1]) == 12  # the ID column: digest[:12]
    shown = ok(cli(proxy, "show", MODEL))
    assert "architecture" in shown
    answer = ok(cli(proxy, "run", MODEL, "Say hi.", "--nowordwrap"))
    assert answer.strip()
    ps = ok(cli(proxy, "ps"))
    assert ps.splitlines()[0].split()[:2] == ["NAME", "ID"]


@BOUND
def test_list_show_and_run_work_with_the_ollama_node_frozen(
    proxy: ProxyProcess, real_ollama: RealOllama
) -> None:
    real_ollama.freeze()
    try:
        listed = ok(cli(proxy, "list"))
        rows = [line.split() for line in listed.splitlines()[1:] if line.strip()]
        assert [row[0] for row in rows] == [MODEL]  # synthesised from the openai node's /v1/models
        assert len(rows[0][1]) == 12
        shown = ok(cli(proxy, "show", MODEL))
        assert "Model" in shown
        assert ok(cli(proxy, "--version")).strip()
        assert "hello" in ok(cli(proxy, "run", MODEL, "Say hi.", "--nowordwrap"))  # the openai node
        assert ok(cli(proxy, "ps")).split()[:2] == ["NAME", "ID"]
    finally:
        real_ollama.thaw()
