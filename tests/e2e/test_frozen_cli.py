"""A frozen node is paid for once by every route (docs/behaviour.md §4.3), as the Ollama CLI meets
it: the real ``ollama`` 0.9.3 binary against a ``twist nvpair`` subprocess over two real Ollamas
serving ``smollm2``, one of them frozen (SIGSTOP, thawed in teardown), with a 4 s response-header
deadline. The first command pays the deadline once; the ``run``s, ``list``s and ``ps``s after it
do not touch the frozen node again. (Before: every ``list`` and ``ps`` waited the list bound, 10 s,
each time.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.e2e.realnodes import ProxyProcess, RealOllama, real_nodes
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

MODEL = "smollm2"
DEADLINE = 4.0
QUICK = 2.0
"""Seconds a list or ps takes that does not wait on the frozen node (on loopback, a few ms)."""


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[RealOllama]]:
    with real_nodes([{}, {}]) as started:
        yield started


@pytest.fixture(scope="module")
def proxy(
    nodes: list[RealOllama], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("frozen-cli")
    listed = workdir / "nodes.toml"
    a, b = nodes
    listed.write_text(
        f'[[node]]\nid = "a"\nurl = "{a.url}"\n\n[[node]]\nid = "b"\nurl = "{b.url}"\n'
    )
    args = ["--engine", "ollama", "--nodes", str(listed), "--response-header-timeout", "4s"]
    process = ProxyProcess(args, workdir)
    try:
        process.wait_ready(2)
        yield process
    finally:
        output = process.stop()
        assert "Traceback" not in output, output


def cli(proxy: ProxyProcess, *args: str) -> tuple[float, str]:
    """The real ``ollama`` CLI with ``OLLAMA_HOST`` naming the proxy: seconds taken, its output."""
    where = ollama_engine.install_dir()
    env = ollama_engine.server_env(where, 0)
    env["OLLAMA_HOST"] = proxy.url.removeprefix("http://")
    started = time.monotonic()
    done = subprocess.run(
        [str(where / "run" / "ollama-lib"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return time.monotonic() - started, done.stdout


@pytest.mark.timeout(600, func_only=True)
def test_the_cli_pays_a_frozen_node_once_across_runs_lists_and_ps(
    proxy: ProxyProcess, nodes: list[RealOllama]
) -> None:
    """Three ``run``s, three ``list``s and two ``ps``s with node ``a`` (first in order) frozen:
    the first ``run``'s ``/api/show`` stalls on ``a`` once and cools it; nothing after that is
    sent to ``a``; each ``list`` and ``ps`` answers at once, ``a``'s model still listed."""
    frozen = nodes[0]
    frozen.freeze()
    try:
        runs = [cli(proxy, "run", MODEL, "Say hi.", "--nowordwrap") for _ in range(3)]
        lists = [cli(proxy, "list") for _ in range(3)]
        pss = [cli(proxy, "ps") for _ in range(2)]
    finally:
        frozen.thaw()
    records = proxy.events("proxy/request")
    stalls = [
        (r["path"], a["ms"])
        for r in records
        for a in r.get("attempts", [])
        if a["node_id"] == "a" and a["outcome"] == "stall"
    ]
    assert len(stalls) == 1 and stalls[0][0] == "/api/show", stalls  # the deadline, once
    first_stall = next(
        i
        for i, r in enumerate(records)
        if any(a["outcome"] == "stall" for a in r.get("attempts", []))
    )
    later = [a for r in records[first_stall + 1 :] for a in r.get("attempts", [])]
    assert all(a["node_id"] == "b" for a in later), later
    assert all(took < QUICK for took, _ in lists + pss), (lists, pss)
    for _, listed in lists:
        assert listed.splitlines()[1].split()[0] == f"{MODEL}:latest"
    assert all(output.strip() for _, output in runs)
    print(  # the figures of the report: seconds per command
        "runs",
        [round(t, 2) for t, _ in runs],
        "lists",
        [round(t, 2) for t, _ in lists],
        "ps",
        [round(t, 2) for t, _ in pss],
    )
