"""Per-facade state (nvpair_tw.corridor._state): who may serve a model, in what order, and how head selection
spreads load without a scheduler and prefers resident nodes (docs/behaviour.md §4.2, §5, §6.4),
through ``MemoryCluster`` on a Clock."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from twisted.internet.task import Clock

from nvpair_tw.corridor._scheduling import trip as trip_of
from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._patience import HOLD_MAX
from nvpair_tw.selection._reservations import make_rank
from nvpair_tw.simulated import Machine, Pace, SimulatedEngine
from nvpair_tw.testing import MemoryCluster, MemoryResponse

Make = Callable[..., MemoryCluster]

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


def polled(*ids: str) -> list[Node]:
    """Nodes without a static model list, so the inventory (and residency) are polled."""
    return [Node(i, f"http://{i}.node.test:11434") for i in ids]


def engines(clock: Clock, loaded: dict[str, Sequence[str] | None]) -> dict[str, SimulatedEngine]:
    """Equal engines serving llama3 with a 3 s stream; ``loaded`` per id (None: no residency)."""
    return {
        node_id: SimulatedEngine(clock, chunks=3, chunk_delay=1.0, loaded=names)
        for node_id, names in loaded.items()
    }


def burst(cluster: MemoryCluster, count: int, settle: float = 0.0) -> list[MemoryResponse]:
    """``count`` overlapping chats, all sent before any finishes (after the inventory polls have
    landed); their responses, headers in after ``settle`` seconds."""
    cluster.flush()
    pending = [cluster.request("POST", "/api/chat", json=CHAT) for _ in range(count)]
    cluster.advance(settle)
    return [cluster.result(p) for p in pending]


def served(responses: Sequence[MemoryResponse]) -> Counter[str | None]:
    return Counter(r.header("x-nvpair-node") for r in responses)


def test_six_concurrent_requests_without_a_scheduler_split_three_and_three(
    memory_cluster: Make,
) -> None:
    """No scheduler snapshot: 6 overlapping requests over two equal nodes go 3 to each (the seed
    sent all 6 to the lowest id), every one is answered, and every reservation is released.
    Neither node has answered yet: one request goes to each, the others wait for their first
    tokens, here at most 0.5 s (§15.2)."""
    clock = Clock()
    cluster = memory_cluster(clock, engines(clock, {"a": None, "b": None}))
    responses = burst(cluster, 6, settle=HOLD_MAX)
    assert {n: len(cluster.received(n)) for n in "ab"} == {"a": 3, "b": 3}
    assert served(responses) == Counter({"a": 3, "b": 3})
    ledger = cluster.facade().shared.ledger
    assert ledger.in_force is None
    assert (ledger.reservations("a"), ledger.reservations("b")) == (3, 3)
    cluster.advance(5)
    assert all(r.complete and r.status == 200 for r in responses)
    assert (ledger.reservations("a"), ledger.reservations("b")) == (0, 0)


def test_an_idle_cluster_answers_from_the_resident_node(memory_cluster: Make) -> None:
    """Residency from the inventory poll: with nothing in flight the node that has the model
    loaded serves, although it has the higher id; the next overlapping request still spreads."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        engines(clock, {"a": [], "b": ["llama3:latest"]}),
        nodes={"ollama": polled("a", "b")},
    )
    cluster.flush()
    inventory = cluster.facade().inventory
    assert (inventory.resident("a", "llama3"), inventory.resident("b", "llama3")) == (False, True)
    first, second = burst(cluster, 2)
    assert (first.header("x-nvpair-node"), second.header("x-nvpair-node")) == ("b", "a")
    cluster.advance(5)
    assert first.complete and second.complete
    [alone] = burst(cluster, 1)
    assert alone.header("x-nvpair-node") == "b"
    cluster.advance(5)


def test_unknown_residency_prefers_nothing(memory_cluster: Make) -> None:
    """Engines without residency endpoints: an idle cluster starts at the lowest id."""
    clock = Clock()
    cluster = memory_cluster(
        clock, engines(clock, {"a": None, "b": None}), nodes={"ollama": polled("b", "a")}
    )
    cluster.flush()
    assert cluster.facade().inventory.resident("b", "llama3") is None
    [response] = burst(cluster, 1)
    assert response.header("x-nvpair-node") == "a"
    cluster.advance(5)


def test_a_scheduler_snapshot_keeps_its_list_and_residency_breaks_its_ties(
    memory_cluster: Make,
) -> None:
    """With a snapshot, only listed nodes are balanced; among equal loads the resident one heads,
    ahead of an earlier list position."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        engines(clock, {"a": [], "b": ["llama3:latest"], "c": ["llama3:latest"]}),
        nodes={"ollama": polled("a", "b", "c")},
    )
    ledger = cluster.facade().shared.ledger
    ledger.apply(1, ["a", "b"], [make_rank("a", 0, 0), make_rank("b", 0, 0)])
    first, second, third = burst(cluster, 3)
    assert [r.header("x-nvpair-node") for r in (first, second, third)] == ["b", "a", "b"]
    assert cluster.received("c") == []
    cluster.advance(5)


def test_a_pin_still_beats_spreading_and_residency(memory_cluster: Make) -> None:
    """An eligible pin (node/select) takes every request, loaded or not, resident or not."""
    clock = Clock()
    cluster = memory_cluster(
        clock,
        engines(clock, {"a": ["llama3:latest"], "b": []}),
        nodes={"ollama": polled("a", "b")},
    )
    cluster.facade().pin = "b"
    assert served(burst(cluster, 3)) == Counter({"b": 3})
    cluster.advance(5)


def three(memory_cluster: Make) -> MemoryCluster:
    clock = Clock()
    return memory_cluster(
        clock,
        {
            "c": SimulatedEngine(clock, models=("llama3:latest",)),
            "a": SimulatedEngine(clock, models=("qwen:7b",)),
            "b": SimulatedEngine(clock, models=("llama3:latest", "qwen:7b")),
        },
    )


def ids(nodes: list) -> list[str]:  # type: ignore[type-arg]
    return [n.id for n in nodes]


def test_eligible_is_the_owners_of_the_model_under_the_engine_rule(memory_cluster: Make) -> None:
    """Owners only (``llama3`` matches ``llama3:latest``); no model means every node."""
    facade = three(memory_cluster).facade()
    assert sorted(ids(facade.eligible("llama3"))) == ["b", "c"]
    assert sorted(ids(facade.eligible("qwen:7b"))) == ["a", "b"]
    assert facade.eligible("mistral") == []
    assert sorted(ids(facade.eligible(None))) == ["a", "b", "c"]


def test_order_is_by_id_with_the_pin_first_and_cooling_nodes_last(memory_cluster: Make) -> None:
    """Base order is by id; a pin goes first; a cooling node goes behind its ready peers."""
    facade = three(memory_cluster).facade()
    everyone = facade.eligible(None)
    assert ids(facade.order(everyone, head_selection=False)[0]) == ["a", "b", "c"]
    facade.pin = "c"
    assert ids(facade.order(everyone, head_selection=False)[0]) == ["c", "a", "b"]
    facade.stalls.cool("c", "test")
    assert ids(facade.order(everyone, head_selection=False)[0]) == ["a", "b", "c"]


def test_order_promotes_a_warm_node_and_says_so(memory_cluster: Make) -> None:
    """An affinity hint that passes the gate goes first, and the second value says it was promoted."""
    facade = three(memory_cluster).facade()
    owners = facade.eligible("llama3")
    nodes, promoted = facade.order(owners, head_selection=True, affinity_hint="c")
    assert (ids(nodes)[0], promoted) == ("c", True)
    nodes, promoted = facade.order(owners, head_selection=True, affinity_hint=None)
    assert promoted is False


# The fastest answer (docs/behaviour.md §15)


def _ollama_at(rate: float) -> Callable[[bytes, bool, bytes], list[bytes]]:
    """An Ollama chat stream of 40 tokens whose final object states ``rate`` tokens/s."""

    def frames(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        piece = {"model": "llama3", "message": {"role": "assistant", "content": "tok "}}
        final = {
            "model": "llama3",
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "prompt_eval_count": 12,
            "eval_count": 40,
            "eval_duration": int(40 / rate * 1e9),
        }
        return [json.dumps(f).encode() + b"\n" for f in (piece, piece, final)]

    return frames


def test_sequential_requests_go_to_the_node_that_showed_it_is_faster(
    memory_cluster: Make,
) -> None:
    """PAIR #7's two idle nodes (10.3 and 57.7 tokens/s), the slow one's id sorting first: the
    first request goes by id, the second explores the unmeasured node, then every one goes to
    the fast node; each record carries its prediction and what it measured."""
    clock = Clock()
    slow = SimulatedEngine(clock, chunk_delay=1.9, script=_ollama_at(10.3))
    fast = SimulatedEngine(clock, chunk_delay=0.35, script=_ollama_at(57.7))
    cluster = memory_cluster(clock, {"a-slow": slow, "b-fast": fast})
    cluster.flush()
    chat = {**CHAT, "stream": True}
    chosen = []
    for _ in range(7):
        pending = cluster.request("POST", "/api/chat", json=chat)
        cluster.advance(10)
        chosen.append(cluster.result(pending).header("x-nvpair-node"))
    assert chosen == ["a-slow", "b-fast", *["b-fast"] * 5]
    speeds = cluster.facade().speeds
    assert speeds.rates("a-slow", "llama3").decode == pytest.approx(10.3)
    assert speeds.rates("b-fast", "llama3").decode == pytest.approx(57.7)
    last = cluster.named("proxy/request")[-1]
    assert last["predicted_ms"] == round(40 / 57.7 * 1000)
    assert last["measured_ms"] == 1050  # three frames, 0.35 s apart, the first one too


def test_a_burst_spreads_by_predicted_finish_not_by_count(memory_cluster: Make) -> None:
    """Unlimited slots, requests sharing a node's rate: with both rates known, a burst of six
    puts more on the fast node than on the slow one (least in flight split it 3/3)."""
    clock = Clock()
    slow = SimulatedEngine(clock, chunk_delay=1.9, script=_ollama_at(10.3))
    fast = SimulatedEngine(clock, chunk_delay=0.35, script=_ollama_at(57.7))
    cluster = memory_cluster(clock, {"a-slow": slow, "b-fast": fast})
    cluster.flush()
    chat = {**CHAT, "stream": True}
    for _ in range(2):  # one answer from each
        pending = cluster.request("POST", "/api/chat", json=chat)
        cluster.advance(10)
        cluster.result(pending)
    responses = [cluster.request("POST", "/api/chat", json=chat) for _ in range(6)]
    cluster.flush()
    counts = served([cluster.result(p) for p in responses])
    cluster.advance(10)
    assert counts == Counter({"b-fast": 5, "a-slow": 1})


def test_a_prompt_too_long_for_a_nodes_loaded_context_goes_to_one_that_holds_it(
    memory_cluster: Make,
) -> None:
    """§15.3: Ollama's /api/ps says the idle resident node loaded the model with 2,048 tokens of
    context; a 10,000-token prompt goes to the node with 32,768, a short one still to either."""
    clock = Clock()
    small = SimulatedEngine(clock, loaded=["llama3:latest"], context_length=2048, kind="ollama")
    big = SimulatedEngine(clock, loaded=["llama3:latest"], context_length=32768, kind="ollama")
    cluster = memory_cluster(
        clock, {"a-small": small, "b-big": big}, nodes={"ollama": polled("a-small", "b-big")}
    )
    cluster.flush()
    assert cluster.facade().inventory.context_length("a-small", "llama3") == 2048
    long_chat = {"model": "llama3", "messages": [{"role": "user", "content": "x" * 40_000}]}
    pending = cluster.request("POST", "/api/chat", json=long_chat)
    assert cluster.result(pending).header("x-nvpair-node") == "b-big"
    cluster.advance(5)
    [short] = burst(cluster, 1)
    assert short.header("x-nvpair-node") == "a-small"
    cluster.advance(5)
    records = cluster.named("proxy/request")
    assert all("context_fit" not in r for r in records)


def test_when_no_node_holds_the_prompt_the_largest_serves_and_the_record_says_so(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    small = SimulatedEngine(clock, loaded=["llama3:latest"], context_length=2048, kind="ollama")
    less = SimulatedEngine(clock, loaded=["llama3:latest"], context_length=1024, kind="ollama")
    cluster = memory_cluster(
        clock, {"a-less": less, "b-small": small}, nodes={"ollama": polled("a-less", "b-small")}
    )
    cluster.flush()
    long_chat = {"model": "llama3", "messages": [{"role": "user", "content": "x" * 40_000}]}
    pending = cluster.request("POST", "/api/chat", json=long_chat)
    assert cluster.result(pending).header("x-nvpair-node") == "b-small"
    cluster.advance(5)
    [record] = cluster.named("proxy/request")
    assert record["context_fit"] is False


def test_a_queued_request_waits_for_the_fast_node_while_the_slow_one_is_free(
    memory_cluster: Make,
) -> None:
    """§15.2 amending §6.4: one slot each, both rates known. A burst of six: the fast node takes
    five, one after the other (each waits less for it than the slow node would take), and only
    the sixth, predicted sooner on the idle slow node, goes there; under first-free binding the
    second request would have taken the slow node at once."""
    clock = Clock()
    slow = SimulatedEngine(clock, chunk_delay=1.9, script=_ollama_at(10.3))
    fast = SimulatedEngine(clock, chunk_delay=0.23, script=_ollama_at(57.7))
    nodes = [Node(i, f"http://{i}.node.test:11434", slots=1) for i in ("a-slow", "b-fast")]
    cluster = memory_cluster(clock, {"a-slow": slow, "b-fast": fast}, nodes={"ollama": nodes})
    cluster.flush()
    chat = {**CHAT, "stream": True}
    for _ in range(2):  # one answer from each
        pending = cluster.request("POST", "/api/chat", json=chat)
        cluster.advance(10)
        cluster.result(pending)
    burst_of = [cluster.request("POST", "/api/chat", json=chat) for _ in range(6)]
    cluster.advance(10)
    order = [cluster.result(p).header("x-nvpair-node") for p in burst_of]
    assert order == ["b-fast"] * 5 + ["a-slow"]
    assert cluster.facade().admission.queue_depth == 0


def _machines(make: Make, clock: Clock) -> MemoryCluster:
    """PAIR #7's two machines as Ollama nodes whose requests share their machine (10.3 and 57.7
    tokens/s), the slow one's id first; nothing measured yet."""
    shared = {
        "a-slow": SimulatedEngine(clock, kind="ollama", pace=Machine(clock, SLOW_PACE)),
        "b-fast": SimulatedEngine(clock, kind="ollama", pace=Machine(clock, FAST_PACE)),
    }
    nodes = [Node(i, f"http://{i}.node.test:11434", ("llama3",)) for i in shared]
    return make(clock, shared, nodes={"ollama": nodes})


SLOW_PACE, FAST_PACE = Pace(decode=10.3, prefill=300.0), Pace(decode=57.7, prefill=1500.0)


def _sent_at_once(cluster: MemoryCluster, bodies: Sequence[dict[str, object]]) -> list[Answered]:
    """``bodies`` sent together (each to the node it names, if any); each answer's node and
    seconds to its last byte, once all have ended."""
    start = cluster.clock.seconds()
    boxes = [_send(cluster, body) for body in bodies]
    cluster.advance(120)
    answers = [r for box in boxes for r in box]
    assert len(answers) == len(bodies) and all(r.complete for r in answers)
    return [(r.header("x-nvpair-node"), r.arrivals[-1] - start) for r in answers]


Answered = tuple[str | None, float]
STREAMED = {**CHAT, "stream": True}


def test_a_cold_burst_on_unequal_machines_is_placed_as_if_both_rates_were_known(
    memory_cluster: Make,
) -> None:
    """Nothing measured yet; six requests at once on PAIR #7's two machines (each request's
    tokens shared with the others on its machine). An oracle that knows both rates sends one to
    the slow node and five to the fast one (the sixth on the fast node would finish later than
    alone on the slow one). The proxy sends one request to each node and holds the others until
    the first tokens of each have shown its rate, then places them by prediction: five and one,
    and no answer later than the slow node's alone (it split 3/3 before: 11.9 s on the slow one)."""
    clock = Clock()
    cluster = _machines(memory_cluster, clock)
    answered = _sent_at_once(cluster, [STREAMED] * 6)
    assert Counter(node for node, _ in answered) == Counter({"b-fast": 5, "a-slow": 1})
    slow_alone = 0.02 + 1 / 300 + 34 / 10.3
    assert max(seconds for _, seconds in answered) <= slow_alone + 0.05


def test_a_waiter_keeps_waiting_for_a_late_fast_node_while_that_pays(memory_cluster: Make) -> None:
    """§15.2: one slot each, both rates known, answers so far 12 tokens long. The fast node runs a
    whole answer (34 tokens, predicted 12: it is late); the slow node a 3-token one for a client
    that named it. A request of 12 tokens arrives: the slow node frees first and the fast node's
    predicted finish for it passes (it took the slow node then, finishing about 0.75 s later),
    but waiting for the fast node still pays (it frees about 0.2 s after that), so it waits."""
    clock = Clock()
    paced = {
        "a-slow": SimulatedEngine(clock, kind="ollama", pace=Pace(decode=10.3, prefill=300.0)),
        "b-fast": SimulatedEngine(clock, kind="ollama", pace=Pace(decode=51.5, prefill=1500.0)),
    }
    nodes = [Node(i, f"http://{i}.node.test:11434", ("llama3",), slots=1) for i in paced]
    cluster = memory_cluster(clock, paced, nodes={"ollama": nodes})
    twelve = {**STREAMED, "options": {"num_predict": 12}}
    for node in ("a-slow", "b-fast", "a-slow", "b-fast"):  # both measured, 12 tokens the mean
        _sent_at_once(cluster, [{**twelve, "node": node}])
    long, named = dict(STREAMED), {**STREAMED, "options": {"num_predict": 3}, "node": "a-slow"}
    start = clock.seconds()
    sent = [_send(cluster, long), _send(cluster, named)]
    cluster.advance(0.01)
    sent.append(_send(cluster, twelve))
    cluster.advance(30)
    [_, _, [waiter]] = sent
    assert waiter.header("x-nvpair-node") == "b-fast"
    after_the_long_one = 2 * 0.02 + (34 + 12) / 51.5  # each answer's load, then its tokens
    assert waiter.arrivals[-1] - start == pytest.approx(after_the_long_one, abs=0.05)


def _send(cluster: MemoryCluster, body: dict[str, object]) -> list[MemoryResponse]:
    """Send ``body`` (to the node it names, if any); the list holds its answer once its headers
    are in."""
    target = body.get("node")
    headers = {"X-NVPair-Node": str(target)} if target else {}
    chat = {k: v for k, v in body.items() if k != "node"}
    box: list[MemoryResponse] = []
    cluster.request("POST", "/api/chat", json=chat, headers=headers).addCallback(box.append)
    return box


def test_only_requests_for_a_model_count_as_work_in_flight(memory_cluster: Make) -> None:
    """A pass-through request (no model) is not work a prediction should wait for."""
    clock = Clock()
    cluster = memory_cluster(clock, engines(clock, {"a": None}))
    facade = cluster.facade()
    trip_of(facade, None, {}, None).attempt("a")
    assert facade.flights.in_flight("a") == 0
    trip = trip_of(facade, "llama3", {"a": 2.0}, None)
    trip.attempt("a")
    assert (facade.flights.in_flight("a"), facade.flights.remaining("a")) == (1, 2.0)
    trip.land()


def test_a_nodes_speed_seeds_its_rates_until_it_has_answered(memory_cluster: Make) -> None:
    """``speed = 5`` on a node: predicted five times the stand-in rate, so it is tried first."""
    clock = Clock()
    nodes = [
        Node("a", "http://a.node.test:11434"),
        Node("b", "http://b.node.test:11434", speed=5.0),
    ]
    cluster = memory_cluster(clock, engines(clock, {"a": None, "b": None}), nodes={"ollama": nodes})
    speeds = cluster.facade().speeds
    assert speeds.rates("b", "llama3").decode == 5 * speeds.rates("a", "llama3").decode
    [response] = burst(cluster, 1)
    assert response.header("x-nvpair-node") == "b"
    cluster.advance(5)
