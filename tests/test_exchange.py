"""One request's walk and its conclusion (nvpair_tw.exchange), in memory: what each relay outcome
does to the workload, the affinity table and the record, and the small parsers at the door."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from twisted.internet.task import Clock

from nvpair_tw.exchange import model_of, target_of
from nvpair_tw.settings import Settings
from nvpair_tw.simulated import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]
TURN = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def cluster_of(memory_cluster: Make, **engines: SimulatedEngine) -> tuple[MemoryCluster, Clock]:
    clock = next(iter(engines.values())).clock
    assert isinstance(clock, Clock)
    return memory_cluster(clock, dict(engines)), clock


def terminal(cluster: MemoryCluster) -> list[tuple[str, str | None, str | None]]:
    """(event, state, error) of every terminal workload event."""
    return [
        (e.name, e.payload["workload"]["state"], e.payload["workload"]["error"])
        for e in cluster.events
        if e.name in ("workload:completed", "workload:errored")
    ]


def test_a_finished_stream_completes_the_workload_and_records_affinity(
    memory_cluster: Make,
) -> None:
    """FINISHED with the terminal frame: completed, and turn 2 of the conversation is warm."""
    clock = Clock()
    cluster, _ = cluster_of(memory_cluster, a=SimulatedEngine(clock), b=SimulatedEngine(clock))
    first = cluster.fetch("POST", "/api/chat", json=TURN)
    assert first.status == 200 and first.complete
    assert terminal(cluster) == [("workload:completed", "completed", None)]
    served = first.header("x-nvpair-node")
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    follow_up = {**TURN, "messages": said}
    second = cluster.fetch("POST", "/api/chat", json=follow_up)
    assert second.header("x-nvpair-node") == served
    assert cluster.named("proxy/request")[1]["cache_affinity"] is True


def test_a_truncated_stream_fails_the_workload_and_records_no_affinity(
    memory_cluster: Make,
) -> None:
    """TRUNCATED: the workload fails with the drop, the record says so, nothing becomes warm."""
    clock = Clock()
    dropping = SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM), chunks=4)
    cluster, _ = cluster_of(memory_cluster, a=dropping)
    response = cluster.fetch("POST", "/api/chat", json=TURN)
    assert response.truncated
    assert terminal(cluster) == [("workload:errored", "failed", "upstream dropped mid-stream")]
    [record] = cluster.named("proxy/request")
    assert (record["node_id"], record["error"]) == ("a", "upstream dropped mid-stream")
    assert len(cluster.facade().affinity) == 0


def test_a_non_2xx_answer_relayed_to_the_end_fails_the_workload(memory_cluster: Make) -> None:
    """A 400 from the last node is the client's answer; its workload fails naming the status."""
    clock = Clock()
    cluster, _ = cluster_of(
        memory_cluster, a=SimulatedEngine(clock, policy=always(Behaviour.STATUS_400))
    )
    response = cluster.fetch("POST", "/api/chat", json=TURN)
    assert response.status == 400 and response.complete
    assert terminal(cluster) == [("workload:errored", "failed", "upstream answered 400")]
    assert cluster.named("proxy/request")[0]["error"] is None


def test_exhausted_candidates_answer_502_and_fail_the_workload(memory_cluster: Make) -> None:
    """Every candidate dropped before the first byte: 502 JSON, the workload fails with the reason."""
    clock = Clock()
    drop = always(Behaviour.DROP_AFTER_HEADERS)
    cluster, _ = cluster_of(
        memory_cluster, a=SimulatedEngine(clock, policy=drop), b=SimulatedEngine(clock, policy=drop)
    )
    response = cluster.fetch("POST", "/api/chat", json=TURN)
    assert response.status == 502 and response.json()["code"] == "upstream-error"
    [(name, state, error)] = terminal(cluster)
    assert (name, state) == ("workload:errored", "failed") and error == response.json()["error"]
    assert [a["outcome"] for a in cluster.named("proxy/request")[0]["attempts"]] == [
        "dropped",
        "dropped",
    ]


def test_every_request_releases_its_reservation(memory_cluster: Make) -> None:
    """Whatever the end (served, truncated), the ledger holds nothing afterwards."""
    clock = Clock()
    cluster, _ = cluster_of(
        memory_cluster,
        a=SimulatedEngine(clock),
        b=SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM)),
    )
    for _ in range(4):
        cluster.fetch("POST", "/api/chat", json=TURN)
    ledger = cluster.runtime.shared.ledger
    assert ledger.reservations("a") == ledger.reservations("b") == 0


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (b'{"model": "llama3"}', "llama3"),
        (b'  {"model": " llama3 "}', " llama3 "),
        (b'{"model": ""}', None),
        (b'{"model": 7}', None),
        (b"[1, 2]", None),
        (b"not json", None),
        (b'{"model": "x"' + b"]" * 10, None),
        (b"[" * 100_000, None),
    ],
)
def test_model_of_takes_only_a_non_empty_top_level_string(body: bytes, model: str | None) -> None:
    """Only a top-level, non-blank string ``model`` gates a request; anything else is not gated."""
    assert model_of(body)[0] == model


def test_model_of_returns_the_parsed_object_for_affinity() -> None:
    """The parsed body comes back with the model, so affinity does not parse it twice."""
    assert model_of(json.dumps(TURN).encode()) == ("llama3", TURN)


@pytest.mark.parametrize(
    ("uri", "target"),
    [
        (b"/api/tags?x=1", b"/api/tags?x=1"),
        (b"/api/tags#frag", b"/api/tags"),
        (b"http://proxy:11435/v1/models?a=b", b"/v1/models?a=b"),
        (b"http://proxy:11435", b"/"),
    ],
)
def test_target_of_keeps_the_raw_path_and_query(uri: bytes, target: bytes) -> None:
    """Origin-form passes as sent (fragment dropped); absolute-form is reduced to path and query."""
    assert target_of(uri) == target


def test_target_of_refuses_an_unparseable_authority() -> None:
    """An absolute-form target whose authority does not parse is a ValueError (the facade's 400)."""
    with pytest.raises(ValueError):
        target_of(b"http://[::1/x")


def test_a_truncated_whole_answer_records_no_affinity(memory_cluster: Make) -> None:
    """A non-streaming answer cut before the end of its framing is TRUNCATED: however much JSON
    arrived, the node is not remembered as warm (affinity needs a clean end)."""
    clock = Clock()
    dropping = SimulatedEngine(clock, policy=always(Behaviour.DROP_MID_STREAM))
    cluster = memory_cluster(clock, {"a": dropping}, settings=Settings(assemble={"ollama": False}))
    response = cluster.fetch("POST", "/v1/chat/completions", json={**TURN, "stream": False})
    assert response.truncated
    assert terminal(cluster) == [("workload:errored", "failed", "upstream dropped mid-stream")]
    assert len(cluster.facade().affinity) == 0
