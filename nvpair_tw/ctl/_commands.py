# -*- test-case-name: tests.ctl.test_commands -*-
"""``nvpair-ctl``: the control channel's console command (docs/control.md, "The console command").

Each subcommand is one row of :data:`COMMANDS`: the JSON-RPC method, whether it acts on one
engine's facade (and so takes ``--engine``'s prefix) or on the process, the params it sends, how
its answer is shown, and how long the answer may take. The channel is found from ``--control``,
else ``NVPAIR_CONTROL``, else the unit's socket (:data:`DEFAULT_CONTROL`); a token from
``--control-token FILE``, else ``NVPAIR_CONTROL_TOKEN_FILE``.

Exit status: 0 done; 1 the call failed, was refused, or did not do it all (a drain that timed out,
a load that failed on a node); 2 the command line is wrong and nothing was sent; 130 interrupted.
Every error is one line on standard error; the token is never shown.
"""

from __future__ import annotations

import argparse
import enum
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from attrs import frozen

from nvpair_tw._version import __version__
from nvpair_tw.ctl import _show as show
from nvpair_tw.ctl._channel import UNAUTHORIZED, CallFailed, ChannelError, Session, read_token
from nvpair_tw.ctl._endpoint import DEFAULT_CONTROL, TcpAddress, UnixAddress, parse_endpoint

__all__ = ["COMMANDS", "PROG", "Command", "Scope", "build_parser", "main"]

PROG = "nvpair-ctl"
QUICK = 30.0
"""How long an answer that comes at once may take (the proxy answers these in milliseconds)."""


class Scope(enum.Enum):
    """Where a method acts: one engine's facade (``ENGINE:`` prefix with ``--engine``), or the
    whole process."""

    ENGINE = "engine"
    PROCESS = "process"


Shower = Callable[[Mapping[str, Any], argparse.Namespace, float], tuple[str, int]]


@frozen
class Command:
    """One subcommand: its method, scope, params, how its answer is shown, and its wait
    (``None``: bounded by the proxy, which answers at its own ``timeout``)."""

    method: str
    scope: Scope
    params: Callable[[argparse.Namespace], dict[str, Any]]
    show: Shower
    wait: float | None


def _given(args: argparse.Namespace, **fields: str) -> dict[str, Any]:
    """``{param: value}`` for each ``param=attribute`` given on the command line."""
    return {k: getattr(args, a) for k, a in fields.items() if getattr(args, a, None) is not None}


def _by(args: argparse.Namespace) -> list[str]:
    return [name.strip() for name in args.by.split(",") if name.strip()]


COMMANDS: dict[str, Command] = {
    "nodes": Command(
        "nodes/list",
        Scope.ENGINE,
        lambda args: {},
        lambda result, args, now: (show.node_table(result, now), 0),
        QUICK,
    ),
    "drain": Command(
        "node/drain",
        Scope.ENGINE,
        lambda args: _given(args, id="node", timeout="timeout", reason="reason"),
        lambda result, args, now: show.drained(result),
        None,
    ),
    "cordon": Command(
        "node/cordon",
        Scope.ENGINE,
        lambda args: _given(args, id="node", reason="reason"),
        lambda result, args, now: show.cordoned(result),
        QUICK,
    ),
    "uncordon": Command(
        "node/uncordon",
        Scope.ENGINE,
        lambda args: _given(args, id="node"),
        lambda result, args, now: show.uncordoned(result),
        QUICK,
    ),
    "load": Command(
        "model/load",
        Scope.ENGINE,
        lambda args: _given(
            args, model="model", nodes="nodes", keep_alive="keep_alive", timeout="timeout"
        ),
        lambda result, args, now: show.changed_models(result),
        None,
    ),
    "unload": Command(
        "model/unload",
        Scope.ENGINE,
        lambda args: _given(args, model="model", nodes="nodes", timeout="timeout"),
        lambda result, args, now: show.changed_models(result),
        None,
    ),
    "usage": Command(
        "usage/report",
        Scope.PROCESS,
        lambda args: {**_given(args, since="since", until="until"), "by": _by(args)},
        lambda result, args, now: (show.usage_table(result, _by(args)), 0),
        120.0,
    ),
    "log-level": Command(
        "log/set-level",
        Scope.PROCESS,
        lambda args: _given(args, level="level"),
        lambda result, args, now: show.level_set(result),
        QUICK,
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage dump) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _Refused(Exception):
    """Nothing can be sent: the message (one line) and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


EXAMPLES = """\
examples:
  nvpair-ctl nodes
  nvpair-ctl drain gpu2 --timeout 15m && nvpair-ctl load llama3:8b --node gpu2
  nvpair-ctl uncordon gpu2
  nvpair-ctl usage --since 7d --by key,model --json
  nvpair-ctl --control tcp:7070:interface=127.0.0.1 --control-token /etc/nvpair/control.token nodes

exit status: 0 done, 1 the call failed or did not do it all, 2 a wrong command line.
"""


def _channel_options() -> argparse.ArgumentParser:
    """The options of every subcommand, accepted before or after its name."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("the channel")
    keep = argparse.SUPPRESS  # an option given before the subcommand is not reset after it
    group.add_argument(
        "--control",
        metavar="ENDPOINT",
        default=keep,
        help=f"the proxy's --control endpoint (env NVPAIR_CONTROL; default {DEFAULT_CONTROL})",
    )
    group.add_argument(
        "--control-token",
        metavar="FILE",
        default=keep,
        help="the file with the proxy's --control-token (env NVPAIR_CONTROL_TOKEN_FILE)",
    )
    group.add_argument(
        "--engine", default=keep, help="the facade to address when the proxy serves several"
    )
    group.add_argument("--json", action="store_true", default=keep, help="print the answer's JSON")
    return common


def _subcommands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, parents=[common])

    add("nodes", "the nodes, their state, slots and models (nodes/list)")
    drain = add("drain", "cordon a node, then wait until nothing runs there (node/drain)")
    drain.add_argument("node", metavar="ID")
    drain.add_argument("--timeout", metavar="DURATION", help="how long to wait (default 10m)")
    drain.add_argument("--reason", help="why, as the status page shows it")
    cordon = add("cordon", "take a node out of service for new work (node/cordon)")
    cordon.add_argument("node", metavar="ID")
    cordon.add_argument("--reason", help="why, as the status page shows it")
    add("uncordon", "put a node back in service (node/uncordon)").add_argument("node", metavar="ID")
    for name, verb in (("load", "load a model on"), ("unload", "unload a model from")):
        change = add(name, f"{verb} its nodes, or the nodes named (model/{name})")
        change.add_argument("model", metavar="MODEL")
        change.add_argument("--node", dest="nodes", metavar="ID", action="append")
        change.add_argument("--timeout", metavar="DURATION", help="per node (default 10m)")
        if name == "load":
            change.add_argument("--keep-alive", metavar="DURATION")
    usage = add("usage", "requests and tokens by key, model, node or time (usage/report)")
    usage.add_argument("--since", default="24h", help="a time or a span back (default 24h)")
    usage.add_argument("--until", help="a time or a span back (default now)")
    usage.add_argument(
        "--by", default="key,model", help="key, model, node, minute, hour, day (default key,model)"
    )
    level = add("log-level", "set the proxy's log level (log/set-level)")
    level.add_argument("level", metavar="LEVEL", help="debug, info, warn, error or critical")


def build_parser() -> argparse.ArgumentParser:
    common = _channel_options()
    parser = _Parser(
        prog=PROG,
        description="Drive a running nvpair-tw proxy over its control channel (docs/control.md).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"nvpair-tw {__version__.public()}")
    _subcommands(parser, common)
    return parser


def _address(args: argparse.Namespace, environ: Mapping[str, str]) -> UnixAddress | TcpAddress:
    given = getattr(args, "control", None)
    text, where = (
        (given, "--control")
        if given is not None
        else (environ.get("NVPAIR_CONTROL") or DEFAULT_CONTROL, "NVPAIR_CONTROL")
    )
    try:
        return parse_endpoint(text)
    except ValueError as error:
        raise _Refused(f"{where}: {error}", 2) from None


def _token(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The token and the file it came from, if one is given."""
    path = getattr(args, "control_token", None) or environ.get("NVPAIR_CONTROL_TOKEN_FILE")
    if not path:
        return None
    try:
        return read_token(path), path
    except ValueError as error:
        raise _Refused(str(error), 2) from None


_UNREACHABLE = {
    errno.ENOENT: "no socket there: is the proxy running with this --control? (choose the "
    "channel with --control ENDPOINT or NVPAIR_CONTROL)",
    errno.EACCES: "permission denied: the socket lets in its owner and group only (join the "
    "operators' group, docs/deploy/README.md, or run as the proxy's user)",
    errno.ECONNREFUSED: "connection refused: nothing listens there",
}


def _unreachable(address: UnixAddress | TcpAddress, error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        why = f"cannot resolve the host: {error.strerror}"
    elif isinstance(error, TimeoutError):
        why = "no connection within 5 s"
    else:
        why = _UNREACHABLE.get(error.errno or 0, error.strerror or str(error))
    return f"cannot reach the control channel at {address}: {why}"


def _refusal(method: str, failed: CallFailed, token: tuple[str, str] | None) -> str:
    if failed.code == UNAUTHORIZED and token is None:
        return (
            "the control channel needs a token: give --control-token FILE "
            "(or NVPAIR_CONTROL_TOKEN_FILE)"
        )
    if failed.code == UNAUTHORIZED and token is not None:
        return f"the control channel refused the token in {token[1]}"
    hint = "; give --engine ENGINE" if "ENGINE:" in failed.message else ""
    return f"{method}: {show.printable(failed.message[:300])}{hint}"


def _call(command: Command, args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    address = _address(args, environ)
    token = _token(args, environ)
    engine = getattr(args, "engine", None)
    method = command.method
    if engine and command.scope is Scope.ENGINE:
        method = f"{engine}:{method}"
    try:
        with Session(address) as session:
            if token is not None:
                session.authenticate(token[0])
            result = session.call(method, command.params(args), command.wait)
    except OSError as error:
        raise _Refused(_unreachable(address, error), 1) from None
    except ChannelError as error:
        raise _Refused(str(error), 1) from None
    except CallFailed as failed:
        raise _Refused(_refusal(method, failed, token), 1) from None
    if not isinstance(result, dict):
        raise _Refused(f"{method}: the answer is not an object", 1)
    return result


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one subcommand; the exit status."""
    args = build_parser().parse_args(argv)
    command = COMMANDS[args.command]
    try:
        result = _call(command, args, os.environ if environ is None else environ)
    except _Refused as refused:
        print(f"{PROG}: {refused}", file=sys.stderr)
        return refused.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    text, status = command.show(result, args, time.time())
    try:
        print(json.dumps(result, indent=2) if getattr(args, "json", False) else text, flush=True)
    except BrokenPipeError:  # the reader left (``| head``): say nothing more, write nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status
