# -*- test-case-name: tests.test_tap_command -*-
"""``twistd nvpair`` as a person runs it: the real ``twistd`` in a subprocess.

A mistake in the plugin's options or files is one line on stderr and exit status 2; a listener
that cannot bind is one line and a non-zero status, in the foreground and as a daemon; the control
socket is created owner-only; ``--help`` shows the options in groups, two examples first. Every
process here has a timeout and listens only on ports the kernel picked or on sockets in tmp_path.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvpair_tw import __version__
from nvpair_tw.tap import Options

REPO = Path(__file__).resolve().parent.parent
TWISTD = str(Path(sys.executable).with_name("twistd"))
QUIET = ["--admin", "none", "--usage-db", "none"]
"""Options that keep a test's process off the fixed admin port and out of the working directory."""


def _environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    environ["PYTHONPATH"] = str(REPO)
    return {**environ, **(extra or {})}


def twistd(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the venv's real ``twistd`` script with the checkout on ``PYTHONPATH``."""
    return subprocess.run(
        [TWISTD, *args],
        cwd=cwd,
        env=_environ(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_real_twistd_script_is_used() -> None:
    """The tests run the console script a person runs, not an import of it."""
    assert Path(TWISTD).is_file() and os.access(TWISTD, os.X_OK)


# ---- a mistake is one line -------------------------------------------------------------------

NODES_TYPO = '[[node]]\nid = "gpu1"\nulr = "http://10.0.0.5:11434"\n'
NODES_BAD_TOML = '[[node]]\nid = "gpu1\nurl = "http://10.0.0.5:11434"\n'
KEYS_TYPO = '[[key]]\nname = "ci"\nkey = "k-0123456789abcdef"\nmodles = ["llama3"]\n'


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ["--nodes", "{nodes_typo}"],
            {},
            "nodes file {nodes_typo}: node 1 (id 'gpu1'): unknown field 'ulr'; did you mean 'url'?",
        ),
        (
            ["--nodes", "{nodes_bad_toml}"],
            {},
            "nodes file {nodes_bad_toml}: invalid TOML: Illegal character '\\n'"
            " (at line 2, column 11)",
        ),
        (
            ["--keys", "{keys_typo}"],
            {},
            "keys file {keys_typo}: [[key]] #1: unknown field 'modles'; did you mean 'models'?",
        ),
        (["--ndoes", "nodes.toml"], {}, "unknown option --ndoes; did you mean --nodes?"),
        (
            ["--logfile", "x.log"],
            {},
            "unknown option --logfile: it is twistd's own option; give it before nvpair",
        ),
        (
            ["--response-header-timeout", "5"],
            {},
            "--response-header-timeout: '5' is not a duration; write 5s, 2m or 1m30s",
        ),
        (
            ["--response-header-timeout", "5x"],
            {},
            "--response-header-timeout: '5x' is not a duration; write 5s, 2m or 1m30s",
        ),
        (
            [],
            {"NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT": "5"},
            "NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT: '5' is not a duration; write 5s, 2m or 1m30s",
        ),
        (
            ["--first-body-timeout", "5"],
            {},
            "--first-body-timeout: '5' is not a duration; write 5s, 2m or 1m30s",
        ),
        (
            ["--connect-timeout", "5x"],
            {},
            "--connect-timeout: '5x' is not a duration; write 5s, 2m or 1m30s",
        ),
        (
            ["--control", "tcp:7070:interface=127.0.0.1"],
            {},
            "--control tcp:7070:interface=127.0.0.1: a control channel on this endpoint needs"
            " --control-token FILE (only stdio and a unix socket may go without)",
        ),
        (
            ["--control", "unix:ctl.sock", "--control-token", "/nonexistent/token"],
            {},
            "--control-token /nonexistent/token cannot be read: No such file or directory",
        ),
        (
            ["--state", "redis://127.0.0.1:1/0", "--state-secret-file", "/nonexistent/s"],
            {},
            "--state-secret-file /nonexistent/s: cannot read: No such file or directory",
        ),
    ],
)
def test_a_mistake_is_one_line_on_stderr_with_status_2(
    tmp_path: Path, args: list[str], env: dict[str, str], line: str
) -> None:
    """The whole of stderr is ``nvpair:`` and one line naming the option or the file (and the
    line, where the TOML parser gives one), with the closest valid name; nothing on stdout, no
    help, status 2, no pid file."""
    files = {
        "nodes_typo": tmp_path / "nodes.toml",
        "nodes_bad_toml": tmp_path / "bad.toml",
        "keys_typo": tmp_path / "keys.toml",
    }
    files["nodes_typo"].write_text(NODES_TYPO)
    files["nodes_bad_toml"].write_text(NODES_BAD_TOML)
    files["keys_typo"].write_text(KEYS_TYPO)
    files["keys_typo"].chmod(0o600)
    named = {name: str(path) for name, path in files.items()}
    given = [a.format(**named) for a in args]
    result = twistd("-n", "--pidfile=", "nvpair", "-e", "ollama", *given, cwd=tmp_path, env=env)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"nvpair: {line.format(**named)}\n"


def test_an_unknown_engine_gets_the_closest_one_or_the_choices(tmp_path: Path) -> None:
    """``--engine olama``: did you mean 'ollama'; ``--engine vllm``: the four choices."""
    close = twistd("nvpair", "--engine", "olama", cwd=tmp_path)
    assert (close.returncode, close.stdout) == (2, "")
    assert close.stderr == "nvpair: --engine: unknown engine 'olama'; did you mean 'ollama'?\n"
    far = twistd("nvpair", "--engine", "vllm", cwd=tmp_path)
    assert far.stderr == (
        "nvpair: --engine: unknown engine 'vllm'; choose from lmstudio, ollama, omlx, openai\n"
    )


def test_no_engine_says_how_to_give_one(tmp_path: Path) -> None:
    """``twistd nvpair`` alone: one line with the engines and an example."""
    result = twistd("nvpair", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "nvpair: at least one --engine is required: ollama, lmstudio, omlx or openai"
        " (e.g. --engine ollama)\n"
    )


def test_twistds_own_mistakes_keep_twistds_behaviour(tmp_path: Path) -> None:
    """A bad option of twistd itself (before ``nvpair``) is twistd's: its help, its status 1."""
    result = twistd("--bogus", "nvpair", "-e", "ollama", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.rstrip("\n").splitlines()[-1].endswith("option --bogus not recognized")
    assert "Usage: twistd [options]" in result.stdout


def test_twistd_help_lists_the_plugin(tmp_path: Path) -> None:
    """``twistd --help`` lists the ``nvpair`` sub-command."""
    result = twistd("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "Traceback" not in result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["nvpair", "Failover"] in [words[:2] for words in lines]


def test_twistd_version_prints_the_nvpair_version(tmp_path: Path) -> None:
    """``twistd nvpair --version`` prints nvpair-tw's version."""
    result = twistd("nvpair", "--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"nvpair-tw {__version__.public()}\n"


# ---- --help in groups ------------------------------------------------------------------------

GROUPS = [
    "Facades:",
    "Nodes:",
    "Routing and timeouts:",
    "Keys:",
    "State and usage:",
    "Operations:",
]
_OPTION = re.compile(r"^  (?:-\w,|   ) --([a-z][a-z-]*)=?(?:\s|$)")


def test_help_shows_two_examples_then_every_option_once_in_its_group(tmp_path: Path) -> None:
    """``twistd nvpair --help``: the synopsis, two examples, then the six groups in order, each
    option of the plugin exactly once and under a group, with its help text and default."""
    result = twistd("nvpair", "--help", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == "Usage: twistd [options] nvpair --engine NAME [--engine NAME]... [options]"
    headings = [line for line in lines if line in ("Examples:", *GROUPS)]
    assert headings == ["Examples:", *GROUPS]
    examples = lines[lines.index("Examples:") + 1 : lines.index(GROUPS[0])]
    assert [line for line in examples if line.startswith("  twistd ")] == [
        "  twistd -n --pidfile= nvpair --engine ollama --demo",
        "  twistd -n --pidfile= nvpair --engine ollama \\",
    ]
    groups = lines[lines.index(GROUPS[0]) :]
    shown = [m.group(1) for line in groups if (m := _OPTION.match(line))]
    assert sorted(shown) == sorted(o.rstrip("=") for o in Options().longOpt)
    assert len(shown) == len(set(shown))
    assert lines.index("  -e, --engine=".ljust(37) + "Engine facade to serve: ollama, lmstudio,")
    text = " ".join(" ".join(line.split()) for line in lines)
    assert "Idle time after which an affinity entry is forgotten. [default: 5m]" in text


# ---- a listener that cannot bind -------------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port the kernel picked, held open (listening) by this test."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def _bind_cases(port: int, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Per listener: the options that make only it fail, and the one line that says so."""
    facade = f"tcp:{port}:interface=127.0.0.1"
    admin = f"tcp:{port}:interface=127.0.0.1"
    control = f"unix:{tmp_path}/missing/ctl.sock"
    return {
        "facade": (
            ["--listen", facade, *QUIET],
            f"cannot listen on {facade} (ollama facade): address already in use",
        ),
        "admin": (
            ["--listen", "tcp:0:interface=127.0.0.1", "--admin", admin, "--usage-db", "none"],
            f"cannot listen on {admin} (admin): address already in use",
        ),
        "control": (
            ["--listen", "tcp:0:interface=127.0.0.1", *QUIET, "--control", control],
            f"cannot listen on {control}:mode=600 (control channel): no such file or directory",
        ),
    }


@pytest.mark.parametrize("listener", ["facade", "admin", "control"])
def test_in_the_foreground_a_listener_that_cannot_bind_is_one_line_and_status_1(
    tmp_path: Path, taken_port: int, listener: str
) -> None:
    """``twistd -n``: stderr is the one line naming the endpoint, its listener and the error;
    status 1, so systemd's ``Restart=on-failure`` retries; no traceback in the log either."""
    args, line = _bind_cases(taken_port, tmp_path)[listener]
    result = twistd("-n", "--pidfile=", "nvpair", "-e", "ollama", *args, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == f"nvpair: {line}\n"
    assert "Traceback" not in result.stdout and "Server Shut Down" not in result.stdout
    assert f"[nvpair_tw.runtime._service#error] {line}" in result.stdout


def test_as_a_daemon_a_listener_that_cannot_bind_reaches_the_terminal(
    tmp_path: Path, taken_port: int
) -> None:
    """Without ``-n`` the bind happens in ``privilegedStartService``, so twistd's start-up pipe
    carries the line (under its 100 bytes) to the terminal; status 1; the pid file is removed and
    the log file has the line."""
    pidfile, logfile = tmp_path / "twistd.pid", tmp_path / "twistd.log"
    args, line = _bind_cases(taken_port, tmp_path)["facade"]
    try:
        result = twistd(
            f"--pidfile={pidfile}", f"--logfile={logfile}", "nvpair", "-e", "ollama", *args,
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        if pidfile.exists():  # a daemon that started after all: do not leave it running
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
    assert len(f"1 nvpair: {line}") < 100
    assert result.returncode == 1
    assert result.stderr == (
        f"An error has occurred: b'nvpair: {line}'\nPlease look at log file for more information.\n"
    )
    assert not pidfile.exists()
    assert line in logfile.read_text()


# ---- the control socket's mode ---------------------------------------------------------------


def _read_until(process: subprocess.Popen[bytes], needle: str, timeout: float = 30.0) -> str:
    """What ``process`` printed up to the line holding ``needle`` (an AssertionError if it ends
    or falls silent first)."""
    assert process.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while needle.encode() not in seen:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError(f"{needle!r} not printed in {timeout}s: {seen!r}")
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"the process ended before {needle!r}: {seen!r}")
            seen += chunk
    return seen.decode()


@pytest.mark.parametrize(("suffix", "mode"), [("", 0o600), (":mode=660", 0o660)])
def test_the_control_socket_is_owner_only_unless_a_mode_is_given(
    tmp_path: Path, suffix: str, mode: int
) -> None:
    """``--control unix:PATH`` creates a socket of mode 0600 (Twisted's default would be 0666:
    any local user could add a node); ``:mode=660`` is kept. The lock beside it is a symbolic
    link holding the pid, which has no mode of its own: its directory guards it."""
    path = tmp_path / "ctl.sock"
    process = subprocess.Popen(
        [TWISTD, "-n", "--pidfile=", "nvpair", "-e", "ollama",
         "--listen", "tcp:0:interface=127.0.0.1", *QUIET, "--control", f"unix:{path}{suffix}"],
        cwd=tmp_path, env=_environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _read_until(process, "control channel listening on")
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == mode
        lock = path.with_name("ctl.sock.lock")
        assert lock.is_symlink() and os.readlink(lock) == str(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.stdout is not None
        process.stdout.close()
