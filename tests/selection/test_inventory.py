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

from nvpair_tw.core._engines import LMSTUDIO, OLLAMA, OMLX, EngineProfile
from nvpair_tw.nodes._directory import Node, NodeDirectory
from nvpair_tw.selection._admission import slot_limit
from nvpair_tw.selection._inventory import InventoryBook, ReadError, get_json, make_http_client

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


def tags(*names: str) -> bytes:
    """An /api/tags body."""
    return json.dumps({"models": [{"name": n, "model": n} for n in names]}).encode()


RESIDENCY_PATHS = (b"/api/ps", b"/api/v0/models", b"/props")
RICH_PATHS = (b"/api/v1/models", b"/models")
"""The richer lists of §17.1 and §17.2, asked before the plain one: 404 unless told."""


class Engines(Resource):
    """In-memory engines told apart by port: each answers ``answers[port]`` or holds the request.

    Residency reads (``/api/ps``, ``/api/v0/models``) are kept apart: answered with
    ``residency[port]`` (404 when absent; ``None`` holds them in ``residency_held``) and recorded in
    ``residency_seen``, so the model-list tests see only model-list reads.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, tuple[int, bytes]] = {}
        self.seen: list[tuple[int, bytes]] = []
        self.held: list[Request] = []
        self.residency: dict[int, tuple[int, bytes] | None] = {}
        self.residency_seen: list[tuple[int, bytes]] = []
        self.residency_held: list[Request] = []
        self.rich: dict[tuple[int, bytes], tuple[int, bytes]] = {}
        self.rich_seen: list[tuple[int, bytes]] = []

    def render_GET(self, request: Request) -> bytes | int:
        port = request.getHost().port
        if request.path in RICH_PATHS or (request.path == b"/props" and request.args):
            self.rich_seen.append((port, request.uri))
            status, body = self.rich.get((port, request.uri), (404, b'{"error": "not found"}'))
            request.setResponseCode(status)
            return body
        if request.path in RESIDENCY_PATHS:
            self.residency_seen.append((port, request.uri))
            answer = self.residency.get(port, (404, b'{"error": "not found"}'))
            if answer is None:
                self.residency_held.append(request)
                return NOT_DONE_YET
            request.setResponseCode(answer[0])
            return answer[1]
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


# --- residency (docs/behaviour.md §6.4): which models are loaded, polled with the inventory -------------------


def ps(*names: str) -> bytes:
    """An Ollama /api/ps body."""
    return json.dumps({"models": [{"name": n, "model": n, "size_vram": 1} for n in names]}).encode()


def v0_models(**states: str) -> bytes:
    """An LM Studio /api/v0/models body: id -> state."""
    data = [{"id": i, "object": "model", "state": s} for i, s in states.items()]
    return json.dumps({"object": "list", "data": data}).encode()


def test_ollama_residency_comes_from_api_ps() -> None:
    """Ollama: /api/ps names the loaded models; an advertised model not listed is known cold, and
    names match under Ollama's rule (llama3 is llama3:latest)."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("llama3:latest", "qwen:7b"))
    memory.engines.residency[1001] = (200, ps("llama3:latest"))
    memory.poll()
    assert memory.engines.residency_seen == [(1001, b"/api/ps")]
    assert memory.book.resident("a", "llama3") is True
    assert memory.book.resident("a", " llama3:latest ") is True
    assert memory.book.resident("a", "qwen:7b") is False
    assert memory.book.loaded("a") == frozenset({"llama3:latest"})
    memory.engines.residency[1001] = (200, ps())
    memory.poll()
    assert memory.book.resident("a", "llama3") is False
    assert memory.book.loaded("a") == frozenset()


def test_lmstudio_residency_reads_state_loaded_from_api_v0_models() -> None:
    """LM Studio: only /api/v0/models records with state "loaded" are resident; names are exact."""
    memory = InMemory([node("a", 1001)], engine=LMSTUDIO)
    memory.engines.answers[1001] = (200, json.dumps({"data": [{"id": "qwen"}]}).encode())
    memory.engines.residency[1001] = (200, v0_models(qwen="loaded", phi="not-loaded"))
    memory.poll()
    assert memory.engines.residency_seen == [(1001, b"/api/v0/models")]
    assert memory.book.resident("a", "qwen") is True
    assert memory.book.resident("a", "phi") is False
    assert memory.book.resident("a", "Qwen") is False
    assert memory.book.loaded("a") == frozenset({"qwen"})


def test_omlx_has_no_residency_endpoint_so_residency_is_unknown() -> None:
    """oMLX's profile has no residency endpoint: nothing is asked and residency stays unknown."""
    memory = InMemory([node("a", 1001)], engine=OMLX)
    memory.engines.answers[1001] = (200, json.dumps({"data": [{"id": "m"}]}).encode())
    memory.poll()
    assert memory.engines.residency_seen == []
    assert memory.book.models("a") == frozenset({"m"})
    assert memory.book.resident("a", "m") is None
    assert memory.book.loaded("a") is None


@pytest.mark.parametrize(
    "answer",
    [
        (404, b'{"error": "not found"}'),
        (500, ps("m")),
        (200, b"garbage"),
        (200, b'{"models": 3}'),
        (200, b"[]"),
    ],
    ids=["missing-endpoint", "server-error", "not-json", "wrong-shape", "not-an-object"],
)
def test_unusable_residency_answer_is_unknown_and_never_touches_the_inventory(
    answer: tuple[int, bytes],
) -> None:
    """A missing endpoint or a failed or malformed residency answer leaves residency unknown, and
    the inventory (models, known, last success) is exactly what its own poll said."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = answer
    memory.clock.advance(7)
    memory.poll()
    assert memory.book.resident("a", "m") is None
    assert memory.book.loaded("a") is None
    assert memory.book.models("a") == frozenset({"m"})
    assert memory.book.known("a") and memory.book.last_success("a") == 7
    assert memory.book.advertises("a", "m")


def test_a_failed_residency_poll_forgets_the_last_answer() -> None:
    """Residency is volatile: after a good answer, a failed one makes it unknown (not stale)."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = (200, ps("m"))
    memory.poll()
    assert memory.book.resident("a", "m") is True
    memory.engines.residency[1001] = (503, b"")
    memory.poll()
    assert memory.book.resident("a", "m") is None
    memory.engines.residency[1001] = (200, ps("m"))
    memory.poll()
    assert memory.book.resident("a", "m") is True


def test_residency_is_read_even_when_the_model_list_fails() -> None:
    """The two reads are independent: a failing model list does not stop residency from landing."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (500, b"")
    memory.engines.residency[1001] = (200, ps("m"))
    memory.poll()
    assert not memory.book.known("a")
    assert memory.book.resident("a", "m") is True


def test_never_answered_residency_is_unknown() -> None:
    """Before any residency answer (still waiting), residency is unknown, not "cold"."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = None
    done = memory.book.poll_now()
    memory.pump()
    assert memory.book.models("a") == frozenset({"m"})
    assert not done.called
    assert memory.book.resident("a", "m") is None
    assert memory.book.resident("nobody", "m") is None
    memory.book.stop()
    memory.pump()
    assert done.called


def test_a_stalled_residency_read_ends_at_the_same_timeout() -> None:
    """A residency endpoint that never answers is cut at the poll timeout; the model list, already
    in, is kept and residency stays unknown; no timer is left behind."""
    memory = InMemory([node("a", 1001)], timeout=3.0)
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = None
    done = memory.book.poll_now()
    memory.pump()
    memory.clock.advance(2.9)
    memory.pump()
    assert not done.called
    assert memory.book.models("a") == frozenset({"m"})
    memory.clock.advance(0.1)
    memory.pump()
    assert done.called
    assert memory.book.resident("a", "m") is None
    assert memory.book.models("a") == frozenset({"m"})
    assert memory.clock.getDelayedCalls() == []


def test_residency_answer_body_is_bounded_like_the_model_list() -> None:
    """The residency read goes through get_json with the same size cap: an oversized /api/ps is
    abandoned and residency stays unknown."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("m"))
    filler = "x" * 4096
    memory.engines.residency[1001] = (200, ps(*[f"m{i}{filler}" for i in range(2100)]))
    memory.poll()
    assert memory.book.resident("a", "m") is None
    assert memory.book.models("a") == frozenset({"m"})


def test_static_nodes_have_unknown_residency_and_are_never_asked() -> None:
    """A static node is not polled, for residency either."""
    memory = InMemory([node("s", 1001, ("m",))])
    memory.engines.residency[1001] = (200, ps("m"))
    memory.poll()
    assert memory.engines.residency_seen == []
    assert memory.book.resident("s", "m") is None


def test_removed_or_moved_nodes_forget_their_residency() -> None:
    """Residency follows the node: a removed node and a node at a new URL are unknown again."""
    memory = InMemory([])
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = (200, ps("m"))
    memory.engines.answers[1002] = (200, tags("m"))
    memory.engines.residency[1002] = None  # the new URL's residency has not answered yet
    memory.book.start()
    memory.directory.add_manual(node("a", 1001))
    memory.pump()
    assert memory.book.resident("a", "m") is True
    memory.directory.add_manual(node("a", 1002))
    memory.pump()
    assert memory.book.models("a") == frozenset({"m"})
    assert memory.book.resident("a", "m") is None
    memory.directory.add_manual(node("b", 1001))
    memory.pump()
    assert memory.book.resident("b", "m") is True
    memory.directory.remove_manual("b")
    assert memory.book.resident("b", "m") is None
    memory.engines.residency[1001] = None  # back at the same URL, not answered yet
    memory.directory.add_manual(node("b", 1001))
    memory.pump()
    assert memory.book.resident("b", "m") is None
    memory.book.stop()
    memory.pump()
    assert memory.clock.getDelayedCalls() == []


def test_stop_cancels_both_reads_quietly() -> None:
    """stop() with the model list and residency both in flight cancels both, fires the poll, logs
    nothing at warn or above and leaves no timer."""
    memory = InMemory([node("a", 1001)])
    memory.engines.residency[1001] = None
    events = Recorder()
    done = memory.book.poll_now()
    memory.pump()
    assert len(memory.engines.held) == len(memory.engines.residency_held) == 1
    globalLogPublisher.addObserver(events)
    try:
        memory.book.stop()
        memory.pump()
    finally:
        globalLogPublisher.removeObserver(events)
    assert done.called
    assert [e for e in events.events if e["log_level"] >= LogLevel.warn] == []
    assert memory.clock.getDelayedCalls() == []


def test_residency_is_polled_on_every_tick() -> None:
    """The timer polls residency with the model list: a model loaded later is seen next tick."""
    memory = InMemory([node("a", 1001)], interval=10.0, jitter=0.0)
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = (200, ps())
    memory.book.start()
    memory.pump()
    assert memory.book.resident("a", "m") is False
    memory.engines.residency[1001] = (200, ps("m"))
    memory.clock.advance(10)
    memory.pump()
    assert memory.book.resident("a", "m") is True
    assert len(memory.engines.residency_seen) == 2
    memory.book.stop()


def test_a_node_that_becomes_static_has_unknown_residency_at_once() -> None:
    """A polled node given a static models list stops being polled: its residency is unknown
    straight away, even on a book that was never started (no directory subscription)."""
    memory = InMemory([node("a", 1001)])
    memory.engines.answers[1001] = (200, tags("m"))
    memory.engines.residency[1001] = (200, ps("m"))
    memory.poll()
    assert memory.book.resident("a", "m") is True
    memory.directory.add_manual(Node("a", "http://127.0.0.1:1001", ("m",), "manual"))
    assert memory.book.resident("a", "m") is None
    assert memory.book.loaded("a") is None


# --- node kinds and the catalogue (docs/behaviour.md §11.1, §11.4) -------------------------------


def test_a_node_is_polled_and_matched_by_its_own_kind_behind_any_facade() -> None:
    """An LM Studio node behind the Ollama facade: its lists (§17.1: /api/v1/models, here
    missing, then /api/v0/models, which answers), exact names."""
    studio = Node("mac", "http://127.0.0.1:1001", kind="lmstudio")
    memory = InMemory([studio, node("box", 1002)])
    memory.engines.answers[1001] = (200, json.dumps({"data": [{"id": "Qwen-7B"}]}).encode())
    memory.engines.answers[1002] = (200, tags("qwen-7b"))
    loaded = {"data": [{"id": "Qwen-7B", "state": "loaded"}]}
    memory.engines.residency[1001] = (200, json.dumps(loaded).encode())
    memory.poll()
    assert sorted(memory.engines.seen) == [(1002, b"/api/tags")]
    assert memory.engines.rich_seen == [(1001, b"/api/v1/models")]
    assert sorted(memory.engines.residency_seen) == [(1001, b"/api/v0/models"), (1002, b"/api/ps")]
    assert memory.book.owners("Qwen-7B") == ["mac"]
    assert memory.book.owners("qwen-7b") == ["box"]
    assert memory.book.resident("mac", "Qwen-7B") is True
    assert memory.book.local_name("box", "qwen-7b:latest") == "qwen-7b"


def test_an_openai_node_names_match_exactly_and_it_has_no_residency() -> None:
    server = Node("cpp", "http://127.0.0.1:1001", kind="openai")
    memory = InMemory([server])
    memory.engines.answers[1001] = (200, json.dumps({"data": [{"id": "SmolLM2"}]}).encode())
    memory.poll()
    assert memory.engines.residency_seen == [(1001, b"/props")]
    assert memory.book.owners("SmolLM2") == ["cpp"] and memory.book.owners("smollm2") == []
    assert memory.book.resident("cpp", "SmolLM2") is None


def test_a_public_name_reaches_every_node_that_has_any_of_its_names(tmp_path: Any) -> None:
    """§11.4: each node answers with its own name for the model; the requested name wins."""
    path = tmp_path / "nodes.toml"
    path.write_text(
        '[[node]]\nid = "box"\nurl = "http://10.0.0.1:1"\nmodels = ["llama3.1:8b"]\n'
        '[[node]]\nid = "mac"\nurl = "http://10.0.0.2:1"\nkind = "lmstudio"\n'
        'models = ["meta-llama-3.1-8b-instruct"]\n'
        '[[node]]\nid = "other"\nurl = "http://10.0.0.3:1"\nmodels = ["qwen"]\n'
        '[[model]]\nname = "llama3.1:8b"\naliases = ["meta-llama-3.1-8b-instruct"]\n'
    )
    clock = Clock()
    directory = NodeDirectory(OLLAMA, clock, nodes_file=str(path))
    directory.start()
    book = InventoryBook(
        OLLAMA, directory, make_http_client(RequestTraversalAgent(Engines())), clock
    )
    assert book.owners("llama3.1:8b") == ["box", "mac"]
    assert book.owners("meta-llama-3.1-8b-instruct") == ["box", "mac"]
    assert book.local_name("mac", "llama3.1:8b") == "meta-llama-3.1-8b-instruct"
    assert book.local_name("box", "meta-llama-3.1-8b-instruct") == "llama3.1:8b"
    assert book.local_name("other", "llama3.1:8b") is None
    directory.stop()


def test_an_openai_node_that_reports_its_slots_gets_them_unless_it_sets_its_own() -> None:
    """§11.1: llama.cpp's ``/props`` ``total_slots`` stands in for an unset ``slots``; a server
    without ``/props`` (vLLM) keeps the default; a node's own ``slots`` is never overridden."""
    nodes = [
        Node("cpp", "http://127.0.0.1:1001", kind="openai"),
        Node("vllm", "http://127.0.0.1:1002", kind="openai"),
        Node("set", "http://127.0.0.1:1003", kind="openai", slots=2, models_max=1),
    ]
    memory = InMemory(nodes)
    for port in (1001, 1002, 1003):
        memory.engines.answers[port] = (200, json.dumps({"data": []}).encode())
    memory.engines.residency[1001] = (200, json.dumps({"total_slots": 4}).encode())
    memory.poll()
    assert (1003, b"/props") not in memory.engines.residency_seen
    limit = slot_limit(memory.directory.get, 1, memory.book.reported_slots)
    assert [limit(n) for n in ("cpp", "vllm", "set", "gone")] == [4, 1, 2, None]
    memory.engines.residency[1001] = (200, b'{"total_slots": "many"}')
    memory.poll()
    assert limit("cpp") == 1


def test_a_reloaded_catalogue_changes_the_answers_for_a_name_asked_before(tmp_path: Any) -> None:
    """§11.4: the name and residency matches follow a new catalogue at once, even for the very
    name the last request asked for (the book keeps each node's last answer only as long as what
    it came from)."""
    path = tmp_path / "nodes.toml"
    polled = '[[node]]\nid = "box"\nurl = "http://127.0.0.1:1001"\n'
    path.write_text(polled)
    clock = Clock()
    engines = Engines()
    engines.answers[1001] = (200, tags("llama3.1:8b"))
    engines.residency[1001] = (200, ps("llama3.1:8b"))
    agent = RequestTraversalAgent(engines)
    directory = NodeDirectory(OLLAMA, clock, nodes_file=str(path))
    directory.start()
    book = InventoryBook(OLLAMA, directory, make_http_client(agent), clock)
    done = book.poll_now()
    for _ in range(4):
        agent.flush()
    assert done.called
    assert book.local_name("box", "fancy") is None
    assert book.resident("box", "fancy") is False
    path.write_text(polled + '[[model]]\nname = "fancy"\naliases = ["llama3.1:8b"]\n')
    assert directory.reload_file()
    assert book.local_name("box", "fancy") == "llama3.1:8b"
    assert book.resident("box", "fancy") is True
    directory.stop()


def test_a_llamacpp_node_says_its_per_slot_context_for_whatever_it_serves() -> None:
    """§15.3: ``/props`` ``default_generation_settings.n_ctx`` is the context of one slot; it
    holds for any model the server is asked for, and a node that does not say is unknown."""
    nodes = [
        Node("cpp", "http://127.0.0.1:1001", kind="openai"),
        Node("vllm", "http://127.0.0.1:1002", kind="openai"),
    ]
    memory = InMemory(nodes)
    for port in (1001, 1002):
        memory.engines.answers[port] = (200, json.dumps({"data": []}).encode())
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    memory.engines.residency[1001] = (200, json.dumps(props).encode())
    memory.poll()
    assert memory.book.context_length("cpp", "any-model") == 4096
    assert memory.book.context_length("vllm", "any-model") is None
