"""The README is a contract (issue 37): every command README.md shows runs here, as it shows it.

The README is parsed (``tests/e2e/shown.py``: its fenced ``sh`` blocks and its inline commands) and
every command it shows must be listed in :data:`COVERED`, either run by a test of this module or set
aside with the reason (the ``tox`` test command itself, which is what runs this module). A command
added to the README without a test, or one removed, fails
``test_every_command_the_readme_shows_is_covered``; a command whose promise breaks fails the test
that runs it.

What runs, as a newcomer runs it, over real sockets on the README's own ports:

- ``pip install . && twistd -n --pidfile= nvpair --engine ollama`` in a fresh venv (the same
  interpreter) inside a copy of the checkout (what a fresh clone holds), in front of a real Ollama
  on ``127.0.0.1:11434`` (``tests/engines/ollama.py``);
- the demo command, with the venv's ``twistd``, from an empty directory (so the installed package,
  not the checkout, is what runs), the README's ``curl`` lines with ``curl``, and the demo story the
  README tells, read from the status page's ``/api/state``;
- the official ``ollama``, ``openai`` and ``anthropic`` clients against the demo's facade;
- ``pip install 'nvpair-tw[traces]'`` in that venv, and ``python -m tests.engines.ollama install``.

The quickstart of ``docs/engines/ollama.md`` runs against the real Ollama (its node URLs replaced by
the real engine's), and ``docs/engines/openai.md``'s against a real ``llama-server`` started from the
page's own line; the option names every other engine and deploy document gives ``nvpair`` are
checked against ``nvpair_tw.tap.Options``.

The README's ports (11435, 9180, the demo's 11501 and 11502, the local Ollama's 11434) are fixed:
one process at a time holds them (:class:`Stage`), and a port another process holds fails the test
naming it. Every process is stopped (its whole process group) when the module ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.realnodes import RealOllama, free_ports, gone
from tests.e2e.shown import (
    nvpair_options,
    option_mentions,
    shown_commands,
    tox_environments,
)
from tests.engines import llamacpp
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SHOWN = shown_commands(README)

TOX = "the tox test command itself: it is what runs this module"
CTL = "tests/ctl/test_against_proxy.py::test_the_documented_commands_run_as_written"
COVERED: dict[str, str] = {
    "pip install . && twistd -n --pidfile= nvpair --engine ollama": "test_the_first_command_installs_and_fronts_the_local_ollama",
    "python3 -m pip install tox && tox": TOX,
    "twistd -n --pidfile= nvpair --engine ollama --demo": "demo (fixture)",
    "curl http://127.0.0.1:11435/api/chat -d '{\"model\": \"llama3\", \"messages\": [{\"role\": \"user\", \"content\": \"Why is the sky blue?\"}]}'": "test_the_demo_tells_the_readme_story",
    "mypy --strict": TOX,
    "python -m tests.engines.ollama install": "test_the_engine_installs_ahead_as_the_readme_says",
    "tox -e mutation": TOX,
    "tox -e bench": TOX,
    "tox -e bench-streams": TOX,
    "pip install 'nvpair-tw[traces]'": "test_the_traces_extra_installs_as_the_readme_says",
    ".ci/run": TOX,
    "nvpair-ctl nodes": CTL,
    "nvpair-ctl drain gpu2": CTL,
}  # fmt: skip
"""Every command the README shows → the test that runs it, or why it is set aside."""

FOREIGN: dict[str, set[str]] = {
    "README.md": {"api-key"},  # oMLX's own flag, named in prose
    "engines/omlx.md": {"api-key"},
    "engines/llamacpp-router.md": {"model", "models-dir", "models-max", "models-autoload"},
    "engines/openai.md": {"parallel", "alias"},  # llama-server's, named in its quickstart
    "deploy/fleet.md": {"save"},  # redis-server's
}
"""Per document, the options it names that belong to another program (an engine, Redis)."""

LOCAL_OLLAMA = 11434
DEMO_NODES = (11501, 11502)
MODEL = ollama_engine.MODEL


def _readme_url(pattern: str, what: str) -> str:
    found = re.search(pattern, README)
    if found is None:
        pytest.fail(f"README.md no longer says {what} (pattern {pattern!r})", pytrace=False)
    return found.group(1).rstrip("/")


FACADE = _readme_url(r"Point clients at `(http://[^`]+)`", "where clients point")
STATUS = _readme_url(r"status page on <(http://[^>]+)>", "where the status page is")
FACADE_PORT = int(FACADE.rsplit(":", 1)[1])
STATUS_PORT = int(STATUS.rsplit(":", 1)[1])


def _shown(predicate: str) -> str:
    """The one command the README shows that contains ``predicate``."""
    matches = [c for c in SHOWN if predicate in c]
    assert len(matches) == 1, f"README.md shows {len(matches)} commands with {predicate!r}"
    return matches[0]


# --- processes on the README's ports --------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _require_free(port: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while not _port_free(port):
        if time.monotonic() > deadline:
            pytest.fail(
                f"port {port} ({what}) is taken by another process: the README's commands "
                "need it; stop that process and run again",
                pytrace=False,
            )
        time.sleep(0.2)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Running:
    """A README command line running under ``/bin/sh -c`` in its own process group."""

    def __init__(self, command: str, cwd: Path, env: Mapping[str, str], log: Path) -> None:
        self.command = command
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_listening(self, ports: Mapping[int, str], timeout: float) -> float:
        """Until every port listens (or fail with the log); the seconds it took."""
        started = time.monotonic()
        for port, what in ports.items():
            while not _listening(port):
                if self.process.poll() is not None:
                    pytest.fail(
                        f"`{self.command}` exited {self.process.returncode} before {what} "
                        f"listened:\n{self.tail()}",
                        pytrace=False,
                    )
                if time.monotonic() - started > timeout:
                    pytest.fail(
                        f"{what} (port {port}) did not listen within {timeout:.0f} s:\n"
                        f"{self.tail()}",
                        pytrace=False,
                    )
                time.sleep(0.1)
        return time.monotonic() - started

    def tail(self, limit: int = 6000) -> str:
        text = self.log.read_text(errors="replace")
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def stop(self) -> None:
        """SIGTERM to the whole group, then SIGKILL after 30 s; waits for the shell."""
        if self.process.poll() is None or not gone(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class Stage:
    """The one process at a time that holds the README's ports."""

    def __init__(self) -> None:
        self.current: Running | None = None

    def run(self, command: str, cwd: Path, env: Mapping[str, str], log: Path) -> Running:
        self.close()
        for port, what in ((FACADE_PORT, "the README's facade"), (STATUS_PORT, "the status page")):
            _require_free(port, what)
        self.current = Running(command, cwd, env, log)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="module")
def stage() -> Iterator[Stage]:
    held = Stage()
    try:
        yield held
    finally:
        held.close()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.fixture(scope="module")
def checkout(workdir: Path) -> Path:
    """What a fresh clone holds: the repository's files (tracked and new, not ignored ones)."""
    target = workdir / "nvpair-tw"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def venv(workdir: Path) -> Path:
    """A fresh venv of this interpreter, with its own pip and nothing else."""
    where = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where


def _activated(venv: Path) -> dict[str, str]:
    """The environment of a shell in which ``venv`` is activated (the checkout is not on the
    path: the installed package is what runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def local_ollama() -> Iterator[RealOllama]:
    """A real Ollama where the README's first command expects the local one: 127.0.0.1:11434."""
    _require_free(LOCAL_OLLAMA, "the local Ollama the README's first command fronts")
    node = RealOllama(LOCAL_OLLAMA, ollama_engine.up_or_fail(LOCAL_OLLAMA))
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def first_command(
    stage: Stage, checkout: Path, venv: Path, workdir: Path, local_ollama: RealOllama
) -> Running:
    """The README's first fenced command, run in the checkout's copy with the venv activated."""
    command = _shown("pip install .")
    running = stage.run(command, checkout, _activated(venv), workdir / "first.log")
    took = running.wait_listening(
        {FACADE_PORT: "the facade", STATUS_PORT: "the status page"}, timeout=600
    )
    print(f"\n[readme] `{command}`: listening after {took:.1f} s (venv install included)")
    return running


@pytest.fixture(scope="module")
def demo(stage: Stage, first_command: Running, venv: Path, workdir: Path) -> Running:
    """The README's demo command, with the venv's twistd, from an empty directory."""
    command = _shown("--demo")
    for port in DEMO_NODES:
        _require_free(port, "a demo node")
    where = workdir / "demo"
    where.mkdir()
    running = stage.run(command, where, _activated(venv), workdir / "demo.log")
    took = running.wait_listening(
        {FACADE_PORT: "the demo's facade", STATUS_PORT: "the status page"}, timeout=60
    )
    _wait_inventory(2, timeout=30)
    print(f"[readme] `{command}`: listening after {took:.1f} s")
    return running


# --- reading the proxy ----------------------------------------------------------------------------


def _get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _state() -> dict[str, Any]:
    status, body = _get(f"{STATUS}/api/state")
    assert status == 200, body
    document: dict[str, Any] = json.loads(body)
    return document


def _nodes() -> dict[str, dict[str, Any]]:
    [facade] = _state()["facades"]
    return {node["id"]: node for node in facade["nodes"]}


def _wait_inventory(count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for n in _nodes().values() if n["inventoryKnown"]) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"fewer than {count} nodes had an inventory after {timeout:.0f} s: {_nodes()}")


def _sh(command: str, cwd: Path, env: Mapping[str, str], timeout: float = 120) -> str:
    """Run one README command line to its end; its output (fails with it on a non-zero exit)."""
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"`{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done.stdout


# --- the README as text ---------------------------------------------------------------------------


def test_every_command_the_readme_shows_is_covered() -> None:
    """Each command README.md shows is run by this module or set aside with its reason, and
    every command listed here is still shown (so the list cannot drift from the README)."""
    assert SHOWN, "no command found in README.md"
    unlisted = [c for c in SHOWN if c not in COVERED]
    stale = [c for c in COVERED if c not in SHOWN]
    assert not unlisted, f"README.md shows commands no test runs: {unlisted}"
    assert not stale, f"COVERED lists commands README.md no longer shows: {stale}"


def test_every_option_the_readme_names_exists() -> None:
    """Every ``--option`` the README gives ``nvpair`` (commands and the configuration table) is
    one ``twistd nvpair`` accepts."""
    known = _known_options() | FOREIGN["README.md"]
    named = option_mentions(README)
    assert named
    assert [n for n in named if n not in known] == []


def test_the_set_aside_tox_commands_name_real_environments() -> None:
    """``tox`` itself is not run here (it runs this module), but each environment a ``tox -e``
    command of the README names exists in tox.ini, and ``.ci/run`` runs the README's command."""
    ini = (REPO / "tox.ini").read_text()
    named = [e for c in SHOWN for e in tox_environments(c)]
    assert named
    assert [e for e in named if f"[testenv:{e}]" not in ini] == []
    assert _shown("pip install tox") in (REPO / ".ci" / "run").read_text()


def _known_options() -> set[str]:
    from nvpair_tw.tap import Options

    return {name.rstrip("=") for name in Options(environ={}).longOpt}


# --- the first command ----------------------------------------------------------------------------


def test_the_first_command_installs_and_fronts_the_local_ollama(
    first_command: Running, venv: Path
) -> None:
    """``pip install . && twistd ... --engine ollama`` installs into the fresh venv and serves an
    Ollama facade in front of the local Ollama: the ``ollama`` client chats through it, the
    ``openai`` SDK through ``/v1``, and the status page answers."""
    import ollama
    import openai

    assert (venv / "bin" / "twistd").exists()
    client = ollama.Client(host=FACADE, timeout=120)
    started = time.monotonic()
    answer = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi"}],
        options={"num_predict": 4},
    )
    print(f"[readme] local ollama through the facade: chat {time.monotonic() - started:.2f} s")
    assert answer.done and answer.eval_count
    sdk = openai.OpenAI(base_url=f"{FACADE}/v1", api_key="unused", max_retries=0)
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    assert completion.choices[0].finish_reason in ("stop", "length")
    status, page = _get(f"{STATUS}/")
    assert status == 200 and b"<html" in page.lower()


def test_the_traces_extra_installs_as_the_readme_says(
    first_command: Running, checkout: Path, venv: Path
) -> None:
    """``pip install 'nvpair-tw[traces]'`` in the venv the first command installed into adds the
    OpenTelemetry SDK (the installed nvpair-tw satisfies the name; only the extra is fetched)."""
    started = time.monotonic()
    _sh(_shown("[traces]"), checkout, _activated(venv), timeout=600)
    print(f"[readme] traces extra: {time.monotonic() - started:.1f} s")
    _sh("python -c 'import opentelemetry.sdk.trace'", checkout, _activated(venv))


def test_the_engine_installs_ahead_as_the_readme_says() -> None:
    """``python -m tests.engines.ollama install``, in the checkout, with this environment's
    ``python``: the real engine is (already) installed, and the command says where."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    said = _sh(_shown("tests.engines.ollama"), REPO, env, timeout=900)
    assert said.strip() == str(ollama_engine.install_dir())
    assert ollama_engine.is_ready(ollama_engine.install_dir())


# --- the demo -------------------------------------------------------------------------------------


def _curl(workdir: Path) -> tuple[float, list[dict[str, Any]]]:
    """The README's curl line, run with curl: how long it took and the NDJSON lines it printed
    (each a JSON object, the last one ``done``)."""
    [curl] = [c for c in SHOWN if c.startswith("curl ")]
    started = time.monotonic()
    out = _sh(curl, workdir, os.environ)
    took = time.monotonic() - started
    try:
        lines = [json.loads(line) for line in out.splitlines()]
    except ValueError:
        pytest.fail(f"`{curl}` printed what is not Ollama's NDJSON: {out[:500]!r}")
    assert lines and all("error" not in line for line in lines), out[:500]
    assert lines[-1]["done"] and "message" in lines[-1] and lines[-1]["eval_count"] > 0
    assert "".join(line["message"]["content"] for line in lines).strip()
    return took, lines


def _samples(node: str) -> int:
    """How many answers of ``node`` the proxy has measured (§15.1)."""
    return sum(int(r["samples"]) for r in _nodes()[node]["rates"].values())


def _served_by(node: str, workdir: Path) -> float:
    """One curl, answered by ``node`` (its measured samples grew by one); how long it took."""
    before = {n: _samples(n) for n in ("demo-fast", "demo-slow")}
    took, _lines = _curl(workdir)
    after = {n: _samples(n) for n in ("demo-fast", "demo-slow")}
    served = [n for n in before if after[n] > before[n]]
    assert served == [node], f"served by {served} (samples {before} -> {after})"
    return took


def _cooling_until_ready(started: float, timeout: float) -> tuple[list[int], float]:
    """Watch ``demo-fast`` cool until it is ready again: each cooldown end the page showed, and
    the seconds since ``started`` at which it was ready."""
    ends: list[int] = []
    while time.monotonic() - started < timeout:
        cooling = _nodes()["demo-fast"]["cooling"]
        if cooling is None:
            return ends, time.monotonic() - started
        if cooling["until"] not in ends:
            ends.append(cooling["until"])
        time.sleep(0.25)
    pytest.fail(f"demo-fast still cooling {timeout:.0f} s after the first chat: {ends}")


def test_the_demo_tells_the_readme_story(demo: Running, workdir: Path) -> None:
    """The README's curl line, run with curl one chat after another, and the status page's
    ``/api/state`` tell the README's story: the first chat waits 5 s on the stuck ``demo-fast``
    and ``demo-slow`` answers it; the next go straight to ``demo-slow``; ``demo-fast``'s cooldown
    is renewed once while it is stuck and ends about 20 s after the first chat; then
    ``demo-fast`` serves every chat, measured at about 50 tokens/s against 12."""
    started = time.monotonic()
    first, _lines = _curl(workdir)
    [failover] = _state()["failovers"]
    hops = [(a["node_id"], a["outcome"]) for a in failover["attempts"]]
    assert hops == [("demo-fast", "stall"), ("demo-slow", "committed")]
    assert 5.0 <= first < 9.0, first
    assert _nodes()["demo-fast"]["cooling"] is not None
    meanwhile = [_served_by("demo-slow", workdir) for _ in range(2)]
    assert all(2.0 < took < 4.5 for took in meanwhile), meanwhile
    ends, ready_at = _cooling_until_ready(started, timeout=40)
    assert len(ends) == 2 and ends[1] - ends[0] >= 9000, ends  # renewed once, a period later
    assert 15.0 <= ready_at <= 30.0, ready_at
    after = [_served_by("demo-fast", workdir) for _ in range(3)]
    assert all(took < 1.5 for took in after), after
    rates = {n: node["rates"]["llama3"] for n, node in _nodes().items()}
    assert rates["demo-fast"]["decodeTokensPerSecond"] == pytest.approx(50, rel=0.05)
    assert rates["demo-slow"]["decodeTokensPerSecond"] == pytest.approx(12, rel=0.05)
    print(
        f"[readme] story: first chat {first:.2f} s, then {', '.join(f'{t:.2f}' for t in meanwhile)}"
        f" s on demo-slow; demo-fast ready {ready_at:.1f} s after the first chat (cooldown ends"
        f" {ends}); then {', '.join(f'{t:.2f}' for t in after)} s on demo-fast; rates {rates}"
    )


def _metric_means(text: str, name: str) -> dict[str, float]:
    """Per node, the mean of a Prometheus histogram ``name`` (its ``_sum`` over its ``_count``)."""
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        found = re.match(rf'{name}_(sum|count)\{{[^}}]*node="([^"]+)"[^}}]*\}} (\S+)', line)
        if found:
            part, node, value = found.groups()
            pair = totals.setdefault(node, [0.0, 0.0])
            pair[0 if part == "sum" else 1] += float(value)
    return {node: total / count for node, (total, count) in totals.items() if count}


def test_the_status_page_shows_who_is_fast_after_the_story(demo: Running) -> None:
    """After the story, the status page (its HTML, ``/api/state`` and ``/metrics``) shows tokens per second for both nodes, their measured rates and a time to
    first token that is shorter on ``demo-fast``."""
    status, page = _get(f"{STATUS}/")
    assert status == 200 and b"<html" in page.lower()
    state = _state()
    series = {s["node"]: [p[1] for p in s["points"] if p[1]] for s in state["throughput"]["series"]}
    assert series.get("demo-fast") and series.get("demo-slow"), series
    status, metrics = _get(f"{STATUS}/metrics")
    ttft = _metric_means(metrics.decode(), "nvpair_time_to_first_token_seconds")
    rate = _metric_means(metrics.decode(), "nvpair_generation_tokens_per_second")
    assert ttft["demo-fast"] < ttft["demo-slow"], ttft
    assert rate["demo-fast"] > 3 * rate["demo-slow"], rate
    rates = {n["id"]: n["rates"] for n in state["facades"][0]["nodes"]}
    print(f"[readme] status page: throughput points {series}")
    print(f"[readme] time to first token (mean s) {ttft}; tokens/s (mean) {rate}")
    print(f"[readme] measured rates {json.dumps(rates)}")


def test_the_readme_states_the_demos_own_figures() -> None:
    """The figures the README's demo paragraph gives are the demo's own: its nodes and their
    speeds, its models, the stretch ``demo-fast`` is stuck for and the demo's deadline."""
    from nvpair_tw.app._demo import DEMO_MODELS, DEMO_NODES, STUCK_FOR
    from nvpair_tw.tap import DEMO_RESPONSE_HEADER_TIMEOUT

    said = " ".join(README.split())
    fast, slow = DEMO_NODES
    names = " and ".join(f"`{m.removesuffix(':latest')}`" for m in DEMO_MODELS)
    for claim in (
        f"both serving {names}",
        f"`{fast.id}`, at about {fast.pace.decode:g} tokens/s, and `{slow.id}`, at about "
        f"{slow.pace.decode:g}.",
        f"stays stuck for {STUCK_FOR:g} s",
        f"the response-header timeout is {DEMO_RESPONSE_HEADER_TIMEOUT:g} s",
        f"The first one waits {DEMO_RESPONSE_HEADER_TIMEOUT:g} s on `{fast.id}`",
    ):
        assert claim in said, f"README.md no longer says {claim!r}"


def test_the_ollama_client_works_unchanged_against_the_demo(demo: Running) -> None:
    """The ``ollama`` library: whole and streamed chat and generate, list, show and ps."""
    import ollama

    client = ollama.Client(host=FACADE, timeout=60)
    timed = _Timed()
    ask = [{"role": "user", "content": "Why is the sky blue?"}]
    whole = timed("ollama chat", lambda: client.chat(model="llama3", messages=ask))
    assert whole.done and whole.message.content and whole.eval_count
    streamed = timed("ollama chat stream", lambda: list(client.chat("llama3", ask, stream=True)))
    assert streamed[-1].done and streamed[-1].message is not None
    assert "".join(p.message.content or "" for p in streamed)
    generated = timed("ollama generate", lambda: client.generate("llama3", "Why is it blue?"))
    assert generated.done and generated.response
    parts = timed(
        "ollama generate stream", lambda: list(client.generate("llama3", "Why?", stream=True))
    )
    assert parts[-1].done and "".join(p.response for p in parts)
    listed = timed("ollama list", client.list)
    assert {m.model for m in listed.models} >= {"llama3:latest"}
    shown = timed("ollama show", lambda: client.show("llama3"))
    assert shown.details is not None and shown.details.family
    running = timed("ollama ps", client.ps)
    assert running.models
    timed.report()


def test_the_openai_sdk_works_unchanged_against_the_demo(demo: Running) -> None:
    """The ``openai`` SDK on ``/v1``: whole and streamed chat completions (with usage when asked)
    and the model list."""
    import openai

    sdk = openai.OpenAI(base_url=f"{FACADE}/v1", api_key="unused", max_retries=0, timeout=60)
    timed = _Timed()
    ask: Any = [{"role": "user", "content": "Why is the sky blue?"}]
    whole = timed("openai chat", lambda: sdk.chat.completions.create(model="llama3", messages=ask))
    assert whole.choices[0].message.content and whole.usage and whole.usage.completion_tokens
    chunks = timed(
        "openai chat stream",
        lambda: list(
            sdk.chat.completions.create(
                model="llama3",
                messages=ask,
                stream=True,
                stream_options={"include_usage": True},
            )
        ),
    )
    assert all(
        c.id and c.object == "chat.completion.chunk" and c.model and c.created for c in chunks
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    models = timed("openai models", lambda: list(sdk.models.list()))
    assert "llama3:latest" in {m.id for m in models}
    timed.report()


def test_the_anthropic_sdk_works_unchanged_against_the_demo(demo: Running) -> None:
    """The ``anthropic`` SDK on ``/v1/messages``: a whole message and a streamed one."""
    import anthropic

    sdk = anthropic.Anthropic(base_url=FACADE, api_key="unused", max_retries=0, timeout=60)
    timed = _Timed()
    ask: Any = [{"role": "user", "content": "Why is the sky blue?"}]
    whole = timed(
        "anthropic message",
        lambda: sdk.messages.create(model="llama3", max_tokens=64, messages=ask),
    )
    assert whole.content and whole.content[0].type == "text" and whole.usage.output_tokens > 0

    def stream() -> Any:
        with sdk.messages.stream(model="llama3", max_tokens=64, messages=ask) as events:
            return events.get_final_message()

    streamed = timed("anthropic message stream", stream)
    assert streamed.stop_reason == "end_turn" and streamed.content[0].type == "text"
    timed.report()


class _Timed:
    """Runs calls and keeps how long each took."""

    def __init__(self) -> None:
        self.took: list[tuple[str, float]] = []

    def __call__(self, what: str, call: Any) -> Any:
        started = time.monotonic()
        result = call()
        self.took.append((what, time.monotonic() - started))
        return result

    def report(self) -> None:
        print("[readme] " + ", ".join(f"{what} {took:.2f} s" for what, took in self.took))


# --- docs/engines and docs/deploy -----------------------------------------------------------------

DOCS = REPO / "docs"


def test_the_ollama_quickstart_runs_against_the_real_engine(
    stage: Stage, demo: Running, venv: Path, workdir: Path, local_ollama: RealOllama
) -> None:
    """docs/engines/ollama.md's command, its two node URLs replaced by the real Ollama's (two
    spellings of it), serves clients that use ``OLLAMA_HOST=127.0.0.1:11435``, as the page says."""
    text = (DOCS / "engines" / "ollama.md").read_text()
    [command] = [c for c in shown_commands(text) if c.startswith("twistd ")]
    urls = re.findall(r"=(http://[\d.]+:\d+)", command)
    assert len(urls) == 2, command
    local = command
    for url, spelling in zip(urls, ("127.0.0.1", "localhost"), strict=True):
        local = local.replace(url, f"http://{spelling}:{LOCAL_OLLAMA}")
    running = stage.run(local, workdir, _activated(venv), workdir / "ollama-md.log")
    running.wait_listening({FACADE_PORT: "the facade"}, timeout=60)
    host = re.search(r"`OLLAMA_HOST=([^`]+)`", text)
    assert host is not None
    env = {**os.environ, "OLLAMA_HOST": host.group(1)}
    said = _sh(
        f"{shlex.quote(sys.executable)} -c "
        + shlex.quote(
            "import ollama; print(ollama.chat(model='smollm2', "
            "messages=[{'role': 'user', 'content': 'hi'}], options={'num_predict': 3}).done)"
        ),
        workdir,
        env,
    )
    assert said.strip() == "True"


def _this_machines_llama_server(line: str, port: int) -> str:
    """docs/engines/openai.md's ``llama-server`` line on this machine: the built binary, the
    tests' GGUF, loopback and a free port, and the flags the shared test machine needs appended
    (one thread, no weight repacking: ``tests.engines.llamacpp.server_command``)."""
    words = shlex.split(line)
    assert words[0] == "llama-server", line
    swap = {"model.gguf": str(llamacpp.model_path()), "0.0.0.0": "127.0.0.1", "8080": str(port)}
    words = [str(llamacpp.binary(llamacpp.install_dir())), *(swap.get(w, w) for w in words[1:])]
    words += ["--threads", "1", "--threads-batch", "1", "--no-repack", "--no-webui"]
    return shlex.join(words)


def _healthy(url: str, running: Running, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if running.process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"`{running.command}` never became healthy:\n{running.tail()}")
        time.sleep(0.2)


@pytest.mark.timeout(1800)  # a fresh machine builds llama-server first (10-20 minutes)
def test_the_llamacpp_quickstart_runs_against_the_real_engine(
    stage: Stage, demo: Running, venv: Path, workdir: Path
) -> None:
    """docs/engines/openai.md's two commands: its ``llama-server`` line on this machine, and its
    ``twistd`` command with both node URLs replaced by that server's (two spellings of it); the
    ``openai`` SDK with ``OPENAI_BASE_URL`` as the page gives it chats with the page's model."""
    llamacpp.install(log=lambda line: print(line, file=sys.stderr))
    text = (DOCS / "engines" / "openai.md").read_text()
    [server_line] = [c for c in shown_commands(text) if c.startswith("llama-server ")]
    [command] = [c for c in shown_commands(text) if c.startswith("twistd ")]
    (port,) = free_ports(1)
    server = Running(
        _this_machines_llama_server(server_line, port), workdir, dict(os.environ),
        workdir / "llama-server.log",
    )  # fmt: skip
    try:
        _healthy(f"http://127.0.0.1:{port}", server, timeout=120)
        urls = re.findall(r"=(http://[\d.]+:\d+)", command)
        assert len(urls) == 2, command
        local = command
        for url, spelling in zip(urls, ("127.0.0.1", "localhost"), strict=True):
            local = local.replace(url, f"http://{spelling}:{port}")
        base = re.search(r"`OPENAI_BASE_URL=([^`]+)`", text)
        model = re.search(r"--alias (\S+)", server_line)
        assert base is not None and model is not None
        facade = int(base.group(1).split(":")[2].split("/")[0])
        running = stage.run(local, workdir, _activated(venv), workdir / "openai-md.log")
        running.wait_listening({facade: "the openai facade"}, timeout=60)
        env = {**os.environ, "OPENAI_BASE_URL": base.group(1), "OPENAI_API_KEY": "any"}
        said = _sh(
            f"{shlex.quote(sys.executable)} -c "
            + shlex.quote(
                "import openai; a = openai.OpenAI(max_retries=0).chat.completions.create("
                f"model={model.group(1)!r}, max_tokens=3, "
                "messages=[{'role': 'user', 'content': 'hi'}]); "
                "print(a.choices[0].finish_reason, a.usage.completion_tokens)"
            ),
            workdir,
            env,
        )
        assert said.split() == ["length", "3"], said
    finally:
        server.stop()


@pytest.mark.parametrize(
    "document",
    [
        "engines/lmstudio.md",
        "engines/omlx.md",
        "engines/mixed.md",
        "engines/openai.md",
        "engines/llamacpp-router.md",
        "deploy/fleet.md",
        "deploy/several-facades.md",
    ],
)
def test_the_options_a_document_gives_nvpair_exist(document: str) -> None:
    """Every ``--option`` a document's ``nvpair`` commands and option spans name is accepted by
    ``twistd nvpair`` (the engines this machine does not run are checked, not run)."""
    named = option_mentions((DOCS / document).read_text())
    known = _known_options() | FOREIGN.get(document, set())
    assert [n for n in named if n not in known] == []


def test_the_options_the_systemd_unit_and_its_environment_give_exist() -> None:
    """docs/deploy/nvpair.service's ``ExecStart`` and nvpair.env.example's ``NVPAIR_ARGS``."""
    unit = (DOCS / "deploy" / "nvpair.service").read_text()
    start = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.M | re.S)
    assert start is not None
    exec_start = re.sub(r"\\\n\s*", " ", start.group(1))
    named = nvpair_options(exec_start)
    environment = (DOCS / "deploy" / "nvpair.env.example").read_text()
    args = re.search(r"^NVPAIR_ARGS=(.*)$", environment, re.M)
    assert args is not None and named
    named += nvpair_options(f"twistd nvpair {args.group(1)}")
    assert [n for n in named if n not in _known_options()] == []
