"""Python calls and self time per small request, by package and by feature, under cProfile.

``python bench/calls.py [--requests N] [--no-admin] [--no-usage] [--log-level L] [--top N]``
starts the fast fake engine and nvpair-tw as ``bench/instructions.py`` runs it (twistd with the
compact JSON log, the admin listener, the usage history in SQLite), with a profiler switched on
and off by signals (``SIGUSR1``, ``SIGUSR2``, which also writes the profile). It sends warm-up
requests, profiles N small ``POST /api/chat`` one after another on one keep-alive connection, and
prints, per request: the calls and self time of each package (``nvpair_tw.corridor``,
``twisted.web``, the C built-ins, ...), the inclusive time and calls of each feature (the log
line, the metrics, the usage record, the phase events, the route, the attempt, the relay, ...)
and the hottest functions. Call counts are exact; times carry the profiler's own overhead and
the machine's noise, so read them as shares, and instructions from ``bench/instructions.py``.
"""

from __future__ import annotations

import argparse
import http.client
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instructions import CHAT, nvpair_argv
from run import BENCH, PY, REPO, free_port, wait_ready

FEATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bus: publish (all kinds)", ("_bus.py:publish",)),
    ("log line (sink, format, observer)", ("_log.py:sink",)),
    ("log observer (JSON, write)", ("logs.py:_compact", "_file.py:__call__")),
    ("metrics (bus sinks)", ("ops/_metrics.py:", "ops/_plain.py:", "ops/_counters.py:")),
    ("status board / recent", ("ops/_board.py:", "ops/_recent.py:", "ops/_throughput.py:")),
    ("usage record", ("usage/_recorder.py:", "usage/_buffer.py:", "usage/_minutes.py:")),
    ("phase events", ("_driver.py:_phase_changed",)),
    ("workload events", ("_workloads.py:",)),
    ("record (Facts.record)", ("_record.py:record",)),
    ("head gate", ("_facade.py:head_gate",)),
    ("read body (parse)", ("_inbound.py:read_body",)),
    ("route (Serving.routed)", ("_serving.py:routed",)),
    ("admission", ("_serving.py:admitted",)),
    ("attempts", ("_attempts.py:run_attempts",)),
    ("relay", ("_relay.py:relay",)),
    ("driver finish", ("_driver.py:_finish",)),
)
"""Each feature: the functions (``file:name``, a prefix of ``file:``) whose inclusive time is its
cost. A feature's functions can call each other's (the bus calls the sinks): the rows overlap."""


IDLE = frozenset({"<method 'poll' of 'select.epoll' objects>"})


def child(stats: str) -> None:
    """Run twistd (argv after ``--``) with a profiler on between SIGUSR1 and SIGUSR2."""
    import cProfile

    profiler = cProfile.Profile()

    def on(*_: object) -> None:
        profiler.enable()

    def off(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(stats)

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    from twisted.scripts.twistd import run

    sys.argv = ["twistd", *sys.argv[sys.argv.index("--") + 1 :]]
    run()


def package(filename: str) -> str:
    """The package a function's file belongs to (``~`` is the C built-ins)."""
    if filename == "~":
        return "builtins (C)"
    path = filename.replace("\\", "/")
    for root in ("nvpair_tw/", "twisted/"):
        if root in path:
            parts = path[path.rindex(root) :].split("/")
            return ".".join(parts[:2]).removesuffix(".py")
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    return "stdlib " + Path(path).stem


def report(stats_path: Path, requests: int, top: int) -> None:
    stats = pstats.Stats(str(stats_path))
    raw = stats.stats  # type: ignore[attr-defined]
    by_package: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    total_calls, total_time = 0, 0.0
    rows = []
    for (filename, _line, name), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        if name in IDLE:
            continue  # the reactor waiting for the next request: not the request's work
        where = package(filename)
        by_package[where][0] += calls
        by_package[where][1] += tottime
        total_calls += calls
        total_time += tottime
        rows.append((tottime, calls, cumtime, f"{filename}:{name}"))
    print(f"\n{total_calls / requests:,.0f} calls, {total_time / requests * 1e6:,.0f} µs a request")
    print("| package | calls / request | self µs / request | share |\n|---|---|---|---|")
    for where, (calls, tottime) in sorted(by_package.items(), key=lambda kv: -kv[1][1]):
        share = tottime / total_time
        if share >= 0.005:
            print(
                f"| {where} | {calls / requests:,.0f} | {tottime / requests * 1e6:,.1f} | {share:.1%} |"
            )
    print("\n| feature | calls / request | inclusive µs / request | share |\n|---|---|---|---|")
    for feature, keys in FEATURES:
        calls, cum = 0, 0.0
        for _tottime, n, cumtime, where in rows:
            tail = where.replace("\\", "/")
            if any(key in tail for key in keys):
                calls, cum = calls + n, cum + cumtime
        print(
            f"| {feature} | {calls / requests:,.1f} | {cum / requests * 1e6:,.1f} | {cum / total_time:.1%} |"
        )
    print(f"\nthe {top} hottest functions by self time (µs / request, calls / request):")
    for tottime, n, _cum, where in sorted(rows, reverse=True)[:top]:
        short = where.split("site-packages/")[-1].split("/wt/")[-1]
        print(f"  {tottime / requests * 1e6:8.1f} {n / requests:6.1f}  {short}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--admin", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--usage", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--keep", help="also write the profile to this file")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nvpair-calls-"))
    stats = tmp / "requests.prof"
    up = free_port()
    upstream = subprocess.Popen([PY, str(BENCH / "upstream.py"), str(up)])
    try:
        wait_ready(up, upstream)
        port = free_port()
        argv = nvpair_argv(port, up, args, tmp)
        profiled = [PY, str(Path(__file__).resolve()), "--child", str(stats), "--", *argv[3:]]
        env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
        log = (tmp / "nvpair.log").open("wb")
        process = subprocess.Popen(profiled, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_ready(port, process, seconds=60)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            ask(connection, args.warmup)
            process.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            ask(connection, args.requests)
            process.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not stats.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            connection.close()
        finally:
            process.terminate()
            process.wait(timeout=60)
        if args.keep:
            shutil.copy(stats, args.keep)
        print(
            f"{args.requests} sequential POST /api/chat, log {args.log_level}, admin "
            f"{'on' if args.admin else 'off'}, usage {'on' if args.usage else 'off'}"
        )
        report(stats, args.requests, args.top)
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def ask(connection: http.client.HTTPConnection, n: int) -> None:
    for _ in range(n):
        connection.request("POST", "/api/chat", body=CHAT)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"bench: a request answered {response.status}")


if __name__ == "__main__":
    main()
