"""What reading a request body strictly costs (docs/behaviour.md §14.1), against plain ``json.loads``.

``python bench/parse.py [--rounds R] [--mib M]`` prints two Markdown tables, single-process and with
no sockets:

- **small bodies**: :func:`nvpair_tw.inbound.parse_body` against ``json.loads`` on chat bodies of about
  200 B, 2 KiB and 200 KiB (CPU µs per body, the best of ``R`` interleaved rounds, and the ratio).
- **large bodies**: :func:`nvpair_tw.inbound.parse_large` on ``M`` MiB bodies of three shapes (one
  long string; a million small objects in an array; objects whose strings hold the separators the
  reader cuts batches at), run by a scheduler that times every reactor turn it would have taken:
  the longest single hold and the total, against ``json.loads`` and ``parse_body``, which each hold
  the reactor for the whole body. The interpreter's own full garbage collection
  (generation 2) may run inside any turn of any program that allocates this much; the turns it
  fell in are shown apart.
- **rewrites of large bodies** (docs/behaviour.md §6.5, §11.4): on the same bodies, the one hold of
  each body rewrite, scanning the body (``plan_assembly`` / ``rewrite_body`` / ``rename_request``
  as before) against editing it by the spans :func:`nvpair_tw.inbound.parse_document_large` gave
  (``plan_assembly(..., outline)`` / ``rewrite_outlined`` / ``rename_outlined``), best and worst
  of five; the floor is one copy of the body (the new body is built once, a fresh allocation whose
  pages the kernel faults in).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from nvpair_tw.assembly import Dialect, plan_assembly, rewrite_body, rewrite_outlined
from nvpair_tw.core import Outlined
from nvpair_tw.dialects import rename_outlined, rename_request
from nvpair_tw.inbound import (
    LARGE_BODY,
    Parsed,
    parse_body,
    parse_document,
    parse_document_large,
    parse_large,
)


def chat_body(size: int) -> bytes:
    """An Ollama /api/chat body of about ``size`` bytes: a system prompt and alternating turns."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    turn = "Tell me about the weather in Paris, please; and what to wear. "
    while len(json.dumps(messages)) < size - 120:
        role = "user" if len(messages) % 2 else "assistant"
        messages.append({"role": role, "content": turn * max(1, size // 2000)})
    body = {
        "model": "llama3:latest",
        "stream": True,
        "options": {"temperature": 0.7, "num_ctx": 8192},
        "messages": messages,
    }
    return json.dumps(body).encode()


def one_string(mib: int) -> bytes:
    words = b"lorem ipsum dolor sit amet, "
    text = words * (mib * 1024 * 1024 // len(words))
    return b'{"model":"llama3","messages":[{"role":"user","content":"' + text + b'"}]}'


def many_objects(mib: int) -> bytes:
    item = b'{"role":"user","content":"hi"}'
    count = mib * 1024 * 1024 // (len(item) + 1)
    return b'{"model":"llama3","messages":[' + b",".join([item] * count) + b"]}"


def awkward_objects(mib: int) -> bytes:
    """Elements whose strings hold the separators a batch is cut at (``},``, ``],``, ``",``)."""
    item = json.dumps([{"a": 'b,"],c"},'}, [1, {}]], separators=(",", ":"))[1:-1].encode()
    count = mib * 1024 * 1024 // (len(item) + 1)
    return b'{"model":"llama3","x":[' + b",".join([item] * count) + b"]}"


def best_of(
    rounds: int, contenders: dict[str, Callable[[], object]], number: int
) -> dict[str, float]:
    """The best CPU seconds per call of each contender, rounds interleaved so load hits all alike."""
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, work in contenders.items():
            start = time.process_time()
            for _ in range(number):
                work()
            best[name] = min(best[name], (time.process_time() - start) / number)
    return best


class Turns:
    """A clock for ``parse_large`` that runs each ``callLater(0, ...)`` as one timed reactor turn,
    noting the turns in which the interpreter ran a full (generation 2) garbage collection."""

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.full_passes = 0

    def callLater(self, delay: float, func: Callable[..., Any], *args: Any) -> None:
        self.pending.append((func, args))

    def seconds(self) -> float:
        return 0.0

    def _noticed(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            self.full_passes += 1

    def run(self) -> tuple[float, float, float, int, int]:
        """Wall seconds: the longest turn, the longest with no full GC in it, the total; the number
        of turns and of full GC passes."""
        longest = longest_own = total = 0.0
        turns = 0
        gc.callbacks.append(self._noticed)
        try:
            while self.pending:
                func, args = self.pending.pop(0)
                before = self.full_passes
                start = time.perf_counter()
                func(*args)
                took = time.perf_counter() - start
                longest, total, turns = max(longest, took), total + took, turns + 1
                if self.full_passes == before:
                    longest_own = max(longest_own, took)
        finally:
            gc.callbacks.remove(self._noticed)
        return longest, longest_own, total, turns, self.full_passes


def one_hold(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def large(name: str, body: bytes) -> None:
    gc.collect()
    loads = one_hold(lambda: json.loads(body))
    gc.collect()
    whole = one_hold(lambda: parse_body(body))
    gc.collect()
    turns = Turns()
    results: list[object] = []
    parse_large(body, turns).addBoth(results.append)  # type: ignore[arg-type]
    longest, own, total, count, passes = turns.run()
    assert isinstance(results[0], dict), results[0]
    print(
        f"| {name}, {len(body) / 2**20:.0f} MiB | {loads * 1e3:.0f} ms | {whole * 1e3:.0f} ms "
        f"| {longest * 1e3:.1f} ms | {own * 1e3:.1f} ms | {total * 1e3:.0f} ms | {count} "
        f"| {passes} |"
    )


def rewrites(name: str, body: bytes) -> None:
    """The one hold of each rewrite of ``body``: scanning it, and by the parse's spans."""
    turns = Turns()
    results: list[object] = []
    parse_document_large(body, turns).addBoth(results.append)  # type: ignore[arg-type]
    turns.run()
    parsed = results[0]
    assert isinstance(parsed, Parsed), parsed
    source = Outlined(body, parsed)
    path = Dialect.OLLAMA_CHAT.value
    doc = {**parsed.doc, "stream": False}
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "plan_assembly": (
            lambda: plan_assembly(path, body, doc, len(body) * 2),
            lambda: plan_assembly(path, body, doc, len(body) * 2, parsed),
        ),
        "rewrite (OpenAI chat)": (
            lambda: rewrite_body(Dialect.OPENAI_CHAT, body),
            lambda: rewrite_outlined(Dialect.OPENAI_CHAT, source),
        ),
        "rename model": (
            lambda: rename_request(body, "llama3:8b"),
            lambda: rename_outlined(source, "llama3:8b"),
        ),
    }
    pairs["one copy of the body (the floor)"] = (lambda: None, lambda: b"".join([body, b""]))
    for rewrite, (scanning, spanned) in pairs.items():
        gc.collect()
        old = one_hold(scanning)
        holds = []
        for _ in range(5):
            gc.collect()
            holds.append(one_hold(spanned))
        print(f"| {name}, {len(body) / 2**20:.0f} MiB | {rewrite} | {old * 1e3:.1f} ms "
              f"| {min(holds) * 1e3:.1f} ms | {max(holds) * 1e3:.1f} ms |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--rewrites-only", action="store_true", help="skip the parse tables")
    args = parser.parse_args()
    print(f"# strict body reading, best of {args.rounds} interleaved rounds\n")
    print("| chat body | json.loads | parse_body | ratio | parse_document | ratio |")
    print("|---|---|---|---|---|---|")
    for size in (200, 2048, 200 * 1024):
        body = chat_body(size)
        assert parse_body(body) == json.loads(body)
        number = max(3, 200_000 // len(body))
        best = best_of(
            args.rounds,
            {
                "loads": partial(json.loads, body),
                "parse": partial(parse_body, body),
                "document": partial(parse_document, body),
            },
            number,
        )
        print(
            f"| {len(body):,} B | {best['loads'] * 1e6:.1f} µs | {best['parse'] * 1e6:.1f} µs "
            f"| {best['parse'] / best['loads']:.2f}x | {best['document'] * 1e6:.1f} µs "
            f"| {best['document'] / best['loads']:.2f}x |"
        )
    print(f"\nLARGE_BODY = {LARGE_BODY:,} B: callers use parse_large above it.\n")
    print("| large body | json.loads (one hold) | parse_body (one hold) | parse_large longest hold "
          "| same, turns without a full GC | parse_large total | turns | full GC passes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    if not args.rewrites_only:
        large("one long string", one_string(args.mib))
        large("a million small objects", many_objects(args.mib))
        large("objects with separators in their strings", awkward_objects(args.mib))
    print("\n| large body | rewrite | scanning the body (one hold) | by the parse's spans, best of 5 "
          "| worst of 5 |")  # fmt: skip
    print("|---|---|---|---|---|")
    rewrites("one long string", one_string(args.mib))
    rewrites("a million small objects", many_objects(args.mib))


if __name__ == "__main__":
    main()
