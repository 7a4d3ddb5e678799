"""Small non-streaming requests only: nvpair-tw vs ReverseProxyResource side by side, and a profile.

``python bench/small.py [--rounds N] [--seconds S] [--log-level L] [--no-admin] [--profile SECONDS]``
starts the fast fake engine, nvpair-tw (the flags of ``bench/run.py``, but the log level is a
choice: ``info``, the default of a deployment, writes one line per request; ``warn`` is what
``bench/run.py`` uses; the admin listener, whose metrics and status board follow every request, is
on as deployed unless ``--no-admin``, as in ``bench/run.py``) and RPR, then runs ``wrk`` at c=1 and c=32 on ``POST /api/chat``,
interleaved round by round, and prints medians and ratios. With ``--profile`` it also records
py-spy on nvpair-tw during a c=32 run and prints the reactor thread's hottest frames, inclusive
and self. It is the narrow form of scenario 1 of ``bench/run.py`` (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (
    BENCH,
    CHAT,
    PY,
    Harness,
    Server,
    free_port,
    wait_ready,
    wrk,
)


def start(harness: Harness, log_level: str, admin: bool) -> dict[str, Server]:
    up = free_port()
    upstream = harness.spawn("upstream", [PY, str(BENCH / "upstream.py"), str(up)])
    wait_ready(up, upstream)
    port = free_port()
    argv = [PY, "-m", "twisted", "nvpair", "--engine", "ollama", "--assemble", "off"]
    argv += ["--usage-db", "none", "--listen", f"tcp:{port}:interface=127.0.0.1:backlog=4096"]
    listener = f"tcp:{free_port()}:interface=127.0.0.1" if admin else "none"
    argv += ["--node", f"a=http://127.0.0.1:{up}", "--admin", listener]
    argv += ["--log-level", log_level, "--max-connections", "4096"]
    servers = {"nvpair-tw": Server("nvpair-tw", port, harness.spawn("nvpair-tw", argv))}
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
    parser.add_argument("--profile", type=int, default=0, help="py-spy seconds at c=32 (0: none)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    pin = shutil.which("taskset") is not None and {0, 1} <= os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, {1})
    harness = Harness(Path(tempfile.mkdtemp(prefix="nvpair-small-")), pin)
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        servers = start(harness, args.log_level, args.admin)
        for server in servers.values():  # warm up
            wrk(harness, server.port, "/api/chat", CHAT, 32, 1)
        for _ in range(args.rounds):
            for name, server in servers.items():
                row = rows.setdefault(name, {"p50": [], "rps": [], "cpu": [], "err": []})
                c1 = wrk(harness, server.port, "/api/chat", CHAT, 1, args.seconds)
                before = server.cpu()
                c32 = wrk(harness, server.port, "/api/chat", CHAT, 32, args.seconds)
                row["cpu"].append((server.cpu() - before) / max(c32["requests"], 1) * 1e6)
                row["p50"].append(c1["p50_us"] / 1000)
                row["rps"].append(c32["rps"])
                row["err"].append(c1["status_errors"] + c32["status_errors"] + c32["timeouts"])
        if args.profile:
            spy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
            out = harness.tmp / "profile.txt"
            pid = str(servers["nvpair-tw"].process.pid)
            argv = [spy, "record", "-p", pid, "-d", str(args.profile), "-f", "raw", "-r", "200"]
            recorder = subprocess.Popen(
                [*argv, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            wrk(harness, servers["nvpair-tw"].port, "/api/chat", CHAT, 32, args.profile)
            recorder.wait(timeout=args.profile + 30)
            keep = BENCH / "results"
            keep.mkdir(exist_ok=True)
            shutil.copy(out, keep / f"small-profile-{os.getpid()}.txt")
            print("\n".join(summarise(out, args.top)))
    finally:
        harness.stop()
        shutil.rmtree(harness.tmp, ignore_errors=True)
    admin = "admin on" if args.admin else "admin none"
    print(
        f"\nlog level {args.log_level}, {admin}, {args.rounds} rounds of {args.seconds} s, medians"
    )
    print(
        "| contender | p50 ms c=1 | req/s c=32 | x RPR | CPU µs/req c=32 | errors | rounds req/s |"
    )
    print("|---|---|---|---|---|---|---|")
    rpr = statistics.median(rows["rpr"]["rps"])
    for name, row in rows.items():
        rps = statistics.median(row["rps"])
        print(
            f"| {name} | {statistics.median(row['p50']):.3f} | {rps:,.0f} | {rps / rpr:.2f} "
            f"| {statistics.median(row['cpu']):.0f} | {sum(row['err']):.0f} "
            f"| {', '.join(f'{r:,.0f}' for r in row['rps'])} |"
        )


if __name__ == "__main__":
    main()
