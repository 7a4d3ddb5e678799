"""The status board (nvpair_tw.ops._board and the modules it reads): each request's verdict and
their counts, the requests in flight as their phase events say, the recent requests, each node's
time to first token and state in precedence, the fan-outs' progress, the version and the address
clients use; every part bounded, no userinfo anywhere."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from attrs import evolve
from twisted.internet.defer import CancelledError
from twisted.internet.testing import MemoryReactorClock

from nvpair_tw._version import __version__
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import (
    Attempt,
    AttemptOutcome,
    Choice,
    FanOutProgress,
    PartProgress,
    PartState,
    Phase,
    ProxyRequest,
    RequestPhase,
    StatusOutcome,
)
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops import _board, _recent
from nvpair_tw.ops._board import FAN_OUTS_ENDED, FAN_OUTS_RUNNING, FanOuts, StatusBoard
from nvpair_tw.ops._nodestate import NodeState, node_state
from nvpair_tw.ops._recent import RECENT, Contact, LastContact, RequestBook
from nvpair_tw.ops._tally import Tally, Verdict, verdict_of
from nvpair_tw.runtime._process import Runtime, build_runtime
from nvpair_tw.selection._admission import Slot, Waiter
from tests.helpers import proxy_request

NOW = 1_700_000_000.0
SECRET = "pa55-userinfo"


def _runtime(nodes: list[Node]) -> tuple[MemoryReactorClock, Runtime]:
    clock = MemoryReactorClock()
    clock.advance(NOW)
    runtime = build_runtime(
        cast(IProxyReactor, clock), Settings(), ["ollama"], nodes={"ollama": nodes}
    )
    return clock, runtime


def _record(status: int | None, **fields: Any) -> ProxyRequest:
    return proxy_request(
        id="r-1", engine="ollama", method="POST", path="/api/chat", status=status, **fields
    )


def _phase(request_id: str, phase: Phase, node: str | None = None, since: int = 0) -> RequestPhase:
    return RequestPhase(
        request_id, "ollama", phase, since, "POST", "/api/chat", node, "llama3", "alice"
    )


# -- verdicts and counts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "verdict"),
    [
        (200, None, Verdict.ANSWERED),
        (204, None, Verdict.ANSWERED),
        (200, "upstream dropped mid-stream", Verdict.FAILED),
        (200, "partial", Verdict.FAILED),
        (400, "bad-body", Verdict.REFUSED),
        (401, "unauthorized", Verdict.REFUSED),
        (404, "model-not-found", Verdict.REFUSED),
        (429, "rate-limited", Verdict.REFUSED),
        (499, "client disconnected", Verdict.CANCELLED),
        (500, "internal-error", Verdict.FAILED),
        (502, "upstream-error", Verdict.FAILED),
        (503, "queue-full", Verdict.FAILED),
        (None, None, Verdict.FAILED),
    ],
)
def test_each_record_has_the_verdict_the_page_documents(
    status: int | None, error: str | None, verdict: Verdict
) -> None:
    """Below 400 without an error: answered; a 4xx but 499: refused; 499: cancelled; a 5xx, no
    status, or a 2xx whose record carries an error (cut mid-way, a partial fan-out): failed."""
    assert verdict_of(_record(status, error=error)) is verdict


def test_a_tally_lists_values_by_name_the_unnamed_last_and_sums_the_overflow() -> None:
    """Rows by name (case-blind), the ``None`` row after them, each with ``requests`` and a count
    per verdict; past its limit new values are summed in one ``others`` row."""
    tally = Tally("model", limit=3)
    for value, verdict in [
        ("qwen", Verdict.FAILED),
        (None, Verdict.REFUSED),
        ("Llama3", Verdict.ANSWERED),
        ("qwen", Verdict.ANSWERED),
        ("mistral", Verdict.CANCELLED),
        ("phi", Verdict.FAILED),
    ]:
        tally.add(value, verdict)
    counts = [
        (r["model"], r["requests"], r["answered"], r["refused"], r["failed"], r["cancelled"])
        for r in tally.to_json()
    ]
    assert counts == [
        ("Llama3", 1, 1, 0, 0, 0),
        ("qwen", 2, 1, 0, 1, 0),
        (None, 1, 0, 1, 0, 0),
        (None, 2, 0, 0, 1, 1),
    ]
    assert tally.to_json()[-1]["others"] is True and "others" not in tally.to_json()[0]


# -- the requests -------------------------------------------------------------------------------


def test_a_request_is_in_flight_in_its_last_published_phase_until_its_record() -> None:
    """Each phase event replaces the request's last; its record ends it, and is counted by key and
    by the model its phase events named when the record names none (it failed before an answer)."""
    book = RequestBook()
    book.phase(_phase("r-1", Phase.QUEUED, since=1000))
    book.phase(_phase("r-1", Phase.WAITING_HEADERS, "a", since=2000))
    book.phase(_phase("r-2", Phase.STREAMING, "b", since=3000))
    shown = book.to_json()["inFlight"]
    assert [(p["id"], p["phase"], p["node_id"]) for p in shown] == [
        ("r-1", "waiting-headers", "a"),
        ("r-2", "streaming", "b"),
    ]
    attempts = (Attempt("a", StatusOutcome(503), 12),)
    book.record(_record(502, error="upstream-error", key="alice", attempts=attempts), NOW)
    state = book.to_json()
    assert [p["id"] for p in state["inFlight"]] == ["r-2"]
    assert state["byModel"] == [
        {"model": "llama3", "requests": 1, "answered": 0, "refused": 0, "failed": 1, "cancelled": 0}
    ]
    assert state["byKey"][0]["key"] == "alice" and state["byKey"][0]["failed"] == 1
    [row] = state["recent"]
    assert (row["status"], row["verdict"], row["node"], row["error"]) == (
        502,
        "failed",
        "a",
        "upstream-error",
    )


def test_requests_in_flight_and_recent_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its bound the oldest request in flight is dropped (should a record never come);
    the recent panel keeps the last ``RECENT`` records, newest first."""
    monkeypatch.setattr(_recent, "MAX_IN_FLIGHT", 3)
    book = RequestBook()
    for i in range(5):
        book.phase(_phase(f"r-{i}", Phase.RECEIVED))
    assert [p["id"] for p in book.to_json()["inFlight"]] == ["r-2", "r-3", "r-4"]
    for i in range(RECENT + 7):
        book.record(evolve(_record(200), id=f"q-{i}"), NOW + i)
    recent = book.to_json()["recent"]
    assert len(recent) == RECENT and recent[0]["id"] == f"q-{RECENT + 6}"


def test_a_recent_row_says_why_that_node_and_its_times_and_never_a_body() -> None:
    """An answered record's row: status, node, why (its ``chosen_by``), time to first token and
    rate; a 503 the node answered has no time to a first token; the node's median counts the
    answers only."""
    book = RequestBook()
    answered = _record(
        200,
        node_id="a",
        chosen_by=Choice.AFFINITY,
        ttft_ms=120,
        tokens_per_s=41.5,
        model="llama3",
        attempts=(Attempt("a", AttemptOutcome.COMMITTED, 300),),
    )
    for ttft in (120, 80, 400):
        book.record(evolve(answered, ttft_ms=ttft), NOW)
    book.record(evolve(answered, status=503, ttft_ms=5), NOW)
    sick, fast, *_ = book.to_json()["recent"]
    assert (fast["chosenBy"], fast["ttftMs"], fast["tokensPerS"]) == ("affinity", 400, 41.5)
    assert sick["ttftMs"] is None
    assert book.ttft("ollama", "a") == {"medianMs": 120, "lastMs": 400, "samples": 3}
    assert book.ttft("ollama", "b") is None


def test_a_nodes_prompt_cache_is_what_its_engine_said_of_its_last_answers() -> None:
    """docs/operations.md, "The status page": per node, over its last answers, the prompt tokens
    of those whose engine said what it found cached, the cached ones among them, and how many
    answers went to the node expected to hold the prefix; an engine that says nothing is not
    counted as 0 cached, a 503 is no answer, and the window is bounded."""
    book = RequestBook()
    warm = _record(
        200,
        node_id="a",
        model="llama3",
        prompt_tokens=48,
        cached_tokens=47,
        cache_affinity=True,
        warm_node="a",
    )
    cold = evolve(warm, cached_tokens=0, cache_affinity=False, warm_node=None)
    silent = evolve(warm, node_id="b", cached_tokens=None, cache_affinity=False)
    for record in (cold, warm, warm, silent, evolve(warm, status=503)):
        book.record(record, NOW)
    assert book.cache("ollama", "a") == {
        "answers": 3,
        "stated": 3,
        "promptTokens": 144,
        "cachedTokens": 94,
        "expectedWarm": 2,
    }
    assert book.cache("ollama", "b") == {
        "answers": 1,
        "stated": 0,
        "promptTokens": 0,
        "cachedTokens": 0,
        "expectedWarm": 0,
    }
    assert book.cache("ollama", "c") is None
    row = book.to_json()["recent"][2]
    assert (row["promptTokens"], row["cachedTokens"], row["expectedWarm"]) == (48, 47, True)
    for _ in range(_recent.CACHE_SAMPLES + 5):
        book.record(warm, NOW)
    assert book.cache("ollama", "a")["answers"] == _recent.CACHE_SAMPLES  # type: ignore[index]
    book.forget({("ollama", "b")})
    assert book.cache("ollama", "a") is None


def test_a_nodes_contact_comes_from_attempts_answered_phases_and_running_fan_out_parts() -> None:
    """A connect error makes the node's last contact "no connection" since the first one in a
    row; a phase saying it answered (reading the prompt), a running fan-out part or any other
    attempt outcome makes it "connected"; a cancelled attempt tells nothing."""
    book = RequestBook()
    refused = (Attempt("a", AttemptOutcome.CONNECT_ERROR, 1),)
    book.record(_record(502, attempts=refused), NOW)
    book.record(_record(502, attempts=refused), NOW + 5)
    assert book.contact("ollama", "a") == LastContact(Contact.NO_CONNECTION, NOW)
    book.record(_record(499, attempts=(Attempt("a", AttemptOutcome.CANCELLED, 1),)), NOW + 6)
    assert book.contact("ollama", "a") == LastContact(Contact.NO_CONNECTION, NOW)
    book.phase(_phase("r-3", Phase.READING_PROMPT, "a", since=int((NOW + 7) * 1000)))
    assert book.contact("ollama", "a") == LastContact(Contact.CONNECTED, NOW + 7)
    book.phase(_phase("r-4", Phase.WAITING_HEADERS, "b"))
    assert book.contact("ollama", "b") is None  # sent is not answered
    running = PartProgress("b", PartState.RUNNING, 10, 100)
    book.fan_out(FanOutProgress("f", "ollama", "/api/pull", None, 0, (running,)), NOW + 8)
    assert book.contact("ollama", "b") == LastContact(Contact.CONNECTED, NOW + 8)
    book.forget({("ollama", "b")})
    assert book.contact("ollama", "a") is None


# -- a node's state -----------------------------------------------------------------------------


def _state(runtime: Runtime, node_id: str, contact: LastContact | None = None) -> dict[str, Any]:
    facade = runtime.facades["ollama"]
    node = facade.directory.get(node_id)
    assert node is not None
    return node_state(facade, node, contact).to_json()


def test_a_node_never_reached_is_never_ready() -> None:
    """A polled node before its first poll ends: unknown, waiting for it; a static list with no
    contact: unknown, not heard from; then ready once a request reached it; unreachable when its
    last request could not connect, since the first such request."""
    _, runtime = _runtime(
        [Node("polled", "http://127.0.0.1:1"), Node("static", "http://127.0.0.1:2", ("m",))]
    )
    polled = _state(runtime, "polled")
    assert (polled["state"], polled["why"]) == ("unknown", "waiting for its first poll")
    static = _state(runtime, "static")
    assert static["state"] == "unknown" and static["why"].startswith("not heard from yet")
    assert _state(runtime, "static", LastContact(Contact.CONNECTED, NOW))["state"] == "ready"
    refused = _state(runtime, "static", LastContact(Contact.NO_CONNECTION, NOW - 30))
    assert refused == {
        "state": "unreachable",
        "why": "could not connect on its last request",
        "since": int((NOW - 30) * 1000),
        "until": None,
        "url": "http://127.0.0.1:2",
    }


def test_a_nodes_state_is_the_first_of_unreachable_cooling_cordoned_busy_in_that_order() -> None:
    """One node made unreachable, cooling, cordoned and busy at once shows unreachable (the
    poll's error, its URL without userinfo, since when); taking each away shows the next."""
    _, runtime = _runtime([Node("a", f"http://ops:{SECRET}@127.0.0.1:1", slots=1)])
    facade = runtime.facades["ollama"]
    node = facade.directory.get("a")
    assert node is not None
    holding = facade.admission.admit([node])
    waiting = facade.admission.admit([node])
    assert isinstance(holding, Slot) and isinstance(waiting, Waiter)
    waiting.bound.addErrback(lambda f: f.trap(CancelledError))
    facade.inventory.reach.failed(node, "connection refused", NOW - 5, None)
    facade.stalls.cool("a", "no response headers within 4s")
    facade.cordons.cordon("a", "driver upgrade")
    shown = _state(runtime, "a")
    assert shown == {
        "state": "unreachable",
        "why": "connection refused",
        "since": int((NOW - 5) * 1000),
        "until": None,
        "url": "http://127.0.0.1:1",
    }
    facade.inventory.reach.answered(node, NOW, 1)
    cooling = _state(runtime, "a")
    assert (cooling["state"], cooling["why"]) == ("cooling", "no response headers within 4s")
    assert cooling["until"] is not None and cooling["until"] > NOW * 1000
    facade.stalls.clear("a")
    assert (_state(runtime, "a")["state"], _state(runtime, "a")["why"]) == (
        "cordoned",
        "driver upgrade",
    )
    facade.cordons.uncordon("a")
    busy = _state(runtime, "a")
    assert (busy["state"], busy["why"]) == ("busy", "1 of 1 slots taken, 1 waiting for it")
    waiting.bound.cancel()
    assert _state(runtime, "a")["why"] == "1 of 1 slots taken"
    holding.release()
    assert _state(runtime, "a") == {
        "state": "ready",
        "why": None,
        "since": None,
        "until": None,
        "url": "http://127.0.0.1:1",
    }
    assert [s.value for s in NodeState] == [
        "unreachable",
        "cooling",
        "cordoned",
        "busy",
        "unknown",
        "ready",
    ]


# -- fan-outs and the snapshot ------------------------------------------------------------------


def _progress(fan_out: str, *states: PartState) -> FanOutProgress:
    parts = tuple(PartProgress(f"n{i}", s, 5, 10) for i, s in enumerate(states))
    return FanOutProgress(fan_out, "ollama", "/api/pull", "llama3", 0, parts)


def test_fan_outs_show_the_running_newest_first_then_the_last_ended() -> None:
    """The running fan-outs (at most ``FAN_OUTS_RUNNING``, the oldest dropped), then the last
    ``FAN_OUTS_ENDED`` that ended, each its latest progress with ``ended``."""
    fan_outs = FanOuts()
    for i in range(FAN_OUTS_RUNNING + 2):
        fan_outs.progress(_progress(f"f-{i}", PartState.RUNNING))
    for i in range(FAN_OUTS_ENDED + 1):
        fan_outs.progress(_progress(f"f-{i + 2}", PartState.SUCCEEDED, PartState.FAILED))
    shown = fan_outs.to_json()
    running = [f["id"] for f in shown if not f["ended"]]
    ended = [f["id"] for f in shown if f["ended"]]
    assert running == [f"f-{i}" for i in range(FAN_OUTS_RUNNING + 1, FAN_OUTS_ENDED + 2, -1)]
    assert ended == [f"f-{i}" for i in range(FAN_OUTS_ENDED + 2, 2, -1)]
    assert shown[0]["nodes"][0] == {
        "node_id": "n0",
        "state": "running",
        "completed": 5,
        "total": 10,
        "error": None,
    }


def test_the_snapshot_names_the_version_and_where_clients_point_and_no_userinfo() -> None:
    """/api/state: the version, each facade's client URL and its /v1 (once it listens), each
    node's state, reachability and time to first token, the requests and the fan-outs; a node's
    userinfo appears nowhere."""
    _, runtime = _runtime([Node("a", f"http://ops:{SECRET}@127.0.0.1:1")])
    board = StatusBoard(runtime)
    before = board.state(lambda _engine: True)
    assert before["version"] == __version__.public()
    assert before["facades"][0]["address"] is None
    runtime.facade_urls["ollama"] = "http://127.0.0.1:11435"
    facade = runtime.facades["ollama"]
    node = facade.directory.get("a")
    assert node is not None
    facade.inventory.reach.failed(node, "connection refused", NOW, None)
    runtime.shared.bus.publish(_phase("r-1", Phase.STREAMING, "a"))
    runtime.shared.bus.publish(_progress("f-1", PartState.RUNNING))
    state = board.state(lambda _engine: True)
    [ollama] = state["facades"]
    assert ollama["address"] == {
        "url": "http://127.0.0.1:11435",
        "openai": "http://127.0.0.1:11435/v1",
    }
    [a] = ollama["nodes"]
    assert a["state"]["state"] == "unreachable"
    assert a["reach"] == {
        "state": "unreachable",
        "url": "http://127.0.0.1:1",
        "since": int(NOW * 1000),
        "error": "connection refused",
    }
    assert a["ttft"] is None and a["cache"] is None and a["waiting"] == 0
    assert [p["id"] for p in state["requests"]["inFlight"]] == ["r-1"]
    assert [f["id"] for f in state["fanOuts"]] == ["f-1"]
    assert SECRET not in json.dumps(state) and "ops:" not in json.dumps(state)
    board.close()
    runtime.shared.bus.publish(_record(200))
    assert board.state(lambda _engine: True)["requests"]["recent"] == []
    assert _board.RECENT_FAILOVERS == 20
