# -*- test-case-name: tests.bench.test_agents -*-
"""Coding agents against a prefix cache (issue 39): does each conversation go back to the node
that holds its prefix, whatever API it speaks?

``python bench/agents.py [--quick] [--facades ollama,lmstudio,omlx,openai] [--turns 8]
[--think 0.5,2] [--spread 2] [--seeds 7,8,9] [--json PATH]`` prints Markdown tables
(docs/performance.md, "Coding agents and the prefix cache") and writes every figure to
``bench/results/agents-<UTC timestamp>.json``.

**Set-up.** Two engine doubles (``bench/kvengine.py``: llama-server with 2 slots, 2,000 prompt
tokens/s and 100 answer tokens/s per slot, a prefix cache per slot; an Ollama double of the same
speed for ``/api/chat``) and S agent sessions running at once, each T turns; every turn resends
the whole conversation plus about 1,000 new tokens on a 2,000-token system prompt
(``bench/agentclients.py``: each agent's own request shape). Sessions start within the first
``--spread`` seconds and think ``--think`` seconds between turns (seeded: every contender is sent
the same words at the same moments).

**Contenders, side by side in one run, each over its own fresh engines:**

- **nvpair-tw**: the real proxy (``nvpair_tw.testing.MemoryCluster``: the facades as built by
  ``build_runtime``, every connection in memory) with the two engines as its nodes, one facade
  at a time (facades that measure the same figures are reported as one row);
- **oracle**: each session pinned to one node (session i to node i mod 2), straight to the
  engines; for Claude Code 2.1.37 it sends the request without the billing block (what a proxy
  that knew better could forward);
- **random**: every turn straight to a node drawn at random (a balancer without affinity).

**Clock.** Everything runs on one virtual clock (``twisted.internet.task.Clock``) that jumps from
timer to timer once every byte in flight has moved: a run of minutes of engine time takes seconds,
the figures repeat exactly for a seed, and the shared machine's load cannot move them. What it
leaves out is the proxy's own CPU time per request (about a millisecond, against turns of about a
second; bench/run.py measures it).

**Reported**, per load (:data:`LOADS`: as many sessions as slots; twice as many; twice as many on
engines with llama-server's host-memory prompt cache), per route: mean seconds per turn (request
sent to last byte), the share of prompt tokens the engines found cached, the share of turns
served on another node than the session's previous turn, each against the oracle.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attrs import asdict, define, field, frozen
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from bench.agentclients import (
    CLIENTS,
    MODEL,
    SYSTEM_WORDS,
    Build,
    Client,
    Session,
    read_reply,
    words,
)
from bench.kvengine import CachingEngine, Kind, Served
from nvpair_tw.nodes import Node
from nvpair_tw.testing import MemoryCluster, MemoryResponse

NODES = ("a", "b")
SLOTS = 2
FACADES = ("ollama", "lmstudio", "omlx", "openai")
DEADLINE = 4 * 3600.0
"""Virtual seconds a run may take before it is called stuck."""


@frozen
class Placement:
    """Where a contender sends a session's next turn, and what it sends."""

    name: str
    to: Callable[[Session, random.Random], dict[str, str]]
    """The request's target: ``{"facade": ...}`` or ``{"node": ...}``."""
    clean: bool
    """Whether it sends the client's clean request (:attr:`Client.clean`)."""


def _nvpair(facade: str) -> Placement:
    return Placement("nvpair-tw", lambda _s, _r: {"facade": facade}, clean=False)


ORACLE = Placement("oracle", lambda s, _r: {"node": NODES[s.index % len(NODES)]}, clean=True)
RANDOM = Placement("random", lambda _s, r: {"node": r.choice(NODES)}, clean=False)


@frozen
class Scenario:
    """One run: ``sessions`` sessions of ``turns`` turns of ``client`` through ``placement``."""

    client: Client
    placement: Placement
    facade: str
    sessions: int
    turns: int
    seed: int
    think: tuple[float, float] = (0.5, 2.0)
    """Seconds an agent takes between an answer and its next request (drawn uniformly)."""
    spread: float = 2.0
    """Sessions start at seconds drawn uniformly in [0, spread)."""
    host_tokens: int = 0
    """Each engine's host-memory prompt cache, in tokens (0: slots only)."""


@define
class Outcome:
    """What one run measured."""

    turn_seconds: list[float] = field(factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    turns: int = 0
    """Turns after a session's first."""
    moved: int = 0
    """Of those, the turns served on another node than the session's previous turn."""
    failures: list[str] = field(factory=list)
    virtual_seconds: float = 0.0
    served: list[Served] = field(factory=list, repr=False)
    """Every request the engines served, in the order they ended."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.turn_seconds) if self.turn_seconds else float("nan")

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else float("nan")

    @property
    def moved_share(self) -> float:
        return self.moved / self.turns if self.turns else float("nan")


@define(eq=False)
class _Flight:
    session: Session
    sent: float
    node: str | None
    response: MemoryResponse | None = None
    failure: str | None = None


@define(eq=False)
class Driver:
    """Drives the sessions of one scenario on a cluster's clock (see :func:`run`)."""

    scenario: Scenario
    cluster: MemoryCluster
    sessions: list[Session]
    outcome: Outcome = field(factory=Outcome)
    flights: list[_Flight] = field(factory=list)
    finished: int = 0
    last_node: dict[int, str] = field(factory=dict)
    rng: random.Random = field(init=False)

    def __attrs_post_init__(self) -> None:
        self.rng = random.Random(f"{self.scenario.seed}/placement")

    @property
    def clock(self) -> Clock:
        return self.cluster.clock

    def start(self) -> None:
        for session in self.sessions:
            rng = random.Random(f"{self.scenario.seed}/start/{session.index}")
            at = rng.uniform(0, self.scenario.spread)
            self.clock.callLater(at, self.send, session)

    def send(self, session: Session) -> None:
        client, placement = self.scenario.client, self.scenario.placement
        build: Build = client.clean if placement.clean and client.clean else client.build
        body, headers = build(session)
        target = placement.to(session, self.rng)
        flight = _Flight(session, self.clock.seconds(), target.get("node"))
        pending = self.cluster.request(
            "POST",
            client.path,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", **headers},
            **target,
        )

        def arrived(response: MemoryResponse) -> None:
            flight.response = response

        def failed(failure: Failure) -> None:
            flight.failure = failure.getErrorMessage()

        pending.addCallbacks(arrived, failed)
        self.flights.append(flight)

    def poll(self) -> None:
        """Collect every answer that ended; schedule each session's next turn after it."""
        for flight in list(self.flights):
            response = flight.response
            if flight.failure is None and (response is None or response.ended is None):
                continue
            self.flights.remove(flight)
            self._ended(flight)

    def _ended(self, flight: _Flight) -> None:
        session, response = flight.session, flight.response
        try:
            if flight.failure is not None or response is None:
                raise ValueError(flight.failure)
            if response.status != 200 or not response.complete:
                raise ValueError(f"status {response.status}: {response.body[:200]!r}")
            reply = read_reply(self.scenario.client.path, response.body)
        except ValueError as error:
            self.outcome.failures.append(f"session {session.index}: {error}")
            self.finished += 1
            return
        end = response.arrivals[-1] if response.arrivals else response.headers_at
        self.outcome.turn_seconds.append(end - flight.sent)
        node = flight.node or response.header("x-nvpair-node") or "?"
        if session.index in self.last_node:
            self.outcome.turns += 1
            self.outcome.moved += node != self.last_node[session.index]
        self.last_node[session.index] = node
        session.answered(reply)
        if len(session.steps) >= self.scenario.turns:
            self.finished += 1
            return
        rng = random.Random(f"{self.scenario.seed}/think/{session.index}/{len(session.steps)}")
        self.clock.callLater(rng.uniform(*self.scenario.think), self.send, session)

    def drive(self) -> None:
        """Move the clock from timer to timer until every session has ended."""
        self.start()
        while self.finished < len(self.sessions):
            due = [c.getTime() for c in self.clock.getDelayedCalls() if c.active()]
            if not due or min(due) > DEADLINE:
                self.outcome.failures.append(f"stuck at {self.clock.seconds():.1f} s")
                return
            self.cluster.advance(max(0.0, min(due) - self.clock.seconds()))
            self.poll()


def _nodes(kind: str) -> list[Node]:
    """The engines as nodes given by URL alone, as ``--node a=URL`` gives them: the proxy polls
    each one's model list and, for llama-server, ``/props`` (so it knows the 2 slots; a node with
    a static model list is never polled and would run unlimited)."""
    return [Node(n, f"http://{n}.node.test:11434", None, kind=kind) for n in NODES]


def run(scenario: Scenario) -> Outcome:
    """One scenario on fresh engines and a fresh proxy, on its own virtual clock."""
    clock = Clock()
    kind = Kind(scenario.client.kind)
    host = scenario.host_tokens if kind is Kind.LLAMACPP else 0  # Ollama keeps no such cache
    engines = {
        n: CachingEngine(clock, n, kind=kind, model=MODEL, slots=SLOTS, host_tokens=host)
        for n in NODES
    }
    through_proxy = scenario.placement.name == "nvpair-tw"
    facades = (scenario.facade,) if through_proxy else ()
    nodes = {scenario.facade: _nodes(scenario.client.kind)} if through_proxy else {}
    cluster = MemoryCluster(clock, engines, facades=facades, nodes=nodes)
    assert all(cluster.url(n) == node.url for n, node in zip(NODES, _nodes("openai"), strict=True))
    system = words(random.Random(f"{scenario.seed}/system"), SYSTEM_WORDS)
    sessions = [Session.new(i, system, scenario.seed) for i in range(scenario.sessions)]
    driver = Driver(scenario, cluster, sessions)
    try:
        driver.drive()
    finally:
        for engine in engines.values():
            engine.stop()
        cluster.stop()
    served = sorted((s for e in engines.values() for s in e.served), key=lambda s: s.ended)
    driver.outcome.served = served
    driver.outcome.prompt_tokens = sum(s.prompt for s in served)
    driver.outcome.cached_tokens = sum(s.cached for s in served)
    driver.outcome.virtual_seconds = clock.seconds()
    return driver.outcome


# -- the report


@frozen
class Load:
    """One configuration of the run: how many sessions, and each engine's host-memory cache."""

    title: str
    sessions: int
    host_tokens: int = 0


HOST_TOKENS = 65_536
"""llama-server's default ``--cache-ram`` (8 GiB) at 128 KiB of KV cache a token."""
LOADS = (
    Load("4 sessions on 4 slots (2 engines x 2 slots), slots only", 4),
    Load("8 sessions on 4 slots, slots only", 8),
    Load(
        "8 sessions on 4 slots, each engine with llama-server's host-memory prompt cache "
        f"({HOST_TOKENS:,} tokens)",
        8,
        HOST_TOKENS,
    ),
)


@frozen
class Row:
    """One route at one load: each contender's outcome, the seeds pooled (nvpair-tw per
    facade)."""

    client: Client
    outcomes: dict[str, Outcome]


@frozen
class Pacing:
    """How the agents pace their sessions (see :class:`Scenario`)."""

    turns: int = 8
    think: tuple[float, float] = (0.5, 2.0)
    spread: float = 2.0


def measure(
    clients: Sequence[Client],
    facades: Sequence[str],
    load: Load,
    pacing: Pacing,
    seeds: Sequence[int],
) -> list[Row]:
    """Every contender on every route at one load."""
    rows = []
    for client in clients:
        placements = [(f, _nvpair(f)) for f in _facades_for(client, facades)]
        placements += [("-", ORACLE), ("-", RANDOM)]
        outcomes: dict[str, Outcome] = {}
        for facade, placement in placements:
            label = f"nvpair-tw/{facade}" if placement.name == "nvpair-tw" else placement.name
            total = outcomes[label] = Outcome()
            for seed in seeds:
                scenario = Scenario(
                    client, placement, facade, load.sessions, pacing.turns, seed,
                    pacing.think, pacing.spread, load.host_tokens,
                )  # fmt: skip
                _pool(total, run(scenario))
        rows.append(Row(client, outcomes))
    return rows


def _facades_for(client: Client, facades: Sequence[str]) -> list[str]:
    """The facades a route is measured through (``/api/chat`` is the Ollama facade's)."""
    return ["ollama"] if client.path == "/api/chat" else list(facades)


def _pool(total: Outcome, outcome: Outcome) -> None:
    total.turn_seconds += outcome.turn_seconds
    total.prompt_tokens += outcome.prompt_tokens
    total.cached_tokens += outcome.cached_tokens
    total.turns += outcome.turns
    total.moved += outcome.moved
    total.failures += outcome.failures
    total.virtual_seconds += outcome.virtual_seconds
    total.served += outcome.served


def _folded(outcomes: dict[str, Outcome]) -> list[tuple[str, Outcome]]:
    """nvpair-tw's facades that measured the same figures as one entry, then the others."""
    groups: dict[tuple[float, float, float, int], list[str]] = {}
    kept: dict[tuple[float, float, float, int], Outcome] = {}
    for label, outcome in outcomes.items():
        if label.startswith("nvpair-tw/"):
            figures = (
                round(outcome.mean, 6), round(outcome.cached_share, 6),
                round(outcome.moved_share, 6), len(outcome.failures),
            )  # fmt: skip
            groups.setdefault(figures, []).append(label.split("/", 1)[1])
            kept[figures] = outcome
    folded = [(f"nvpair-tw ({', '.join(names)})", kept[key]) for key, names in groups.items()]
    return folded + [(k, v) for k, v in outcomes.items() if not k.startswith("nvpair-tw/")]


def table(rows: Sequence[Row]) -> str:
    """The Markdown table of one load: each contender's mean seconds per turn, its share of
    prompt tokens found cached and its turns moved to another node, against the oracle."""
    lines = [
        "| route (client) | contender | s / turn | x oracle | prompt tokens found cached "
        "| x oracle | turns moved to another node |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        oracle = row.outcomes["oracle"]
        for label, outcome in _folded(row.outcomes):
            failed = f" ({len(outcome.failures)} turns failed)" if outcome.failures else ""
            lines.append(
                f"| {row.client.name} | {label}{failed} | {outcome.mean:.2f} | "
                f"{outcome.mean / oracle.mean:.2f} | {outcome.cached_share:.0%} | "
                f"{_ratio(outcome.cached_share, oracle.cached_share)} | "
                f"{outcome.moved_share:.0%} |"
            )
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def _pair(text: str) -> tuple[float, float]:
    low, high = (float(x) for x in text.split(","))
    return low, high


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="the Ollama facade only, one seed")
    parser.add_argument("--facades", default=",".join(FACADES), help="comma-separated")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--think", type=_pair, default=(0.5, 2.0), help="MIN,MAX seconds")
    parser.add_argument("--spread", type=float, default=2.0, help="sessions start within it")
    parser.add_argument("--seeds", default="7,8,9", help="comma-separated; outcomes are pooled")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    args = parser.parse_args(argv)
    facades = ["ollama"] if args.quick else args.facades.split(",")
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None]
    pacing = Pacing(args.turns, args.think, args.spread)
    started = time.monotonic()
    report: dict[str, Any] = {"facades": facades, "seeds": seeds, **asdict(pacing), "loads": []}
    for load in LOADS:
        rows = measure(CLIENTS, facades, load, pacing, seeds)
        print(f"\n#### {load.title}, {pacing.turns} turns each\n", flush=True)
        print(table(rows), flush=True)
        figures = [
            {"client": r.client.name, "outcomes": {k: _figures(v) for k, v in r.outcomes.items()}}
            for r in rows
        ]
        report["loads"].append({**asdict(load), "rows": figures})
    report["wall_seconds"] = time.monotonic() - started
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.json or Path(__file__).parent / "results" / f"agents-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\n{report['wall_seconds']:.0f} s (wall); figures in {out}")
    return 0


def _figures(outcome: Outcome) -> dict[str, Any]:
    return {
        **asdict(outcome, filter=lambda a, _v: a.name != "served"),
        "mean": outcome.mean,
        "cached_share": outcome.cached_share,
        "moved_share": outcome.moved_share,
    }


if __name__ == "__main__":
    sys.exit(main())
