"""Where a request goes on unequal machines (docs/behaviour.md §15.4), side by side in one run.

``python bench/scheduling.py [--requests N] [--seed S]`` prints Markdown tables
(docs/performance.md, "Scheduling"). A pure simulation on an injected clock: no sockets, no
engines. Each simulated node shares its rates among the requests on it (processor sharing, as
engines with parallel slots do): a request's work is its prompt over the node's prefill rate plus
its completion over its decode rate, done at 1/k speed while k requests run there. A cold node
first loads the model (every request on it waits for the load). A seeded trace of mixed prompt
(50-4,000 tokens) and answer (10-400 tokens) lengths arrives as a Poisson process at light,
medium and heavy rates (10 %, 50 % and 85 % of the fleet's capacity).

Contenders, each dispatching at arrival:

- **predicted** (this rule): the real :func:`~nvpair_tw.selection._predict.predict_all` and
  :func:`~nvpair_tw.selection._ordering.order_candidates` over a real
  :class:`~nvpair_tw.selection._speed.SpeedBook` and :class:`~nvpair_tw.selection._flights.FlightBook`,
  learning online from the answers (no priming, no knowledge of the rates or of answer lengths);
- **least in flight** (the rule it replaces, §5.2): the real ``order_candidates`` without
  predictions: least in flight, then resident, then id (the slow node's id sorts first);
- **round robin**;
- **oracle**: knows every rate and each request's true lengths, and sends each arrival where it
  would finish first given the work already there (greedy least finish time).
- **LiteLLM**'s routing strategies ``simple-shuffle``, ``least-busy``, ``latency-based-routing``
  and ``usage-based-routing``, re-expressed from its ``litellm/router_strategy`` sources with their
  defaults (each function cites the file it follows); each sends a request to a node at arrival.

A second set of tables sends bursts (eight requests at once, after a short warm-up) to the two-node
fleet, with one slot per node and with unlimited slots.

Reported: mean and p95 time to last token (arrival to last token), their ratio to the oracle's
mean, and, of the requests that arrived while the fastest node was idle, the share that went to
it (the light-load target is 90 %).

Then the same question black box (``bench/placement.py``): the real proxy over two simulated
machines whose requests share them, from a start with nothing measured, against an oracle.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attrs import define, field, frozen
from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.selection._admission import Admission, Slot, Waiter
from nvpair_tw.selection._flights import Flight, FlightBook
from nvpair_tw.selection._ordering import order_candidates
from nvpair_tw.selection._patience import Outlook, Patience
from nvpair_tw.selection._predict import (
    EXPLORE,
    Load,
    RequestSize,
    expected_completion,
    predict,
    predict_all,
    slot_wait,
)
from nvpair_tw.selection._speed import Answer, SpeedBook, Start, sample_of

MODEL = "llama3"
_NODES: dict[str, Node] = {}
"""The simulated fleet as the admission sees it (node id to node)."""


@frozen
class Machine:
    id: str
    decode: float
    prefill: float
    load: float = 0.0
    cold: bool = False
    slots: int = 0
    """0: unlimited (requests share the rates); 1: one at a time, the rest wait."""


@frozen
class Ask:
    at: float
    prompt: int
    completion: int


@define(eq=False)
class _Job:
    ask: Ask
    prefill_left: float
    decode_left: float
    dispatched: float
    start: Start
    first_at: float | None = None
    flight: Flight | None = None
    slot: Slot | None = None


@frozen
class Bind:
    """Through the real admission: the candidates in order, the patience of §15.2 (or None) and
    each node's prediction."""

    order: list[str]
    patience: Patience | None
    predicted: dict[str, float]


@frozen
class Queue:
    """Straight to ``node``'s own FIFO (round robin and the oracle choose at arrival)."""

    node: str


@define
class _Node:
    machine: Machine
    jobs: list[_Job] = field(factory=list)
    loaded_at: float = 0.0

    def work(self, ask: Ask) -> tuple[float, float]:
        return ask.prompt / self.machine.prefill, ask.completion / self.machine.decode


@define
class Router:
    """What a LiteLLM router keeps between requests, for its reference policies below (seeded:
    each run repeats)."""

    rng: random.Random = field(factory=lambda: random.Random(0))
    logged: int = 0
    """How many of the sim's answers the router's success callbacks have seen."""
    latency: dict[str, list[float | None]] = field(factory=dict)
    """lowest_latency.py's per-deployment sample list (seconds per completion token). None stands
    for the integer 0 it writes for a deployment first met at selection once the map exists:
    counted in the mean's length, not in its sum, and kept."""
    tokens: dict[tuple[str, int], int] = field(factory=dict)
    """lowest_tpm_rpm.py's total tokens (prompt + completion) per (deployment, clock minute)."""


@define
class Sim:
    """The fleet on one clock; ``done`` collects (ask, node, finish) as requests end."""

    machines: Sequence[Machine]
    clock: Clock = field(factory=Clock)
    nodes: dict[str, _Node] = field(init=False)
    speeds: SpeedBook = field(init=False)
    flights: FlightBook = field(init=False)
    admission: Admission = field(init=False)
    held: dict[str, deque[Ask]] = field(init=False)
    done: list[tuple[Ask, str, float, bool | None]] = field(factory=list)
    """(request, node, clock time of its last token, whether it went to the fastest node when
    that node was idle (None: it was busy))."""
    turn: int = 0
    answered: list[tuple[str, Ask, float]] = field(factory=list)
    """(node, request, clock time of its last token) in the order the answers ended."""
    router: Router = field(factory=lambda: Router())

    def __attrs_post_init__(self) -> None:
        self.nodes = {
            m.id: _Node(m, loaded_at=float("inf") if m.cold else 0.0) for m in self.machines
        }
        self.speeds = SpeedBook(self.clock)
        self.flights = FlightBook(self.clock)
        slots = {m.id: m.slots for m in self.machines}
        self.admission = Admission(self.clock, slots.get, 10**6, 1e12)
        self.held = {m.id: deque() for m in self.machines}

    def arrive(self, ask: Ask, decision: Bind | Queue) -> None:
        if isinstance(decision, Queue):
            self.held[decision.node].append(ask)
            self._serve_held(decision.node)
            return
        nodes = [_NODES[n] for n in decision.order]
        ticket = self.admission.admit(nodes, patience=decision.patience)
        if isinstance(ticket, Slot):
            self._bound(ask, decision, ticket)
        else:
            assert isinstance(ticket, Waiter)
            ticket.bound.addCallback(lambda slot: self._bound(ask, decision, slot))

    def _bound(self, ask: Ask, decision: Bind, slot: Slot) -> None:
        # A flight counts as work ahead its prediction from dispatch (as the corridor's Trip).
        assert slot.node_id is not None
        seen = decision.patience.last if decision.patience is not None else {}
        ahead = seen[slot.node_id].service if slot.node_id in seen else None
        predicted = decision.predicted.get(slot.node_id, 0.0) if ahead is None else ahead
        self.dispatch(ask, slot.node_id, predicted, slot)

    def _serve_held(self, node_id: str) -> None:
        node = self.nodes[node_id]
        limit = node.machine.slots
        while self.held[node_id] and (limit == 0 or len(node.jobs) < limit):
            self.dispatch(self.held[node_id].popleft(), node_id, 0.0, None)

    @property
    def now(self) -> float:
        return self.clock.seconds()

    def resident(self, node_id: str) -> bool:
        return self.nodes[node_id].loaded_at <= self.now

    def dispatch(self, ask: Ask, node_id: str, predicted: float, slot: Slot | None) -> None:
        node = self.nodes[node_id]
        fastest = max(self.nodes.values(), key=lambda n: n.machine.decode)
        hit = None if fastest.jobs else fastest.machine.id == node_id
        if node.loaded_at == float("inf"):
            node.loaded_at = self.now + node.machine.load
        start = Start.PLAIN if self.resident(node_id) else Start.LOADED
        prefill, decode = node.work(ask)
        job = _Job(ask, prefill, decode, self.now, start, slot=slot)
        job.flight = self.flights.take_off(node_id, predicted)
        node.jobs.append(job)
        self.done.append((ask, node_id, -1.0, hit))

    def run_until(self, until: float) -> None:
        """Advance every node's shared work to clock time ``until``, ending jobs on the way."""
        while True:
            step, node = self._next_event(until)
            self._progress(step)
            if node is not None:
                self._finish(node)
            elif self.now >= until:
                return

    def _next_event(self, until: float) -> tuple[float, _Node | None]:
        best, where = until - self.now, None
        for call in self.clock.getDelayedCalls():  # the admission's patience timers
            if call.active() and call.getTime() - self.now < best:
                best = call.getTime() - self.now
        for node in self.nodes.values():
            if not node.jobs:
                continue
            if node.loaded_at > self.now:
                if node.loaded_at - self.now < best:
                    best, where = node.loaded_at - self.now, None
                continue
            k = len(node.jobs)
            for job in node.jobs:
                left = (job.prefill_left or job.decode_left) * k
                if left < best:
                    best, where = left, node
        return max(0.0, best), where

    def _progress(self, seconds: float) -> None:
        for node in self.nodes.values():
            if node.jobs and node.loaded_at <= self.now:
                share = seconds / len(node.jobs)
                for job in node.jobs:
                    if job.prefill_left > 0:
                        job.prefill_left = max(0.0, job.prefill_left - share)
                    else:
                        job.decode_left = max(0.0, job.decode_left - share)
        self.clock.advance(seconds)
        for node in self.nodes.values():
            for job in node.jobs:
                if job.prefill_left <= 1e-12 and job.first_at is None:
                    job.first_at = self.now

    def _finish(self, node: _Node) -> None:
        for job in [j for j in node.jobs if j.prefill_left <= 1e-9 and j.decode_left <= 1e-9]:
            node.jobs.remove(job)
            assert job.flight is not None
            concurrency = job.flight.land()
            ask = job.ask
            answer = Answer(ask.prompt, ask.completion, job.dispatched, job.first_at, self.now)
            prefill = self.speeds.rates(node.machine.id, MODEL).prefill
            sample = sample_of(answer, job.start, concurrency, prefill)
            self.speeds.learn(node.machine.id, MODEL, sample)
            for i, (a, n, _end, hit) in enumerate(self.done):
                if a is ask:
                    self.done[i] = (a, n, self.now, hit)
            self.answered.append((node.machine.id, ask, self.now))
            if job.slot is not None:
                job.slot.release()  # binds the next waiter it suits (the real admission)
            self._serve_held(node.machine.id)


def predicted_rule(sim: Sim, ask: Ask) -> Bind:
    ids = [m.id for m in sim.machines]

    def load(node_id: str) -> Load:
        busy = max(sim.flights.in_flight(node_id), sim.admission.slots_in_use(node_id))
        return Load(
            busy,
            sim.admission.slots(node_id),
            sim.flights.remaining(node_id) + sim.admission.queued_for(node_id),
            sim.resident(node_id),
        )

    size = RequestSize(ask.prompt, ask.prompt, None)
    predicted = predict_all(ids, MODEL, size, sim.speeds, load, None)
    ordering = order_candidates(
        ids,
        pin=None,
        snapshot=None,
        ledger_view=_InFlight(sim),
        affinity_hint=None,
        head_selection=True,
        cooling=(),
        predicted=predicted,
    )
    return Bind(list(ordering.nodes), Patience(_outlook(sim, ids, size)), predicted)


def _outlook(sim: Sim, ids: list[str], size: RequestSize) -> Callable[[], dict[str, Outlook]]:
    """The corridor's outlook (``nvpair_tw.corridor._scheduling.outlook``) over the simulated
    fleet, read again at every look: the service with the rates and loads of that moment, the
    wait for a slot. The fluid simulation streams no tokens, so no node is held for its first
    answer (the black-box tables of ``bench/placement.py`` measure that)."""

    def read() -> dict[str, Outlook]:
        completion = expected_completion(size, sim.speeds.completion_mean(MODEL))
        views = {}
        for node_id in ids:
            busy = max(sim.flights.in_flight(node_id), sim.admission.slots_in_use(node_id))
            slots = sim.admission.slots(node_id)
            load = Load(busy, slots, sim.flights.remaining(node_id), sim.resident(node_id))
            rates = sim.speeds.rates(node_id, MODEL)
            service = predict(
                rates, Load(busy, slots, 0.0, load.resident), size.prompt_tokens, completion
            )
            views[node_id] = Outlook(service * (1 if rates.measured else EXPLORE), slot_wait(load))
        return views

    return read


@define
class _InFlight:
    sim: Sim

    def pending(self, node_id: str) -> int:
        return 0

    def gpu_pressure(self, node_id: str) -> int:
        return 0

    def reservations(self, node_id: str) -> int:
        return self.sim.flights.in_flight(node_id)


def least_in_flight(sim: Sim, ask: Ask) -> Bind:
    ids = [m.id for m in sim.machines]
    ordering = order_candidates(
        ids,
        pin=None,
        snapshot=None,
        ledger_view=_InFlight(sim),
        affinity_hint=None,
        head_selection=True,
        cooling=(),
        resident={n for n in ids if sim.resident(n)},
    )
    return Bind(list(ordering.nodes), None, {})


def round_robin(sim: Sim, ask: Ask) -> Queue:
    sim.turn += 1
    return Queue(sim.machines[sim.turn % len(sim.machines)].id)


# LiteLLM's routing strategies (https://docs.litellm.ai/docs/routing, "Advanced - Routing
# Strategies"), re-expressed on the simulated fleet: LiteLLM sends each request to a deployment at
# once (the engine queues it), so each is a ``Queue`` decision like round robin. Defaults throughout:
# no weight, tpm or rpm configured, non-streaming calls (the latency sample is the whole answer's).
LATENCY_SAMPLES = 10
"""lowest_latency.py ``RoutingArgs.max_latency_list_size``."""


def _log_answers(sim: Sim) -> None:
    """The router's success callbacks for the answers that ended since the last request, in order."""
    router = sim.router
    for node_id, ask, end in sim.answered[router.logged :]:
        # lowest_latency.py log_success_event: (end - call start) / completion tokens; once the
        # list is full its last entry is replaced (the first nine stay).
        kept = router.latency.setdefault(node_id, [])
        sample = (end - ask.at) / ask.completion
        kept[:] = [*kept, sample] if len(kept) < LATENCY_SAMPLES else [*kept[:-1], sample]
        # lowest_tpm_rpm.py log_success_event: total tokens into the minute the answer ended in.
        key = (node_id, int(end // 60))
        router.tokens[key] = router.tokens.get(key, 0) + ask.prompt + ask.completion
    router.logged = len(sim.answered)


def simple_shuffle(sim: Sim, ask: Ask) -> Queue:
    """``simple-shuffle``, the default (litellm/router_strategy/simple_shuffle.py): with no weight,
    rpm or tpm set, a deployment drawn uniformly at random."""
    return Queue(sim.router.rng.choice(sim.machines).id)


def least_busy(sim: Sim, ask: Ask) -> Queue:
    """``least-busy`` (litellm/router_strategy/least_busy.py): the fewest requests sent and not yet
    answered (counted up before the call, down on its answer); a tie goes to the first listed."""
    return Queue(
        min(sim.machines, key=lambda m: len(sim.nodes[m.id].jobs) + len(sim.held[m.id])).id
    )


def latency_based(sim: Sim, ask: Ask) -> Queue:
    """``latency-based-routing`` (litellm/router_strategy/lowest_latency.py, buffer 0): the lowest
    mean of the recorded seconds per completion token; a deployment with none counts as 0; ties at
    random. It starts cold, as a fresh router does."""
    _log_answers(sim)
    router, means = sim.router, {}
    for machine in sim.machines:
        kept = router.latency.get(machine.id)
        if kept is None and router.latency:  # written into the cached map, so it stays
            kept = router.latency[machine.id] = [None]
        means[machine.id] = sum(s for s in kept if s is not None) / len(kept) if kept else 0.0
    best = min(means.values())
    return Queue(router.rng.choice([n for n, mean in means.items() if mean == best]))


def usage_based(sim: Sim, ask: Ask) -> Queue:
    """``usage-based-routing`` (litellm/router_strategy/lowest_tpm_rpm.py; no tpm/rpm limits): the
    fewest tokens answered in the current clock minute; a tie goes to the first listed."""
    _log_answers(sim)
    minute = int(sim.now // 60)
    return Queue(min(sim.machines, key=lambda m: sim.router.tokens.get((m.id, minute), 0)).id)


def oracle(sim: Sim, ask: Ask) -> Queue:
    """Greedy least finish time, knowing every rate and this request's true lengths."""
    best: tuple[float, str] | None = None
    for node in sim.nodes.values():
        prefill, decode = node.work(ask)
        if node.machine.slots:
            finish = _finish_queued(sim, node, prefill + decode)
        else:
            finish = _finish_with(node, prefill + decode, sim.now)
        if best is None or finish < best[0]:
            best = (finish, node.machine.id)
    assert best is not None
    return Queue(best[1])


def _finish_queued(sim: Sim, node: _Node, work: float) -> float:
    """When a new job would end behind the work running and held on a one-slot node."""
    running = sum(j.prefill_left + j.decode_left for j in node.jobs)
    held = sum(sum(node.work(a)) for a in sim.held[node.machine.id])
    return sim.now + running + held + work


def _finish_with(node: _Node, work: float, now: float) -> float:
    """When a new job of ``work`` seconds would end on ``node`` under processor sharing."""
    start = max(now, node.loaded_at if node.loaded_at != float("inf") else now + node.machine.load)
    others = sorted(j.prefill_left + j.decode_left for j in node.jobs)
    t, done, k = start, 0.0, len(others) + 1
    for left in others:
        if left >= work:
            break
        t += (left - done) * k
        done, k = left, k - 1
    return t + (work - done) * k


def trace(rng: random.Random, count: int, rate: float) -> list[Ask]:
    asks, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        asks.append(Ask(t, *_lengths(rng)))
    return asks


def _lengths(rng: random.Random) -> tuple[int, int]:
    prompt = int(min(4000, max(50, rng.lognormvariate(5.5, 1.0))))
    completion = int(min(400, max(10, rng.lognormvariate(4.6, 0.8))))
    return prompt, completion


WARM_UP = 4
BURST_GAP = 600.0
"""Seconds between bursts: each drains before the next, under every contender."""


def bursts(rng: random.Random, size: int, count: int) -> list[Ask]:
    """``WARM_UP`` requests a minute apart, then ``count`` bursts of ``size`` requests arriving
    together ``BURST_GAP`` apart; lengths as in :func:`trace`."""
    asks = [Ask(60.0 * (i + 1), *_lengths(rng)) for i in range(WARM_UP)]
    for k in range(count):
        asks += [Ask(BURST_GAP * (k + 1), *_lengths(rng)) for _ in range(size)]
    return asks


def burst_summary(sim: Sim) -> tuple[float, float, float, float]:
    """Over the bursts' requests (not the warm-up's): mean and p95 time to last token, and the
    mean and worst time from a burst's arrival to its last answer."""
    times: dict[float, list[float]] = {}
    for ask, _n, end, _h in sim.done:
        if ask.at >= BURST_GAP:
            times.setdefault(ask.at, []).append(end - ask.at)
    every = [t for group in times.values() for t in group]
    spans = [max(group) for group in times.values()]
    p95 = statistics.quantiles(every, n=20)[18]
    return statistics.fmean(every), p95, statistics.fmean(spans), max(spans)


Policy = Callable[[Sim, Ask], Bind | Queue]


def simulate(machines: Sequence[Machine], asks: Sequence[Ask], policy: Policy) -> Sim:
    _NODES.clear()
    _NODES.update(
        {m.id: Node(m.id, f"http://{m.id}.test", (MODEL,), slots=m.slots) for m in machines}
    )
    sim = Sim(machines)
    for ask in asks:
        sim.run_until(ask.at)
        sim.arrive(ask, policy(sim, ask))
    sim.run_until(asks[-1].at + 1e6)
    assert len(sim.done) == len(asks), "a request was never dispatched"
    assert all(end >= 0 for _a, _n, end, _h in sim.done), "a request was never answered"
    return sim


def summary(sim: Sim) -> tuple[float, float, float]:
    times = [end - ask.at for ask, _n, end, _h in sim.done]
    assert all(end >= 0 for _a, _n, end, _h in sim.done)
    p95 = statistics.quantiles(times, n=20)[18]
    idle = [hit for *_rest, hit in sim.done if hit is not None]
    return statistics.fmean(times), p95, sum(idle) / len(idle) if idle else 0.0


CASES = {
    "two nodes, 10 and 57 tok/s": (
        Machine("a-slow", decode=10.0, prefill=300.0),
        Machine("b-fast", decode=57.0, prefill=1500.0),
    ),
    "two nodes, one slot each (requests wait in the proxy's queue)": (
        Machine("a-slow", decode=10.0, prefill=300.0, slots=1),
        Machine("b-fast", decode=57.0, prefill=1500.0, slots=1),
    ),
    "three nodes, one cold (8 s load)": (
        Machine("a-slow", decode=10.0, prefill=300.0),
        Machine("b-fast", decode=57.0, prefill=1500.0),
        Machine("c-cold", decode=30.0, prefill=800.0, load=8.0, cold=True),
    ),
}
POLICIES: dict[str, Policy] = {
    "predicted (this rule)": predicted_rule,
    "least in flight (replaced)": least_in_flight,
    "round robin": round_robin,
    "LiteLLM simple-shuffle": simple_shuffle,
    "LiteLLM least-busy": least_busy,
    "LiteLLM latency-based-routing": latency_based,
    "LiteLLM usage-based-routing": usage_based,
    "oracle (greedy least finish)": oracle,
}
LOADS = {"light": 0.10, "medium": 0.50, "heavy": 0.85}


def capacity(machines: Sequence[Machine], asks: Sequence[Ask]) -> float:
    """Requests per second the fleet serves flat out, for the trace's mean lengths."""
    prompt = statistics.fmean(a.prompt for a in asks)
    completion = statistics.fmean(a.completion for a in asks)
    return sum(1 / (prompt / m.prefill + completion / m.decode) for m in machines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for case, machines in CASES.items():
        shape = trace(random.Random(args.seed), args.requests, 1.0)
        full = capacity(machines, shape)
        print(f"\n### {case} ({args.requests} requests, capacity {full:.2f} req/s)\n")
        print(
            "| load | rule | mean TTLT s | p95 s | mean / oracle | to the fastest node when idle |"
        )
        print("|---|---|---|---|---|---|")
        for load, share in LOADS.items():
            asks = trace(random.Random(args.seed), args.requests, full * share)
            results = {name: summary(simulate(machines, asks, p)) for name, p in POLICIES.items()}
            best = results["oracle (greedy least finish)"][0]
            for name, (mean, p95, hit) in results.items():
                print(
                    f"| {load} ({share:.0%}) | {name} | {mean:.2f} | {p95:.2f} | "
                    f"{mean / best:.2f}x | {hit:.0%} |"
                )
    burst_tables(args.seed)
    from bench.placement import main as through_the_proxy

    through_the_proxy([])


BURST_SIZE, BURST_COUNT = 8, 10
BURST_CASES = (
    "two nodes, one slot each (requests wait in the proxy's queue)",
    "two nodes, 10 and 57 tok/s",
)


def burst_tables(seed: int) -> None:
    """Bursts after a warm-up (the e2e test's "a burst on one-slot nodes finishes sooner than
    under the old rule", in simulated time)."""
    asks = bursts(random.Random(seed), BURST_SIZE, BURST_COUNT)
    for case in BURST_CASES:
        print(
            f"\n### bursts: {case} ({WARM_UP} warm-up requests, then {BURST_COUNT} bursts of "
            f"{BURST_SIZE})\n"
        )
        print("| rule | mean TTLT s | p95 s | burst done in, mean s | worst s |")
        print("|---|---|---|---|---|")
        for name, policy in POLICIES.items():
            mean, p95, span, worst = burst_summary(simulate(CASES[case], asks, policy))
            print(f"| {name} | {mean:.2f} | {p95:.2f} | {span:.2f} | {worst:.2f} |")


if __name__ == "__main__":
    main()
