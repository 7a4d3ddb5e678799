"""The Ollama CLI itself as a client of the ollama facade (docs/behaviour.md §17.6), end to end.

The real ``ollama`` 0.9.3 binary (the one ``tests/engines/ollama.py`` installs, which is also the
CLI) runs ``list``, ``ps``, ``show`` and ``run`` with ``OLLAMA_HOST`` set to a ``twist nvpair``
subprocess in front of a mixed fleet of real engines: a real Ollama (kind ``ollama``) and a real
llama.cpp ``llama-server`` (kind ``openai``, ``tests/engines/llamacpp.py``), both serving the
SmolLM2 GGUF under the public name ``smollm2`` (the llama-server's ``smollm2-llamacpp`` is an
alias in a ``[[model]]`` table, docs/behaviour.md §11.1). Then the real Ollama is frozen
(SIGSTOP, thawed in teardown): the CLI's heartbeat (``HEAD /``) is the facade's own answer,
``list`` and ``show`` still work from the llama-server's synthesised records, and ``run`` and
``ps`` too (the merged ``/api/tags`` record once lacked ``digest`` and the CLI panicked on
``digest[:12]``). A ``[[model]]`` no node holds, whose fallback is ``smollm2``, is listed, shown
and run through that fallback (§16.2). One engine of each kind serves the whole module.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer, RealOllama
from tests.engines import llamacpp
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

MODEL = "smollm2"
BOUND = pytest.mark.timeout(180, func_only=True)

# The llama-server's own name is an alias of the public one; ``num_predict`` bounds ``ollama run``
# on one CPU thread per engine (docs/behaviour.md §16.1: a default, applied before translation).
# No node holds ``FALLBACK_ONLY``: it is listed and served through its fallback (§16.2).
FALLBACK_ONLY = "smollm2-large"
CATALOGUE = (
    f'[[model]]\nname = "{MODEL}"\naliases = ["{llamacpp.ALIAS}"]\n'
    "defaults = { options = { num_predict = 24 } }\n\n"
    f'[[model]]\nname = "{FALLBACK_ONLY}"\nfallbacks = ["{MODEL}"]\n'
)


@pytest.fixture(scope="module")
def llama() -> Iterator[RealLlamaServer]:
    server = RealLlamaServer.start(slots=1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy(
    real_ollama: RealOllama, llama: RealLlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("cli")
    nodes = workdir / "nodes.toml"
    nodes.write_text(
        f'[[node]]\nid = "o"\nurl = "{real_ollama.url}"\nkind = "ollama"\n\n'
        f'[[node]]\nid = "l"\nurl = "{llama.url}"\nkind = "openai"\n\n{CATALOGUE}'
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


def ollama_digest(node: RealOllama) -> str:
    """The digest the real Ollama's own ``/api/tags`` gives ``smollm2:latest``."""
    with urllib.request.urlopen(f"{node.url}/api/tags", timeout=30) as answer:
        listed = json.load(answer)["models"]
    return str(next(m["digest"] for m in listed if m["name"] == f"{MODEL}:latest"))


@BOUND
def test_list_ps_show_and_run_through_a_mixed_fleet(
    proxy: ProxyProcess, real_ollama: RealOllama
) -> None:
    listed = ok(cli(proxy, "list"))
    rows = [line.split() for line in listed.splitlines()[1:] if line.strip()]
    assert [row[0] for row in rows] == [MODEL, FALLBACK_ONLY]  # each once, by its public name
    assert rows[0][1] == ollama_digest(real_ollama)[:12]  # the ID column: the Ollama node's own
    assert len(rows[1][1]) == 12
    assert "architecture" in ok(cli(proxy, "show", FALLBACK_ONLY))  # the fallback's answer
    assert ok(cli(proxy, "run", FALLBACK_ONLY, "Say hi.", "--nowordwrap")).strip()
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
        # synthesised from the llama-server's /v1/models, then the model its fallback serves
        assert [row[0] for row in rows] == [MODEL, FALLBACK_ONLY]
        assert len(rows[0][1]) == 12
        shown = ok(cli(proxy, "show", MODEL))
        assert "Model" in shown
        assert ok(cli(proxy, "--version")).strip()
        assert ok(cli(proxy, "run", MODEL, "Say hi.", "--nowordwrap")).strip()  # the llama-server
        assert ok(cli(proxy, "ps")).split()[:2] == ["NAME", "ID"]
    finally:
        real_ollama.thaw()
