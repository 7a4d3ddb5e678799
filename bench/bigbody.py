"""A large request body must never hold the reactor (docs/behaviour.md §14.1): side by side in one
run, how long another client's small request takes while a 32 MiB body is read, parsed and sent on.

``python bench/bigbody.py [--checkout DIR ...] [--rounds N]`` starts the fast fake engine
(``bench/upstream.py``) and one nvpair-tw per checkout (this one by default; ``--checkout`` adds
another tree, e.g. a ``git worktree`` of an older commit, as a contender of the same run). For each
contender it measures small ``/api/chat`` requests alone (the baseline), then the same requests sent
every 5 ms while one large body is posted, for three shapes of 32 MiB JSON: one long string, a
million small objects, and objects whose strings hold JSON punctuation; and, as the machine's own
share, the same bodies posted straight to the engine while the small requests still go through
this checkout's proxy (on two shared cores the client, the engine and the proxy compete for CPU).
It prints, per contender and shape, the small requests' median and worst time and the worst added to the baseline median
(the figure §14.1 bounds at 100 ms), and how long the large request itself took.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from run import PY, REPO, Harness, Server, free_port, http, wait_ready  # noqa: E402

SMALL = b'{"model":"llama3","stream":false,"messages":[{"role":"user","content":"hi"}]}'
SIZE = 32 * 1024 * 1024 - 4096


def long_string() -> bytes:
    head = b'{"model":"llama3","stream":false,"messages":[{"role":"user","content":"'
    tail = b'"}]}'
    return head + b"a" * (SIZE - len(head) - len(tail)) + tail


def small_objects() -> bytes:
    one = b'{"role":"user","content":"hello world ok"},'
    count = (SIZE - 100) // len(one)
    body = b'{"model":"llama3","stream":false,"messages":[' + one * count
    return body[:-1] + b"]}"


def punctuation() -> bytes:
    one = b'{"role":"user","content":"},],\\",{[x"},'
    count = (SIZE - 100) // len(one)
    body = b'{"model":"llama3","stream":false,"messages":[' + one * count
    return body[:-1] + b"]}"


SHAPES = {"one long string": long_string, "a million small objects": small_objects}
SHAPES["JSON punctuation in strings"] = punctuation


def smalls(
    port: int, seconds: float | None, count: int | None, stop: threading.Event
) -> list[float]:
    """Small requests one after another, 5 ms apart: their times in ms."""
    times: list[float] = []
    deadline = time.monotonic() + (seconds or 1e9)
    while not stop.is_set() and time.monotonic() < deadline:
        if count is not None and len(times) >= count:
            break
        answer, _, total = http(port, b"/api/chat", SMALL, 30)
        if not answer.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"small request failed: {answer[:80]!r}")
        times.append(total * 1000)
        time.sleep(0.005)
    return times


def during(
    port: int, body: bytes, large_port: int | None = None
) -> tuple[list[float], float, bytes]:
    """Small requests while one large body is posted (to ``large_port``, else the same port):
    their times, the large one's, its status."""
    stop = threading.Event()
    result: dict[str, object] = {}

    def large() -> None:
        answer, _, total = http(large_port or port, b"/api/chat", body, 120)
        result["status"], result["seconds"] = answer[:12], total
        stop.set()

    thread = threading.Thread(target=large)
    time.sleep(0.05)
    thread.start()
    times = smalls(port, 120, None, stop)
    thread.join()
    return times, float(result["seconds"]) * 1000, bytes(result["status"])  # type: ignore[arg-type]


def contender(harness: Harness, name: str, tree: Path, up: int, assemble: str) -> Server:
    """nvpair-tw from ``tree`` (its package first on the path) in front of the fast engine."""
    port = free_port()
    argv = [PY, "-m", "twisted", "nvpair", "--engine", "ollama", "--assemble", assemble]
    argv += ["--usage-db", "none", "--max-body-size", "64MiB"]
    argv += ["--listen", f"tcp:{port}:interface=127.0.0.1", "--node", f"a=http://127.0.0.1:{up}"]
    argv += ["--admin", "none", "--log-level", "warn"]
    log = (harness.tmp / f"{name}.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tree, env=env)
    harness.servers.append(process)
    return Server(name, port, process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, default=[])
    parser.add_argument("--baseline", type=int, default=200, help="small requests alone")
    parser.add_argument("--assemble", choices=("on", "off"), default="on", help="as --assemble")
    args = parser.parse_args()
    harness = Harness(Path(tempfile.mkdtemp(prefix="nvpair-bigbody-")), pin=False)
    rows = []
    try:
        up = free_port()
        upstream = harness.spawn("upstream", [PY, str(BENCH / "upstream.py"), str(up)])
        wait_ready(up, upstream)
        trees = [("this checkout", REPO)] + [(str(t), t.resolve()) for t in args.checkout]
        servers = [(label, contender(harness, f"c{i}", tree, up, args.assemble)) for i, (label, tree) in
                   enumerate(trees)]  # fmt: skip
        for _, server in servers:
            wait_ready(server.port, server.process)
        bodies = {shape: make() for shape, make in SHAPES.items()}
        for label, server in servers:
            alone = smalls(server.port, None, args.baseline, threading.Event())
            base = statistics.median(alone)
            rows.append((label, "(alone)", base, max(alone), 0.0, 0.0, ""))
            shapes = [(shape, body, None) for shape, body in bodies.items()]
            if label == trees[0][0]:  # the machine itself: the large body to the engine directly
                shapes += [(f"{shape}, to the engine", b, up) for shape, b in bodies.items()]
            for shape, body, large_port in shapes:
                times, large_ms, status = during(server.port, body, large_port)
                worst = max(times)
                rows.append((label, shape, statistics.median(times), worst, worst - base,
                             large_ms, status.decode(errors="replace")))  # fmt: skip
    finally:
        harness.stop()
    print("| contender | large body | small median ms | small worst ms | worst - baseline ms"
          " | large request ms | large status |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, shape, median, worst, added, large_ms, status in rows:
        print(f"| {label} | {shape} | {median:.1f} | {worst:.1f} | {added:.1f} | {large_ms:.0f} |"
              f" {status} |")  # fmt: skip
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
