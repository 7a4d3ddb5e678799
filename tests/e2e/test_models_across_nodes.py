"""Models across nodes on real Ollama (docs/behaviour.md §13.2): create, copy and delete run on two
real Ollama nodes at once through ``X-NVPair-Node: *`` (or a list), and each node's own
``/api/tags`` shows the model there, then gone; a delete without the header reaches every owner.

Each node has a model store of its own (``OLLAMA_MODELS`` in a temporary directory, ``smollm2``
registered there), so a model made on one node is not on the other's disk: a call targeted at one
node shows on that node alone. The proxy is a ``twist nvpair`` subprocess.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.realnodes import MODEL, ProxyProcess, RealOllama, real_nodes

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

CREATED = "smollm2-fanout-created"
COPIED = "smollm2-fanout-copied"
ONLY_A = "smollm2-fanout-only-a"


def tags(node: RealOllama) -> set[str]:
    """The model names a node itself lists (straight from the node, not through the proxy)."""
    listed = httpx.get(f"{node.url}/api/tags", timeout=30).json()["models"]
    return {m["model"] for m in listed}


def ndjson(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.split(b"\n") if line.strip()]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[RealOllama], ProxyProcess]]:
    """Two real Ollama nodes with separate stores, and a proxy over them (a, b)."""
    stores = [tmp_path / "store-a", tmp_path / "store-b"]
    with real_nodes([{"OLLAMA_MODELS": str(store)} for store in stores]) as nodes:
        lines = []
        for name, node in zip("ab", nodes, strict=True):
            lines += ["[[node]]", f'id = "{name}"', f'url = "{node.url}"', ""]
        listing = tmp_path / "nodes.toml"
        listing.write_text("\n".join(lines))
        workdir = tmp_path / "proxy"
        workdir.mkdir()
        args = ["--engine", "ollama", "--nodes", str(listing), "--inventory-interval", "1s"]
        proxy = ProxyProcess(args, workdir)
        try:
            proxy.wait_ready(2)
            yield nodes, proxy
        finally:
            output = proxy.stop()
            assert "Traceback" not in output, output


def wait_for_owners(proxy: ProxyProcess, model: str, count: int, timeout: float = 30) -> None:
    """Until the proxy's inventory shows ``model`` on ``count`` nodes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = proxy.call("nodes/list")["nodes"]
        if sum(1 for n in listed if any(model in m for m in n.get("models") or ())) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"{model} never showed on {count} nodes: {proxy.call('nodes/list')}")


def test_create_copy_and_delete_run_on_both_real_nodes(
    cluster: tuple[list[RealOllama], ProxyProcess],
) -> None:
    """On two real Ollama nodes: a copy targeted at a lands on a alone (the stores are separate);
    create on ``*`` streams both nodes' progress and ends in success, the model on both; copy on
    ``a,b`` answers 200 per node; delete on ``*`` removes it from both and a second one is 502
    with each node's own 404 text; a pull of a model no registry serves is ``partial`` with each
    node's own error line; delete without the header goes to the owners and removes it."""
    (a, b), proxy = cluster
    timings: dict[str, float] = {}
    with httpx.Client(base_url=proxy.url, timeout=300) as client:

        def timed(name: str, *args: Any, **kw: Any) -> httpx.Response:
            started = time.monotonic()
            response = client.request(*args, **kw)
            timings[name] = time.monotonic() - started
            return response

        alone = timed(
            "copy-a",
            "POST",
            "/api/copy",
            json={"source": MODEL, "destination": ONLY_A},
            headers={"x-nvpair-node": "a"},
        )
        assert alone.status_code == 200
        assert f"{ONLY_A}:latest" in tags(a)
        assert f"{ONLY_A}:latest" not in tags(b)

        created = timed(
            "create",
            "POST",
            "/api/create",
            json={"model": CREATED, "from": MODEL},
            headers={"x-nvpair-node": "*"},
        )
        assert created.status_code == 200
        assert created.headers["content-type"] == "application/x-ndjson"
        *progress, final = ndjson(created.content)
        assert final == {"status": "success", "nodes": {"a": "success", "b": "success"}}, final
        for node_id in "ab":
            own = [line for line in progress if line.get("nvpair_node") == node_id]
            assert own and own[-1]["status"] == "success"
        assert f"{CREATED}:latest" in tags(a) and f"{CREATED}:latest" in tags(b)

        copied = timed(
            "copy",
            "POST",
            "/api/copy",
            json={"source": CREATED, "destination": COPIED},
            headers={"x-nvpair-node": "a,b"},
        )
        assert copied.status_code == 200
        assert copied.json() == {
            "status": "success",
            "nodes": {"a": {"status": 200}, "b": {"status": 200}},
        }
        assert f"{COPIED}:latest" in tags(a) and f"{COPIED}:latest" in tags(b)

        deleted = timed(
            "delete",
            "DELETE",
            "/api/delete",
            json={"model": CREATED},
            headers={"x-nvpair-node": "*"},
        )
        assert (deleted.status_code, deleted.json()["status"]) == (200, "success")
        assert f"{CREATED}:latest" not in tags(a) | tags(b)

        again = timed(
            "delete-again",
            "DELETE",
            "/api/delete",
            json={"model": CREATED},
            headers={"x-nvpair-node": "*"},
        )
        assert again.status_code == 502
        for node_id in "ab":
            part = again.json()["nodes"][node_id]
            assert part["status"] == 404
            assert "not found" in part["error"], part

        pulled = timed(
            "pull-missing",
            "POST",
            "/api/pull",
            json={"model": "nvpair-no-such-model"},
            headers={"x-nvpair-node": "*"},
        )
        assert pulled.status_code == 200
        *progress, final = ndjson(pulled.content)
        assert final["status"] == "partial"
        for node_id in "ab":
            # each node's own error line (the registry is unreachable, or has no such model)
            errors = [
                p["error"] for p in progress if p.get("nvpair_node") == node_id and "error" in p
            ]
            summary = final["nodes"][node_id]
            assert errors and errors[0].startswith(summary.rstrip("…")), (errors, final)

        wait_for_owners(proxy, COPIED, 2)
        owners = timed("delete-owners", "DELETE", "/api/delete", json={"model": COPIED})
        assert owners.status_code == 200
        assert set(owners.json()["nodes"]) == {"a", "b"}
        assert f"{COPIED}:latest" not in tags(a) | tags(b)
    print("timings (s):", {k: round(v, 2) for k, v in timings.items()})


def loaded(node: RealOllama) -> set[str]:
    """What a node itself says it has in memory (its own ``/api/ps``)."""
    listed = httpx.get(f"{node.url}/api/ps", timeout=30).json()["models"]
    return {m["model"] for m in listed}


def settles(nodes: list[RealOllama], expected: list[set[str]], timeout: float = 30) -> None:
    """Until each node's own ``/api/ps`` shows ``expected`` (bounded). Ollama answers an unload
    when it has expired the model's runner, and lists the model until the runner has stopped."""
    deadline = time.monotonic() + timeout
    while (seen := [loaded(node) for node in nodes]) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"/api/ps showed {seen}, not {expected}, within {timeout:.0f} s")
        time.sleep(0.1)


def test_model_load_and_unload_on_both_real_nodes(
    cluster: tuple[list[RealOllama], ProxyProcess],
) -> None:
    """``model/load`` on the control channel loads smollm2 on every owner (each node's own
    ``/api/ps`` shows it), ``model/unload`` empties them; ``nodes`` limits it to one node
    (docs/behaviour.md §13.3)."""
    nodes, proxy = cluster
    for node in nodes:
        httpx.post(f"{node.url}/api/generate", json={"model": MODEL, "keep_alive": 0}, timeout=60)
    settles(nodes, [set(), set()])
    answer = proxy.call("model/load", {"model": MODEL, "keep_alive": "10m"}, timeout=120)
    assert answer == {
        "model": MODEL,
        "nodes": {"a": {"status": "loaded"}, "b": {"status": "loaded"}},
    }
    assert [loaded(node) for node in nodes] == [{f"{MODEL}:latest"}] * 2  # loaded when answered
    answer = proxy.call("model/unload", {"model": MODEL, "nodes": ["b"]}, timeout=120)
    assert answer["nodes"] == {"b": {"status": "unloaded"}}
    settles(nodes, [{f"{MODEL}:latest"}, set()])
    answer = proxy.call("model/unload", {"model": MODEL}, timeout=120)
    assert answer["nodes"] == {"a": {"status": "unloaded"}, "b": {"status": "unloaded"}}
    settles(nodes, [set(), set()])
