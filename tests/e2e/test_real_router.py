"""The real ``llama-server`` in router mode behind the openai facade (docs/behaviour.md §17.2): one
server over a models directory holding the SmolLM2 GGUF under two names, ``--models-max 1``.
Inventory, residency, load and unload through the proxy are checked against the server's own
``GET /models`` after every step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.realnodes import ProxyProcess, free_ports
from tests.engines import llamacpp
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine, pytest.mark.timeout(300)]

NAMES = ("smolA", "smolB")


def _router_models(url: str) -> dict[str, str]:
    """The router's own answer: model id -> status value."""
    with urllib.request.urlopen(f"{url}/models", timeout=5) as answer:
        listed = json.load(answer)["data"]
    return {m["id"]: m["status"]["value"] for m in listed}


class Router:
    """The real router on a free port, in its own process group (stopped with its children)."""

    def __init__(self, models_dir: Path, log: Path) -> None:
        try:
            directory = llamacpp.install(log=lambda line: print(line, file=sys.stderr))
            model = llamacpp.model_path()
        except (ollama_engine.EngineError, OSError, subprocess.SubprocessError) as error:
            pytest.fail(f"llama-server could not be built or installed: {error}", pytrace=False)
        for name in NAMES:
            (models_dir / f"{name}.gguf").symlink_to(model)
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        command = llamacpp.router_command(directory, port, models_dir, models_max=1)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                if set(_router_models(self.url)) == set(NAMES):
                    return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the router did not answer /models:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM to the router, which stops the model servers it started."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    where = tmp_path_factory.mktemp("router")
    (where / "models").mkdir()
    server = Router(where / "models", where / "router.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy(router: Router, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("proxy")
    nodes = workdir / "nodes.toml"
    nodes.write_text(f'[[node]]\nid = "r"\nurl = "{router.url}"\nkind = "openai"\n')
    started = ProxyProcess(["--engine", "openai", "--nodes", str(nodes)], workdir)
    try:
        yield started
    finally:
        output = started.stop()
        assert "Traceback" not in output, output


def _node(proxy: ProxyProcess) -> dict[str, Any]:
    [node] = proxy.call("nodes/list")["nodes"]
    return dict(node)


def _proxy_sees(
    proxy: ProxyProcess, router: Router, loaded: list[str], timeout: float = 60
) -> dict[str, Any]:
    """Until the router's own ``/models`` says exactly ``loaded`` are loaded (its
    ``/models/load`` answers while the model is still ``loading``) and the proxy's inventory and
    residency of it are the same; the node as ``nodes/list`` shows it."""
    deadline = time.monotonic() + timeout
    while True:
        own = _router_models(router.url)
        try:
            node = _node(proxy)
        except OSError:  # the proxy is not listening on its control socket yet
            node = {}
        says = sorted(name for name, status in own.items() if status == "loaded")
        same = sorted(node.get("models") or ()) == sorted(own) and node.get("loaded") == says
        if same and says == loaded:
            return node
        if time.monotonic() > deadline:
            pytest.fail(f"the proxy shows {node}, the router says {own}")
        time.sleep(0.2)


def test_the_router_through_the_proxy_matches_its_own_models(
    proxy: ProxyProcess, router: Router
) -> None:
    """Nothing loaded at first; ``model/load`` loads through ``/models/load``; loading the other
    name evicts the first (``--models-max 1``); ``model/unload`` unloads; an inference request
    for a model the router has not loaded is served (the router loads it); after each step the
    proxy's inventory and residency are the router's own ``/models``."""
    _proxy_sees(proxy, router, [])
    loaded = proxy.call("model/load", {"model": "smolA", "timeout": 60}, timeout=70)
    assert loaded["nodes"] == {"r": {"status": "loaded"}}
    _proxy_sees(proxy, router, ["smolA"])
    proxy.call("model/load", {"model": "smolB", "timeout": 60}, timeout=70)
    _proxy_sees(proxy, router, ["smolB"])
    unloaded = proxy.call("model/unload", {"model": "smolB", "timeout": 60}, timeout=70)
    assert unloaded["nodes"] == {"r": {"status": "unloaded"}}
    _proxy_sees(proxy, router, [])
    chat = {"model": "smolA", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-nvpair-node"] == "r"
    _proxy_sees(proxy, router, ["smolA"])
