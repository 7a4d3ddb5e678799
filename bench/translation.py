"""What translating and renaming an answer cost per token, against merely relaying it.

``python bench/translation.py [--tokens N] [--rounds R] [--relay-us U]`` (or
``python -m bench.translation``, from the checkout) prints Markdown tables and writes
``bench/results/translation-<UTC timestamp>.json``. Single-process and deterministic (no sockets);
CPU is ``time.process_time``, the least of R rounds over one stream of N one-token chunks, one
chunk per feed as engines send them:

- **identity**: the relay's own per-chunk work (``corridor._relay.Progress``: counting and
  terminal-frame detection, then a no-op write) over the node's stream: SSE for the translated
  case, NDJSON for the renamed one;
- **renamer**: the same, with :func:`nvpair_tw.dialects.renamer` rewriting each Ollama NDJSON
  chunk's ``model`` before the relay sees it (a native route under the catalogue);
- **translated**: :class:`nvpair_tw.dialects.Translation`'s transducer turning each OpenAI SSE
  chunk into Ollama NDJSON (an Ollama client on an OpenAI-compatible node), before the relay's
  work on the NDJSON it gives.

The ratios here are transducer-level: the full relay also parses and writes HTTP. The
**relay-level** estimate adds the extra CPU per token measured here to the full relay's CPU per
chunk (``--relay-us``; default 2.1 µs, docs/performance.md "relay cost" for nvpair-tw, SSE and
NDJSON at one connection), the figure the project's targets are stated against (translated ≤ 2x,
renamed ≤ 1.2x of a native relay).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nvpair_tw.corridor._relay import Progress  # noqa: E402
from nvpair_tw.dialects import renamer, translate  # noqa: E402

WORDS = [" token", " the", " caf\u00e9", ' "quoted"', " \u2603", "\n"]


def openai_stream(tokens: int) -> list[bytes]:
    """An OpenAI chat stream (as Ollama's /v1 sends it): content chunks, finish, usage, [DONE]."""

    def chunk(choices: list[object], **extra: object) -> bytes:
        body = {
            "id": "chatcmpl-241",
            "object": "chat.completion.chunk",
            "created": 1796085388,
            "model": "smollm2:135m",
            "system_fingerprint": "fp_ollama",
            "choices": choices,
            **extra,
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    deltas = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": w}, "finish_reason": None}])
        for w in WORDS
    ]
    end = chunk(
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]
    )
    usage = chunk(
        [], usage={"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}
    )
    return [deltas[i % len(deltas)] for i in range(tokens)] + [end, usage, b"data: [DONE]\n\n"]


def ollama_stream(tokens: int) -> list[bytes]:
    """An Ollama /api/chat stream of one-token chunks and its final object."""

    def line(piece: dict[str, object]) -> bytes:
        return json.dumps(piece, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    pieces = [
        line(
            {
                "model": "llama3.1:8b",
                "created_at": "2026-12-01T00:36:22.604824921Z",
                "message": {"role": "assistant", "content": w},
                "done": False,
            }
        )
        for w in WORDS
    ]
    final = line(
        {
            "model": "llama3.1:8b",
            "created_at": "2026-12-01T00:36:22.77071696Z",
            "message": {"role": "assistant", "content": ""},
            "done_reason": "stop",
            "done": True,
            "total_duration": 3576342731,
            "eval_count": tokens,
        }
    )
    return [pieces[i % len(pieces)] for i in range(tokens)] + [final]


def identity(content_type: str, frames: list[bytes]) -> int:
    progress = Progress(content_type, None)
    sink = progress.wrap(lambda data: None)
    for frame in frames:
        sink(frame)
    return progress.sent


def renamed(frames: list[bytes]) -> int:
    progress = Progress("application/x-ndjson", None)
    sink = progress.wrap(lambda data: None)
    rename = renamer("llama3.1:8b", "meta-llama-3.1-8b-instruct", b"application/x-ndjson")
    feed = rename.feed
    for frame in frames:
        out = feed(frame)
        if out:
            sink(out)
    sink(rename.end())
    return progress.sent


def translated(frames: list[bytes]) -> int:
    body = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}]}
    t = translate("/api/chat", body, local_model="smollm2:135m", client_model="llama3.1:8b")
    now = [1_796_085_388.0]

    def clock() -> float:
        now[0] += 0.0001
        return now[0]

    transducer = t.answer(200, b"text/event-stream", clock)
    progress = Progress("application/x-ndjson", None)
    sink = progress.wrap(lambda data: None)
    feed = transducer.feed
    for frame in frames:
        out = feed(frame)
        if out:
            sink(out)
    sink(transducer.end())
    assert progress.complete
    return progress.sent


def measure(works: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """The least CPU seconds of each of ``works`` over ``rounds``, the passes interleaved in each
    round so that other load on the machine disturbs them alike."""
    best = dict.fromkeys(works, float("inf"))
    for _ in range(rounds):
        for name, work in works.items():
            gc.collect()
            start = time.process_time()
            work()
            best[name] = min(best[name], time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--relay-us", type=float, default=2.1)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    tokens, rounds, relay = args.tokens, args.rounds, args.relay_us
    sse, ndjson = openai_stream(tokens), ollama_stream(tokens)
    us = 1e6 / tokens
    works: dict[str, Callable[[], int]] = {
        "identity (SSE)": lambda: identity("text/event-stream", sse),
        "identity (NDJSON)": lambda: identity("application/x-ndjson", ndjson),
        "renamer (NDJSON)": lambda: renamed(ndjson),
        "translated (SSE -> NDJSON)": lambda: translated(sse),
    }
    cpu = {name: seconds * us for name, seconds in measure(works, rounds).items()}
    rename_ratio = cpu["renamer (NDJSON)"] / cpu["identity (NDJSON)"]
    translate_ratio = cpu["translated (SSE -> NDJSON)"] / cpu["identity (SSE)"]
    rename_extra = cpu["renamer (NDJSON)"] - cpu["identity (NDJSON)"]
    translate_extra = cpu["translated (SSE -> NDJSON)"] - cpu["identity (SSE)"]
    print(f"# answer translation cost, {tokens} tokens per stream, least of {rounds} rounds\n")
    print("| pass | CPU µs / token |")
    print("|---|---|")
    for name, value in cpu.items():
        print(f"| {name} | {value:.3f} |")
    print(f"\n| ratio | transducer level | relay level (relay = {relay:.2f} µs/chunk) |")
    print("|---|---|---|")
    print(f"| renamer / identity | {rename_ratio:.2f}x | {(relay + rename_extra) / relay:.2f}x |")
    print(
        f"| translated / identity | {translate_ratio:.2f}x "
        f"| {(relay + translate_extra) / relay:.2f}x |"
    )
    if not args.no_save:
        results = REPO / "bench" / "results"
        results.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        record = {
            "tokens": tokens,
            "rounds": rounds,
            "relay_us": relay,
            "cpu_us_per_token": cpu,
            "ratios": {
                "renamer_transducer": rename_ratio,
                "translated_transducer": translate_ratio,
                "renamer_relay": (relay + rename_extra) / relay,
                "translated_relay": (relay + translate_extra) / relay,
            },
        }
        (results / f"translation-{stamp}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
