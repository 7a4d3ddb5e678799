"""``nvpair-ctl`` against a real ``twistd nvpair`` over its real control socket: the table and
the JSON of ``nodes``, a drain that answers once the stream in flight has ended, an unknown node,
a TCP channel's token, usage, the log level, loading a model."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool
from twisted.web.http_headers import Headers

from nvpair_tw.testing import SimulatedEngine, start_engine
from tests.ctl.running import REPO, Proxy, environment, free_port, running_proxy

_Test = TypeVar("_Test", bound=Callable[..., Any])
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
COLUMNS = ["ID", "KIND", "STATE", "IN USE", "MODELS", "LOADED", "CONTEXT", "URL"]


def on_reactor(test: _Test) -> _Test:
    return cast(_Test, pytest_twisted.ensureDeferred(test))


def _unix(directory: Path) -> str:
    return f"unix:{directory / 'ctl.sock'}:mode=600"


class _Body(Protocol):
    def __init__(self) -> None:
        self.lost: Deferred[None] = Deferred()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.callback(None)


async def _stream(reactor: Any, proxy: Proxy) -> _Body:
    """A streamed chat through the proxy, left to run; its body's end is ``lost``."""
    agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
    response = await agent.request(
        b"POST",
        f"{proxy.facade}/api/chat".encode(),
        Headers({b"content-type": [b"application/json"]}),
        FileBodyProducer(io.BytesIO(json.dumps(CHAT).encode())),
    )
    assert response.code == 200
    body = _Body()
    response.deliverBody(body)
    return body


def _columns(header: str) -> list[str]:
    return re.split(r"\s{2,}", header.strip())


@on_reactor
async def test_nodes_is_a_table_with_its_columns_and_json_on_request(
    reactor: Any, tmp_path: Path
) -> None:
    """``nodes``: a header of the eight columns, a row for the node, the queue; ``--json`` is
    the channel's own answer. The channel comes from ``NVPAIR_CONTROL`` when not given."""
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    url = engine.url
    try:
        async with running_proxy(reactor, engine, tmp_path, _unix(tmp_path)) as proxy:
            shown = await proxy.ctl("nodes", env=environment(NVPAIR_CONTROL=proxy.control))
            as_json = await proxy.ctl("nodes", "--json")
    finally:
        await engine.stop()
    assert (shown.status, shown.err) == (0, "")
    header, row, queue = shown.out.splitlines()
    assert _columns(header) == COLUMNS
    assert _columns(row) == [
        "sim",
        "ollama",
        "in service",
        "0/no limit",
        "llama3:latest",
        "?",
        "-",
        url,
    ]
    assert queue == "queue: 0 waiting"
    assert as_json.status == 0
    answer = json.loads(as_json.out)
    assert [node["id"] for node in answer["nodes"]] == ["sim"]
    assert answer["nodes"][0]["models"] == ["llama3:latest"] and answer["queueDepth"] == 0


@on_reactor
async def test_a_drain_answers_once_the_stream_in_flight_has_ended(
    reactor: Any, tmp_path: Path
) -> None:
    """``drain sim`` while a 5-second stream runs there: the command waits for it (the events
    of that stream come first on the channel and are skipped), says how long it waited, and the
    node is left cordoned with nothing in use."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, chunks=100, chunk_delay=0.05))
    try:
        async with running_proxy(reactor, engine, tmp_path, _unix(tmp_path)) as proxy:
            body = await _stream(reactor, proxy)
            assert not body.lost.called  # in flight when the drain starts
            drained = await proxy.ctl("drain", "sim", "--timeout", "30s")
            after = await proxy.ctl("nodes")
            await body.lost
    finally:
        await engine.stop()
    assert (drained.status, drained.err) == (0, ""), drained
    waited = re.fullmatch(
        r"sim drained in (\d+\.\d) s \(it stays cordoned: uncordon sim\)\n", drained.out
    )
    assert waited is not None, drained.out
    assert float(waited.group(1)) >= 1.0  # it waited for the stream, not answered at once
    assert _columns(after.out.splitlines()[1])[2:4] == ["cordoned: draining", "0/no limit"]


@on_reactor
async def test_an_unknown_node_is_one_line_and_status_1(reactor: Any, tmp_path: Path) -> None:
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    try:
        async with running_proxy(reactor, engine, tmp_path, _unix(tmp_path)) as proxy:
            refused = await proxy.ctl("cordon", "nope")
            drained = await proxy.ctl("drain", "nope", "--json")
    finally:
        await engine.stop()
    assert refused == type(refused)(1, "", 'nvpair-ctl: node/cordon: node "nope" not found\n')
    assert drained == type(drained)(1, "", 'nvpair-ctl: node/drain: node "nope" not found\n')


@on_reactor
async def test_a_tcp_channel_takes_the_right_token_only_and_never_shows_it(
    reactor: Any, tmp_path: Path
) -> None:
    """On ``tcp:`` with ``--control-token``: the right token works; a wrong one and none are
    one line each, status 1, and no output holds either token."""
    secret, wrong = "right-token-4f9a", "wrong-token-77c1"
    token, other = tmp_path / "control.token", tmp_path / "other.token"
    for path, text in ((token, secret), (other, wrong)):
        path.write_text(text + "\n")
        os.chmod(path, 0o600)
    control = f"tcp:{free_port()}:interface=127.0.0.1"
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    try:
        async with running_proxy(
            reactor, engine, tmp_path, control, "--control-token", str(token)
        ) as proxy:
            right = await proxy.ctl("--control-token", str(token), "nodes")
            refused = await proxy.ctl("--control-token", str(other), "nodes")
            from_env = await proxy.ctl(
                "nodes", env=environment(NVPAIR_CONTROL_TOKEN_FILE=str(other))
            )
            without = await proxy.ctl("nodes")
    finally:
        await engine.stop()
    assert right.status == 0 and right.out.startswith("ID ")
    assert refused == type(refused)(
        1, "", f"nvpair-ctl: the control channel refused the token in {other}\n"
    )
    assert from_env == refused
    assert without == type(without)(
        1,
        "",
        "nvpair-ctl: the control channel needs a token: give --control-token FILE"
        " (or NVPAIR_CONTROL_TOKEN_FILE)\n",
    )
    for ran in (right, refused, from_env, without):
        assert secret not in ran.out + ran.err and wrong not in ran.out + ran.err


@on_reactor
async def test_usage_log_level_and_load_show_their_answers(reactor: Any, tmp_path: Path) -> None:
    """After one request: ``usage`` has a row for it under its columns; ``log-level`` says the
    level in force; ``load`` and ``unload`` a row per node."""
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    try:
        async with running_proxy(reactor, engine, tmp_path, _unix(tmp_path)) as proxy:
            await (await _stream(reactor, proxy)).lost
            usage = await proxy.ctl("usage", "--by", "model,node")
            level = await proxy.ctl("log-level", "debug")
            loaded = await proxy.ctl("load", "llama3:latest", "--node", "sim")
            unloaded = await proxy.ctl("unload", "llama3:latest", "--json")
    finally:
        await engine.stop()
    assert usage.status == 0, usage
    header, row, scope = usage.out.splitlines()
    assert _columns(header) == [
        "MODEL",
        "NODE",
        "REQUESTS",
        "ERRORS",
        "PROMPT TOKENS",
        "COMPLETION TOKENS",
        "UNKNOWN TOKENS",
        "CACHED TOKENS",
        "UNKNOWN CACHED",
    ]
    assert _columns(row)[:4] == ["llama3", "sim", "1", "0"]
    assert _columns(row)[-2:] == ["0", "1"]  # the simulated engine states no cached count
    assert scope == "scope: local"
    assert level == type(level)(0, "log level: debug\n", "")
    assert loaded.status == 0, loaded
    assert [_columns(line) for line in loaded.out.splitlines()] == [
        ["NODE", "STATUS", "ERROR"],
        ["sim", "loaded"],
    ]
    assert unloaded.status == 0, unloaded
    assert json.loads(unloaded.out) == {
        "model": "llama3:latest",
        "nodes": {"sim": {"status": "unloaded"}},
    }


def _documented() -> list[list[str]]:
    """Every ``nvpair-ctl`` command in README.md's backticks and docs/control.md's console block,
    split as a shell would (``&&`` chains split into their commands)."""
    readme = (REPO / "README.md").read_text()
    control = (REPO / "docs" / "control.md").read_text()
    block = control.split("```console\n", 1)[1].split("```", 1)[0]
    lines = re.findall(r"`(nvpair-ctl [^`]+)`", readme)
    lines += [line.removeprefix("$ ") for line in block.splitlines() if line.startswith("$ ")]
    return [shlex.split(part) for line in lines for part in line.split("&&")]


def test_the_documented_commands_are_found() -> None:
    assert [c[:2] for c in _documented()] == [
        ["nvpair-ctl", "nodes"],
        ["nvpair-ctl", "drain"],
        ["nvpair-ctl", "nodes"],
        ["nvpair-ctl", "drain"],
        ["nvpair-ctl", "load"],
        ["nvpair-ctl", "uncordon"],
    ]


@on_reactor
async def test_the_documented_commands_run_as_written(reactor: Any, tmp_path: Path) -> None:
    """README's and docs/control.md's ``nvpair-ctl`` lines, against a proxy whose node is
    ``gpu2`` serving ``llama3:8b``, with the channel in ``NVPAIR_CONTROL``: each exits 0."""
    engine = await start_engine(reactor, SimulatedEngine(reactor, models=("llama3:8b",)))
    ran = []
    try:
        async with running_proxy(
            reactor, engine, tmp_path, _unix(tmp_path), "--node", f"gpu2={engine.url}"
        ) as proxy:
            for command in _documented():
                assert command[0] == "nvpair-ctl"
                env = environment(NVPAIR_CONTROL=proxy.control)
                ran.append((command, await proxy.ctl(*command[1:], env=env)))
    finally:
        await engine.stop()
    assert [(command, result.status, result.err) for command, result in ran] == [
        (command, 0, "") for command, _ in ran
    ]
