"""Per-request pure steps, a module at a git ref against the working tree, in one process.

``python bench/hotpaths.py [--base REF] [--rounds N] [--batch N]`` loads each measured module twice,
as it is at ``REF`` (default ``HEAD~1``) and as it is in the working tree, and times one step of a
small request with each, in alternating batches on the same thread: the CPU time of the thread
(not wall time, which other processes' turns would inflate), best batch of ``--rounds``. Steps:
the affinity digests of a one-message chat (``selection._affinity``), the upstream request head
of a small POST, its URL parsed (``upstream._agent``), a response body's gate from relay to end
(``upstream._attempt``), one read of 1, 3 and 50 chunked SSE events decoded, the 50 also with
the body's last chunk (``upstream._http1``), and the terminal-frame detector over a 1,000-event stream read
whole and in 64 KiB reads (``corridor._terminal``), and the usage meter (its first content and
its counts) and stripper over the same stream read whole (``dialects._usage``).
``bench/perrequest.py`` measures the bookkeeping that needs a runtime.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

Step = Callable[[], object]


def load(source: str, name: str) -> ModuleType:
    """``source`` (a module's text) as a module named ``name``."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def versions(base: str, path: str) -> tuple[ModuleType, ModuleType]:
    old = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{base}:{path}"], capture_output=True, check=True
    ).stdout.decode()
    tag = path.replace("/", "_").removesuffix(".py")
    return load(old, f"old_{tag}"), load((REPO / path).read_text(), f"new_{tag}")


def affinity(module: ModuleType) -> Step:
    chat = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    return lambda: module.affinity_key("/api/chat", "llama3:latest", chat)


def request_head(module: ModuleType) -> Step:
    from twisted.internet.task import Clock
    from twisted.web.client import URI
    from twisted.web.http_headers import Headers

    from nvpair_tw.upstream._attempt import ReplayBodyProducer

    url = b"http://127.0.0.1:41234/api/chat"
    headers = Headers({b"content-type": [b"application/json"], b"x-forwarded-for": [b"127.0.0.1"]})
    body = ReplayBodyProducer(b"x" * 80, lambda: None)
    agent: Any = module.NodeAgent(Clock(), None)
    if not hasattr(agent, "_parse"):  # before URLs were kept parsed
        return lambda: module._head(b"POST", URI.fromBytes(url), headers, body)
    if "target" in inspect.signature(module._head).parameters:  # before the Host value was kept

        def parts() -> object:
            parsed, target = agent._parse(url)
            return module._head(b"POST", parsed, target, headers, body)

        return parts
    return lambda: module._head(b"POST", agent._parse(url), headers, body)


def body_end(module: ModuleType) -> Step:
    from twisted.internet.task import Clock
    from twisted.python.failure import Failure
    from twisted.web.client import ResponseDone

    clock = Clock()

    def step() -> object:
        gate = module.BodyGate(clock, 30.0)
        gate.start_relay(len)
        gate.connectionLost(Failure(ResponseDone()))
        return gate

    return step


EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"llama3","choices":[{"index":0,"delta":{"content":"tok 42"}}]}\n\n'
)
READ = (b"%x\r\n%s\r\n" % (len(EVENT), EVENT)) * 50
"""One read of 50 chunked SSE events, as an engine's burst arrives."""


ONE = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
"""One chunked SSE event: a token stream's usual read."""


def one_chunk(module: ModuleType) -> Step:
    return lambda: module.ChunkedDecoder().feed(ONE)


def three_chunks(module: ModuleType) -> Step:
    return lambda: module.ChunkedDecoder().feed(ONE * 3)


def chunked_read(module: ModuleType) -> Step:
    return lambda: module.ChunkedDecoder().feed(READ)


def last_chunked_read(module: ModuleType) -> Step:
    last = READ + b"0\r\n\r\n"
    return lambda: module.ChunkedDecoder().feed(last)


STREAM = EVENT * 1000 + b"data: [DONE]\n\n"
"""A 1,000-event SSE stream and its end, as the relay hands it to the terminal-frame detector."""


def terminal_whole(module: ModuleType) -> Step:
    def step() -> object:
        detector = module.TerminalFrameDetector("text/event-stream")
        detector.feed(STREAM)
        return detector.seen

    return step


def terminal_reads(module: ModuleType) -> Step:
    reads = [STREAM[i : i + 65536] for i in range(0, len(STREAM), 65536)]

    def step() -> object:
        detector = module.TerminalFrameDetector("text/event-stream")
        for read in reads:
            detector.feed(read)
        return detector.seen

    return step


def meter_whole(module: ModuleType) -> Step:
    from nvpair_tw.core import Framing

    def step() -> object:
        meter = module.UsageMeter(Framing.SSE, time.monotonic)
        meter.feed(STREAM)
        return meter.end()

    return step


def stripper_whole(module: ModuleType) -> Step:
    def step() -> object:
        stripper = module.UsageStripper(b"text/event-stream")
        return stripper.feed(STREAM), stripper.end()

    return step


STEPS: dict[str, tuple[str, Callable[[ModuleType], Step]]] = {
    "affinity digests (one message)": ("nvpair_tw/selection/_affinity.py", affinity),
    "upstream request head": ("nvpair_tw/upstream/_agent.py", request_head),
    "upstream body gate, one response": ("nvpair_tw/upstream/_attempt.py", body_end),
    "chunked read of one SSE event": ("nvpair_tw/upstream/_http1.py", one_chunk),
    "chunked read of 3 SSE events": ("nvpair_tw/upstream/_http1.py", three_chunks),
    "chunked read of 50 SSE events": ("nvpair_tw/upstream/_http1.py", chunked_read),
    "the same read ending the body": ("nvpair_tw/upstream/_http1.py", last_chunked_read),
    "terminal frame, 1,000 events read whole": ("nvpair_tw/corridor/_terminal.py", terminal_whole),
    "terminal frame, the same in 64 KiB reads": ("nvpair_tw/corridor/_terminal.py", terminal_reads),
    "usage meter, 1,000 events read whole": ("nvpair_tw/dialects/_usage.py", meter_whole),
    "usage stripper, the same": ("nvpair_tw/dialects/_usage.py", stripper_whole),
}


def best(steps: dict[str, Step], rounds: int, batch: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.thread_time()
            for _ in range(batch):
                step()
            times[name].append((time.thread_time() - start) / batch * 1e6)
    return {name: min(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    print(f"µs per call, thread CPU, best of {args.rounds} alternating batches of {args.batch}")
    print(f"| step | {args.base} | working tree | new/old |")
    print("|---|---|---|---|")
    for label, (path, make) in STEPS.items():
        old, new = versions(args.base, path)
        got = best({"old": make(old), "new": make(new)}, args.rounds, args.batch)
        ratio = got["new"] / got["old"]
        print(f"| {label} | {got['old']:.2f} | {got['new']:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
