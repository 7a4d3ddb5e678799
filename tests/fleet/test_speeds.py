"""Learnt speeds across a fleet (docs/behaviour.md §15.1, §6.6), over a real redis-server: each
proxy publishes the samples it learns for (node, model) and folds in its peers' — samples, not
estimates, are merged."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from nvpair_tw.core import IProxyReactor, Settings
from nvpair_tw.fleet._sharing import SharedSpeeds
from nvpair_tw.fleet._wire import Codec
from nvpair_tw.nodes import Node
from nvpair_tw.selection import Sample, SpeedBook
from tests.fleet.test_store import (  # noqa: F401 -- fleet and redis are fixtures
    MODEL,
    PEER_BOUND,
    Fleet,
    RedisServer,
    fleet,
    healthy,
    redis,
)
from tests.helpers import eventually


def _ollama_at(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
    """An Ollama chat stream whose final object states 40 tokens at 57.7 tokens/s."""
    piece = {"model": "llama3", "message": {"role": "assistant", "content": "tok "}}
    final = {
        "model": "llama3",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "prompt_eval_count": 12,
        "eval_count": 40,
        "eval_duration": int(40 / 57.7 * 1e9),
    }
    return [json.dumps(f).encode() + b"\n" for f in (piece, piece, final)]


def _samples(book: SpeedBook, node: str, model: str) -> int:
    rates = book.measured(node, model)
    return 0 if rates is None else rates.samples


@pytest_twisted.ensureDeferred
async def test_an_answer_on_one_proxy_teaches_the_other_the_nodes_rate(
    reactor: Any,
    fleet: Fleet,  # noqa: F811
    redis: RedisServer,  # noqa: F811
) -> None:
    n0 = await fleet.engine(healthy(reactor, script=_ollama_at))
    nodes = [Node("n0", n0.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    body = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    status, _, node = await fleet.post(p1, body)
    assert (status, node) == (200, "n0")
    here = p1.runtime.facades["ollama"].speeds
    there = p2.runtime.facades["ollama"].speeds
    await eventually(reactor, lambda: _samples(here, "n0", "llama3") == 1, 5.0, "own sample")
    await eventually(
        reactor, lambda: _samples(there, "n0", "llama3") == 1, PEER_BOUND, "peer sample"
    )
    mine, theirs = here.measured("n0", "llama3"), there.measured("n0", "llama3")  # public name
    assert mine is not None and theirs is not None
    assert theirs.decode == mine.decode == pytest.approx(57.7)
    assert json.dumps(there.to_json("n0"))  # shown like a sample of its own


@pytest_twisted.ensureDeferred
async def test_each_proxy_folds_in_every_sample_so_both_count_the_fleets_answers(
    reactor: Any,
    fleet: Fleet,  # noqa: F811
    redis: RedisServer,  # noqa: F811
) -> None:
    """P1 learns two samples and P2 one: each ends with all three (merging estimates would
    leave each with its own count); a sample's concurrency travels with it."""
    nodes = [Node("n0", "http://127.0.0.1:1", MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    one, two = p1.runtime.facades["ollama"].speeds, p2.runtime.facades["ollama"].speeds
    one.learn("n0", "m", Sample(decode_rate=10.0, concurrency=2.0))
    await eventually(reactor, lambda: _samples(two, "n0", "m") == 1, PEER_BOUND, "first sample")
    first = two.measured("n0", "m")
    assert first is not None and first.decode == 20.0  # throughput: rate x requests sharing it
    one.learn("n0", "m", Sample(decode_rate=30.0, prefill_rate=500.0, completion_tokens=40))
    two.learn("n0", "m", Sample(decode_rate=50.0, load_seconds=2.0))
    await eventually(
        reactor,
        lambda: (_samples(one, "n0", "m"), _samples(two, "n0", "m")) == (3, 3),
        PEER_BOUND,
        "three samples on each",
    )
    for book in (one, two):
        rates = book.measured("n0", "m")
        assert rates is not None and 20.0 < rates.decode < 50.0
        assert (rates.prefill, rates.load) == (500.0, 2.0)
        assert book.completion_mean("m") == 40.0


def test_a_peers_malformed_sample_is_ignored_and_its_own_samples_are_not_republished() -> None:
    clock = Clock()
    sent: list[object] = []
    speeds = SharedSpeeds(cast(IProxyReactor, clock), Codec("me", "ns"), sent.append, lambda: True)
    book = SpeedBook(clock)
    speeds.bind("ollama", book)
    for figures in ({"d": "fast"}, {"d": True}, "10", {"k": [2]}):
        assert not speeds.apply("ollama", "n0", {"m": "m", "s": figures})
    assert not speeds.apply("ollama", "n0", {"s": {"d": 10.0}})
    assert not speeds.apply("lmstudio", "n0", {"m": "m", "s": {"d": 10.0}})
    assert book.measured("n0", "m") is None
    assert speeds.apply("ollama", "n0", {"m": "m", "s": {"d": 10.0, "c": 40}})
    assert sent == []  # a peer's sample is folded in, never sent back out
    book.learn("n0", "m", Sample(decode_rate=12.0))
    assert len(sent) == 1


def test_a_samples_bytes_per_token_travels_to_the_peers() -> None:
    """The model's bytes per token (§15.1) is published with the sample and folded in by a peer;
    a peer's ratio outside 1..16 is not learnt."""
    clock = Clock()
    sent: list[Any] = []
    here = SharedSpeeds(cast(IProxyReactor, clock), Codec("me", "ns"), sent.append, lambda: True)
    book = SpeedBook(clock)
    here.bind("ollama", book)
    book.learn("n0", "m", Sample(decode_rate=12.0, bytes_per_token=3.0))
    [write] = sent
    [(_verb, message)] = write()
    elsewhere: list[Any] = []
    peer = SharedSpeeds(
        cast(IProxyReactor, clock), Codec("peer", "ns"), elsewhere.append, lambda: True
    )
    theirs = SpeedBook(clock)
    peer.bind("ollama", theirs)
    assert peer.apply("ollama", "n0", message)
    assert theirs.bytes_per_token("m") == 3.0
    assert peer.apply("ollama", "n0", {"m": "other", "s": {"d": 10.0, "b": 40.0}})
    assert theirs.bytes_per_token("other") is None


def test_a_peers_sample_with_an_infinite_or_nan_figure_is_ignored() -> None:
    """A peer's message is hostile input (docs/behaviour.md §14, §6.6): JSON's ``Infinity`` would
    stick in the node's mean for good (and go out again as non-JSON); the sample is refused."""
    clock = Clock()
    sent: list[Any] = []
    speeds = SharedSpeeds(cast(IProxyReactor, clock), Codec("me", "ns"), sent.append, lambda: True)
    book = SpeedBook(clock)
    speeds.bind("ollama", book)
    codec = Codec("me", "ns")
    for figure in ("Infinity", "-Infinity", "NaN"):
        head = '{"t":"speed","o":"peer","e":"ollama","n":"n0","m":"m","s":{"d":'
        raw = head + figure + "}}"
        [message] = codec.decode(raw)  # the codec reads what a peer published
        assert not speeds.apply("ollama", "n0", message.fields)
    assert book.measured("n0", "m") is None
    assert speeds.apply("ollama", "n0", {"m": "m", "s": {"d": 10.0}})
    rates = book.measured("n0", "m")
    assert rates is not None and rates.decode == 10.0
