"""What the prompt caches' book adds to each request (docs/behaviour.md §5.3.1), in CPU time.

``python bench/caches.py [--rounds N] [--requests N]`` times, on one thread (its CPU time, not
wall time; the best of ``--rounds``), the work :class:`~nvpair_tw.selection.CacheBook` adds to one
request with a conversation, as the corridor does it: where the conversation stands on its warm
node (``place``, at routing), the active conversation it would push out of each candidate
(``pushed_out``), where it stands on the node attempted (``place`` again), the correction from
the engine's cached count (``judge``) and the note of the node that answered (``note``). Books
of 8 and of 256 conversations per node (256 is the most kept, what a long-running proxy's books
hold), 2 and 8 candidate nodes, roots kept as they are and sealed with the fleet's HMAC
(``--state-secret-file``), for a conversation second on its node (an active one: the walk for
its position stops at once) and for the oldest there (the walk goes through the whole book).
docs/performance.md, "Prompt caches", holds a run.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twisted.internet.task import Clock  # noqa: E402

from nvpair_tw.selection import CacheBook  # noqa: E402

MODEL = "qwen3-coder:30b"
SECRET = b"fleet secret"


def sealed(digest: bytes) -> bytes:
    return hmac.new(SECRET, digest, hashlib.sha256).digest()


def book_of(held: int, nodes: int, seal: Callable[[bytes], bytes] | None) -> CacheBook:
    """A book whose ``nodes`` nodes were each sent ``held`` conversations, each keeping 2."""
    book = CacheBook(Clock(), lambda _node: 2)
    if seal is not None:
        book.shared(seal, lambda *_noted: None)
    for n in range(nodes):
        for i in range(held):
            book.note(f"n{n}", MODEL, hashlib.sha256(b"%d" % i).digest(), 9000)
    return book


def one_request(book: CacheBook, nodes: int, root: bytes) -> None:
    """What a request whose conversation is the oldest on n0 adds (see the module docstring)."""
    found = book.place("n0", MODEL, root)
    for n in range(nodes):
        book.pushed_out(f"n{n}", MODEL)
    found = book.place("n0", MODEL, root)
    if found is not None:
        book.judge("n0", MODEL, found, 8000, 10_000)
    book.note("n0", MODEL, root, 10_025)


def per_request(
    held: int, nodes: int, seal: Callable[[bytes], bytes] | None, count: int, oldest: bool
) -> float:
    """Microseconds of thread CPU per request, over ``count`` requests: each the oldest
    conversation on its node (the next in the cycle), or the second (the one before last)."""
    book = book_of(held, nodes, seal)
    roots = [hashlib.sha256(b"%d" % i).digest() for i in range(held)]
    started = time.thread_time_ns()
    for i in range(count):
        one_request(
            book, nodes, roots[i % held] if oldest else roots[(held - 2 + i) % 2 + held - 2]
        )
    return (time.thread_time_ns() - started) / count / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    options = parser.parse_args()
    print("| conversations per node | candidates | roots | µs per request: second / oldest |")
    print("|---|---|---|---|")
    for held in (8, 256):
        for nodes in (2, 8):
            for name, seal in (("as they are", None), ("sealed (HMAC)", sealed)):
                best = [
                    min(
                        per_request(held, nodes, seal, options.requests, oldest)
                        for _ in range(options.rounds)
                    )
                    for oldest in (False, True)
                ]
                print(f"| {held} | {nodes} | {name} | {best[0]:.1f} / {best[1]:.1f} |")


if __name__ == "__main__":
    main()
