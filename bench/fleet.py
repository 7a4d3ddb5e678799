"""Added latency of ``--state`` at concurrency 1: ``python bench/fleet.py [--requests N]``.

Starts a redis-server (persistence off) and the fast fake engine (``bench/upstream.py``) on free
loopback ports, then two ``twistd nvpair`` processes over that engine: one with
``--state redis://…``, one without. Sequential ``POST /api/chat`` requests on fresh connections
are interleaved one by one (so drift on a shared machine hits both alike); the report gives the
median, p90 and mean of each and the difference of the medians. Every request with a model takes
and releases a reservation (published to the store), so this is the store's per-request cost.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import CHAT, Harness, free_port, http, wait_ready


def measure(port: int, count: int) -> list[float]:
    return [http(port, b"/api/chat", CHAT)[2] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per proxy (default 2000)")
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    redis = shutil.which("redis-server")
    if redis is None:
        raise SystemExit("redis-server is required")
    with tempfile.TemporaryDirectory() as tmp:
        harness = Harness(Path(tmp), pin=False)
        try:
            store, engine, plain, shared, alone, closed = (free_port() for _ in range(6))
            harness.spawn(
                "redis",
                [
                    redis,
                    "--port",
                    str(store),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
            )
            upstream = harness.spawn("upstream", [sys.executable, "bench/upstream.py", str(engine)])
            common = [
                sys.executable, "-m", "twisted", "nvpair", "--engine", "ollama",
                "--node", f"n0=http://127.0.0.1:{engine}", "--admin", "none",
                "--log-level", "warn", "--usage-db", "none",
            ]  # fmt: skip
            processes = {
                "without --state": (
                    plain,
                    harness.spawn(
                        "plain", [*common, "--listen", f"tcp:{plain}:interface=127.0.0.1"]
                    ),
                ),
                "--state, down": (
                    alone,
                    harness.spawn(
                        "alone",
                        [
                            *common,
                            "--listen",
                            f"tcp:{alone}:interface=127.0.0.1",
                            "--state",
                            f"redis://127.0.0.1:{closed}/0",
                        ],
                    ),
                ),
                "with --state": (
                    shared,
                    harness.spawn(
                        "shared",
                        [
                            *common,
                            "--listen",
                            f"tcp:{shared}:interface=127.0.0.1",
                            "--state",
                            f"redis://127.0.0.1:{store}/0",
                        ],
                    ),
                ),
            }
            del upstream
            for port, process in processes.values():
                wait_ready(port, process)
            for port, _ in processes.values():
                measure(port, args.warmup)
            samples: dict[str, list[float]] = {name: [] for name in processes}
            started = time.monotonic()
            order = list(processes.items())
            for round_ in range(args.requests):
                # Rotate who goes first, so no proxy always follows the same one.
                for name, (port, _) in order[round_ % 3 :] + order[: round_ % 3]:
                    samples[name] += measure(port, 1)
            elapsed = time.monotonic() - started
        finally:
            harness.stop()
    print(f"{args.requests} sequential requests per proxy, interleaved one by one "
          f"({elapsed:.1f} s)")  # fmt: skip
    medians = {}
    for name, values in samples.items():
        ordered = sorted(values)
        medians[name] = statistics.median(ordered)
        print(
            f"{name:16} median {medians[name] * 1000:.3f} ms  "
            f"p90 {ordered[int(len(ordered) * 0.9)] * 1000:.3f} ms  "
            f"mean {statistics.fmean(ordered) * 1000:.3f} ms"
        )
    for name in ("with --state", "--state, down"):
        added = (medians[name] - medians["without --state"]) * 1000
        print(f"added by {name} (median): {added:+.3f} ms")


if __name__ == "__main__":
    main()
