"""Tests for InventoryBook and get_json: polling, last good inventory, timers, owners."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
from treq.client import HTTPClient
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.logger import ILogObserver, LogEvent, LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

from nvpair_tw.engines import LMSTUDIO, OLLAMA, OMLX, EngineProfile
from nvpair_tw.inventory import InventoryBook, ReadError, get_json, make_http_client
from nvpair_tw.nodes import Node, NodeDirectory

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


def tags(*names: str) -> bytes:
    """An /api/tags body."""
    return json.dumps({"models": [{"name": n, "model": n} for n in names]}).encode()


class Engines(Resource):
    """In-memory engines told apart by port: each answers ``answers[port]`` or holds the request."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, tuple[int, bytes]] = {}
        self.seen: list[tuple[int, bytes]] = []
        self.held: list[Request] = []

    def render_GET(self, request: Request) -> bytes | int:
        port = request.getHost().port
        self.seen.append((port, request.uri))
        if port not in self.answers:
            self.held.append(request)
            return NOT_DONE_YET
        status, body = self.answers[port]
        request.setResponseCode(status)
        return body


@implementer(ILogObserver)
class Recorder:
    """A log observer keeping every event."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)


class InMemory:
    """An InventoryBook over in-memory engines and a task.Clock."""

    def __init__(self, nodes: list[Node], engine: EngineProfile = OLLAMA, **options: Any) -> None:
        self.clock = Clock()
        self.engines = Engines()
        self.agent = RequestTraversalAgent(self.engines)
        self.directory = NodeDirectory(engine, self.clock, flag_nodes=nodes)
        self.book = InventoryBook(
            engine, self.directory, make_http_client(self.agent), self.clock, **options
        )

    def pump(self) -> None:
        """Move every pending byte between the in-memory clients and engines."""
        for _ in range(4):
            self.agent.flush()

    def poll(self) -> None:
        """Poll once and let it complete."""
        done = self.book.poll_now()
        self.pump()
        assert done.called


def node(node_id: str, port: int, models: tuple[str, ...] | None = None) -> Node:
    """A node at an in-memory port."""
    return Node(node_id, f"http://127.0.0.1:{port}", models)


def test_last_good_inventory_survives_failed_polls() -> None:
    """A 500, garbage or a wrong shape after a good poll keeps the last good models and time."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("llama3:latest"))
    memory.clock.advance(5)
    memory.poll()
    assert memory.book.models("a") == frozenset({"llama3:latest"})
    assert memory.book.last_success("a") == 5
    for answer in [(500, tags("x")), (200, b"garbage"), (200, b'{"data": []}')]:
        memory.engines.answers[1001] = answer
        memory.clock.advance(1)
        memory.poll()
        assert memory.book.models("a") == frozenset({"llama3:latest"})
        assert memory.book.last_success("a") == 5
        assert memory.book.known("a")
    assert memory.engines.seen[0] == (1001, b"/api/tags")
    assert memory.clock.getDelayedCalls() == []


def test_node_that_never_answered_is_unknown_and_empty() -> None:
    """A node whose polls all failed has no inventory."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (503, b"")
    memory.poll()
    assert memory.book.models("a") == frozenset()
    assert not memory.book.known("a")
    assert memory.book.last_success("a") is None


def test_static_nodes_are_never_polled() -> None:
    """A node with a static models list is known at once and never contacted."""
    memory = InMemory([node("s", 1001, ("m1",)), node("p", 1002)])
    memory.engines.answers[1002] = (200, tags("m2"))
    memory.book.start()
    memory.pump()
    memory.clock.advance(60)
    memory.pump()
    assert {port for port, _ in memory.engines.seen} == {1002}
    assert memory.book.models("s") == frozenset({"m1"})
    assert memory.book.known("s")
    memory.book.stop()


def test_openai_inventory_reads_v1_models() -> None:
    """OpenAI-style engines are polled at /v1/models and read data[].id."""
    memory = InMemory([node("a", 1001)], engine=LMSTUDIO)
    body = json.dumps({"data": [{"id": "qwen"}, {"id": "phi"}]}).encode()
    memory.engines.answers[1001] = (200, body)
    memory.poll()
    assert memory.engines.seen == [(1001, b"/v1/models")]
    assert memory.book.models("a") == frozenset({"qwen", "phi"})


def test_owners_treat_llama3_as_llama3_latest_for_ollama() -> None:
    """Ollama matching: llama3 and llama3:latest name the same model, from polls or static lists."""
    memory = InMemory([node("a", 1001), node("b", 1002, ("llama3",)), node("c", 1003, ("qwen",))])
    memory.engines.answers[1001] = (200, tags("llama3:latest"))
    memory.poll()
    assert memory.book.owners("llama3") == ["a", "b"]
    assert memory.book.owners(" llama3:latest ") == ["a", "b"]
    assert memory.book.owners("llama3:8b") == []


def test_matching_follows_each_new_inventory() -> None:
    """The per-node matching cache follows a changed poll, a static list and a removed node."""
    memory = InMemory([node("a", 1001), node("b", 1002, ("qwen",))])
    memory.engines.answers[1001] = (200, tags("llama3:latest"))
    memory.poll()
    assert memory.book.advertises("a", "llama3")
    memory.engines.answers[1001] = (200, tags("mistral:7b"))
    memory.poll()
    assert not memory.book.advertises("a", "llama3")
    assert memory.book.advertises("a", "mistral:7b")
    assert memory.book.advertises("b", "qwen:latest")
    memory.directory.add_manual(Node("b", "http://127.0.0.1:1002", ("llama3",), "manual"))
    assert memory.book.advertises("b", "llama3") and not memory.book.advertises("b", "qwen")
    assert not memory.book.advertises("gone", "llama3")


def test_owners_are_case_insensitive_for_omlx_only() -> None:
    """oMLX compares names case-insensitively; LM Studio compares them exactly."""
    nodes = [node("a", 1001, ("Qwen-7B",)), node("b", 1002, ("qwen-7b",))]
    assert InMemory(nodes, engine=OMLX).book.owners("QWEN-7b") == ["a", "b"]
    assert InMemory(nodes, engine=LMSTUDIO).book.owners("qwen-7b") == ["b"]


def test_start_polls_at_once_then_every_interval_with_jitter() -> None:
    """The first poll is immediate, the next after interval x (1 + jitter x (2r - 1))."""
    memory = InMemory([node("a", 1001)], interval=10.0, jitter=0.1, random=lambda: 1.0)
    memory.engines.answers[1001] = (200, tags("m"))
    memory.book.start()
    memory.pump()
    assert len(memory.engines.seen) == 1
    memory.clock.advance(10.9)
    memory.pump()
    assert len(memory.engines.seen) == 1
    memory.clock.advance(0.1)
    memory.pump()
    assert len(memory.engines.seen) == 2
    memory.book.stop()
    assert memory.clock.getDelayedCalls() == []


def test_poll_is_bounded_by_the_timeout() -> None:
    """An engine that never answers is abandoned after the timeout; nothing is left scheduled."""
    memory = InMemory([node("a", 1001)], timeout=3.0)
    done = memory.book.poll_now()
    memory.pump()
    memory.clock.advance(2.9)
    assert not done.called
    memory.clock.advance(0.1)
    memory.pump()
    assert done.called
    assert not memory.book.known("a")
    assert memory.clock.getDelayedCalls() == []


def test_body_stall_is_bounded_by_the_same_timeout() -> None:
    """Headers and part of a body, then silence: the read is cut at the timeout, nothing kept."""
    memory = InMemory([node("a", 1001)], timeout=3.0)
    done = memory.book.poll_now()
    memory.pump()
    memory.engines.held[0].write(b'{"models": [')
    memory.pump()
    memory.clock.advance(2.9)
    memory.pump()
    assert not done.called
    memory.clock.advance(0.1)
    memory.pump()
    assert done.called
    assert not memory.book.known("a")
    assert memory.clock.getDelayedCalls() == []


def test_in_flight_poll_is_shared_not_repeated() -> None:
    """A second poll_now while a node is still answering waits for the same request."""
    memory = InMemory([node("a", 1001)])
    first, second = memory.book.poll_now(), memory.book.poll_now()
    memory.pump()
    assert len(memory.engines.held) == 1
    held = memory.engines.held[0]
    held.write(tags("m"))
    held.finish()
    memory.pump()
    assert first.called and second.called
    assert memory.book.models("a") == frozenset({"m"})


def test_stop_cancels_timers_and_in_flight_polls() -> None:
    """stop() leaves no timer behind, the pending poll_now fires, and nothing is logged as failed."""
    memory = InMemory([node("a", 1001)])
    events = Recorder()
    memory.book.start()
    memory.pump()
    done = memory.book.poll_now()
    globalLogPublisher.addObserver(events)
    try:
        memory.book.stop()
        memory.pump()
    finally:
        globalLogPublisher.removeObserver(events)
    assert done.called
    assert [e for e in events.events if e["log_level"] >= LogLevel.warn] == []
    assert memory.clock.getDelayedCalls() == []
    assert not memory.book.known("a")


def test_stop_mid_body_closes_the_engine_connection() -> None:
    """Stopping while a body is arriving tears the connection down rather than reading on."""
    memory = InMemory([node("a", 1001)])
    memory.book.start()
    memory.pump()
    held = memory.engines.held[0]
    gone: list[Failure] = []
    held.notifyFinish().addErrback(gone.append)
    held.write(b'{"models": [')
    memory.pump()
    memory.book.stop()
    memory.pump()
    assert len(gone) == 1
    assert memory.clock.getDelayedCalls() == []


def test_removed_nodes_are_forgotten_and_new_ones_polled_at_once() -> None:
    """A node leaving the directory loses its inventory; a node joining is polled straight away."""
    memory = InMemory([])
    memory.engines.answers[1001] = (200, tags("m"))
    memory.book.start()
    memory.directory.add_manual(node("a", 1001))
    memory.pump()
    assert memory.book.models("a") == frozenset({"m"})
    memory.directory.remove_manual("a")
    assert not memory.book.known("a")
    assert memory.book.last_success("a") is None
    memory.book.stop()


def test_url_change_drops_the_old_inventory() -> None:
    """A node that moves to another URL is unknown until its new URL answers."""
    memory = InMemory([])
    memory.engines.answers[1001] = (200, tags("old"))
    memory.book.start()
    memory.directory.add_manual(node("a", 1001))
    memory.pump()
    memory.directory.add_manual(node("a", 1002))
    assert memory.book.models("a") == frozenset()
    memory.book.stop()


def test_oversized_answer_is_a_read_error() -> None:
    """get_json gives up on a body larger than its limit."""
    memory = InMemory([])
    memory.engines.answers[1001] = (200, tags(*[f"m{i}" for i in range(100)]))
    result = Deferred.fromCoroutine(
        get_json(
            make_http_client(memory.agent),
            memory.clock,
            "http://127.0.0.1:1001/api/tags",
            timeout=5,
            limit=100,
        )
    )
    errors: list[Failure] = []
    result.addErrback(errors.append)
    memory.pump()
    assert [(type(f.value), str(f.value)) for f in errors] == [(ReadError, "answer too large")]
    assert memory.clock.getDelayedCalls() == []


class Stalling(Resource):
    """A real engine that answers /api/tags well, stalls /slow-headers, and stalls mid-body;
    ``arrived[path]`` fires when a stalled request has come in."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.arrived: dict[bytes, Deferred[None]] = {
            b"/slow-headers": Deferred(),
            b"/slow-body": Deferred(),
        }

    def render_GET(self, request: Request) -> bytes | int:
        if request.path == b"/api/tags":
            return tags("m")
        if request.path == b"/slow-body":
            request.write(b'{"models": [')
        self.arrived[request.path].callback(None)
        return NOT_DONE_YET


class HeadersSeen:
    """The treq client, but ``headers`` fires once a response's headers have arrived."""

    def __init__(self, http: HTTPClient) -> None:
        self._http = http
        self.headers: Deferred[None] = Deferred()

    def get(self, url: str, **options: Any) -> Deferred[Any]:
        def seen(response: Any) -> Any:
            self.headers.callback(None)
            return response

        return self._http.get(url, **options).addCallback(seen)


@on_reactor
async def test_loopback_poll_and_timeouts(
    reactor: Any, listen: Callable[[Any], int], http: HTTPClient
) -> None:
    """Over real sockets a good poll lands, and stalls before or after headers end exactly at the
    timeout (measured on an injected clock), not a moment earlier."""
    engine = Stalling()
    site = Site(engine)
    site.noisy = False
    base = f"http://127.0.0.1:{listen(site)}"
    directory = NodeDirectory(OLLAMA, reactor, flag_nodes=[Node("a", base)])
    book = InventoryBook(OLLAMA, directory, http, reactor, timeout=0.2)
    await book.poll_now()
    assert book.models("a") == frozenset({"m"})
    for path in [b"/slow-headers", b"/slow-body"]:
        clock = Clock()
        client = HeadersSeen(http)
        read = Deferred.fromCoroutine(
            get_json(cast(HTTPClient, client), clock, base + path.decode(), timeout=0.2)
        )
        await engine.arrived[path]
        if path == b"/slow-body":
            await client.headers
            await deferLater(reactor, 0, lambda: None)  # get_json now waits on the body
        clock.advance(0.199)
        assert not read.called
        clock.advance(0.001)
        with pytest.raises(ReadError, match="timed out"):
            await read
        assert clock.getDelayedCalls() == []
