"""The simulated engine: each behaviour, its policies and its timers, driven in memory on a Clock.

Requests go straight to the engine (``MemoryCluster.request(..., node=...)``, no facade), so "later"
is ``cluster.advance`` rather than a sleep and nothing listens.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.defer import CancelledError
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseNeverReceived

from nvpair_tw.dialects import route_missing
from nvpair_tw.simulated._engine import (
    Behaviour,
    Policy,
    SimulatedEngine,
    alternate,
    always,
    once,
    reply_frames,
    stream_kind,
)
from nvpair_tw.testing import MemoryCluster, MemoryResponse

CHAT = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode()
DONE = b'{"done": true, "done_reason": "stop"}\n'

Make = Callable[..., MemoryCluster]


def serve(memory_cluster: Make, behaviour: Behaviour | Policy, **kw: Any) -> MemoryCluster:
    """A cluster with one simulated engine ``e`` (no facade) on a fresh clock."""
    clock = Clock()
    policy = always(behaviour) if isinstance(behaviour, Behaviour) else behaviour
    engine = SimulatedEngine(clock, policy=policy, **kw)
    return memory_cluster(clock, {"e": engine}, facades=())


def engine_of(cluster: MemoryCluster) -> SimulatedEngine:
    engine = cluster.engines["e"]
    assert isinstance(engine, SimulatedEngine)
    return engine


def post(cluster: MemoryCluster, path: str = "/api/chat", body: bytes = CHAT) -> MemoryResponse:
    """POST straight to the engine; the response once its headers are in (body maybe not)."""
    return cluster.result(cluster.request("POST", path, data=body, node="e"))


def ndjson(engine: SimulatedEngine, count: int) -> bytes:
    """The first ``count`` streamed /api/chat frames of ``engine``."""
    return b"".join(
        json.dumps(
            {"message": {"role": "assistant", "content": f"{engine.reply_text}{i}"}, "done": False}
        ).encode()
        + b"\n"
        for i in range(count)
    )


def test_healthy_streams_every_frame_then_done(memory_cluster: Make) -> None:
    """HEALTHY streams ``chunks`` NDJSON frames and a done frame, then ends cleanly."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY, chunks=2)
    response = post(cluster)
    assert response.status == 200
    assert response.header("content-type") == "application/x-ndjson"
    assert response.body == ndjson(engine_of(cluster), 2) + DONE
    assert response.complete


def test_frozen_never_sends_headers(memory_cluster: Make) -> None:
    """FROZEN reads the request and never answers, however long the clock runs."""
    cluster = serve(memory_cluster, Behaviour.FROZEN)
    pending = cluster.request("POST", "/api/chat", data=CHAT, node="e")
    cluster.advance(24 * 3600)
    assert [r.body for r in engine_of(cluster).received] == [CHAT]
    assert not pending.called
    pending.cancel()
    failures: list[Failure] = []
    pending.addErrback(failures.append)
    assert failures[0].check(CancelledError, ResponseNeverReceived)


def test_headers_only_sends_headers_and_no_body(memory_cluster: Make) -> None:
    """HEADERS_ONLY sends a 200 with headers, then nothing until the engine is stopped."""
    cluster = serve(memory_cluster, Behaviour.HEADERS_ONLY)
    response = post(cluster)
    assert response.status == 200
    cluster.advance(3600)
    assert response.body == b"" and response.ended is None
    engine_of(cluster).stop()
    cluster.flush()
    assert response.body == b"" and response.truncated


def test_drop_after_headers_closes_before_any_body_byte(memory_cluster: Make) -> None:
    """DROP_AFTER_HEADERS sends headers, then hangs up: an empty, truncated body."""
    cluster = serve(memory_cluster, Behaviour.DROP_AFTER_HEADERS)
    response = post(cluster)
    assert response.status == 200
    assert response.body == b"" and response.truncated


def test_drop_mid_stream_sends_half_the_frames_then_resets(memory_cluster: Make) -> None:
    """DROP_MID_STREAM sends the first half of the frames, then the body fails."""
    cluster = serve(memory_cluster, Behaviour.DROP_MID_STREAM, chunks=5)
    response = post(cluster)
    assert response.body == ndjson(engine_of(cluster), 3)  # 6 frames with the done frame
    assert response.truncated


@pytest.mark.parametrize(
    "behaviour", [Behaviour.STATUS_503, Behaviour.STATUS_404, Behaviour.STATUS_400]
)
def test_status_behaviours_answer_that_status_in_json(
    memory_cluster: Make, behaviour: Behaviour
) -> None:
    """STATUS_<code> answers <code> with a JSON error naming it."""
    code = int(behaviour.value.rsplit("-", 1)[1])
    response = post(serve(memory_cluster, behaviour))
    assert response.status == code
    assert response.json() == {"error": f"simulated {code}"}
    assert response.complete


def test_no_route_answers_as_a_fastapi_server_without_the_route(memory_cluster: Make) -> None:
    """NO_ROUTE answers 404 ``{"detail": "Not Found"}``, as vLLM and LocalAI answer a route their
    build lacks, which the proxy reads as a missing route (docs/behaviour.md §17.3)."""
    response = post(serve(memory_cluster, Behaviour.NO_ROUTE))
    assert response.status == 404 and response.complete
    assert response.json() == {"detail": "Not Found"}
    assert route_missing(response.body)


def test_empty_200_has_content_length_zero(memory_cluster: Make) -> None:
    """EMPTY_200 answers 200 with ``Content-Length: 0`` and ends cleanly."""
    response = post(serve(memory_cluster, Behaviour.EMPTY_200))
    assert response.status == 200 and response.length == 0
    assert response.body == b"" and response.complete


def test_slow_body_sends_the_body_after_body_delay(memory_cluster: Make) -> None:
    """SLOW_BODY sends headers at once and the body when ``body_delay`` has passed on its clock."""
    cluster = serve(memory_cluster, Behaviour.SLOW_BODY, body_delay=5.0, chunks=1)
    response = post(cluster)
    assert response.status == 200 and response.headers_at == 0.0
    cluster.advance(4.5)
    assert response.body == b"" and response.ended is None
    cluster.advance(0.5)
    assert response.body == ndjson(engine_of(cluster), 1) + DONE
    assert set(response.arrivals) == {5.0} and response.complete


def test_header_delay_holds_the_headers_on_the_clock(memory_cluster: Make) -> None:
    """``header_delay`` postpones the status line by exactly that long on the engine's clock."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY, header_delay=2.0, chunks=1)
    pending = cluster.request("POST", "/api/chat", data=CHAT, node="e")
    cluster.advance(1.9)
    assert not pending.called
    cluster.advance(0.1)
    response = cluster.result(pending)
    assert response.headers_at == 2.0 and response.complete


def test_chunk_delay_spaces_the_frames_on_the_clock(memory_cluster: Make) -> None:
    """``chunk_delay`` sends one frame per delay: the first at once, the done frame last."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY, chunk_delay=0.5, chunks=2)
    response = post(cluster)
    cluster.advance(10)
    assert response.arrivals == [0.0, 0.5, 1.0]
    assert response.chunks == [*ndjson(engine_of(cluster), 2).splitlines(keepends=True), DONE]


def test_openai_routes_stream_sse_only_when_asked(memory_cluster: Make) -> None:
    """/v1/chat/completions answers one JSON document, or SSE events ending in ``[DONE]``."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY, chunks=2)
    plain = post(cluster, "/v1/chat/completions", b'{"model": "m"}')
    assert plain.header("content-type") == "application/json"
    assert plain.json()["choices"][0]["message"]["content"] == "hello"
    streamed = post(cluster, "/v1/chat/completions", b'{"model": "m", "stream": true}')
    assert streamed.header("content-type") == "text/event-stream"
    assert streamed.body == b"".join(reply_frames(b"/v1/chat/completions", True, 2, "hello"))
    assert streamed.body.endswith(b"data: [DONE]\n\n") and streamed.body.count(b"data: ") == 3


def test_stream_kind_follows_each_api_default() -> None:
    """Ollama routes stream unless told not to; OpenAI routes only when told to; bad JSON is {}."""
    assert stream_kind(b"/api/chat", b"{}") == (True, b"application/x-ndjson")
    assert stream_kind(b"/api/chat", b'{"stream": false}') == (False, b"application/json")
    assert stream_kind(b"/api/embed", b"{}") == (False, b"application/json")
    assert stream_kind(b"/v1/completions", b"[1]") == (False, b"application/json")
    assert stream_kind(b"/v1/completions", b'{"stream": true}') == (True, b"text/event-stream")


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


def test_once_gives_the_first_request_its_behaviour_and_the_rest_healthy() -> None:
    """``once(b)``: ``b`` for inference request 1 only."""
    policy = once(Behaviour.STUCK)
    assert [policy(n, b"/api/chat") for n in (1, 2, 3)] == [
        Behaviour.STUCK,
        Behaviour.HEALTHY,
        Behaviour.HEALTHY,
    ]


def test_stuck_freezes_the_whole_engine_for_a_stretch(memory_cluster: Make) -> None:
    """STUCK: that request is never answered, and for ``stuck_for`` seconds no other request is
    either, model lists included; afterwards the engine answers what arrives (not what it took
    while stuck)."""
    cluster = serve(memory_cluster, once(Behaviour.STUCK), stuck_for=10.0, chunks=1)
    stuck = cluster.request("POST", "/api/chat", data=CHAT, node="e")
    cluster.advance(1.0)
    assert engine_of(cluster).frozen
    during = [
        cluster.request("GET", "/api/tags", node="e"),
        cluster.request("POST", "/api/chat", data=CHAT, node="e"),
    ]
    cluster.advance(8.9)
    assert not any(p.called for p in [stuck, *during])
    cluster.advance(0.2)
    assert not engine_of(cluster).frozen
    assert cluster.fetch("GET", "/api/tags", node="e").status == 200
    assert post(cluster).complete
    cluster.advance(60)
    assert not any(p.called for p in [stuck, *during])


def test_policy_counts_inference_requests_only(memory_cluster: Make) -> None:
    """Model lists are not inference: an alternating engine fails POST 1, serves POST 2."""
    cluster = serve(memory_cluster, alternate(Behaviour.STATUS_503, Behaviour.HEALTHY))
    tags = cluster.fetch("GET", "/api/tags", node="e").json()
    assert tags == {"models": [{"name": "llama3:latest", "model": "llama3:latest"}]}
    models = cluster.fetch("GET", "/v1/models", node="e").json()
    assert models["data"] == [{"id": "llama3:latest", "object": "model"}]
    assert [post(cluster).status for _ in range(2)] == [503, 200]
    assert engine_of(cluster).inference_count == 2


def test_received_records_method_target_headers_and_exact_body(memory_cluster: Make) -> None:
    """Every request is kept: method, target with query, lower-cased headers, the body bytes."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY)
    body = b'{"model": "llama3", "stream": false, "x": "\xc3\xa9"}'
    cluster.fetch("POST", "/api/chat?trace=1", data=body, headers={"X-Custom": "yes"}, node="e")
    [seen] = engine_of(cluster).received
    assert (seen.method, seen.path, seen.body) == (b"POST", b"/api/chat?trace=1", body)
    assert seen.headers[b"x-custom"] == [b"yes"]


def test_stop_closes_open_requests_and_cancels_timers(memory_cluster: Make) -> None:
    """``stop`` resets a frozen request's connection and cancels a pending slow-body timer."""

    def policy(_number: int, path: bytes) -> Behaviour:
        return Behaviour.FROZEN if path == b"/api/generate" else Behaviour.SLOW_BODY

    cluster = serve(memory_cluster, policy, body_delay=5.0)
    frozen = cluster.request("POST", "/api/generate", data=CHAT, node="e")
    slow = post(cluster)
    assert len(cluster.clock.getDelayedCalls()) == 1
    engine_of(cluster).stop()
    assert cluster.clock.getDelayedCalls() == []
    cluster.flush()
    failures: list[Failure] = []
    frozen.addErrback(failures.append)
    [failure] = failures
    assert isinstance(failure.value, ResponseNeverReceived)
    assert failure.value.reasons[0].check(ConnectionLost)
    assert slow.body == b"" and slow.truncated


def test_a_required_key_refuses_any_other_authorization_with_401(memory_cluster: Make) -> None:
    """With ``api_key`` set, only ``Authorization: Bearer <key>`` is served; the request is still
    recorded, so a test sees what was sent."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY, api_key="k1")
    assert cluster.fetch("GET", "/api/tags", node="e").status == 401
    wrong = cluster.fetch("GET", "/api/tags", node="e", headers={"authorization": "Bearer k2"})
    right = cluster.fetch("GET", "/api/tags", node="e", headers={"authorization": "Bearer k1"})
    assert (wrong.status, right.status) == (401, 200)
    assert len(engine_of(cluster).received) == 3


def test_issue_14_routes_answer_from_the_engines_models(memory_cluster: Make) -> None:
    """``/api/show`` (404 for a model it lacks), ``/api/ps`` (the ``loaded`` ones), LM Studio's
    ``/api/v0/models`` and ``/api/v0/models/{id}``, and OpenAI-style ``/api/v0`` inference."""
    cluster = serve(
        memory_cluster, Behaviour.HEALTHY, models=("a:latest", "b:latest"), loaded=("b:latest",)
    )
    shown = post(cluster, "/api/show", b'{"model": "a"}')
    assert (shown.status, shown.json()["details"]) == (200, {"family": "sim"})
    assert post(cluster, "/api/show", b'{"name": "zzz"}').json() == {
        "error": "model 'zzz' not found"
    }
    ps = cluster.fetch("GET", "/api/ps", node="e").json()
    assert [m["model"] for m in ps["models"]] == ["b:latest"]
    v0 = cluster.fetch("GET", "/api/v0/models", node="e").json()
    assert [(r["id"], r["state"]) for r in v0["data"]] == [
        ("a:latest", "not-loaded"),
        ("b:latest", "loaded"),
    ]
    assert cluster.fetch("GET", "/api/v0/models/b:latest", node="e").json()["id"] == "b:latest"
    assert cluster.fetch("GET", "/api/v0/models/c", node="e").status == 404
    chat = post(cluster, "/api/v0/chat/completions", b'{"model": "a:latest", "stream": true}')
    assert chat.header("content-type") == "text/event-stream"


def test_responses_answer_with_a_numbered_id_and_end_at_response_completed(
    memory_cluster: Make,
) -> None:
    cluster = serve(memory_cluster, Behaviour.HEALTHY, chunks=2, response_prefix="resp_e")
    plain = post(cluster, "/v1/responses", b'{"model": "m"}')
    assert (plain.json()["id"], plain.json()["status"]) == ("resp_e_1", "completed")
    streamed = post(cluster, "/v1/responses", b'{"model": "m", "stream": true}')
    events = [e.split(b"\n")[0] for e in streamed.body.split(b"\n\n") if e]
    assert events == [
        b"event: response.created",
        b"event: response.output_text.delta",
        b"event: response.output_text.delta",
        b"event: response.completed",
    ]
    assert b'"id": "resp_e_2"' in streamed.body.split(b"\n\n")[0]


# --- residency answers ---------------------------------------------------------------------------


def test_residency_endpoints_answer_404_unless_loaded_is_set(memory_cluster: Make) -> None:
    """By default the engine has no residency endpoints (404), so residency stays unknown."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY)
    for path in ("/api/ps", "/api/v0/models"):
        response = cluster.fetch("GET", path, node="e")
        assert response.status == 404
        assert response.json() == {"error": "not found"}


def test_residency_endpoints_report_the_loaded_models(memory_cluster: Make) -> None:
    """``loaded`` is reported by /api/ps (as models) and by /api/v0/models (as ``state``), and can
    be changed between polls."""
    cluster = serve(memory_cluster, Behaviour.HEALTHY, models=("a:latest", "b:latest"))
    engine = engine_of(cluster)
    engine.loaded = ["b:latest"]
    ps = cluster.fetch("GET", "/api/ps", node="e").json()
    assert [m["model"] for m in ps["models"]] == ["b:latest"]
    v0 = cluster.fetch("GET", "/api/v0/models", node="e").json()
    assert {r["id"]: r["state"] for r in v0["data"]} == {
        "a:latest": "not-loaded",
        "b:latest": "loaded",
    }
    engine.loaded = []
    assert cluster.fetch("GET", "/api/ps", node="e").json() == {"models": []}
    assert engine.inference_count == 0
