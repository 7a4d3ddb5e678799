"""docs/behaviour.md §17.5: compressed request bodies, decoded before the one parse.

Over real loopback sockets to a simulated node: what the node received is the decoded body
without ``Content-Encoding``; the cap applies to the decoded size; other codings are 415.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
import zstandard
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers

from nvpair_tw.core import RouteKind, Settings
from nvpair_tw.corridor._decoding import (
    SLICE,
    Coding,
    _Bad,
    _decode,
    _TooLarge,
    codings,
    decode_body,
)
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._roles import Channel, Targeting
from nvpair_tw.inbound import LOCAL, Rejection, parse_target
from nvpair_tw.simulated._engine import SimulatedEngine
from nvpair_tw.testing import Clusters, ProxyCluster

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi " * 50}]})
BODY = CHAT.encode()

ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


async def proxied(clusters: Clusters, settings: Settings | None = None) -> ProxyCluster:
    cluster = clusters(ProxyCluster)
    await cluster.start([SimulatedEngine(cluster.reactor)], settings)
    return cluster


def node_saw(cluster: ProxyCluster) -> list[tuple[bytes, dict[bytes, list[bytes]]]]:
    engine = cluster.handles[0].engine
    return [(r.body, r.headers) for r in engine.received if r.method == b"POST"]


@pytest.mark.parametrize("coding", sorted(ENCODERS))
@pytest_twisted.ensureDeferred
async def test_a_compressed_body_reaches_the_node_decoded_without_the_header(
    reactor: Any, clusters: Clusters, coding: str
) -> None:
    cluster = await proxied(clusters)
    sent = ENCODERS[coding](BODY)
    code, _, _ = await cluster.post(sent, headers={"Content-Encoding": coding})
    assert code == 200
    [(body, headers)] = node_saw(cluster)
    assert body == BODY
    assert b"content-encoding" not in headers
    assert headers[b"content-length"] == [str(len(BODY)).encode()]


@pytest_twisted.ensureDeferred
async def test_the_cap_applies_to_the_decoded_size(reactor: Any, clusters: Clusters) -> None:
    """A few hundred compressed bytes that decode past the cap are 413; no node is contacted."""
    cluster = await proxied(clusters, Settings(max_body_size=64 * 1024))
    padded = json.dumps({"model": "llama3", "prompt": " " * (1 << 20)}).encode()
    sent = zstandard.ZstdCompressor().compress(padded)
    assert len(sent) < 1024
    code, content, _ = await cluster.post(
        sent, "/api/generate", headers={"Content-Encoding": "zstd"}
    )
    assert code == 413 and json.loads(content)["code"] == "body-too-large"
    assert node_saw(cluster) == []


@pytest_twisted.ensureDeferred
async def test_an_unknown_coding_is_415(reactor: Any, clusters: Clusters) -> None:
    cluster = await proxied(clusters)
    code, content, _ = await cluster.post(BODY, headers={"Content-Encoding": "br"})
    assert code == 415 and json.loads(content)["code"] == "unsupported-encoding"
    assert node_saw(cluster) == []


@pytest_twisted.ensureDeferred
async def test_a_corrupt_body_is_400(reactor: Any, clusters: Clusters) -> None:
    cluster = await proxied(clusters)
    truncated = gzip.compress(BODY)[:-12]
    code, content, _ = await cluster.post(truncated, headers={"Content-Encoding": "gzip"})
    assert code == 400 and json.loads(content)["code"] == "bad-body"
    assert node_saw(cluster) == []


def test_codings_are_listed_in_the_order_applied() -> None:
    headers = Headers({b"content-encoding": [b"gzip, identity", b"ZSTD"]})
    assert codings(headers) == [Coding.GZIP, Coding.IDENTITY, Coding.ZSTD]
    assert codings(Headers()) == []
    refused = codings(Headers({b"content-encoding": [b"gzip, compress"]}))
    assert isinstance(refused, Rejection) and refused.status == 415


def head_of(headers: Headers) -> Head:
    target = parse_target(b"/api/chat")
    assert not isinstance(target, Rejection)
    return Head(
        b"POST",
        target,
        RouteKind.INFERENCE,
        Channel.HTTP,
        LOCAL,
        Targeting.NONE,
        (),
        headers,
        None,
    )


def test_two_codings_are_undone_last_first() -> None:
    """``Content-Encoding: gzip, zstd``: gzip was applied first, so zstd is undone first."""
    sent = zstandard.ZstdCompressor().compress(gzip.compress(BODY))
    head = head_of(Headers({b"content-encoding": [b"gzip, zstd"], b"x-other": [b"1"]}))
    outcome: list[Any] = []
    Deferred.fromCoroutine(decode_body(head, sent, 1 << 20, Clock())).addBoth(outcome.append)
    [(new_head, body)] = outcome
    assert body == BODY
    assert new_head.headers.getRawHeaders(b"content-encoding") is None
    assert new_head.headers.getRawHeaders(b"x-other") == [b"1"]
    assert head.headers.getRawHeaders(b"content-encoding") == [b"gzip, zstd"]  # a copy changed


class CountingClock(Clock):
    """A clock that counts the calls scheduled on it."""

    turns = 0

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> IDelayedCall:
        self.turns += 1
        return super().callLater(delay, callable, *args, **kw)


def test_decoding_yields_to_the_reactor_between_slices_and_stops_at_the_cap() -> None:
    """Output is made a slice per reactor turn, and nothing past the cap is ever kept."""
    raw = b"x" * (3 * SLICE + 5)
    clock = CountingClock()
    outcome: list[Any] = []
    Deferred.fromCoroutine(_decode(Coding.GZIP, gzip.compress(raw), 1 << 30, clock)).addBoth(
        outcome.append
    )
    assert outcome == [] and clock.turns == 1  # the first slice made, then a turn
    clock.advance(0)
    assert outcome == [raw] and clock.turns == 3
    capped: list[Any] = []
    Deferred.fromCoroutine(_decode(Coding.ZSTD, ENCODERS["zstd"](raw), SLICE, clock)).addBoth(
        capped.append
    )
    clock.advance(0)
    [failure] = capped
    assert failure.check(_TooLarge)


def test_gzip_members_follow_each_other_and_deflate_takes_raw_streams() -> None:
    """Two gzip members decode to both halves; a raw deflate stream is taken for ``deflate``;
    bytes after a deflate stream's end are refused."""
    clock = Clock()

    def decoded(coding: Coding, data: bytes) -> Any:
        outcome: list[Any] = []
        Deferred.fromCoroutine(_decode(coding, data, 1 << 20, clock)).addBoth(outcome.append)
        return outcome[0]

    assert decoded(Coding.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decoded(Coding.DEFLATE, raw.compress(BODY) + raw.flush()) == BODY
    assert decoded(Coding.DEFLATE, zlib.compress(BODY) + b"x").check(_Bad)
