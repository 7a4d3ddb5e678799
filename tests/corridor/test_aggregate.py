"""Tests for aggregate_model_list over in-memory engines on a Clock: order, de-dup, failures, headers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from attrs import evolve
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from nvpair_tw.core import ENGINES, ModelListFormat
from nvpair_tw.core._engines import OLLAMA, OPENAI_MODELS, PS, TAGS
from nvpair_tw.corridor._aggregate import (
    AggregateResult,
    Cooling,
    FirstSeen,
    aggregate_model_list,
)
from nvpair_tw.nodes import Catalogue
from nvpair_tw.nodes._catalogue import ModelNames
from nvpair_tw.nodes._directory import Node, NodeDirectory
from nvpair_tw.selection import InventoryBook, StallTracker
from nvpair_tw.testing import MemoryCluster

UNAVAILABLE = {"error": "model inventory unavailable", "code": "inventory-unavailable"}
DOWN = Node("down", "http://down.node.test:11434")  # nothing serves it: connection refused

Make = Callable[..., MemoryCluster]


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


class Fleet:
    """Fake engines in memory: ``node(id)`` is the node serving engine ``id``; ``run`` drives a fan-out."""

    def __init__(self, memory_cluster: Make, **engines: Resource) -> None:
        self.clock = Clock()
        self.cluster = memory_cluster(self.clock, engines, facades=())
        self.http = self.cluster.http

    def node(self, node_id: str) -> Node:
        return Node(node_id, self.cluster.url(node_id))

    def start(self, fan_out: Coroutine[Any, Any, AggregateResult]) -> Deferred[AggregateResult]:
        """Start a fan-out and deliver what is due now."""
        pending = Deferred.fromCoroutine(fan_out)
        self.cluster.flush()
        return pending

    def run(self, fan_out: Coroutine[Any, Any, AggregateResult]) -> AggregateResult:
        """A fan-out that needs no clock time: its result."""
        return finished(self.start(fan_out))


def finished(pending: Deferred[AggregateResult]) -> AggregateResult:
    """The result ``pending`` already has."""
    outcome: list[AggregateResult | Failure] = []
    pending.addBoth(outcome.append)
    [result] = outcome
    assert isinstance(result, AggregateResult), result
    return result


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


def test_tags_merge_in_candidate_order_skipping_down_and_garbage(memory_cluster: Make) -> None:
    """/api/tags merges the good nodes in the given order even when the first answers last."""
    release: Deferred[None] = Deferred()
    early = FakeEngine(tags({"name": "b:1", "model": "b:1"}, {"name": "c:1"}))
    fleet = Fleet(
        memory_cluster,
        late=FakeEngine(tags({"name": "a:1", "model": "a:1"}), hold=release),
        garbage=FakeEngine(b"<html>not json"),
        early=early,
    )
    nodes = [fleet.node("late"), DOWN, fleet.node("garbage"), fleet.node("early")]
    pending = fleet.start(
        aggregate_model_list(TAGS, nodes, "/api/tags?x=1", fleet.http, fleet.clock, timeout=5)
    )
    assert early.arrived.called and not pending.called
    release.callback(None)
    fleet.cluster.flush()
    result = finished(pending)
    assert result.status == 200
    assert decoded(result) == {
        "models": [
            {"name": "a:1", "model": "a:1"},
            {"name": "b:1", "model": "b:1"},
            {"name": "c:1"},
        ]
    }
    assert [uri for uri, _ in early.seen] == [b"/api/tags?x=1"]


def test_openai_models_merge_skipping_down_and_non_200(memory_cluster: Make) -> None:
    """/v1/models keeps the envelope and skips a down node and a 500."""
    fleet = Fleet(
        memory_cluster,
        a=FakeEngine(models("m1", "m2")),
        err=FakeEngine(models("x"), status=500),
        b=FakeEngine(models("m3")),
    )
    nodes = [fleet.node("a"), DOWN, fleet.node("err"), fleet.node("b")]
    result = fleet.run(
        aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", fleet.http, fleet.clock)
    )
    assert result.status == 200
    assert decoded(result)["object"] == "list"
    assert [r["id"] for r in decoded(result)["data"]] == ["m1", "m2", "m3"]


def test_duplicates_keep_the_first_record_verbatim(memory_cluster: Make) -> None:
    """Ollama keys are normalised (llama3 = llama3:latest); the earlier node's record wins."""
    first = {"name": "llama3:latest", "model": "llama3:latest", "size": 1}
    second = {"name": "llama3", "model": "llama3", "size": 2}
    fleet = Fleet(
        memory_cluster, a=FakeEngine(tags(first)), b=FakeEngine(tags(second, {"model": "qwen"}))
    )
    nodes = [fleet.node("a"), fleet.node("b")]
    result = fleet.run(aggregate_model_list(TAGS, nodes, "/api/tags", fleet.http, fleet.clock))
    assert decoded(result) == {"models": [first, {"model": "qwen"}]}


def test_openai_ids_compare_verbatim(memory_cluster: Make) -> None:
    """/v1/models de-duplicates by id exactly: M1 and m1 are two records, m1 twice is one."""
    fleet = Fleet(memory_cluster, a=FakeEngine(models("m1")), b=FakeEngine(models("M1", "m1")))
    nodes = [fleet.node("a"), fleet.node("b")]
    result = fleet.run(
        aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", fleet.http, fleet.clock)
    )
    assert [r["id"] for r in decoded(result)["data"]] == ["m1", "M1"]


def test_all_down_is_503_at_the_timeout(memory_cluster: Make) -> None:
    """No good answer (down, garbage, wrong shape, stalled past the timeout) gives the 503 JSON,
    exactly when the timeout expires on the clock."""
    fleet = Fleet(
        memory_cluster,
        garbage=FakeEngine(b"{"),
        shape=FakeEngine(b'{"data": []}'),
        slow=FakeEngine(None),
    )
    nodes = [DOWN, fleet.node("garbage"), fleet.node("shape"), fleet.node("slow")]
    pending = fleet.start(
        aggregate_model_list(TAGS, nodes, "/api/tags", fleet.http, fleet.clock, timeout=0.2)
    )
    fleet.cluster.advance(0.19)
    assert not pending.called
    fleet.cluster.advance(0.01)
    result = finished(pending)
    assert (result.status, decoded(result)) == (503, UNAVAILABLE)


def test_one_empty_good_answer_is_200(memory_cluster: Make) -> None:
    """A single good but empty list is a 200 with an empty envelope, not a 503."""
    fleet = Fleet(memory_cluster, empty=FakeEngine(models()))
    nodes = [DOWN, fleet.node("empty")]
    result = fleet.run(
        aggregate_model_list(OPENAI_MODELS, nodes, "/v1/models", fleet.http, fleet.clock)
    )
    assert (result.status, decoded(result)) == (200, {"object": "list", "data": []})


def test_no_node_is_503(memory_cluster: Make) -> None:
    """An empty node list has no good answer."""
    fleet = Fleet(memory_cluster)
    result = fleet.run(aggregate_model_list(TAGS, [], "/api/tags", fleet.http, fleet.clock))
    assert result.status == 503


def test_fan_out_never_sends_authorization_or_cookie(memory_cluster: Make) -> None:
    """Even after an engine sets a cookie, the next fan-out sends no Cookie and no Authorization."""
    engine = FakeEngine(models("m"), set_cookie=True)
    fleet = Fleet(memory_cluster, a=engine)
    for _ in range(2):
        fleet.run(
            aggregate_model_list(
                OPENAI_MODELS, [fleet.node("a")], "/v1/models", fleet.http, fleet.clock
            )
        )
    assert len(engine.seen) == 2
    for _, headers in engine.seen:
        assert not headers.hasHeader(b"authorization")
        assert not headers.hasHeader(b"cookie")


def test_cancelling_the_fan_out_leaves_no_timer(memory_cluster: Make) -> None:
    """A caller going away cancels every node's read and its 30 s timer."""
    slow = FakeEngine(None)
    fleet = Fleet(memory_cluster, slow=slow)
    pending = fleet.start(
        aggregate_model_list(
            TAGS, [fleet.node("slow")], "/api/tags", fleet.http, fleet.clock, timeout=30
        )
    )
    assert slow.arrived.called and fleet.clock.getDelayedCalls()
    pending.cancel()
    failures: list[Failure] = []
    pending.addErrback(failures.append)
    assert [f.type for f in failures] == [CancelledError]
    fleet.cluster.flush()
    assert fleet.clock.getDelayedCalls() == [] and fleet.cluster.network.open == 0


def test_a_public_name_is_listed_once_under_each_kinds_rule(memory_cluster: Make) -> None:
    """§11.4 on /v1/models (ids verbatim): an Ollama node's ``llama3:latest`` is the public
    ``llama3`` under the Ollama rule, as an openai node's alias is; one record, the public name."""
    fleet = Fleet(
        memory_cluster,
        l=FakeEngine(models("meta-llama-3-8b")),
        o=FakeEngine(models("llama3:latest", "qwen:latest")),
    )
    nodes = [
        evolve(fleet.node("l"), kind="openai"),
        evolve(fleet.node("o"), kind="ollama"),
    ]
    catalogue = Catalogue.of((ModelNames("llama3", ("meta-llama-3-8b",)),))
    for order in (nodes, nodes[::-1]):
        result = fleet.run(
            aggregate_model_list(
                OPENAI_MODELS,
                order,
                "/v1/models",
                fleet.http,
                fleet.clock,
                facade=ENGINES["openai"],
                catalogue=catalogue,
            )
        )
        assert sorted(r["id"] for r in decoded(result)["data"]) == ["llama3", "qwen:latest"]


def test_an_ollama_record_is_preferred_to_a_synthesised_one_whatever_the_order(
    memory_cluster: Make,
) -> None:
    """docs/behaviour.md §17.6: the Ollama node's own record wins over the one synthesised from an
    openai node's /v1/models, at the place the model first appeared; the synthesised digest is
    the same whichever order the nodes come in."""
    own = {"name": "smollm2:latest", "model": "smollm2:latest", "digest": "e" * 64, "size": 9}
    fleet = Fleet(
        memory_cluster,
        o=FakeEngine(tags(own)),
        b=FakeEngine(models("smollm2", "other")),
    )
    nodes = [evolve(fleet.node("b"), kind="openai"), evolve(fleet.node("o"), kind="ollama")]
    seen = FirstSeen()
    listed = []
    for order in (nodes, nodes[::-1]):
        result = fleet.run(
            aggregate_model_list(
                TAGS,
                order,
                "/api/tags",
                fleet.http,
                fleet.clock,
                facade=ENGINES["ollama"],
                first_seen=seen,
            )
        )
        listed.append({r["name"]: r for r in decoded(result)["models"]})
        fleet.clock.advance(60)
    for records in listed:
        assert records["smollm2:latest"] == own
        assert records["other"]["digest"] == hashlib.sha256(b"other:latest").hexdigest()
    first, second = listed
    assert first["other"] == second["other"]  # modified_at: when it was first seen
    assert first["other"]["modified_at"] == "1970-01-01T00:00:00Z"


# --- a frozen node is paid for once (docs/behaviour.md §4.3) ---------------------------------------


class Remembering:
    """A fleet's nodes with the facade's books: an inventory (polled from the fakes) and a stall
    tracker, for a list that does not wait on a cooling node."""

    def __init__(self, fleet: Fleet, *ids: str, deadline: float = 2.0) -> None:
        self.fleet = fleet
        self.nodes = [fleet.node(i) for i in ids]
        directory = NodeDirectory(OLLAMA, fleet.clock, flag_nodes=self.nodes)
        self.inventory = InventoryBook(OLLAMA, directory, fleet.http, fleet.clock)
        self.stalls = StallTracker(fleet.clock, 60.0)
        self.cooling = Cooling(self.inventory, self.stalls, deadline)

    def poll(self) -> None:
        polled = self.inventory.poll_now()
        self.fleet.cluster.flush()
        assert polled.called

    def start(self, fmt: ModelListFormat = TAGS) -> Deferred[AggregateResult]:
        return self.fleet.start(
            aggregate_model_list(
                fmt,
                self.nodes,
                fmt.path,
                self.fleet.http,
                self.fleet.clock,
                facade=OLLAMA,
                cooling=self.cooling,
            )
        )

    def run(self, fmt: ModelListFormat = TAGS) -> AggregateResult:
        return finished(self.start(fmt))


MakeBooks = Callable[..., Remembering]


@pytest.fixture
def remembering(memory_cluster: Make) -> Iterator[MakeBooks]:
    """Makes :class:`Remembering` books over a fleet of ``engines``; their cooldowns are ended
    after the test (before the memory cluster's leftover-timer check)."""
    made: list[Remembering] = []

    def make(engines: dict[str, Resource], deadline: float = 2.0) -> Remembering:
        books = Remembering(Fleet(memory_cluster, **engines), *engines, deadline=deadline)
        made.append(books)
        return books

    yield make
    for books in made:
        books.stalls.stop()


OWN_A = {"name": "a:1", "model": "a:1", "digest": "a" * 64, "size": 5, "details": {}}
OWN_B = {"name": "b:1", "model": "b:1", "digest": "b" * 64, "size": 6, "details": {}}


def test_a_cooling_node_is_not_asked_and_its_last_answer_is_listed_as_stale(
    remembering: MakeBooks,
) -> None:
    """A node cooling after a stall is not waited on: its part of /api/tags is its last good answer,
    records verbatim, and it is named stale; the other node is asked as always."""
    a, b = FakeEngine(tags(OWN_A)), FakeEngine(tags(OWN_B))
    books = remembering({"a": a, "b": b})
    assert books.run().stale == ()  # both asked; their answers kept
    a.body = None  # frozen from now on
    books.stalls.cool("a", "no response headers within 2s")
    asked = len(a.seen)
    result = books.run()  # no clock time passes: nothing waits
    assert (result.status, result.stale) == (200, ("a",))
    assert decoded(result) == {"models": [OWN_A, OWN_B]}
    assert len(a.seen) == asked and len(b.seen) == 2


def test_a_node_that_gives_no_list_within_the_deadline_is_cooled_and_paid_once(
    remembering: MakeBooks,
) -> None:
    """A frozen node not yet cooling costs one list the response-header deadline (shorter than the
    list's own bound): it is then cooled, listed from its last poll, named stale; the next list
    does not ask it at all."""
    a, b = FakeEngine(tags(OWN_A)), FakeEngine(tags(OWN_B))
    books = remembering({"a": a, "b": b}, deadline=2.0)
    books.poll()  # the poll's /api/tags answers are kept
    a.body = None
    pending = books.start()
    books.fleet.cluster.advance(1.999)
    assert not pending.called
    books.fleet.cluster.advance(0.001)
    result = finished(pending)
    assert (result.stale, decoded(result)) == (("a",), {"models": [OWN_A, OWN_B]})
    cooled = books.stalls.cooldown("a")
    assert cooled is not None and cooled.reason == "no model list within 2s"
    asked = len(a.seen)
    assert books.run().stale == ("a",) and len(a.seen) == asked


def test_a_cooling_node_without_a_kept_answer_is_listed_from_its_inventory(
    remembering: MakeBooks,
) -> None:
    """With no answer of its own to /v1/models kept, a cooling node's part is made from its last
    inventory, with the fields an OpenAI client reads (§17.6); /api/ps uses its last residency
    answer, each record tagged with the node."""
    a, b = FakeEngine(tags(OWN_A)), FakeEngine(tags(OWN_B))
    books = remembering({"a": a, "b": b})
    books.poll()
    books.stalls.cool("a", "stall")
    result = books.run(OPENAI_MODELS)
    assert result.stale == ("a",)
    assert decoded(result)["data"] == [
        {"id": "a:1", "object": "model", "created": 0, "owned_by": "ollama"},
    ]  # b's fake answers its tags to /v1/models: no data list, skipped
    ps = decoded(books.run(PS))["models"]
    assert [(r["name"], r["nvpair_node"]) for r in ps] == [("a:1", "a"), ("b:1", "b")]
    assert ps[0] == {**OWN_A, "nvpair_node": "a"}


def test_every_node_cooling_and_never_seen_is_503_at_once_naming_them(
    remembering: MakeBooks,
) -> None:
    """Nothing known of any node and every one cooling: 503 inventory-unavailable without a wait,
    every node named stale."""
    books = remembering({"a": FakeEngine(None)})
    books.stalls.cool("a", "stall")
    result = books.run()
    assert (result.status, decoded(result), result.stale) == (503, UNAVAILABLE, ("a",))
