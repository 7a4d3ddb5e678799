"""What the proxy's admission queue costs: 1,000 requests queued at once, against no queue.

``python bench/queueing.py [--requests N] [--rounds R]`` prints Markdown tables (docs/performance.md,
"Queueing"). Two one-slot nodes take N requests at once (2 bound, N - 2 queued); the baseline is the
same N requests on the same two nodes with unlimited slots (none queued). Two measurements:

- **admission** (single process, no sockets): :class:`nvpair_tw.selection._admission.Admission` on the *real*
  reactor — ``task.Clock.callLater`` re-sorts its whole list on every call, which would dominate
  1,000 queue timers, while the reactor's timers are a heap. Per request: admit, wait, bind (the
  waiter's Deferred fires with its slot), release (which binds the next waiter); the reactor's
  timer bookkeeping (``runUntilCurrent``: heap insertion, cancelled-timer removal) is included.
  CPU is ``time.process_time``; memory is what ``tracemalloc`` counts as held while all N requests
  are admitted (waiting or bound), divided by N.
- **whole requests over loopback** (the real reactor, one process): the proxy (``start_proxy``) over
  two simulated engines, N non-streaming ``POST /api/chat`` sent at once by an in-process client,
  one connection each (treq, no keep-alive). CPU of the whole process (client, proxy and engines alike) per request; the
  difference between the two runs is the proxy's queueing cost, since nothing else differs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from typing import Any

import treq
from twisted.internet import defer, task
from twisted.internet.task import Clock

from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.selection._admission import Admission, Slot, Waiter, slot_limit
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import http_client, start_engine, start_proxy

MODELS = ("llama3:latest",)


def _admit_all(admission: Admission, candidates: list[Node], requests: int) -> list[Slot]:
    """Admit ``requests``; the list fills with each one's slot as it is bound (now or later)."""
    held: list[Slot] = []
    for _ in range(requests):
        admitted = admission.admit(candidates)
        if isinstance(admitted, Waiter):
            admitted.bound.addCallback(held.append)
        else:
            assert isinstance(admitted, Slot)
            held.append(admitted)
    return held


def _release_all(admission: Admission, held: list[Slot], requests: int) -> None:
    done = 0
    while held:
        held.pop().release()  # binds the oldest waiter, whose callback appends its slot
        done += 1
    assert done == requests and admission.queue_depth == 0


def _settle(clock: Any) -> None:
    """The reactor's timer bookkeeping (a ``task.Clock`` has none: it sorts on every call)."""
    run = getattr(clock, "runUntilCurrent", None)
    if run is not None:
        run()


def admission_round(reactor: Any, requests: int, slots: int) -> tuple[float, int]:
    """CPU seconds for ``requests`` admit+wait+bind+release, and bytes held while all are in."""
    nodes = {n: Node(n, f"http://{n}.test:1", MODELS, slots=slots) for n in ("a", "b")}
    candidates = list(nodes.values())
    admission = Admission(reactor, slot_limit(nodes.get, 0), requests + 1, 600.0)
    gc.collect()
    start = time.process_time()
    held = _admit_all(admission, candidates, requests)
    _settle(reactor)  # the queue timers go into the reactor's heap
    _release_all(admission, held, requests)
    _settle(reactor)  # the cancelled timers leave the heap
    elapsed = time.process_time() - start
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = _admit_all(admission, candidates, requests)
    _settle(reactor)
    in_memory = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    _release_all(admission, held, requests)
    _settle(reactor)
    return elapsed, in_memory


async def loopback_round(reactor: Any, requests: int, slots: int) -> tuple[float, int]:
    """CPU seconds of the whole process for ``requests`` concurrent chats through the proxy, and
    how many did not end in a 200 (a connection the busy loopback lost counts there)."""
    engines = [
        await start_engine(reactor, SimulatedEngine(reactor, MODELS, chunks=1)) for _ in "ab"
    ]
    nodes = [
        Node(n, handle.url, MODELS, slots=slots)
        for n, handle in zip(("a", "b"), engines, strict=True)
    ]
    settings = Settings(queue_size=requests + 1, max_connections=requests + 16)
    proxy = await start_proxy(reactor, {"ollama": nodes}, settings)
    client = http_client(reactor)
    body = b'{"model":"llama3","messages":[{"role":"user","content":"hi"}],"stream":false}'
    url = proxy.url() + "/api/chat"
    gc.collect()
    start = time.process_time()

    async def one() -> int:
        try:
            response = await client.post(url, data=body)
            await treq.content(response)
        except Exception:
            return 0
        return int(response.code)

    codes = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(one()) for _ in range(requests)]
    )
    elapsed = time.process_time() - start
    await proxy.stop()
    for handle in engines:
        await handle.stop()
    return elapsed, sum(1 for code in codes if code != 200)


def admission_table(reactor: Any, requests: int, rounds: int) -> None:
    rows = {}
    for label, slots in (("unlimited slots (no queue)", 0), ("one slot each (queued)", 1)):
        results = [admission_round(reactor, requests, slots) for _ in range(rounds)]
        rows[label] = (
            statistics.median(r[0] for r in results) / requests,
            statistics.median(r[1] for r in results) / requests,
        )
    (base_cpu, base_mem), (q_cpu, q_mem) = rows.values()
    clock = "task.Clock" if isinstance(reactor, Clock) else "real reactor"
    print(f"| admission ({clock}) | CPU / request | memory / request while in |")
    print("|---|---|---|")
    for label, (cpu, mem) in rows.items():
        print(f"| {label} | {cpu * 1e6:.1f} µs | {mem:.0f} B |")
    print(f"| ratio queued / unlimited | {q_cpu / base_cpu:.1f}x | {q_mem / base_mem:.1f}x |")
    print(f"| per waiter, extra | {(q_cpu - base_cpu) * 1e6:.1f} µs | {q_mem - base_mem:.0f} B |")


async def loopback_table(reactor: Any, requests: int, rounds: int) -> None:
    print("\n| whole request over loopback | CPU / request (client + proxy + engines) | not 200 |")
    print("|---|---|---|")
    loop: dict[str, float] = {}
    for label, slots in (("unlimited slots (no queue)", 0), ("one slot each (queued)", 1)):
        results = [await loopback_round(reactor, requests, slots) for _ in range(rounds)]
        loop[label] = statistics.median(r[0] for r in results) / requests
        failed = sum(r[1] for r in results)
        print(f"| {label} | {loop[label] * 1e3:.2f} ms | {failed} of {requests * rounds} |")
    base, queued = loop.values()
    print(f"| ratio queued / unlimited | {queued / base:.2f}x | |")
    print(f"| per queued request, extra | {(queued - base) * 1e6:.0f} µs | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-loopback", dest="loopback", action="store_false")
    parser.add_argument(
        "--task-clock",
        action="store_true",
        help="run the admission table on a task.Clock instead (to see what its sorting costs)",
    )
    args = parser.parse_args()
    from twisted.internet import reactor  # the real one: its timers are a heap, not a sorted list

    print(
        f"# queueing cost, {args.requests} requests at once on two nodes, medians of {args.rounds} rounds\n"
    )
    admission_table(Clock() if args.task_clock else reactor, args.requests, args.rounds)
    if args.loopback:
        task.react(
            lambda r: defer.Deferred.fromCoroutine(loopback_table(r, args.requests, args.rounds))
        )


if __name__ == "__main__":
    main()
