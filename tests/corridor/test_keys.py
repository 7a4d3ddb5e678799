"""Named keys in the corridor (docs/behaviour.md §12.1), in memory on one clock: 403
``model-not-allowed`` and 429 ``rate-limited`` without a workload or a node contacted, model
lists showing only a key's models, and the key's name on the request record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IAddress
from twisted.internet.task import Clock
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

from nvpair_tw.corridor._driver import _tokens
from nvpair_tw.corridor._record import Facts
from nvpair_tw.testing import MemoryCluster, SimulatedEngine
from tests.helpers import chat

pytestmark = pytest.mark.timeout(30)

Make = Callable[..., MemoryCluster]
ALICE = "sk-alice-0123456789"
BOB = "sk-bob-9876543210"
ENV = "sk-env-5555555555"

KEYS = f"""
[[key]]
name = "alice"
key = "{ALICE}"
models = ["llama3*"]
requests_per_minute = 3
max_concurrent = 1

[[key]]
name = "bob"
key = "{BOB}"
"""


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys_path(tmp_path: Path) -> str:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS)
    path.chmod(0o600)
    return str(path)


def cluster_with(
    memory_cluster: Make, clock: Clock, keys_path: str, **engine: Any
) -> MemoryCluster:
    engines = {
        "a": SimulatedEngine(clock, ("llama3:latest", "qwen2.5:7b", "llama3.1:8b"), **engine)
    }
    return memory_cluster(
        clock, engines, keys_file=keys_path, environ={"NVPAIR_PROXY_API_KEYS": ENV}
    )


def requests_of(cluster: MemoryCluster) -> list[Mapping[str, Any]]:
    return [e.payload for e in cluster.events if e.name == "proxy/request"]


def workloads_of(cluster: MemoryCluster) -> list[str]:
    return [e.name for e in cluster.events if e.name.startswith("workload:")]


def test_a_model_outside_the_keys_scope_is_403_without_contacting_a_node(
    memory_cluster: Make, keys_path: str
) -> None:
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path)
    response = cluster.fetch(
        "POST", "/api/chat", json=chat("qwen2.5:7b", stream=False), headers=auth(ALICE)
    )
    assert response.status == 403
    assert response.json() == {
        "error": "this key may not use model 'qwen2.5:7b'",
        "code": "model-not-allowed",
    }
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    assert [r for r in engine.received if r.method == b"POST"] == []
    assert workloads_of(cluster) == []
    [record] = requests_of(cluster)
    assert record["status"] == 403 and record["error"] == "model-not-allowed"
    assert record["key"] == "alice"
    # The same model is served to a key without a scope, and to a loopback caller without one.
    assert (
        cluster.fetch(
            "POST", "/api/chat", json=chat("qwen2.5:7b", stream=False), headers=auth(BOB)
        ).status
        == 200
    )
    assert cluster.fetch("POST", "/api/chat", json=chat("qwen2.5:7b", stream=False)).status == 200
    assert [r["key"] for r in requests_of(cluster)] == ["alice", "bob", "local"]


def test_a_model_routed_request_is_scoped_too(memory_cluster: Make, keys_path: str) -> None:
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path)
    refused = cluster.fetch("POST", "/api/show", json={"model": "qwen2.5:7b"}, headers=auth(ALICE))
    assert refused.status == 403 and refused.json()["code"] == "model-not-allowed"
    allowed = cluster.fetch(
        "POST", "/api/show", json={"model": "llama3:latest"}, headers=auth(ALICE)
    )
    assert allowed.status != 403


def test_over_requests_per_minute_is_429_with_retry_after_and_no_node(
    memory_cluster: Make, keys_path: str
) -> None:
    clock = Clock()
    clock.advance(60 * 1000 + 20)
    cluster = cluster_with(memory_cluster, clock, keys_path)
    for _ in range(3):
        assert (
            cluster.fetch(
                "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
            ).status
            == 200
        )
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    sent = len(engine.received)
    before = len(workloads_of(cluster))
    limited = cluster.fetch(
        "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
    )
    assert limited.status == 429
    assert limited.header("retry-after") == "40"
    assert limited.json()["code"] == "rate-limited"
    assert "alice" in limited.json()["error"] and ALICE not in limited.body.decode()
    assert len(engine.received) == sent and len(workloads_of(cluster)) == before
    record = requests_of(cluster)[-1]
    assert (record["status"], record["error"], record["key"]) == (429, "rate-limited", "alice")
    # Other keys are not limited by alice's count; the next minute alice is served again.
    assert (
        cluster.fetch(
            "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(BOB)
        ).status
        == 200
    )
    clock.advance(40)
    assert (
        cluster.fetch(
            "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
        ).status
        == 200
    )


def test_max_concurrent_holds_while_a_stream_runs_and_frees_at_its_end(
    memory_cluster: Make, keys_path: str
) -> None:
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path, chunk_delay=1.0)
    streaming = cluster.result(
        cluster.request(
            "POST", "/api/chat", json=chat("llama3:latest", stream=True), headers=auth(ALICE)
        )
    )
    assert streaming.status == 200 and streaming.ended is None
    second = cluster.fetch(
        "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
    )
    assert second.status == 429 and second.header("retry-after") == "1"
    assert cluster.runtime.shared.limiter.in_flight("alice") == 1
    cluster.advance(10)
    assert streaming.complete
    assert cluster.runtime.shared.limiter.in_flight("alice") == 0
    third = cluster.result(
        cluster.request(
            "POST", "/api/chat", json=chat("llama3:latest", stream=True), headers=auth(ALICE)
        )
    )
    assert third.status == 200
    cluster.advance(10)
    assert third.complete


def test_a_client_that_leaves_frees_its_slot(memory_cluster: Make, keys_path: str) -> None:
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path, chunk_delay=1.0)
    streaming = cluster.result(
        cluster.request(
            "POST", "/api/chat", json=chat("llama3:latest", stream=True), headers=auth(ALICE)
        )
    )
    assert cluster.runtime.shared.limiter.in_flight("alice") == 1
    streaming.hang_up()
    cluster.advance(5)
    assert cluster.runtime.shared.limiter.in_flight("alice") == 0


def test_model_lists_show_only_the_keys_models(memory_cluster: Make, keys_path: str) -> None:
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path)
    scoped = cluster.fetch("GET", "/api/tags", headers=auth(ALICE))
    assert scoped.status == 200
    assert sorted(m["name"] for m in scoped.json()["models"]) == ["llama3.1:8b", "llama3:latest"]
    everything = cluster.fetch("GET", "/api/tags", headers=auth(BOB))
    assert len(everything.json()["models"]) == 3
    assert len(cluster.fetch("GET", "/api/tags").json()["models"]) == 3
    openai = cluster.fetch("GET", "/v1/models", headers=auth(ALICE))
    assert openai.status == 200
    assert sorted(m["id"] for m in openai.json()["data"]) == ["llama3.1:8b", "llama3:latest"]
    assert [r["key"] for r in requests_of(cluster)][:3] == ["alice", "bob", "local"]


def test_an_environment_key_is_named_by_its_digest_on_the_record(
    memory_cluster: Make, keys_path: str
) -> None:
    import hashlib

    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path)
    assert (
        cluster.fetch(
            "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ENV)
        ).status
        == 200
    )
    [record] = requests_of(cluster)
    assert record["key"] == "key-" + hashlib.sha256(ENV.encode()).hexdigest()[:8]


def test_the_tokens_handed_to_the_limiter_are_prompt_plus_completion() -> None:
    facts = Facts("r1", "ollama", "POST", "/api/chat", 0.0)
    assert _tokens(facts.record(1.0, 200, "a", None)) is None
    facts.prompt_tokens = 12
    assert _tokens(facts.record(1.0, 200, "a", None)) == 12
    facts.completion_tokens = 30
    assert _tokens(facts.record(1.0, 200, "a", None)) == 42


class _ForeignPeer(ProtocolWrapper):
    """Makes the facade see a caller from another host (the connection stays in memory)."""

    def getPeer(self) -> IAddress:
        return IPv4Address("TCP", "192.0.2.10", 40000)


def test_a_caller_from_another_host_is_named_before_its_key_is_stripped(
    memory_cluster: Make, keys_path: str
) -> None:
    """The key names the caller (and its scope applies) though it never reaches the node."""
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path)
    wrapped = WrappingFactory(cluster.runtime.site_for("ollama"))
    wrapped.protocol = _ForeignPeer
    port = int(cluster.facade_url().rsplit(":", 1)[1])
    cluster.network.add("ollama.facade.test", port, wrapped)
    assert (
        cluster.fetch("POST", "/api/chat", json=chat("llama3:latest", stream=False)).status == 401
    )
    served = cluster.fetch(
        "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers={"X-Api-Key": ALICE}
    )
    assert served.status == 200
    refused = cluster.fetch(
        "POST", "/api/chat", json=chat("qwen2.5:7b", stream=False), headers={"X-Api-Key": ALICE}
    )
    assert refused.status == 403
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    [forwarded] = [r for r in engine.received if r.method == b"POST"]
    assert b"x-api-key" not in forwarded.headers
    assert [r.get("key") for r in requests_of(cluster)] == [None, "alice", "alice"]


def test_tokens_per_minute_counts_the_engines_own_tokens_and_refuses_the_next_minute_s_excess(
    memory_cluster: Make, tmp_path: Path
) -> None:
    """§12.1 with §12.2: the engine's counts (prompt 1 + completion 3 per answer here) are
    counted when a request ends; once a key's minute holds its ``tokens_per_minute``, the next
    request is 429 with ``Retry-After`` until the window turns."""
    path = tmp_path / "keys.toml"
    path.write_text(f'[[key]]\nname = "carol"\nkey = "{ALICE}"\ntokens_per_minute = 8\n')
    path.chmod(0o600)
    clock = Clock()
    engines = {"a": SimulatedEngine(clock, ("llama3:latest",), kind="ollama")}
    cluster = memory_cluster(clock, engines, keys_file=str(path), environ={})
    statuses = [
        cluster.fetch(
            "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
        ).status
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    counted = [(r["prompt_tokens"], r["completion_tokens"]) for r in requests_of(cluster)[:2]]
    assert counted == [(1, 3), (1, 3)]
    refused = cluster.fetch(
        "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
    )
    assert refused.json()["code"] == "rate-limited" and int(refused.header("retry-after") or 0) >= 1
    clock.advance(60)
    assert (
        cluster.fetch(
            "POST", "/api/chat", json=chat("llama3:latest", stream=False), headers=auth(ALICE)
        ).status
        == 200
    )


def test_a_model_outside_the_scope_is_403_even_when_no_node_has_it(
    memory_cluster: Make, keys_path: str
) -> None:
    """The scope is checked before the capability gate: a key cannot learn from a 404/502 which
    models the fleet has."""
    clock = Clock()
    cluster = cluster_with(memory_cluster, clock, keys_path)
    response = cluster.fetch(
        "POST", "/api/chat", json=chat("nobody-has-this", stream=False), headers=auth(ALICE)
    )
    assert response.status == 403 and response.json()["code"] == "model-not-allowed"
