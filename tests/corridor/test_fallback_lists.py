"""A model served only through its fallbacks is listed (docs/behaviour.md §16.2), over real sockets
to simulated Ollama nodes: a client that lists the models and then asks for one sees every model it
would be served, under the name it asks for."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import Clusters, http_client
from tests.corridor.catalogued import CataloguedCluster

pytestmark = pytest.mark.timeout(30)

TABLES = """
[[model]]
name = "big"
fallbacks = ["small"]
"""


async def fleet(
    reactor: Any, clusters: Clusters, tmp_path: Path, models: dict[str, str], **kw: Any
) -> CataloguedCluster:
    """One Ollama node per ``id: model`` (loaded) behind the ollama facade, with :data:`TABLES`."""
    engines = {
        i: SimulatedEngine(reactor, (m,), kind="ollama", loaded=[m]) for i, m in models.items()
    }
    cluster = clusters(CataloguedCluster)
    await cluster.start_catalogued(engines, TABLES, tmp_path, **kw)
    return cluster


async def listed(
    reactor: Any, cluster: CataloguedCluster, path: str, headers: dict[str, str] | None = None
) -> Any:
    sent: dict[bytes | str, bytes | str] = dict((headers or {}).items())
    response = await http_client(reactor).get(cluster.url + path, headers=sent)
    assert response.code == 200
    return json.loads(await treq.content(response))


@pytest_twisted.ensureDeferred
async def test_a_model_only_a_fallback_serves_is_listed_with_the_fields_clients_read(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    cluster = await fleet(reactor, clusters, tmp_path, {"s": "small"})
    tags = (await listed(reactor, cluster, "/api/tags"))["models"]
    assert [m["name"] for m in tags] == ["small", "big"]
    big = tags[1]
    assert big["model"] == "big"  # the CLI prints digest[:12]: that of a synthesised record
    assert big["digest"] == hashlib.sha256(b"big:latest").hexdigest()
    assert big["size"] == 0 and big["details"] == {} and big["modified_at"].endswith("Z")
    models = (await listed(reactor, cluster, "/v1/models"))["data"]
    assert [m["id"] for m in models] == ["small", "big"]
    assert models[1]["object"] == "model" and models[1]["owned_by"] == "nvpair"
    status, body, _ = await cluster.post(
        b'{"model":"big","messages":[{"role":"user","content":"hi"}],"stream":false}'
    )
    assert status == 200 and json.loads(body)["model"] == "small"  # what listing it promised


@pytest_twisted.ensureDeferred
async def test_a_model_with_no_fallback_a_node_lists_is_not_listed(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    cluster = await fleet(reactor, clusters, tmp_path, {"o": "other"})
    tags = (await listed(reactor, cluster, "/api/tags"))["models"]
    assert [m["name"] for m in tags] == ["other"]


@pytest_twisted.ensureDeferred
async def test_a_model_a_node_holds_is_listed_once_as_the_node_lists_it(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    cluster = await fleet(reactor, clusters, tmp_path, {"b": "big", "s": "small"})
    tags = (await listed(reactor, cluster, "/api/tags"))["models"]
    assert sorted(m["name"] for m in tags) == ["big", "small"]
    assert next(m for m in tags if m["name"] == "big")["size"] > 0  # the node's own record


@pytest_twisted.ensureDeferred
async def test_loaded_lists_and_one_nodes_list_show_no_fallback_only_model(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """``/api/ps`` lists what is loaded, and a list of one named node what that node holds (a
    request naming its node never falls back)."""
    cluster = await fleet(reactor, clusters, tmp_path, {"s": "small"})
    named = (await listed(reactor, cluster, "/api/tags", {"X-NVPair-Node": "s"}))["models"]
    assert [m["name"] for m in named] == ["small"]
    loaded = (await listed(reactor, cluster, "/api/ps"))["models"]
    assert [m["name"] for m in loaded] == ["small"]


@pytest_twisted.ensureDeferred
async def test_a_key_sees_the_model_only_when_its_scope_allows_it_and_a_listed_fallback(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """A key's scope (§12.1): a fallback outside it is skipped, so it lists nothing either."""
    keys = tmp_path / "keys.toml"
    scopes = {"both": '["big", "small"]', "asked": '["big"]', "fallback": '["small"]'}
    keys.write_text(
        "".join(
            f'[[key]]\nname = "{n}"\nkey = "sk-{n}-0123456789"\nmodels = {m}\n'
            for n, m in scopes.items()
        )
    )
    keys.chmod(0o600)
    cluster = await fleet(reactor, clusters, tmp_path, {"s": "small"}, keys_file=str(keys))
    seen = {}
    for name in scopes:
        auth = {"Authorization": f"Bearer sk-{name}-0123456789"}
        seen[name] = [
            m["name"] for m in (await listed(reactor, cluster, "/api/tags", auth))["models"]
        ]
    assert seen == {"both": ["small", "big"], "asked": [], "fallback": ["small"]}
