"""What assembling a whole answer costs, per 1,000 tokens, against merely relaying the same stream.

``python bench/assembly.py [--tokens N] [--rounds R]`` prints a Markdown table (docs/performance.md,
"Assembly"). Two measurements, both single-process and deterministic (no sockets):

- **fold**: the stream's bytes, one token per chunk as engines send them, fed to
  :class:`nvpair_tw.assembly._whole.Assembler` (then the answer serialised), against the work the relay does
  per chunk of the same stream (:class:`nvpair_tw.corridor._relay.Progress`: counting and terminal-frame
  detection, then a write). CPU is ``time.process_time``; memory is the ``tracemalloc`` peak while
  the stream passes (the relay keeps nothing but the unfinished line; the assembler keeps the answer).
- **corridor**: whole requests through a :class:`nvpair_tw.testing.MemoryCluster` (facade, attempt
  loop, gate, relay, HTTP framing in memory) to a simulated engine streaming N tokens: a streaming
  request (relayed) against the same request with ``"stream": false`` (assembled). The in-memory
  transport's own cost is in both, so the difference is what assembly adds to a request.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable

from twisted.internet.task import Clock

from nvpair_tw.assembly._whole import Assembler, Dialect
from nvpair_tw.corridor._relay import Progress
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import MemoryCluster

WORD = " token"


def ollama_stream(tokens: int) -> list[bytes]:
    """An Ollama /api/chat stream of ``tokens`` one-word chunks and its final object."""
    piece = {
        "model": "llama3",
        "created_at": "2026-12-01T00:36:22.604824921Z",
        "message": {"role": "assistant", "content": WORD},
        "done": False,
    }
    line = json.dumps(piece, separators=(",", ":")).encode() + b"\n"
    final = {
        "model": "llama3",
        "created_at": "2026-12-01T00:36:22.77071696Z",
        "message": {"role": "assistant", "content": ""},
        "done_reason": "stop",
        "done": True,
        "total_duration": 3576342731,
        "eval_count": tokens,
    }
    return [line] * tokens + [json.dumps(final).encode() + b"\n"]


def openai_stream(tokens: int) -> list[bytes]:
    """An OpenAI chat-completions stream of ``tokens`` chunks, a usage chunk and ``[DONE]``."""

    def chunk(choices: list[object], **extra: object) -> bytes:
        body = {
            "id": "chatcmpl-241",
            "object": "chat.completion.chunk",
            "created": 1796085388,
            "model": "llama3",
            "system_fingerprint": "fp_ollama",
            "choices": choices,
            **extra,
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    delta = chunk([{"index": 0, "delta": {"role": "assistant", "content": WORD}}])
    end = chunk([{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}])
    usage = chunk([], usage={"prompt_tokens": 9, "completion_tokens": tokens})
    return [delta] * tokens + [end, usage, b"data: [DONE]\n\n"]


def relay_pass(content_type: str, frames: list[bytes]) -> int:
    """What the relay does per chunk (count, watch for the terminal frame, write)."""
    progress = Progress(content_type, None)
    sink = progress.wrap(lambda data: None)
    for frame in frames:
        sink(frame)
    return progress.sent


def assemble_pass(dialect: Dialect, frames: list[bytes]) -> int:
    """The assembler over the same chunks, and the answer serialised."""
    assembler = Assembler(dialect, 1 << 30)
    for frame in frames:
        assembler.feed(frame)
    return len(assembler.finish().body)


def measure(work: Callable[[], int], rounds: int) -> tuple[float, int]:
    """Median CPU seconds of ``work`` over ``rounds``, and its tracemalloc peak (bytes)."""
    times = []
    for _ in range(rounds):
        gc.collect()
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    gc.collect()
    tracemalloc.start()
    work()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak


def corridor(tokens: int, rounds: int, path: str, stream: bool) -> float:
    """Median CPU seconds of one whole request through an in-memory proxy."""
    times = []
    for _ in range(rounds):
        clock = Clock()
        engine = SimulatedEngine(
            clock, ("llama3:latest",), chunks=tokens, chunk_delay=0.01, reply_text=WORD
        )
        cluster = MemoryCluster(clock, {"a": engine})
        body: dict[str, object] = {
            "model": "llama3",
            "messages": [{"role": "user", "content": "hi"}],
        }
        body["stream"] = stream
        gc.collect()
        start = time.process_time()
        pending = cluster.request("POST", path, json=body)
        cluster.advance(tokens * 0.01 + 1)  # one token per 10 ms of the cluster's clock
        response = cluster.result(pending)
        times.append(time.process_time() - start)
        assert response.status == 200 and response.complete
        cluster.stop()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    tokens, rounds = args.tokens, args.rounds
    per = 1000 / tokens
    print(f"# assembly cost, {tokens} tokens per stream, medians of {rounds} rounds\n")
    print("| stream | relay CPU /1k tok | assemble CPU /1k tok | relay peak | assemble peak |")
    print("|---|---|---|---|---|")
    for name, dialect, content_type, frames in (
        ("Ollama /api/chat NDJSON", Dialect.OLLAMA_CHAT, "application/x-ndjson", ollama_stream),
        ("OpenAI chat SSE", Dialect.OPENAI_CHAT, "text/event-stream", openai_stream),
    ):
        stream = frames(tokens)
        relay_cpu, relay_peak = measure(lambda s=stream, t=content_type: relay_pass(t, s), rounds)
        fold_cpu, fold_peak = measure(lambda s=stream, d=dialect: assemble_pass(d, s), rounds)
        print(
            f"| {name} | {relay_cpu * per * 1e3:.2f} ms | {fold_cpu * per * 1e3:.2f} ms "
            f"| {relay_peak / 1024:.1f} KiB | {fold_peak / 1024:.1f} KiB |"
        )
    print("\n| whole request (in memory) | streamed, relayed | non-streaming, assembled |")
    print("|---|---|---|")
    small = max(1, tokens // 10)
    for path in ("/api/chat", "/v1/chat/completions"):
        relayed = corridor(small, rounds, path, True)
        assembled = corridor(small, rounds, path, False)
        print(
            f"| {path}, CPU per 1k tokens | {relayed * 1000 / small * 1e3:.1f} ms "
            f"| {assembled * 1000 / small * 1e3:.1f} ms |"
        )


if __name__ == "__main__":
    main()
