"""A simulated machine shared by the requests it runs (``SimulatedEngine(kind=...,
pace=Machine(...))``): alone a request goes at the machine's pace; two at once each go at half of
it, and say so in the durations they state; with ``parallel`` 1 the second waits its turn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.simulated import Machine, Pace, SimulatedEngine
from nvpair_tw.simulated._pace import ANSWER
from nvpair_tw.testing import MemoryCluster, MemoryResponse

Make = Callable[..., MemoryCluster]
ASK = [{"role": "user", "content": "Why is the sky blue?"}]  # five prompt tokens
PACE = Pace(decode=10.0, prefill=50.0, load=0.1)
TOKENS = len(ANSWER.split(" "))
CHAT = {"model": "llama3", "messages": ASK}


def _on(memory_cluster: Make, parallel: int = 0) -> tuple[MemoryCluster, Machine]:
    clock = Clock()
    machine = Machine(clock, PACE, parallel)
    engine = SimulatedEngine(clock, kind="ollama", pace=machine)
    return memory_cluster(clock, {"e": engine}, facades=()), machine


def _send(cluster: MemoryCluster, count: int, body: dict[str, Any]) -> list[MemoryResponse]:
    """``count`` requests at once, straight to the engine; their answers once all have ended."""
    got: list[MemoryResponse] = []
    for _ in range(count):
        cluster.request("POST", "/api/chat", json=body, node="e").addCallback(got.append)
    cluster.advance(60)
    assert len(got) == count and all(r.complete for r in got)
    return got


def _final(response: MemoryResponse) -> dict[str, Any]:
    last: dict[str, Any] = json.loads(response.body.splitlines()[-1])
    return last


def test_a_request_alone_goes_at_the_machines_pace(memory_cluster: Make) -> None:
    """The first word after load + prompt + one token, then one every 1 / decode; the closing line
    states the pace's own durations."""
    cluster, _ = _on(memory_cluster)
    [response] = _send(cluster, 1, CHAT)
    assert response.headers_at == pytest.approx(0.1 + 5 / 50 + 0.1)
    assert response.arrivals[-1] == pytest.approx(0.2 + TOKENS * 0.1)
    final = _final(response)
    assert (final["eval_count"], final["prompt_eval_count"]) == (TOKENS, 5)
    assert final["eval_duration"] == pytest.approx(TOKENS * 0.1e9)
    assert final["prompt_eval_duration"] == pytest.approx(0.1e9)


def test_two_requests_at_once_share_it_and_state_the_rate_they_got(memory_cluster: Make) -> None:
    """Each goes at half the pace: both end at twice the time one alone takes, and each states
    half the decode rate (``eval_count`` over ``eval_duration``)."""
    cluster, machine = _on(memory_cluster)
    first, second = _send(cluster, 2, CHAT)
    for response in (first, second):
        assert response.arrivals[-1] == pytest.approx(2 * (0.2 + TOKENS * 0.1))
        final = _final(response)
        assert final["eval_count"] / (final["eval_duration"] / 1e9) == pytest.approx(5.0)
    assert machine.running == 0


def test_a_short_answer_ends_first_and_the_long_one_goes_on_alone(memory_cluster: Make) -> None:
    """Three words to a short prompt and a whole answer to a 20-token one, at once: the short one
    at half the pace throughout (twice its time alone); the machine never idles, so the long one
    ends when both requests' work is done."""
    cluster, _ = _on(memory_cluster)
    short = {**CHAT, "options": {"num_predict": 3}}
    words = " ".join(["word"] * 20)
    long = {"model": "llama3", "messages": [{"role": "user", "content": words}]}
    got: list[MemoryResponse] = []
    for body in (short, long):
        cluster.request("POST", "/api/chat", json=body, node="e").addCallback(got.append)
    cluster.advance(60)
    ends = sorted(r.arrivals[-1] for r in got)
    alone = (0.1 + 5 / 50 + 3 * 0.1, 0.1 + 20 / 50 + TOKENS * 0.1)
    assert ends == [pytest.approx(2 * alone[0]), pytest.approx(sum(alone))]


def test_the_work_left_is_each_requests_machine_time_still_needed(memory_cluster: Make) -> None:
    """Two requests at once: 2.6 machine-seconds each at first (load, prompt and the 34 tokens);
    after 1 s both have had half a second of it; a request waiting its turn counts whole."""
    cluster, machine = _on(memory_cluster)
    cluster.request("POST", "/api/chat", json=CHAT, node="e")
    cluster.request("POST", "/api/chat", json=CHAT, node="e")
    cluster.flush()
    alone = 0.1 + 5 / 50 + TOKENS * 0.1
    assert machine.work_left() == [pytest.approx(alone)] * 2
    cluster.advance(1.0)
    assert machine.work_left() == [pytest.approx(alone - 0.5)] * 2
    turns, turn = _on(memory_cluster, parallel=1)
    for _ in range(2):
        turns.request("POST", "/api/chat", json=CHAT, node="e")
    turns.advance(1.0)
    assert turn.work_left() == [pytest.approx(alone - 1.0), pytest.approx(alone)]
    cluster.advance(60)
    turns.advance(60)


def test_one_at_a_time_the_second_waits_its_turn(memory_cluster: Make) -> None:
    """``parallel`` 1: the second starts when the first ends, then goes at the full pace."""
    cluster, _ = _on(memory_cluster, parallel=1)
    alone = 0.2 + TOKENS * 0.1
    first, second = sorted(_send(cluster, 2, CHAT), key=lambda r: r.arrivals[-1])
    assert first.arrivals[-1] == pytest.approx(alone)
    assert second.arrivals[-1] == pytest.approx(2 * alone)
    assert _final(second)["eval_duration"] == pytest.approx(TOKENS * 0.1e9)


def test_a_client_that_leaves_gives_its_share_back(memory_cluster: Make) -> None:
    """Two at once; one client hangs up after its first word: the other ends as if alone from
    then on, and the machine runs nothing afterwards."""
    cluster, machine = _on(memory_cluster)
    got: list[MemoryResponse] = []
    for _ in range(2):
        cluster.request("POST", "/api/chat", json=CHAT, node="e").addCallback(got.append)
    cluster.advance(0.4 + 0.2)  # both past their prompt and first word (at half pace)
    assert len(got) == 2 and machine.running == 2
    got[0].hang_up()
    cluster.advance(60)
    assert got[1].complete and machine.running == 0
    shared = 0.4 + 0.2  # the prompt and the first word took twice as long
    assert got[1].arrivals[-1] == pytest.approx(shared + (TOKENS - 1) * 0.1)
