"""The proxy's per-request bookkeeping, old code against new, side by side in one run.

``python bench/perrequest.py [--base REF] [--runs N] [--requests N]`` times, in µs per request,
what every small request does besides moving bytes (docs/performance.md): its candidate order
(its affinity digests, ``FacadeState.eligible`` and ``order`` with the residency reads), its workload's events and its
``proxy/request`` record on the bus, with the sinks of a deployment subscribed (the log line at
``info`` through twist's JSON file observer into /dev/null, the admin listener's metrics and status
board). Each run is a fresh process; runs alternate between the code at ``REF`` (default
``HEAD~1``, unpacked with ``git archive``) and the working tree. Each run reports the CPU time of
its thread (not wall time, which the other processes' turns would inflate) for its fastest 40th of
the requests; the medians over runs are printed with their ratio. ``--worker PATH`` is the child's
entry point (PATH is put first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent


def _worker(requests: int) -> dict[str, float]:
    from twisted.internet.testing import MemoryReactorClock
    from twisted.logger import (
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
        jsonFileLogObserver,
    )

    from nvpair_tw.core._reactor import IProxyReactor
    from nvpair_tw.core._resolved import Settings
    from nvpair_tw.corridor._workloads import RequestRecord
    from nvpair_tw.nodes._directory import Node
    from nvpair_tw.ops._admin import StatusBoard
    from nvpair_tw.ops._metrics import ProxyMetrics
    from nvpair_tw.runtime._process import build_runtime
    from nvpair_tw.selection import affinity_key

    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    observer = FilteringLogObserver(
        jsonFileLogObserver(sink), [LogLevelFilterPredicate(LogLevel.info)]
    )
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    clock = MemoryReactorClock()
    clock.advance(1_700_000_000)
    node = Node("a", "http://127.0.0.1:1")  # polled, as in a deployment: residency is read
    runtime = build_runtime(
        cast(IProxyReactor, clock), Settings(), ["ollama"], nodes={"ollama": [node]}
    )
    runtime.facades["ollama"].inventory.record_models(node, frozenset({"llama3:latest"}), 1.0)
    runtime.facades["ollama"].inventory.record_loaded(node, frozenset({"llama3:latest"}), 1.0)
    ProxyMetrics(runtime)
    StatusBoard(runtime)
    facade = runtime.facades["ollama"]
    shared = runtime.shared
    model = "llama3:latest"

    chat = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}

    def order() -> None:
        affinity_key("/api/chat", facade.profile.normalise("llama3"), chat)
        eligible = facade.eligible(model)
        facade.order(eligible, head_selection=True, affinity_hint=None, model=model)

    def events() -> None:
        record = RequestRecord.begin(
            clock, shared.workloads.next_request_id(), "ollama", "POST", "/api/chat"
        )
        workload = shared.workloads.create("ollama", model)
        record.workload_id = workload.id
        record.attempt_started("a")
        workload.running("a")
        record.served_as("llama3", model, False)
        record.first_byte()
        record.attempt_ended("committed")
        record.prompt_tokens, record.completion_tokens = 12, 30
        record.ttft_ms, record.tokens_per_s = 3, 120.5
        workload.complete()
        record.publish(shared.bus, status=200, node_id="a", error=None)

    out: dict[str, float] = {}
    for name, step in (("order", order), ("events", events)):
        for _ in range(requests // 10):  # warm the label children and caches
            step()
        batches = []
        for _ in range(40):  # the fastest batch: the least disturbed by the other processes
            start = time.thread_time()
            for _ in range(requests // 40):
                step()
            batches.append((time.thread_time() - start) / (requests // 40) * 1e6)
        out[name] = min(batches)
    return out


def _unpack(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "nvpair_tw"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _run(path: Path, requests: int) -> dict[str, float]:
    argv = [sys.executable, __file__, "--worker", str(path), "--requests", str(requests)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--worker", type=Path)
    args = parser.parse_args()
    if args.worker is not None:
        sys.path.insert(0, str(args.worker))
        print(json.dumps(_worker(args.requests)))
        return
    with tempfile.TemporaryDirectory(prefix="nvpair-perrequest-") as tmp:
        old = _unpack(args.base, Path(tmp))
        samples: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for _ in range(args.runs):
            samples["old"].append(_run(old, args.requests))
            samples["new"].append(_run(REPO, args.requests))
    rows: dict[str, Any] = {}
    for step in samples["old"][0]:
        before = statistics.median(r[step] for r in samples["old"])
        after = statistics.median(r[step] for r in samples["new"])
        rows[step] = (before, after)
    print(f"µs per request, medians of {args.runs} alternating runs of {args.requests}")
    print(f"| step | {args.base} | working tree | new/old |")
    print("|---|---|---|---|")
    for step, (before, after) in rows.items():
        print(f"| {step} | {before:.1f} | {after:.1f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
