"""The test harness itself: each simulated-engine behaviour over loopback, policies, and proxy clusters.

Engines whose timers matter run on a ``task.Clock`` while listening on the real reactor, so "later"
is ``clock.advance`` rather than a sleep.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseNeverReceived
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    EngineHandle,
    Policy,
    ProxyCluster,
    SimulatedEngine,
    alternate,
    always,
    http_client,
    start_engine,
)

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Collector(Protocol):
    """Keeps every body chunk; ``ended`` fires with the reason the body ended (in a list)."""

    def __init__(self) -> None:
        self.data = b""
        self.ended: Deferred[list[Failure]] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:  # noqa: B008
        self.ended.callback([reason])


async def serve(
    reactor: Any, behaviour: Behaviour | Policy, clock: IReactorTime | None = None, **kw: Any
) -> EngineHandle:
    """A simulated engine with ``behaviour`` (or a policy) on loopback."""
    policy = always(behaviour) if isinstance(behaviour, Behaviour) else behaviour
    engine = SimulatedEngine(clock if clock is not None else reactor, policy=policy, **kw)
    return await start_engine(reactor, engine)


async def post(
    reactor: Any, url: str, body: bytes = CHAT, *, timeout: float | None = None
) -> IResponse:
    """POST ``body`` and return the response as soon as its headers are in (body unread)."""
    response: IResponse = await http_client(reactor).post(
        url, data=body, unbuffered=True, timeout=timeout
    )
    return response


async def read(response: IResponse) -> tuple[bytes, Failure]:
    """The whole body and why it ended."""
    collector = Collector()
    response.deliverBody(collector)
    [reason] = await collector.ended
    return collector.data, reason


def ndjson(engine: SimulatedEngine, count: int) -> bytes:
    """The first ``count`` streamed /api/chat frames of ``engine``."""
    return b"".join(
        json.dumps(
            {"message": {"role": "assistant", "content": f"{engine.reply_text}{i}"}, "done": False}
        ).encode()
        + b"\n"
        for i in range(count)
    )


@pytest_twisted.ensureDeferred
async def test_healthy_streams_every_frame_then_done(reactor: Any) -> None:
    """HEALTHY streams ``chunks`` NDJSON frames and a done frame, then ends cleanly."""
    handle = await serve(reactor, Behaviour.HEALTHY, chunks=2)
    try:
        response = await post(reactor, handle.url + "/api/chat")
        assert response.code == 200
        assert response.headers.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
        data, reason = await read(response)
        assert data == ndjson(handle.engine, 2) + b'{"done": true, "done_reason": "stop"}\n'
        assert reason.check(ResponseDone)
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_frozen_never_sends_headers(reactor: Any) -> None:
    """FROZEN reads the request and never answers: a client timeout started on arrival expires."""
    arrived: Deferred[None] = Deferred()

    def policy(_number: int, _path: bytes) -> Behaviour:
        reactor.callLater(0, arrived.callback, None)  # once render has returned
        return Behaviour.FROZEN

    handle = await serve(reactor, policy)
    try:
        waiting = Deferred.fromCoroutine(post(reactor, handle.url + "/api/chat"))
        await arrived
        assert [r.body for r in handle.engine.received] == [CHAT]
        timeout = reactor.callLater(0.2, waiting.cancel)
        with pytest.raises(ResponseNeverReceived) as raised:
            await waiting
        assert raised.value.reasons[0].check(CancelledError)
        assert not timeout.active()  # the client gave up; the engine never sent headers
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_headers_only_sends_headers_and_no_body(reactor: Any) -> None:
    """HEADERS_ONLY sends a 200 with headers, then nothing until the engine is stopped."""
    handle = await serve(reactor, Behaviour.HEADERS_ONLY)
    response = await post(reactor, handle.url + "/api/chat")
    assert response.code == 200
    collector = Collector()
    response.deliverBody(collector)
    assert collector.data == b"" and not collector.ended.called
    await handle.stop()
    [reason] = await collector.ended
    assert collector.data == b"" and not reason.check(ResponseDone)


@pytest_twisted.ensureDeferred
async def test_drop_after_headers_closes_before_any_body_byte(reactor: Any) -> None:
    """DROP_AFTER_HEADERS sends headers, then hangs up: an empty, failed body."""
    handle = await serve(reactor, Behaviour.DROP_AFTER_HEADERS)
    try:
        response = await post(reactor, handle.url + "/api/chat")
        assert response.code == 200
        data, reason = await read(response)
        assert data == b"" and not reason.check(ResponseDone)
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_drop_mid_stream_sends_half_the_frames_then_resets(reactor: Any) -> None:
    """DROP_MID_STREAM sends the first half of the frames, then the body fails."""
    handle = await serve(reactor, Behaviour.DROP_MID_STREAM, chunks=5)
    try:
        data, reason = await read(await post(reactor, handle.url + "/api/chat"))
        assert data == ndjson(handle.engine, 3)  # 6 frames with the done frame: half is 3
        assert not reason.check(ResponseDone)
    finally:
        await handle.stop()


@pytest.mark.parametrize(
    "behaviour", [Behaviour.STATUS_503, Behaviour.STATUS_404, Behaviour.STATUS_400]
)
@pytest_twisted.ensureDeferred
async def test_status_behaviours_answer_that_status_in_json(
    reactor: Any, behaviour: Behaviour
) -> None:
    """STATUS_<code> answers <code> with a JSON error naming it."""
    code = int(behaviour.value.rsplit("-", 1)[1])
    handle = await serve(reactor, behaviour)
    try:
        response = await post(reactor, handle.url + "/api/chat")
        data, reason = await read(response)
        assert response.code == code
        assert json.loads(data) == {"error": f"simulated {code}"}
        assert reason.check(ResponseDone)
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_empty_200_has_content_length_zero(reactor: Any) -> None:
    """EMPTY_200 answers 200 with ``Content-Length: 0`` and ends cleanly."""
    handle = await serve(reactor, Behaviour.EMPTY_200)
    try:
        response = await post(reactor, handle.url + "/api/chat")
        assert response.code == 200 and response.length == 0
        data, reason = await read(response)
        assert data == b"" and reason.check(ResponseDone)
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_slow_body_sends_the_body_after_body_delay(reactor: Any) -> None:
    """SLOW_BODY sends headers at once and the body when ``body_delay`` has passed on its clock."""
    clock = Clock()
    handle = await serve(reactor, Behaviour.SLOW_BODY, clock, body_delay=5.0, chunks=1)
    try:
        response = await post(reactor, handle.url + "/api/chat")
        assert response.code == 200
        [timer] = clock.getDelayedCalls()
        assert timer.getTime() == 5.0
        collector = Collector()
        response.deliverBody(collector)
        clock.advance(4.5)
        assert clock.getDelayedCalls() == [timer] and collector.data == b""
        clock.advance(0.5)
        assert clock.getDelayedCalls() == []
        [reason] = await collector.ended
        assert collector.data.startswith(ndjson(handle.engine, 1)) and reason.check(ResponseDone)
    finally:
        await handle.stop()


def test_always_and_alternate_choose_by_request_number() -> None:
    """``always`` ignores the number; ``alternate`` gives odd requests the first behaviour."""
    assert {always(Behaviour.FROZEN)(n, b"/api/chat") for n in (1, 2, 3)} == {Behaviour.FROZEN}
    policy = alternate(Behaviour.STATUS_503, Behaviour.HEALTHY)
    assert [policy(n, b"/api/chat") for n in (1, 2, 3, 4)] == [
        Behaviour.STATUS_503,
        Behaviour.HEALTHY,
        Behaviour.STATUS_503,
        Behaviour.HEALTHY,
    ]


@pytest_twisted.ensureDeferred
async def test_policy_counts_inference_requests_only(reactor: Any) -> None:
    """Model lists are not inference: an alternating engine fails POST 1, serves POST 2."""
    handle = await serve(reactor, alternate(Behaviour.STATUS_503, Behaviour.HEALTHY))
    try:
        client = http_client(reactor)
        tags = json.loads(await treq.content(await client.get(handle.url + "/api/tags")))
        assert tags == {"models": [{"name": "llama3:latest", "model": "llama3:latest"}]}
        models = json.loads(await treq.content(await client.get(handle.url + "/v1/models")))
        assert models["data"] == [{"id": "llama3:latest", "object": "model"}]
        codes = []
        for _ in range(2):
            response = await post(reactor, handle.url + "/api/chat")
            codes.append(response.code)
            await read(response)
        assert codes == [503, 200] and handle.engine.inference_count == 2
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_received_records_method_target_headers_and_exact_body(reactor: Any) -> None:
    """Every request is kept: method, target with query, lower-cased headers, the body bytes."""
    handle = await serve(reactor, Behaviour.HEALTHY)
    try:
        body = b'{"model": "llama3", "stream": false, "x": "\xc3\xa9"}'
        response = await http_client(reactor).post(
            handle.url + "/api/chat?trace=1",
            data=body,
            headers=Headers({b"X-Custom": [b"yes"]}),
            unbuffered=True,
        )
        await read(response)
        [seen] = handle.engine.received
        assert (seen.method, seen.path, seen.body) == (b"POST", b"/api/chat?trace=1", body)
        assert seen.headers[b"x-custom"] == [b"yes"]
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_stop_closes_open_requests_and_cancels_timers(reactor: Any) -> None:
    """``stop`` aborts a frozen request's connection and cancels a pending slow-body timer."""
    clock = Clock()
    frozen_seen: Deferred[None] = Deferred()

    def policy(_number: int, path: bytes) -> Behaviour:
        if path == b"/api/generate":
            reactor.callLater(0, frozen_seen.callback, None)  # once render has returned
            return Behaviour.FROZEN
        return Behaviour.SLOW_BODY

    handle = await serve(reactor, policy, clock, body_delay=5.0)
    try:
        frozen = http_client(reactor).post(handle.url + "/api/generate", data=CHAT)
        await frozen_seen
        slow = await post(reactor, handle.url + "/api/chat")
        assert len(clock.getDelayedCalls()) == 1
        collector = Collector()
        slow.deliverBody(collector)
        handle.engine.stop()
        assert clock.getDelayedCalls() == []
        frozen.addTimeout(5, reactor)  # a missed abort fails here instead of hanging
        with pytest.raises(ResponseNeverReceived) as raised:
            await frozen
        assert raised.value.reasons[0].check(ConnectionLost)
        [reason] = await collector.ended
        assert collector.data == b"" and not reason.check(ResponseDone)
    finally:
        await handle.stop()


@pytest_twisted.ensureDeferred
async def test_proxy_cluster_serves_through_the_proxy_and_records_events(
    reactor: Any, clusters: Clusters
) -> None:
    """A cluster over named engines answers via the proxy, records bus events and engine bodies."""
    cluster = clusters(ProxyCluster)
    await cluster.start({"left": SimulatedEngine(reactor), "right": SimulatedEngine(reactor)})
    code, content, response = await cluster.post(CHAT)
    assert code == 200 and content
    node = response.headers.getRawHeaders(b"x-nvpair-node")
    assert node in ([b"left"], [b"right"])
    index = 0 if node == [b"left"] else 1
    assert cluster.received(index) == [CHAT] and cluster.received(1 - index) == []
    assert cluster.facade.engine == "ollama"
    assert [n.id for n in cluster.facade.directory.nodes()] == ["left", "right"]
    [record] = cluster.named("proxy/request")
    assert record["status"] == 200 and record["node_id"] == node[0].decode()


@pytest_twisted.ensureDeferred
async def test_clusters_stop_every_cluster_last_made_first(reactor: Any) -> None:
    """``Clusters.stop`` stops each cluster it made, newest first, and forgets them."""
    order: list[str] = []

    class Named(ProxyCluster):
        async def stop(self) -> None:
            order.append(self.engine_name)
            await super().stop()

    made = Clusters(reactor)
    first, second = made(Named), made(Named)
    first.engine_name, second.engine_name = "first", "second"
    await made.stop()
    assert order == ["second", "first"] and made.made == []
