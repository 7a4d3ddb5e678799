"""What decoding a compressed request body costs the reactor (docs/behaviour.md §17.5).

``python bench/decoding.py [--rounds R]`` prints one Markdown table, single-process, no sockets:
for chat bodies of several sizes compressed with zstd, gzip and deflate, the time one decode of the
whole body would hold the reactor (one call, as a decoder without slicing would) against the
longest and the median single slice of :mod:`nvpair_tw.corridor._decoding` (a slice of
``SLICE`` decoded bytes per reactor turn), best of ``R`` rounds each. Times are the thread's CPU
time (``time.thread_time``), so another process taking the core mid-slice does not count.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import time
import zlib
from collections.abc import Callable

import zstandard

from nvpair_tw.corridor._decoding import SLICE, Coding, _pieces

ENCODERS: dict[Coding, Callable[[bytes], bytes]] = {
    Coding.ZSTD: lambda data: zstandard.ZstdCompressor().compress(data),
    Coding.GZIP: gzip.compress,
    Coding.DEFLATE: zlib.compress,
}
WHOLE: dict[Coding, Callable[[bytes], bytes]] = {
    Coding.ZSTD: lambda data: zstandard.ZstdDecompressor().stream_reader(data).read(),
    Coding.GZIP: gzip.decompress,
    Coding.DEFLATE: zlib.decompress,
}


def chat_body(size: int, seed: int = 1) -> bytes:
    """A chat body of about ``size`` bytes of prose-like text (compresses about 3:1)."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(alphabet, k=rng.randint(2, 9))) for _ in range(5000)]
    messages = []
    total = 0
    while total < size:
        text = " ".join(rng.choices(words, k=200))
        messages.append({"role": "user", "content": text})
        total += len(text) + 30
    return json.dumps({"model": "m", "messages": messages}).encode()


def slices(coding: Coding, data: bytes) -> list[float]:
    """Seconds each slice of the proxy's decode took."""
    taken = []
    last = time.thread_time()
    for _ in _pieces(coding, data):
        now = time.thread_time()
        taken.append(now - last)
        last = now
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    print(f"slice: {SLICE // 1024} KiB of decoded output per reactor turn\n")
    print("| coding | decoded | compressed | one call holds | longest slice | median slice |")
    print("|---|---|---|---|---|---|")
    for mib in (1, 8, 32):
        raw = chat_body(mib << 20)
        for coding, encode in ENCODERS.items():
            data = encode(raw)
            whole = min(_timed(WHOLE[coding], data) for _ in range(rounds))
            runs = [slices(coding, data) for _ in range(rounds)]
            longest = min(max(run) for run in runs)
            median = min(statistics.median(run) for run in runs)
            print(
                f"| {coding.value} | {len(raw) / 2**20:.1f} MiB | {len(data) / 2**20:.2f} MiB"
                f" | {whole * 1e3:.1f} ms | {longest * 1e3:.2f} ms | {median * 1e3:.2f} ms |"
            )


def _timed(decode: Callable[[bytes], bytes], data: bytes) -> float:
    start = time.thread_time()
    decode(data)
    return time.thread_time() - start


if __name__ == "__main__":
    main()
