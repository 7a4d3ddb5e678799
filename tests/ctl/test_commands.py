"""Tests for nvpair_tw.ctl._commands, in-process: what each subcommand sends, where the channel
and the token come from, and every mistake as one line with exit status 2 (the command line) or
1 (the call)."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvpair_tw import __version__
from nvpair_tw.ctl import main
from nvpair_tw.ctl._commands import _unreachable
from nvpair_tw.ctl._endpoint import TcpAddress, UnixAddress
from tests.ctl.peer import answer, scripted_peer
from tests.ctl.running import environment

Captured = pytest.CaptureFixture[str]


def _run(capsys: Captured, *argv: str, **environ: str) -> tuple[int, str, str]:
    status = main(list(argv), environ)
    out, err = capsys.readouterr()
    return status, out, err


def _one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


@pytest.mark.parametrize(
    ("argv", "method", "params"),
    [
        (["nodes"], "nodes/list", {}),
        (["drain", "gpu2"], "node/drain", {"id": "gpu2"}),
        (
            ["drain", "gpu2", "--timeout", "15m", "--reason", "upgrade"],
            "node/drain",
            {"id": "gpu2", "timeout": "15m", "reason": "upgrade"},
        ),
        (["cordon", "gpu2", "--reason", "x"], "node/cordon", {"id": "gpu2", "reason": "x"}),
        (["uncordon", "gpu2"], "node/uncordon", {"id": "gpu2"}),
        (
            ["load", "llama3", "--node", "a", "--node", "b", "--keep-alive", "1h"],
            "model/load",
            {"model": "llama3", "nodes": ["a", "b"], "keep_alive": "1h"},
        ),
        (
            ["unload", "llama3", "--timeout", "1m"],
            "model/unload",
            {"model": "llama3", "timeout": "1m"},
        ),
        (["usage"], "usage/report", {"since": "24h", "by": ["key", "model"]}),
        (
            ["usage", "--since", "7d", "--until", "1h", "--by", "node, day"],
            "usage/report",
            {"since": "7d", "until": "1h", "by": ["node", "day"]},
        ),
        (["log-level", "warn"], "log/set-level", {"level": "warn"}),
    ],
)
def test_each_subcommand_sends_its_method_and_params(
    capsys: Captured, tmp_path: Path, argv: list[str], method: str, params: dict[str, Any]
) -> None:
    with scripted_peer(tmp_path, answer({})) as (endpoint, received):
        main(["--control", endpoint, *argv], {})
    capsys.readouterr()
    assert [(r["method"], r["params"]) for r in received] == [(method, params)]


@pytest.mark.parametrize(
    ("argv", "method"),
    [
        (["nodes"], "lmstudio:nodes/list"),
        (["drain", "a"], "lmstudio:node/drain"),
        (["usage"], "usage/report"),
        (["log-level", "info"], "log/set-level"),
    ],
)
def test_engine_prefixes_the_facade_methods_only(
    capsys: Captured, tmp_path: Path, argv: list[str], method: str
) -> None:
    with scripted_peer(tmp_path, answer({})) as (endpoint, received):
        main(["--engine", "lmstudio", "--control", endpoint, *argv], {})
    capsys.readouterr()
    assert [r["method"] for r in received] == [method]


def test_the_channel_options_work_after_the_subcommand_too(
    capsys: Captured, tmp_path: Path
) -> None:
    with scripted_peer(tmp_path, answer({"level": "info"})) as (endpoint, _):
        status, out, err = _run(capsys, "log-level", "info", "--json", "--control", endpoint)
    assert (status, json.loads(out), err) == (0, {"level": "info"}, "")


def test_control_beats_the_environment_and_the_environment_beats_the_default(
    capsys: Captured, tmp_path: Path
) -> None:
    with scripted_peer(tmp_path, answer({"level": "info"})) as (endpoint, received):
        flag = _run(capsys, "--control", endpoint, "log-level", "info", NVPAIR_CONTROL="stdio")
    assert flag[0] == 0 and len(received) == 1
    with scripted_peer(tmp_path, answer({"level": "info"})) as (endpoint, received):
        env = _run(capsys, "log-level", "info", NVPAIR_CONTROL=endpoint)
    assert env[0] == 0 and len(received) == 1
    status, out, err = _run(capsys, "nodes", NVPAIR_CONTROL="")
    assert status == 1 and out == ""
    assert _one_line(err).startswith(
        "nvpair-ctl: cannot reach the control channel at unix:/run/nvpair/ctl.sock: "
    )


def test_a_token_file_opens_the_session_with_auth(capsys: Captured, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with scripted_peer(tmp_path, answer({})) as (endpoint, received):
        _run(capsys, "nodes", NVPAIR_CONTROL=endpoint, NVPAIR_CONTROL_TOKEN_FILE=str(token))
    assert [r["method"] for r in received] == ["auth", "nodes/list"]
    assert received[0]["params"] == {"token": "s3cret"}


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {}, "nvpair-ctl: the following arguments are required: COMMAND"),
        (["nodse"], {}, "nvpair-ctl: argument COMMAND: invalid choice: 'nodse'"),
        (["drain"], {}, "nvpair-ctl drain: the following arguments are required: ID"),
        (["nodes", "--jsn"], {}, "nvpair-ctl: unrecognized arguments: --jsn"),
        (
            ["--control", "stdio", "nodes"],
            {},
            "nvpair-ctl: --control: 'stdio' cannot be reached from outside the proxy",
        ),
        (
            ["nodes"],
            {"NVPAIR_CONTROL": "tcp:99999"},
            "nvpair-ctl: NVPAIR_CONTROL: 'tcp:99999': the port must be a number from 1 to 65535",
        ),
        (
            ["--control-token", "/nonexistent/token", "nodes"],
            {},
            "nvpair-ctl: --control-token /nonexistent/token: cannot be read: No such file",
        ),
    ],
)
def test_a_wrong_command_line_is_one_line_and_status_2(
    capsys: Captured, argv: list[str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        status = main(argv, environ)
        raise SystemExit(status)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert _one_line(err).startswith(message)


def test_version_names_the_package(capsys: Captured) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"], {})
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"nvpair-tw {__version__.public()}\n"


def test_no_socket_a_stale_socket_and_a_closed_port_are_status_1(
    capsys: Captured, tmp_path: Path
) -> None:
    missing = _run(capsys, "--control", f"unix:{tmp_path / 'none.sock'}", "nodes")
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(stale))  # bound, never listening: what a killed proxy leaves
        refused = _run(capsys, "--control", f"unix:{stale}", "nodes")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        closed = _run(capsys, "--control", f"tcp:127.0.0.1:{port}", "nodes")
    assert missing[:2] == (1, "")
    assert _one_line(missing[2]) == (
        f"nvpair-ctl: cannot reach the control channel at unix:{tmp_path / 'none.sock'}: no "
        "socket there: is the proxy running with this --control? (choose the channel with "
        "--control ENDPOINT or NVPAIR_CONTROL)"
    )
    assert _one_line(refused[2]).endswith("connection refused: nothing listens there")
    assert _one_line(closed[2]) == (
        f"nvpair-ctl: cannot reach the control channel at tcp:127.0.0.1:{port}: "
        "connection refused: nothing listens there"
    )
    assert refused[0] == closed[0] == 1


def test_a_socket_the_user_may_not_open_points_at_the_operators_group() -> None:
    """(The tests run as root, whom a socket's mode does not stop: the message is checked on
    the error the kernel gives everyone else.)"""
    denied = PermissionError(errno.EACCES, "Permission denied")
    assert _unreachable(UnixAddress("/run/nvpair/ctl.sock"), denied) == (
        "cannot reach the control channel at unix:/run/nvpair/ctl.sock: permission denied: the "
        "socket lets in its owner and group only (join the operators' group, "
        "docs/deploy/README.md, or run as the proxy's user)"
    )
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert _unreachable(TcpAddress("nope.invalid", 7070), unknown).endswith(
        "cannot resolve the host: Name or service not known"
    )


def test_a_refusal_is_one_line_escaped_with_a_hint_for_the_engine(
    capsys: Captured, tmp_path: Path
) -> None:
    def refuse(request: dict[str, Any]) -> bytes:
        message = "nodes/list: several engines are served; address it as ENGINE:method\x1b[2J"
        error = {"code": -32602, "message": message}
        return json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}).encode() + b"\n"

    with scripted_peer(tmp_path, refuse) as (endpoint, _):
        status, out, err = _run(capsys, "nodes", NVPAIR_CONTROL=endpoint)
    assert (status, out) == (1, "")
    assert _one_line(err) == (
        "nvpair-ctl: nodes/list: nodes/list: several engines are served; address it as "
        "ENGINE:method\\x1b[2J; give --engine ENGINE"
    )


def test_an_answer_that_is_not_an_object_is_status_1(capsys: Captured, tmp_path: Path) -> None:
    with scripted_peer(tmp_path, answer([1, 2])) as (endpoint, _):
        status, out, err = _run(capsys, "nodes", NVPAIR_CONTROL=endpoint)
    assert (status, out, err) == (1, "", "nvpair-ctl: nodes/list: the answer is not an object\n")


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """``nvpair-ctl nodes --json | head -1`` on a long answer: the pipe closes while it writes."""
    many = {"nodes": [{"id": f"node-{i}", "models": ["m"] * 50} for i in range(2000)]}
    with scripted_peer(tmp_path, answer(many)) as (endpoint, _):
        child = subprocess.Popen(
            [sys.executable, "-m", "nvpair_tw.ctl", "--control", endpoint, "nodes", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment(),
        )
        assert child.stdout is not None and child.stderr is not None
        assert child.stdout.readline() == b"{\n"
        child.stdout.close()
        err = child.stderr.read()
        status = child.wait(30)
    assert (status, err) == (0, b"")
