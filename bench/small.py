"""Small requests and streamed events: nvpair-tw vs ReverseProxyResource side by side, a profile.

``python bench/small.py [--rounds N] [--seconds S] [--log-level L] [--no-admin]
[--load small|stream|both] [--base REF] [--profile SECONDS]`` starts the fast fake engine,
nvpair-tw (as the shipped unit runs it: twistd with the compact JSON log; the flags of
``bench/run.py``, but the log level is a choice: ``info``, a deployment's
default, writes one line per request, ``warn`` is what ``bench/run.py`` uses; the admin listener,
whose metrics and status board follow every request, is on as deployed unless ``--no-admin``, as
in ``bench/run.py``; so is the usage history, in a SQLite file, unless ``--no-usage``), with ``--base`` a second nvpair-tw running the code at that git ref, and
RPR. ``small``: ``wrk`` at c=1 and c=32 on ``POST /api/chat``; ``stream``: ``wrk`` at c=4 on
streams of 1,000 SSE events in one burst, CPU per relayed event. Contenders interleave round by
round, in reverse order every other round; medians are printed, with the ratio of the medians to
RPR's and the median (and quartiles) of the rounds' own ratios. ``--profile`` records py-spy on each nvpair-tw under the
(first) load, keeps the raw stacks in ``bench/results/`` and prints the hottest frames, inclusive
and self. It is the narrow form of
scenarios 1 and 2 of ``bench/run.py`` (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from io import BytesIO
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (
    BENCH,
    CHAT,
    CHUNKS,
    PY,
    REPO,
    STREAM,
    Harness,
    Server,
    free_port,
    wait_ready,
    wrk,
)


def nvpair(harness: Harness, up: int, options: argparse.Namespace, root: Path) -> Server:
    """nvpair-tw in front of the engine on ``up``, its code (and plugin) from ``root``."""
    port = free_port()
    # As the shipped unit runs it (docs/deploy/nvpair.service): twistd with the compact JSON log.
    twistd = [PY, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon"]
    twistd += ["--pidfile=", "--logger=nvpair_tw.logs.compactJson"]
    argv = [*twistd, "nvpair", "--engine", "ollama", "--assemble", "off"]
    usage = str(harness.tmp / f"usage-{port}.sqlite3") if options.usage else "none"
    argv += ["--usage-db", usage, "--listen", f"tcp:{port}:interface=127.0.0.1:backlog=4096"]
    listener = f"tcp:{free_port()}:interface=127.0.0.1" if options.admin else "none"
    argv += ["--node", f"a=http://127.0.0.1:{up}", "--admin", listener]
    argv += ["--log-level", options.log_level, "--max-connections", "4096"]
    if harness.pin:
        argv = ["taskset", "-c", "0", *argv]
    name = "nvpair-tw" if root == REPO else f"nvpair-tw@{options.base}"
    log = (harness.tmp / f"{name}.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(root)}
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env)
    harness.servers.append(process)
    return Server(name, port, process)


def start(harness: Harness, options: argparse.Namespace) -> dict[str, Server]:
    """The engine, nvpair-tw (and, with ``--base``, nvpair-tw at that ref) and RPR, ready."""
    up = free_port()
    upstream = harness.spawn("upstream", [PY, str(BENCH / "upstream.py"), str(up)])
    wait_ready(up, upstream)
    servers = {"nvpair-tw": nvpair(harness, up, options, REPO)}
    if options.base:
        root = harness.tmp / "base"
        root.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", options.base, "nvpair_tw", "twisted"],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        base = nvpair(harness, up, options, root)
        servers[base.name] = base
    rpr = free_port()
    servers["rpr"] = Server(
        "rpr", rpr, harness.spawn("rpr", [PY, str(BENCH / "rpr.py"), str(rpr), str(up)])
    )
    for server in servers.values():
        wait_ready(server.port, server.process)
    return servers


def summarise(path: Path, top: int) -> list[str]:
    """The hottest frames of the sampled stacks, inclusive and self, as shares of all samples."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if any("threading.py" in f for f in frames):
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    out = [f"{total} samples; inclusive:"]
    out += [f"  {n / total * 100:5.1f}% {f}" for f, n in inclusive.most_common(top * 2)]
    out += ["self:"]
    out += [f"  {n / total * 100:5.1f}% {f}" for f, n in own.most_common(top)]
    return out


Rows = dict[str, dict[str, list[float]]]


def in_turn(servers: dict[str, Server], turn: int) -> list[tuple[str, Server]]:
    """The contenders in the order of one round: reversed every other round, so a drift in the
    shared machine's speed during a round favours none of them."""
    order = list(servers.items())
    return order[::-1] if turn % 2 else order


def small(harness: Harness, servers: dict[str, Server], rounds: int, seconds: int) -> Rows:
    """c=1 latency, then c=32 throughput and CPU per request, interleaved round by round."""
    rows: Rows = {}
    for turn in range(rounds):
        for name, server in in_turn(servers, turn):
            row = rows.setdefault(name, {"p50": [], "rps": [], "cpu": [], "err": []})
            c1 = wrk(harness, server.port, "/api/chat", CHAT, 1, seconds)
            before = server.cpu()
            c32 = wrk(harness, server.port, "/api/chat", CHAT, 32, seconds)
            row["cpu"].append((server.cpu() - before) / max(c32["requests"], 1) * 1e6)
            row["p50"].append(c1["p50_us"] / 1000)
            row["rps"].append(c32["rps"])
            row["err"].append(c1["status_errors"] + c32["status_errors"] + c32["timeouts"])
    return rows


def streamed(harness: Harness, servers: dict[str, Server], rounds: int, seconds: int) -> Rows:
    """c=4 streams of 1,000 SSE events in one burst: CPU per relayed event, interleaved."""
    rows: Rows = {}
    for turn in range(rounds):
        for name, server in in_turn(servers, turn):
            row = rows.setdefault(name, {"cpu": [], "eps": [], "err": []})
            before = server.cpu()
            run = wrk(harness, server.port, "/v1/chat/completions", STREAM, 4, seconds)
            events = max(run["requests"], 1) * CHUNKS
            row["cpu"].append((server.cpu() - before) / events * 1e6)
            row["eps"].append(run["rps"] * CHUNKS)
            row["err"].append(run["status_errors"] + run["timeouts"] + run["socket_errors"])
    return rows


def profile(harness: Harness, server: Server, seconds: int, load: str, top: int) -> list[str]:
    """py-spy on ``server`` during ``seconds`` of the small (c=32) or the streamed (c=4) load."""
    spy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    out = harness.tmp / "profile.txt"
    argv = [spy, "record", "-p", str(server.process.pid), "-d", str(seconds), "-f", "raw"]
    recorder = subprocess.Popen(
        [*argv, "-r", "200", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if load == "stream":
        wrk(harness, server.port, "/v1/chat/completions", STREAM, 4, seconds)
    else:
        wrk(harness, server.port, "/api/chat", CHAT, 32, seconds)
    recorder.wait(timeout=seconds + 30)
    keep = BENCH / "results"
    keep.mkdir(exist_ok=True)
    name = server.name.replace("@", "-at-")
    shutil.copy(out, keep / f"{load}-profile-{name}-{os.getpid()}.txt")
    return [
        f"{server.name}: " + line if not line.startswith(" ") else line
        for line in summarise(out, top)
    ]


def table(rows: Rows, columns: dict[str, tuple[str, int]], ratio: str) -> list[str]:
    """Medians per contender, ``ratio`` also as a multiple of RPR's: the ratio of the medians,
    and the median (and quartiles) of the rounds' own ratios, each round's contenders measured
    back to back (the machine's speed drifts between rounds more than within one)."""
    names = list(columns)
    lines = [
        "| contender | "
        + " | ".join(columns[n][0] for n in names)
        + f" | {ratio} x RPR | paired x RPR (quartiles) |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    rpr = rows["rpr"][ratio]
    for contender, row in rows.items():
        cells = [f"{statistics.median(row[n]):,.{columns[n][1]}f}" for n in names]
        paired = [mine / theirs for mine, theirs in zip(row[ratio], rpr, strict=True)]
        low, mid, high = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        lines.append(
            f"| {contender} | "
            + " | ".join(cells)
            + f" | {statistics.median(row[ratio]) / statistics.median(rpr):.2f}"
            + f" | {mid:.2f} ({low:.2f}-{high:.2f}) |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--admin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the admin listener (metrics, status board) on, as deployed, or off as in run.py",
    )
    parser.add_argument(
        "--usage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the usage history in a SQLite file, as deployed (--no-usage: --usage-db none)",
    )
    parser.add_argument("--base", help="also run nvpair-tw as it is at this git ref")
    parser.add_argument("--load", choices=("small", "stream", "both"), default="small")
    parser.add_argument("--profile", type=int, default=0, help="py-spy seconds (0: none)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    pin = shutil.which("taskset") is not None and {0, 1} <= os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, {1})
    harness = Harness(Path(tempfile.mkdtemp(prefix="nvpair-small-")), pin)
    out: list[str] = []
    results: dict[str, Any] = {}
    try:
        servers = start(harness, args)
        for server in servers.values():  # warm up
            wrk(harness, server.port, "/api/chat", CHAT, 32, 1)
        if args.load in ("small", "both"):
            results["small"] = small(harness, servers, args.rounds, args.seconds)
        if args.load in ("stream", "both"):
            results["stream"] = streamed(harness, servers, args.rounds, args.seconds)
        if args.profile:
            load = "stream" if args.load == "stream" else "small"
            for name, server in servers.items():
                if name.startswith("nvpair-tw"):
                    out += profile(harness, server, args.profile, load, args.top)
    finally:
        harness.stop()
        shutil.rmtree(harness.tmp, ignore_errors=True)
    print("\n".join(out))
    admin = "admin on" if args.admin else "admin none"
    print(
        f"\nlog level {args.log_level}, {admin}, {args.rounds} rounds of {args.seconds} s, medians"
    )
    if "small" in results:
        columns = {"p50": ("p50 ms c=1", 3), "rps": ("req/s c=32", 0), "cpu": ("CPU µs/req", 0)}
        print("\n".join(table(results["small"], columns, "rps")))
    if "stream" in results:
        columns = {"eps": ("events/s c=4", 0), "cpu": ("CPU µs/event", 2)}
        print("\n".join(table(results["stream"], columns, "cpu")))
    for kind, rows in results.items():
        for name, row in rows.items():
            print(f"{kind} {name} rounds: " + ", ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
