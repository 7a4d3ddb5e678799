"""A node's prompt cache is finite (docs/behaviour.md §5.3.1), through a facade in memory on one
clock: a conversation pushed out of a node's cache is no longer expected warm there, and what the
engine says it found cached corrects how many conversations the cache holds.

As in ``test_conversations``, a turn pinned to ``b`` is served there and recorded; with the pin
lifted, the candidate order alone puts ``a`` first, so a turn that goes to ``b`` went there for
its warm prefix."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.nodes import Node
from nvpair_tw.selection import Capacity, CapacitySource
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import MemoryCluster
from tests.corridor.test_conversations import (
    FIRST,
    MODEL,
    OTHER,
    SECOND,
    THIRD,
    chat_completions,
    chosen,
    pinned,
    send,
)

pytestmark = pytest.mark.timeout(30)

Make = Callable[..., MemoryCluster]
Script = Callable[[bytes, bool, bytes], list[bytes]]


def stating(cached: list[int], completion: int = 8) -> Script:
    """An engine that answers 500 prompt tokens, of which it found the next of ``cached`` (0
    once they run out) in its cache, and ``completion`` tokens, as llama.cpp states them."""

    def script(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        usage = {
            "prompt_tokens": 500,
            "completion_tokens": completion,
            "total_tokens": 500 + completion,
            "prompt_tokens_details": {"cached_tokens": cached.pop(0) if cached else 0},
        }
        message = {"role": "assistant", "content": "Done."}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        answer = {"object": "chat.completion", "model": MODEL, "choices": [choice]}
        return [json.dumps({**answer, "usage": usage}).encode()]

    return script


def two_nodes(
    make: Make, capacity: int | None = None, kind: str = "openai", script: Script | None = None
) -> MemoryCluster:
    clock = Clock()
    engines = {n: SimulatedEngine(clock, (MODEL,), kind=kind, script=script) for n in "ab"}
    nodes = [
        Node(n, f"http://{n}.node.test:11434", (MODEL,), kind=kind, cache_conversations=capacity)
        for n in "ab"
    ]
    return make(clock, engines, facades=("openai",), nodes={"openai": nodes})


def warm_nodes(cluster: MemoryCluster) -> list[str | None]:
    return [r.get("warm_node") for r in cluster.named("proxy/request")]


ROUTE = "/v1/chat/completions"


def test_a_conversation_pushed_out_of_a_nodes_cache_is_no_longer_expected_warm(
    memory_cluster: Make,
) -> None:
    """``b`` keeps one conversation: another one served there since pushed this one out, so its
    next turn is predicted like a new one (to ``a``) and no warm node is recorded."""
    cluster = two_nodes(memory_cluster, capacity=1)
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    pinned(cluster, "b", ROUTE, chat_completions(OTHER))
    assert send(cluster, ROUTE, chat_completions(SECOND)) == "a"
    assert chosen(cluster)[-1] == "prediction"
    assert warm_nodes(cluster)[-1] is None


def test_a_conversation_still_in_a_nodes_cache_goes_back_to_it(memory_cluster: Make) -> None:
    cluster = two_nodes(memory_cluster, capacity=2)
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    pinned(cluster, "b", ROUTE, chat_completions(OTHER))
    assert send(cluster, ROUTE, chat_completions(SECOND)) == "b"
    assert (chosen(cluster)[-1], warm_nodes(cluster)[-1]) == ("affinity", "b")


def test_a_warm_prediction_the_engines_cached_count_contradicts_shrinks_the_capacity(
    memory_cluster: Make,
) -> None:
    """Nothing says how many conversations ``b`` keeps: both are expected warm. The first to come
    back is found cold there (the engine cached none of it): ``b`` keeps one, the one it just
    served, and the other is no longer expected warm on ``b``."""
    cluster = two_nodes(memory_cluster, script=stating([0, 0, 0]))
    facade = cluster.facade()
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    pinned(cluster, "b", ROUTE, chat_completions(OTHER))
    assert facade.caches.capacity("b", MODEL) == Capacity(None)
    assert send(cluster, ROUTE, chat_completions(SECOND)) == "b"  # expected warm: found cold
    assert facade.caches.capacity("b", MODEL) == Capacity(1, 0, CapacitySource.LEARNT)
    other = [*OTHER, ("assistant", "It says hello."), ("user", "And then?")]
    assert send(cluster, ROUTE, chat_completions(other)) == "a"
    assert chosen(cluster)[-1] == "prediction"


def test_a_turn_found_warm_where_it_was_not_expected_grows_the_capacity(
    memory_cluster: Make,
) -> None:
    """``b`` is said to keep one conversation; pinned there, a conversation pushed out is found
    with all its last turn cached: ``b`` keeps two."""
    cluster = two_nodes(memory_cluster, capacity=1, script=stating([0, 0, 490]))
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    pinned(cluster, "b", ROUTE, chat_completions(OTHER))
    pinned(cluster, "b", ROUTE, chat_completions(SECOND))
    capacity = cluster.facade().caches.capacity("b", MODEL)
    assert capacity == Capacity(2, 0, CapacitySource.LEARNT)
    assert send(cluster, ROUTE, chat_completions(THIRD)) == "b"


def test_an_engine_stating_no_cached_count_corrects_nothing(memory_cluster: Make) -> None:
    """Ollama 0.9.3 states no cached count (its ``prompt_eval_count`` is the whole prompt), and
    the cached count an Ollama node writes is a constant 0 (§12.2): what it found is unknown, not
    a miss."""
    cluster = two_nodes(memory_cluster, kind="ollama", script=stating([0, 0, 0]))
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    pinned(cluster, "b", ROUTE, chat_completions(OTHER))
    assert send(cluster, ROUTE, chat_completions(SECOND)) == "b"
    assert cluster.facade().caches.capacity("b", MODEL) == Capacity(None)


def test_a_conversation_pushed_out_everywhere_is_placed_anew(memory_cluster: Make) -> None:
    """Nothing holds it any more: no node is warm for it, and serving it makes it the most
    recent on its node again."""
    cluster = two_nodes(memory_cluster, capacity=0)
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    assert send(cluster, ROUTE, chat_completions(SECOND)) == "a"
    place = cluster.facade().caches.place("a", MODEL, _root(cluster))
    assert place is not None and place.position == 1 and not place.resident


def _root(cluster: MemoryCluster) -> bytes:
    [book] = [b for (node, _), b in cluster.facade().caches._books.items() if node == "a"]
    return next(iter(book))


def test_only_digests_are_kept(memory_cluster: Make) -> None:
    cluster = two_nodes(memory_cluster, capacity=2)
    send(cluster, ROUTE, chat_completions(FIRST))
    kept: Any = cluster.facade().caches._books
    assert "What does app.py do?" not in repr(kept)
    assert all(len(root) == 32 for book in kept.values() for root in book)


# --- a new conversation and the active ones --------------------------------------------------------


def seeded(make: Make, speed_b: float) -> MemoryCluster:
    """``a`` and ``b`` keep one conversation each; ``b`` is ``speed_b`` times as fast as ``a``
    (its seed, §15.1: decode 20 tokens/s times its speed). The engines answer 500 prompt and 200
    completion tokens, so a conversation pushed out of ``b`` would take 700 tokens at the default
    400 tokens/s, 1.75 s, to be read again; a new one's 200 answer tokens take 10 s on ``a``."""
    clock = Clock()
    script = stating([], completion=200)
    engines = {n: SimulatedEngine(clock, (MODEL,), kind="openai", script=script) for n in "ab"}
    nodes = [
        Node(
            n,
            f"http://{n}.node.test:11434",
            (MODEL,),
            kind="openai",
            cache_conversations=1,
            speed=speed_b if n == "b" else 1.0,
        )
        for n in "ab"
    ]
    return make(clock, engines, facades=("openai",), nodes={"openai": nodes})


NEW = [("user", "Write a haiku about caches. " * 20)]


def test_a_new_conversation_does_not_push_an_active_one_out_when_the_times_are_close(
    memory_cluster: Make,
) -> None:
    """``b`` is predicted about 0.9 s sooner, less than the 1.75 s the active conversation it
    holds would take to be read again: the new one goes to ``a``."""
    cluster = seeded(memory_cluster, speed_b=1.1)
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    assert send(cluster, ROUTE, chat_completions(NEW)) == "a"


def test_a_new_conversation_takes_the_faster_node_when_it_is_much_faster(
    memory_cluster: Make,
) -> None:
    """5 s sooner on ``b``: more than the 1.75 s the pushed-out conversation pays."""
    cluster = seeded(memory_cluster, speed_b=2.0)
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    assert send(cluster, ROUTE, chat_completions(NEW)) == "b"


def test_a_conversation_idle_past_the_affinity_time_is_not_active(memory_cluster: Make) -> None:
    cluster = seeded(memory_cluster, speed_b=1.1)
    pinned(cluster, "b", ROUTE, chat_completions(FIRST))
    cluster.advance(cluster.facade().shared.settings.affinity_ttl)
    assert send(cluster, ROUTE, chat_completions(NEW)) == "b"


def test_without_the_conversation_the_faster_node_is_first(memory_cluster: Make) -> None:
    cluster = seeded(memory_cluster, speed_b=1.1)
    assert send(cluster, ROUTE, chat_completions(NEW)) == "b"
