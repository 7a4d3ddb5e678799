"""Tests for nvpair_tw.ops._usage and ``GET /api/usage``: reports over a real proxy on loopback
with a real SQLite file, bad parameters as JSON errors, and no body ever in the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.http_headers import Headers
from twisted.web.server import Site

from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import StatusBoard, admin_resource
from nvpair_tw.ops._control import ControlMethods
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.testing import SimulatedEngine, http_client, start_engine, start_proxy

pytestmark = pytest.mark.timeout(60)

CANARY = "canary-usage-5d1e-never-stored"


async def proxy_with_usage(reactor: Any, path: Path) -> tuple[Any, Any]:
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    port = engine.port.getHost().port  # type: ignore[attr-defined]
    node = Node("n0", f"http://127.0.0.1:{port}")
    proxy = await start_proxy(reactor, {"ollama": [node]}, usage_db=str(path))
    inventory = proxy.runtime.facades["ollama"].inventory
    for _ in range(1000):  # bounded: the first inventory poll of a loopback engine
        if inventory.known("n0"):
            break
        await deferLater(reactor, 0.005, lambda: None)
    return engine, proxy


async def chat(reactor: Any, proxy: Any) -> int:
    body = {
        "model": "llama3:latest",
        "stream": False,
        "messages": [{"role": "user", "content": CANARY}],
    }
    response = await http_client(reactor).post(
        proxy.url() + "/api/chat",
        data=json.dumps(body).encode(),
        headers=Headers({b"x-canary": [CANARY.encode()]}),
    )
    await treq.content(response)
    return int(response.code)


@pytest_twisted.ensureDeferred
async def test_usage_report_answers_rows_and_the_database_never_holds_a_body(
    reactor: Any, tmp_path: Path
) -> None:
    """Two chats → one row by model and node; the file (and its WAL) never contains the canary."""
    path = tmp_path / "usage.sqlite3"
    engine, proxy = await proxy_with_usage(reactor, path)
    try:
        assert await chat(reactor, proxy) == 200
        assert await chat(reactor, proxy) == 200
        methods = ControlMethods(proxy.runtime)
        line = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "usage/report",
                "params": {"since": "1h", "by": ["model", "node"]},
            }
        ).encode()
        pending = methods.handle_line(line)
        assert isinstance(pending, Deferred)
        answer = await pending
        assert answer is not None
        [row] = answer["result"]["rows"]
        assert row["model"] == "llama3:latest" and row["node"] == "n0"
        assert row["requests"] == 2 and row["errors"] == 0
        assert answer["result"]["scope"] == "local"
    finally:
        await proxy.stop()
        await engine.port.stopListening()
    held = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("usage"))
    assert b"llama3:latest" in held  # the minute is there ...
    assert CANARY.encode() not in held  # ... and nothing of the request


@pytest_twisted.ensureDeferred
async def test_bad_parameters_are_invalid_params_on_the_control_channel(
    reactor: Any, tmp_path: Path
) -> None:
    """-32602 with a message, never a traceback."""
    engine, proxy = await proxy_with_usage(reactor, tmp_path / "u.sqlite3")
    try:
        methods = ControlMethods(proxy.runtime)
        for params in [
            {"since": "last tuesday"},
            {"by": ["week"]},
            {"since": "1h", "until": "2h"},
            {"by": 7},
            {"colour": "red"},
        ]:
            line = json.dumps(
                {"jsonrpc": "2.0", "id": 2, "method": "usage/report", "params": params}
            ).encode()
            answer = methods.handle_line(line)
            assert isinstance(answer, dict), params
            assert answer["error"]["code"] == -32602, params
            assert "Traceback" not in answer["error"]["message"]
    finally:
        await proxy.stop()
        await engine.port.stopListening()


@pytest_twisted.ensureDeferred
async def test_admin_api_usage_is_json_with_json_errors(reactor: Any, tmp_path: Path) -> None:
    """``GET /api/usage?since=24h&by=key,model`` → rows; a bad ``by`` → 400 ``invalid-params``."""
    engine, proxy = await proxy_with_usage(reactor, tmp_path / "u.sqlite3")
    runtime = proxy.runtime
    board = StatusBoard(runtime)
    metrics = ProxyMetrics(runtime)
    root = admin_resource(runtime, metrics, board, lambda _e: True, lambda _r: None)
    port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")
    base = f"http://127.0.0.1:{port.getHost().port}"
    try:
        assert await chat(reactor, proxy) == 200
        client = http_client(reactor)
        response = await client.get(base + "/api/usage?since=24h&by=key,model")
        document = json.loads(await treq.content(response))
        assert response.code == 200
        assert document["rows"] == [
            {
                "key": "local",
                "model": "llama3:latest",
                "requests": 1,
                "errors": 0,
                **{
                    k: document["rows"][0][k]
                    for k in ("prompt_tokens", "completion_tokens", "unknown_tokens")
                },
                "cached_tokens": 0,  # the engine said nothing of a cache:
                "unknown_cached": 1,  # one request whose cached count is unknown
            }
        ]
        response = await client.get(base + "/api/usage?by=week")
        document = json.loads(await treq.content(response))
        assert response.code == 400 and document["code"] == "invalid-params"
        assert "week" in document["error"]
    finally:
        await port.stopListening()
        board.close()
        metrics.close()
        await proxy.stop()
        await engine.port.stopListening()
