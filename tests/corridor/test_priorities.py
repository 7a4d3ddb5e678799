"""Priorities over real sockets (docs/behaviour.md §16.3): the priority is read once at the head
from the key and ``X-NVPair-Priority`` — a header can lower a key's priority, never raise it — and
the queue serves interactive requests before batch ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from attrs import evolve
from twisted.internet.defer import CancelledError, Deferred

from nvpair_tw.core import Priority, Settings
from nvpair_tw.selection import Slot, Waiter
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import Clusters, ProxyCluster

pytestmark = pytest.mark.timeout(30)

BATCHER = "sk-batcher-0123456789"
PERSON = "sk-person-9876543210"
KEYS = f"""
[[key]]
name = "batcher"
key = "{BATCHER}"
priority = "batch"

[[key]]
name = "person"
key = "{PERSON}"
"""


def _chat(text: str) -> bytes:
    return json.dumps(
        {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": text}]}
    ).encode()


def _headers(key: str, priority: str | None = None) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {key}"}
    if priority is not None:
        sent["X-NVPair-Priority"] = priority
    return sent


def _events(cluster: ProxyCluster, name: str, count: int) -> Deferred[None]:
    """Fires once the proxy has published ``count`` events called ``name``."""
    seen: Deferred[None] = Deferred()

    def check(_: object = None) -> None:
        if not seen.called and len(cluster.named(name)) >= count:
            seen.callback(None)

    assert cluster.proxy is not None
    cluster.proxy.runtime.shared.bus.subscribe(check, name=f"wait-{name}-{count}")
    check()
    return seen


async def _cluster(clusters: Clusters, tmp_path: Path, reactor: Any) -> ProxyCluster:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    cluster = clusters(ProxyCluster)
    engine = SimulatedEngine(reactor, ("llama3",), chunks=2, chunk_delay=0.2)
    node = await cluster.add_engine("n0", engine)
    await cluster.start_proxy([evolve(node, slots=1)], keys_file=str(keys))
    return cluster


@pytest_twisted.ensureDeferred
async def test_a_header_lowers_a_keys_priority_but_never_raises_it_and_interactive_goes_first(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """One one-slot node, held by a first request; then, queued in this order: the batch key
    asking ``interactive`` (stays batch), the interactive key asking ``batch`` (lowered), the
    interactive key with no header. The slot goes to the last one first, then the batch ones
    oldest first."""
    cluster = await _cluster(clusters, tmp_path, reactor)
    sends: list[tuple[str, str, str | None]] = [("first", PERSON, None)]
    sends += [("raised", BATCHER, "interactive"), ("lowered", PERSON, "batch")]
    sends += [("plain", PERSON, None)]
    answers = []
    for number, (text, key, priority) in enumerate(sends):
        post = cluster.post(_chat(text), headers=_headers(key, priority))
        answers.append(Deferred.fromCoroutine(post))
        if number == 0:
            await _events(cluster, "workload:started", 1)
        else:
            await _events(cluster, "workload:queued", number)
    facade = cluster.facade
    assert (facade.admission.depth_of(Priority.BATCH), facade.admission.queue_depth) == (2, 3)
    results = [await answer for answer in answers]
    assert [status for status, _, _ in results] == [200] * 4
    served = [json.loads(body)["messages"][0]["content"] for body in cluster.received(0)]
    assert served == ["first", "plain", "raised", "lowered"]


@pytest_twisted.ensureDeferred
async def test_a_priority_header_the_proxy_does_not_understand_is_400_bad_priority(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    cluster = await _cluster(clusters, tmp_path, reactor)
    status, body, _ = await cluster.post(_chat("hi"), headers=_headers(PERSON, "urgent"))
    assert (status, json.loads(body)["code"]) == (400, "bad-priority")
    assert cluster.received(0) == []


@pytest_twisted.ensureDeferred
async def test_the_runtime_gives_admission_the_nodes_reserved_slots_and_batch_max_wait(
    reactor: Any, clusters: Clusters
) -> None:
    """``slots_reserved`` from the node and ``--batch-max-wait`` from the settings reach the
    facade's admission: on a two-slot node keeping one, a second batch request waits."""
    cluster = clusters(ProxyCluster)
    node = await cluster.add_engine("n0", SimulatedEngine(reactor, ("llama3",)))
    node = evolve(node, slots=2, slots_reserved=1)
    await cluster.start_proxy([node], Settings(batch_max_wait=5.0))
    admission = cluster.facade.admission
    assert admission.batch_max_wait == 5.0
    held = admission.admit([node], priority=Priority.BATCH)
    assert isinstance(held, Slot)
    waiting = admission.admit([node], priority=Priority.BATCH)
    assert isinstance(waiting, Waiter)
    waiting.bound.addErrback(lambda failure: failure.trap(CancelledError))
    waiting.bound.cancel()
    held.release()
    assert admission.queue_depth == 0 and admission.slots_in_use("n0") == 0
