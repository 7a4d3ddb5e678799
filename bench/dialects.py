"""Relay cost of translation and renaming (§11.3, §11.4), through the real proxy process.

``python bench/dialects.py [--quick] [--rounds R] [--seconds S] [--conns 1,64] [--batch K]``
builds ``bench/streamgen.c``, starts its engine in *real* mode (Ollama NDJSON and OpenAI SSE chunks
as the engines send them, naming the model the request named; bursts of 1,000 token events, K per
engine write) and one nvpair-tw (``python -m twisted nvpair --engine ollama``) over a nodes file
that puts the same engine behind two nodes:

- ``o``, ``kind = "ollama"``, ``models = ["local-name"]``, with ``[[model]] name = "pub"
  aliases = ["local-name"]``;
- ``x``, ``kind = "openai"``, ``models = ["remote-name"]``.

Each variant is a streamgen relay client (one or more keep-alive connections asking for bursts
back to back) through the proxy; the proxy's CPU over the run divided by the token events the
client received is its CPU µs per token:

- **native NDJSON**: ``/api/chat`` for ``local-name`` (node ``o``, relayed as it comes);
- **renamed NDJSON**: ``/api/chat`` for ``pub`` (node ``o`` is asked for ``local-name``, every
  ``"model":"local-name"`` of the answer becomes ``"model":"pub"``);
- **translated**: ``/api/chat`` for ``remote-name`` (node ``x`` is asked
  ``/v1/chat/completions`` and its SSE becomes Ollama NDJSON);
- **native SSE**: ``/v1/chat/completions`` for ``local-name`` (node ``o``, natively);
- **renamed SSE**: ``/v1/chat/completions`` for ``pub``;
- **translated SSE->Messages**: ``/v1/messages`` for ``local-name`` (node ``o``: an Ollama node
  may lack Anthropic Messages, docs/behaviour.md §17.3, so it is asked ``/v1/chat/completions``
  and its SSE becomes Messages events), against native SSE (target at most 2x).

Rounds interleave the variants (the order rotates every round), so load from other processes on
the machine falls on all of them alike; the tables give the median and the best of the rounds and
the ratios of the per-round pairs (median) as well as of the bests. The engine and the client run
on core 1, the proxy alone on core 0 (when the machine has two cores). Prints Markdown tables and
writes ``bench/results/dialects-<UTC timestamp>.json``. See docs/performance.md, "Translation and
renaming".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from run import BENCH, PY, Harness, Server, fmt, free_port
from streams import build_streamgen, client, core_busy, core_times, others, reap

EVENTS = 1000  # token events per burst response
BATCH = 50  # events per engine write (see streams.RELAY_BATCH)
NODES = """\
[[model]]
name = "pub"
aliases = ["local-name"]

[[node]]
id = "o"
url = "http://127.0.0.1:{up}"
kind = "ollama"
models = ["local-name"]

[[node]]
id = "x"
url = "http://127.0.0.1:{up}"
kind = "openai"
models = ["remote-name"]
"""


@dataclass(frozen=True)
class Variant:
    name: str
    path: str
    model: str
    answered: str  # the model every chunk the client gets must name
    framing: str  # what the client gets: "ndjson" or "sse"


VARIANTS = (
    Variant("native NDJSON", "/api/chat", "local-name", "local-name", "ndjson"),
    Variant("renamed NDJSON", "/api/chat", "pub", "pub", "ndjson"),
    Variant("translated SSE->NDJSON", "/api/chat", "remote-name", "remote-name", "ndjson"),
    Variant("native SSE", "/v1/chat/completions", "local-name", "local-name", "sse"),
    Variant("renamed SSE", "/v1/chat/completions", "pub", "pub", "sse"),
    Variant("translated SSE->Messages", "/v1/messages", "local-name", "local-name", "messages"),
)
BASE = {"renamed NDJSON": "native NDJSON", "renamed SSE": "native SSE"}
# (numerator, denominator, target) of every ratio reported
RATIOS = (
    ("renamed NDJSON", "native NDJSON", 1.2),
    ("translated SSE->NDJSON", "native NDJSON", 2.0),
    ("translated SSE->NDJSON", "native SSE", 2.0),
    ("renamed SSE", "native SSE", 1.2),
    ("translated SSE->Messages", "native SSE", 2.0),
)


# ------------------------------------------------------------------------------------ processes


def fetch(port: int, variant: Variant) -> list[bytes]:
    """One whole burst through the proxy, as the lines of its body."""
    body = {
        "model": variant.model,
        "stream": True,
        "bench_rate": 0,
        "bench_events": 5,
        "bench_batch": 5,
        "messages": [{"role": "user", "content": "hi"}],
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{variant.path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return [line for line in answer.read().split(b"\n") if line.strip()]


def check(port: int, variant: Variant) -> None:
    """The variant is what it says: every chunk names the right model, and the translated one was
    translated (its final object is the proxy's, without the engine's ``load_duration``)."""
    lines = fetch(port, variant)
    if variant.framing == "messages":
        check_messages(lines, variant)
        return
    chunks = [line.removeprefix(b"data: ") for line in lines if line != b"data: [DONE]"]
    docs = [json.loads(chunk) for chunk in chunks]
    models = {doc.get("model") for doc in docs if "model" in doc}
    if models != {variant.answered}:
        raise RuntimeError(f"{variant.name}: the answer names {models}, not {variant.answered!r}")
    if variant.framing == "sse" and lines[-1] != b"data: [DONE]":
        raise RuntimeError(f"{variant.name}: no data: [DONE]")
    if variant.framing == "ndjson" and docs[-1].get("done") is not True:
        raise RuntimeError(f"{variant.name}: no final object")
    translated = "load_duration" not in docs[-1]
    if variant.framing == "ndjson" and translated != variant.name.startswith("translated"):
        raise RuntimeError(f"{variant.name}: translated={translated}")
    tokens = sum(1 for chunk in chunks if b'"content":"tok' in chunk)
    if tokens < 5:
        raise RuntimeError(f"{variant.name}: {tokens} token chunks")


def check_messages(lines: list[bytes], variant: Variant) -> None:
    """A Messages stream: every event named, the model in ``message_start``, ``message_stop``
    last, the tokens as ``text_delta`` events."""
    docs = [json.loads(line.removeprefix(b"data: ")) for line in lines if line.startswith(b"data:")]
    names = [line.removeprefix(b"event: ").decode() for line in lines if line.startswith(b"event:")]
    if names != [doc.get("type") for doc in docs]:
        raise RuntimeError(f"{variant.name}: events not named as their type")
    if docs[0]["message"]["model"] != variant.answered or docs[-1]["type"] != "message_stop":
        raise RuntimeError(f"{variant.name}: not a Messages stream for {variant.answered!r}")
    tokens = sum(1 for line in lines if b'"text":"tok' in line)
    if tokens < 5:
        raise RuntimeError(f"{variant.name}: {tokens} token events")


def wait_ready(port: int, process: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"process on port {port} exited with {process.returncode}")
        try:
            for variant in VARIANTS:
                check(port, variant)
            return
        except (OSError, RuntimeError, ValueError) as error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {port} not ready after {seconds} s: {error}") from error
            time.sleep(0.2)


@contextmanager
def running(
    pin: bool, batch: int, compare: Path | None
) -> Iterator[tuple[Harness, Path, Server, dict[str, Server]]]:
    """The engine (core 1) and the proxy (core 0), and with ``compare`` a second proxy run from
    that checkout (also core 0); every process is stopped on the way out."""
    harness = Harness(Path(tempfile.mkdtemp(prefix="nvpair-dialects-")), pin)
    try:
        streamgen = build_streamgen(harness.tmp)
        up = free_port()
        argv = [str(streamgen), "serve", str(up), "real", str(EVENTS), str(batch)]
        engine = Server("engine", up, harness.spawn("engine", argv, core=1))
        nodes = harness.tmp / "nodes.toml"
        nodes.write_text(NODES.format(up=up))
        proxies = {}
        checkouts = {"this": None} if compare is None else {"this": None, "compared": compare}
        for label, checkout in checkouts.items():
            port = free_port()
            argv = [PY, "-m", "twisted", "nvpair", "--engine", "ollama", "--assemble", "off"]
            if checkout is None:  # usage in memory: its recording is part of what is measured
                argv += ["--usage-db", "none"]
            argv += ["--listen", f"tcp:{port}:interface=127.0.0.1:backlog=4096"]
            argv += ["--nodes", str(nodes), "--admin", "none", "--log-level", "warn"]
            if checkout is not None:  # its own nvpair_tw first on the path, run from there
                argv = ["env", "-C", str(checkout), f"PYTHONPATH={checkout}", *argv]
            proxy = Server(label, port, harness.spawn(f"nvpair-tw-{label}", argv))
            wait_ready(port, proxy.process)
            proxies[label] = proxy
        yield harness, streamgen, engine, proxies
    finally:
        harness.stop()
        shutil.rmtree(harness.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------- measuring


def relay(
    harness: Harness,
    streamgen: Path,
    engine: Server,
    proxy: Server,
    variant: Variant,
    conns: int,
    seconds: float,
    batch: int,
) -> dict[str, Any]:
    argv = [str(streamgen), "relay", str(proxy.port), variant.path, str(conns), str(EVENTS)]
    argv += [f"{seconds:g}", str(batch), variant.model]
    cpu0, engine0, cores0 = proxy.cpu(), engine.cpu(), core_times()
    started = time.monotonic()
    process = client(harness, argv)
    result, client_cpu = reap(process)
    cpu, engine_cpu, cores1 = proxy.cpu() - cpu0, engine.cpu() - engine0, core_times()
    wall = time.monotonic() - started
    tokens = max(result["events"], 1)
    proxy_pct, engine_pct = cpu / wall * 100, engine_cpu / wall * 100
    return {
        **result,
        "variant": variant.name,
        "tokens_per_s": result["events"] / result["seconds"],
        "proxy_cpu_us_per_token": cpu / tokens * 1e6,
        "proxy_cpu_pct": proxy_pct,
        "engine_cpu_pct": engine_pct,
        "client_cpu_pct": client_cpu / wall * 100,
        **others(core_busy(cores0, cores1), proxy_pct, engine_pct + client_cpu / wall * 100, False),
    }


def summarise(
    runs: list[dict[str, Any]], conns: int, rounds: int, proxy: str = "this"
) -> dict[str, Any]:
    mine = [r for r in runs if r["conns"] == conns and r["proxy"] == proxy]
    per: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        values = [r["proxy_cpu_us_per_token"] for r in mine if r["variant"] == variant.name]
        rates = [r["tokens_per_s"] for r in mine if r["variant"] == variant.name]
        per[variant.name] = {
            "median_us": statistics.median(values),
            "best_us": min(values),
            "worst_us": max(values),
            "spread_pct": (max(values) - min(values)) / min(values) * 100,
            "tokens_per_s": statistics.median(rates),
        }
    ratios = []
    for top, bottom, target in RATIOS:
        pairs = []
        for index in range(rounds):
            a = next(r for r in mine if r["round"] == index and r["variant"] == top)
            b = next(r for r in mine if r["round"] == index and r["variant"] == bottom)
            pairs.append(a["proxy_cpu_us_per_token"] / b["proxy_cpu_us_per_token"])
        ratios.append(
            {
                "ratio": f"{top} / {bottom}",
                "target": target,
                "paired_median": statistics.median(pairs),
                "paired_min": min(pairs),
                "paired_max": max(pairs),
                "of_bests": per[top]["best_us"] / per[bottom]["best_us"],
                "of_medians": per[top]["median_us"] / per[bottom]["median_us"],
            }
        )
    return {"proxy": proxy, "conns": conns, "variants": per, "ratios": ratios}


def tables(summary: dict[str, Any], rounds: int) -> str:
    conns = summary["conns"]
    lines = [
        f"Proxy CPU per token ({summary['proxy']} checkout), {conns} connection(s), "
        f"{rounds} interleaved rounds:\n",
        "| variant | CPU µs / token, median | best | worst | spread % | tokens/s (median) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary["variants"].items():
        lines.append(
            f"| {name} | {fmt(row['median_us'], 3)} | {fmt(row['best_us'], 3)} "
            f"| {fmt(row['worst_us'], 3)} | {fmt(row['spread_pct'], 0)} "
            f"| {fmt(row['tokens_per_s'], 0)} |"
        )
    lines += [
        "",
        "| ratio | target | per-round pairs: median (min-max) | of bests | of medians | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in summary["ratios"]:
        met = "yes" if row["paired_median"] <= row["target"] else "**no**"
        lines.append(
            f"| {row['ratio']} | ≤ {row['target']:g}x | {row['paired_median']:.2f}x "
            f"({row['paired_min']:.2f}-{row['paired_max']:.2f}) | {row['of_bests']:.2f}x "
            f"| {row['of_medians']:.2f}x | {met} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1.5 s (~30 s)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 3)")
    parser.add_argument("--seconds", type=float, help="seconds per run (default 3, quick 1.5)")
    parser.add_argument("--conns", default="1", help="comma-separated connection counts")
    parser.add_argument("--batch", type=int, default=BATCH, help="events per engine write")
    parser.add_argument(
        "--compare",
        type=Path,
        help="another checkout (e.g. a `git archive` of an older commit): its proxy runs too, "
        "interleaved, for a before/after table from one run",
    )
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    seconds = args.seconds or (1.5 if args.quick else 3.0)
    conn_counts = [int(n) for n in args.conns.split(",")]
    cores = os.sched_getaffinity(0)
    pin = shutil.which("taskset") is not None and {0, 1} <= cores
    if pin:
        os.sched_setaffinity(0, {1})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    print(
        f"pinning: {'proxy on core 0, engine + client + harness on core 1' if pin else 'off'}; "
        f"{EVENTS}-event bursts, {args.batch} per engine write, {seconds:g} s per run",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    with running(pin, args.batch, args.compare) as (harness, streamgen, engine, proxies):
        for conns in conn_counts:
            for index in range(rounds):
                order = VARIANTS[index % len(VARIANTS) :] + VARIANTS[: index % len(VARIANTS)]
                for variant, proxy in [(v, p) for v in order for p in proxies.values()]:
                    row = relay(
                        harness, streamgen, engine, proxy, variant, conns, seconds, args.batch
                    )
                    row.update(round=index, proxy=proxy.name)
                    runs.append(row)
                    print(
                        f"  c={conns} round {index + 1}: {proxy.name}: {variant.name}: "
                        f"{row['proxy_cpu_us_per_token']:.3f} µs/token, "
                        f"{row['tokens_per_s']:,.0f} tokens/s, errors {row['errors']}, "
                        f"core 0 busy {row['core0_busy_pct']:.0f} %, "
                        f"core 1 other {row['core1_other_pct']:.0f} %",
                        flush=True,
                    )
    labels = ["this"] + (["compared"] if args.compare else [])
    summaries = [summarise(runs, conns, rounds, label) for conns in conn_counts for label in labels]
    for summary in summaries:
        print()
        print(tables(summary, rounds))
    if not args.no_save:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        results = BENCH / "results"
        results.mkdir(exist_ok=True)
        dest = results / f"dialects-{stamp}.json"
        record = {
            "started": stamp,
            "seconds": time.time() - started,
            "pinned": pin,
            "events": EVENTS,
            "batch": args.batch,
            "rounds": rounds,
            "run_seconds": seconds,
            "compared": str(args.compare) if args.compare else None,
            "summaries": summaries,
            "runs": runs,
        }
        dest.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nresults written to {dest} ({record['seconds']:.0f} s)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: every process started was stopped", file=sys.stderr)
        sys.exit(130)
