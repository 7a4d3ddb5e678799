"""Tests for aggregate_model_list over real loopback sockets: order, de-dup, failures, headers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest_twisted
from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.aggregate import AggregateResult, aggregate_model_list
from nvpair_tw.engines import OPENAI_MODELS, TAGS
from nvpair_tw.nodes import Node

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


UNAVAILABLE = {"error": "model inventory unavailable", "code": "inventory-unavailable"}


class FakeEngine(Resource):
    """An engine answering every GET with a fixed status and body; records what it was sent.

    ``body=None`` never answers (a stalled engine); ``hold`` delays the answer until fired.
    """

    isLeaf = True

    def __init__(
        self,
        body: bytes | None,
        *,
        status: int = 200,
        hold: Deferred[None] | None = None,
        set_cookie: bool = False,
    ) -> None:
        super().__init__()
        self.body, self.status, self.hold, self.set_cookie = body, status, hold, set_cookie
        self.seen: list[tuple[bytes, Headers]] = []
        self.arrived: Deferred[None] = Deferred()

    def render_GET(self, request: Request) -> bytes | int:
        self.seen.append((request.uri, request.requestHeaders))
        if not self.arrived.called:
            self.arrived.callback(None)
        request.setResponseCode(self.status)
        if self.set_cookie:
            request.setHeader(b"set-cookie", b"sid=secret; Path=/")
        if self.body is None:
            return NOT_DONE_YET
        if self.hold is not None:
            body = self.body
            self.hold.addCallback(lambda _: (request.write(body), request.finish()))
            return NOT_DONE_YET
        return self.body


def serve(listen: Callable[[Any], int], engine: Resource) -> str:
    """Serve a fake engine on loopback; return its base URL."""
    site = Site(engine)
    site.noisy = False
    return f"http://127.0.0.1:{listen(site)}"


async def closed_port_url(reactor: Any) -> str:
    """The URL of a loopback port nothing listens on any more."""
    port = reactor.listenTCP(0, Factory(), interface="127.0.0.1")
    number = port.getHost().port
    await port.stopListening()
    return f"http://127.0.0.1:{number}"


def tags(*records: dict[str, Any]) -> bytes:
    """An /api/tags body."""
    return json.dumps({"models": list(records)}).encode()


def models(*ids: str) -> bytes:
    """A /v1/models body."""
    return json.dumps(
        {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}
    ).encode()


def decoded(result: AggregateResult) -> Any:
    """The JSON body of an aggregate result."""
    return json.loads(result.body)


@on_reactor
async def test_tags_merge_in_candidate_order_skipping_down_and_garbage(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """/api/tags merges the good nodes in the given order even when the first answers last."""
    release: Deferred[None] = Deferred()
    late = serve(listen, FakeEngine(tags({"name": "a:1", "model": "a:1"}), hold=release))
    early = FakeEngine(tags({"name": "b:1", "model": "b:1"}, {"name": "c:1"}))
    early_url = serve(listen, early)
    garbage = serve(listen, FakeEngine(b"<html>not json"))
    nodes = [
        Node("late", late),
        Node("down", await closed_port_url(reactor)),
        Node("garbage", garbage),
        Node("early", early_url),
    ]
    pending = Deferred.fromCoroutine(
        aggregate_model_list(TAGS, nodes, "/api/tags?x=1", http, reactor, timeout=5)
    )
    await early.arrived
    await _pause(reactor, 0.05)
    release.callback(None)
    result = await pending
    assert result.status == 200
    assert decoded(result) == {
        "models": [
            {"name": "a:1", "model": "a:1"},
            {"name": "b:1", "model": "b:1"},
            {"name": "c:1"},
        ]
    }
    assert [uri for uri, _ in early.seen] == [b"/api/tags?x=1"]


@on_reactor
async def test_openai_models_merge_skipping_down_and_non_200(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """/v1/models keeps the envelope and skips a down node and a 500."""
    nodes = [
        Node("a", serve(listen, FakeEngine(models("m1", "m2")))),
        Node("down", await closed_port_url(reactor)),
        Node("err", serve(listen, FakeEngine(models("x"), status=500))),
        Node("b", serve(listen, FakeEngine(models("m3")))),
    ]
    result = await aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", http, reactor)
    assert result.status == 200
    assert decoded(result)["object"] == "list"
    assert [r["id"] for r in decoded(result)["data"]] == ["m1", "m2", "m3"]


@on_reactor
async def test_duplicates_keep_the_first_record_verbatim(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """Ollama keys are normalised (llama3 = llama3:latest); the earlier node's record wins."""
    first = {"name": "llama3:latest", "model": "llama3:latest", "size": 1}
    second = {"name": "llama3", "model": "llama3", "size": 2}
    nodes = [
        Node("a", serve(listen, FakeEngine(tags(first)))),
        Node("b", serve(listen, FakeEngine(tags(second, {"model": "qwen"})))),
    ]
    result = await aggregate_model_list(TAGS, nodes, "/api/tags", http, reactor)
    assert decoded(result) == {"models": [first, {"model": "qwen"}]}


@on_reactor
async def test_openai_ids_compare_verbatim(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """/v1/models de-duplicates by id exactly: M1 and m1 are two records, m1 twice is one."""
    nodes = [
        Node("a", serve(listen, FakeEngine(models("m1")))),
        Node("b", serve(listen, FakeEngine(models("M1", "m1")))),
    ]
    result = await aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", http, reactor)
    assert [r["id"] for r in decoded(result)["data"]] == ["m1", "M1"]


@on_reactor
async def test_all_down_is_503(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """No good answer (down, garbage, wrong shape, stalled past the timeout) gives the 503 JSON,
    as soon as the stalled node's timeout (on the injected clock) ends its read, not before."""
    slow = FakeEngine(None)
    nodes = [
        Node("down", await closed_port_url(reactor)),
        Node("garbage", serve(listen, FakeEngine(b"{"))),
        Node("shape", serve(listen, FakeEngine(b'{"data": []}'))),
        Node("slow", serve(listen, slow)),
    ]
    clock = Clock()
    pending = Deferred.fromCoroutine(
        aggregate_model_list(TAGS, nodes, "/api/tags", http, clock, timeout=0.2)
    )
    await slow.arrived
    clock.advance(0.199)
    assert not pending.called
    clock.advance(0.001)
    result = await pending
    assert (result.status, decoded(result)) == (503, UNAVAILABLE)
    assert clock.getDelayedCalls() == []


@on_reactor
async def test_one_empty_good_answer_is_200(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """A single good but empty list is a 200 with an empty envelope, not a 503."""
    nodes = [
        Node("down", await closed_port_url(reactor)),
        Node("empty", serve(listen, FakeEngine(models()))),
    ]
    result = await aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", http, reactor)
    assert (result.status, decoded(result)) == (200, {"object": "list", "data": []})


@on_reactor
async def test_no_node_is_503(reactor: Any, http: HTTPClient) -> None:
    """An empty node list has no good answer."""
    result = await aggregate_model_list(TAGS, [], "/api/tags", http, reactor)
    assert result.status == 503


@on_reactor
async def test_fan_out_never_sends_authorization_or_cookie(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """Even after an engine sets a cookie, the next fan-out sends no Cookie and no Authorization."""
    engine = FakeEngine(models("m"), set_cookie=True)
    nodes = [Node("a", serve(listen, engine))]
    await aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", http, reactor)
    await aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", http, reactor)
    assert len(engine.seen) == 2
    for _, headers in engine.seen:
        assert not headers.hasHeader(b"authorization")
        assert not headers.hasHeader(b"cookie")


@on_reactor
async def test_cancelling_the_fan_out_leaves_no_timer(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """A caller going away cancels every node's read and its 30 s timer (the leak check verifies)."""
    slow = FakeEngine(None)
    pending = Deferred.fromCoroutine(
        aggregate_model_list(
            TAGS, [Node("slow", serve(listen, slow))], "/api/tags", http, reactor, timeout=30
        )
    )
    await slow.arrived
    pending.cancel()
    failures: list[Failure] = []
    pending.addErrback(failures.append)
    assert [f.type for f in failures] == [CancelledError]


async def _pause(reactor: Any, delay: float) -> None:
    """Part of a scenario (the first node answers after the last), not a synchronisation stand-in."""
    done: Deferred[None] = Deferred()
    reactor.callLater(delay, done.callback, None)
    await done
