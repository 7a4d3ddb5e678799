# -*- test-case-name: tests.bench.test_placement -*-
"""Where the real proxy sends requests on unequal machines, against an oracle (issue 39, "What
placement still gets wrong"; docs/behaviour.md §15.2, §15.4): the scheduling bench of
``bench/scheduling.py`` measured black box.

``python bench/placement.py [--json PATH]`` prints Markdown tables (docs/performance.md,
"Scheduling through the proxy"); ``bench/scheduling.py`` prints them after its own.

**Set-up.** PAIR #7's two machines as Ollama nodes: ``a-slow`` at 10.3 answer tokens/s (300
prompt tokens/s), ``b-fast`` at 57.7 (1,500), the slow one's id first. Each is a
:class:`nvpair_tw.simulated.Machine`: the requests it runs at once share its pace (processor
sharing, as an engine's parallel slots share its GPU), and each states the durations it got. Every
request is a streamed ``/api/chat`` of 9 prompt tokens answered with 34 tokens. The proxy is the
real one (``nvpair_tw.testing.MemoryCluster``: the facade as ``build_runtime`` builds it, every
connection in memory, everything on one virtual clock), started afresh for each run: nothing is
measured before the first answer, as after a start.

**Contenders.** *nvpair-tw* through the proxy; the *oracle* straight to the engines, knowing both
machines' rates, the work each one still holds and every answer's length: it sends each arrival
where it would finish first (greedy least finish time, as in ``bench/scheduling.py``).

**Scenarios** (:data:`SCENARIOS`): three bursts of six a minute apart on a proxy that has measured
nothing (the issue's figure); the same after two sequential warm-up requests; 30 sequential
requests 10 s apart; 60 Poisson arrivals at half the fleet's capacity; each with unlimited slots
(the machines share) and with one slot per node (``slots = 1``: the proxy's queue and late binding
decide; the machines then run one request at a time).

**Reported**: per scenario and contender, the share of requests on the slow node, the mean and
p95 time to last token (request sent to last byte) and their ratio to the oracle's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attrs import asdict, frozen
from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.simulated import Machine, Pace, SimulatedEngine
from nvpair_tw.testing import MemoryCluster, MemoryResponse

SLOW, FAST = "a-slow", "b-fast"
PACES = {SLOW: Pace(decode=10.3, prefill=300.0), FAST: Pace(decode=57.7, prefill=1500.0)}
CHAT = {
    "model": "llama3",
    "stream": True,
    "messages": [{"role": "user", "content": "Name three colours of the sky, please."}],
}
PROMPT_TOKENS, ANSWER_TOKENS = 7, 34
"""What the machines count in :data:`CHAT` (its words) and answer (the paced engine's text)."""
SETTLE = 600.0
"""Virtual seconds a run is given to end after its last arrival."""


@frozen
class Scenario:
    """Arrival times (seconds), and the slots set on each node (None: unlimited)."""

    name: str
    arrivals: tuple[float, ...]
    slots: int | None = None


def _bursts(warm_up: int) -> tuple[float, ...]:
    ups = tuple(10.0 * i for i in range(warm_up))
    return ups + tuple(60.0 * (k + 1) for k in range(3) for _ in range(6))


def _poisson(count: int, rate: float, seed: int = 7) -> tuple[float, ...]:
    rng, at, times = random.Random(seed), 0.0, []
    for _ in range(count):
        at += rng.expovariate(rate)
        times.append(at)
    return tuple(times)


def capacity() -> float:
    """Requests a second both machines serve flat out."""
    return sum(1 / (PROMPT_TOKENS / p.prefill + ANSWER_TOKENS / p.decode) for p in PACES.values())


def scenarios() -> list[Scenario]:
    """The runs, each with unlimited slots and with one slot per node."""
    shapes = [
        ("3 bursts of 6, nothing measured", _bursts(0)),
        ("3 bursts of 6 after 2 warm-up requests", _bursts(2)),
        ("30 sequential, 10 s apart", tuple(10.0 * i for i in range(30))),
        ("60 Poisson at 50 % of capacity", _poisson(60, 0.5 * capacity())),
    ]
    return [
        Scenario(f"{name}{tag}", times, slots) for slots, tag in _SLOTS for name, times in shapes
    ]


_SLOTS = ((None, ""), (1, ", one slot each"))
SCENARIOS = scenarios()


@frozen
class Answered:
    """One request: the node that answered and seconds from sending it to its last byte."""

    node: str
    seconds: float


Route = Callable[[dict[str, Machine]], str | None]
"""Where a contender sends the next request: None (the proxy) or a node's id."""


def through_proxy(_machines: dict[str, Machine]) -> str | None:
    return None


def oracle(machines: dict[str, Machine]) -> str:
    """Greedy least finish time, knowing every rate and length (ties: the fast node)."""

    def finish(node_id: str) -> float:
        machine = machines[node_id]
        pace = machine.pace
        work = pace.load + PROMPT_TOKENS / pace.prefill + ANSWER_TOKENS / pace.decode
        held = machine.work_left()
        if machine.parallel == 1:
            return sum(held) + work
        return _shared_finish(held, work)

    return min((FAST, SLOW), key=finish)


def _shared_finish(others: Sequence[float], work: float) -> float:
    """When ``work`` seconds of a machine end, shared equally with jobs of ``others`` seconds."""
    t, done, k = 0.0, 0.0, len(others) + 1
    for left in sorted(others):
        if left >= work:
            break
        t += (left - done) * k
        done, k = left, k - 1
    return t + (work - done) * k


def run(scenario: Scenario, route: Route) -> list[Answered]:
    """One run of ``scenario`` on a fresh proxy and fresh machines, sent as ``route`` says."""
    clock = Clock()
    parallel = 1 if scenario.slots == 1 else 0
    machines = {n: Machine(clock, pace, parallel) for n, pace in PACES.items()}
    engines = {n: SimulatedEngine(clock, kind="ollama", pace=m) for n, m in machines.items()}
    url = "http://{}.node.test:11434"
    nodes = [Node(n, url.format(n), ("llama3",), slots=scenario.slots) for n in engines]
    cluster = MemoryCluster(clock, engines, nodes={"ollama": nodes})
    sent: list[tuple[float, list[MemoryResponse]]] = []
    try:
        for at in scenario.arrivals:
            cluster.advance(max(0.0, at - clock.seconds()))
            box: list[MemoryResponse] = []
            pending = cluster.request("POST", "/api/chat", json=CHAT, node=route(machines))
            pending.addCallback(box.append)
            sent.append((clock.seconds(), box))
        cluster.advance(SETTLE)
        return [_answered(at, box) for at, box in sent]
    finally:
        cluster.stop()


def _answered(at: float, box: list[MemoryResponse]) -> Answered:
    """The proxy names the node that answered; a request sent straight to an engine has none."""
    [response] = box
    assert response.complete, "a request was not answered whole"
    return Answered(response.header("x-nvpair-node") or "", response.arrivals[-1] - at)


@frozen
class Figures:
    """One contender's run of one scenario."""

    slow_share: float
    mean: float
    p95: float


def figures(answers: Sequence[Answered]) -> Figures:
    seconds = [a.seconds for a in answers]
    p95 = statistics.quantiles(seconds, n=20)[18] if len(seconds) > 1 else seconds[0]
    slow = sum(a.node == SLOW for a in answers) / len(answers)
    return Figures(slow, statistics.fmean(seconds), p95)


def measure(scenario: Scenario) -> dict[str, Figures]:
    """Both contenders on ``scenario``."""
    return {
        "nvpair-tw": figures(run(scenario, through_proxy)),
        "oracle": figures(_oracle_run(scenario)),
    }


def _oracle_run(scenario: Scenario) -> list[Answered]:
    """The oracle's run: each request straight to the node it chose (named in the answer)."""
    chosen: list[str] = []

    def choose(machines: dict[str, Machine]) -> str:
        chosen.append(oracle(machines))
        return chosen[-1]

    answers = run(scenario, choose)
    return [Answered(node, a.seconds) for node, a in zip(chosen, answers, strict=True)]


def table(results: dict[str, dict[str, Figures]]) -> str:
    lines = [
        "| scenario | contender | to the slow node | mean TTLT s | p95 s | mean / oracle "
        "| p95 / oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by in results.items():
        best = by["oracle"]
        for contender, f in by.items():
            lines.append(
                f"| {name} | {contender} | {f.slow_share:.0%} | {f.mean:.2f} | {f.p95:.2f} | "
                f"{f.mean / best.mean:.2f}x | {f.p95 / best.p95:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="where to write the figures")
    args = parser.parse_args(argv)
    results = {s.name: measure(s) for s in SCENARIOS}
    print("\n### Scheduling through the proxy (PAIR #7's machines, 10.3 and 57.7 tokens/s)\n")
    print(table(results))
    if args.json is not None:
        shown: dict[str, Any] = {
            n: {c: asdict(f) for c, f in by.items()} for n, by in results.items()
        }
        args.json.write_text(json.dumps(shown, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
