# -*- test-case-name: tests.simulated.test_engine -*-
"""What a :class:`~nvpair_tw.simulated._engine.SimulatedEngine` answers, route by route: the JSON documents
of the non-inference routes (model lists, ``/api/ps``, ``/api/show``, LM Studio's ``/api/v0/*``, the
version) and the frames of an inference answer (Ollama NDJSON, OpenAI SSE, ``/v1/responses``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = [
    "control_answer",
    "listing",
    "progress_frames",
    "reply_frames",
    "route_answer",
    "stream_kind",
]


def route_answer(
    method: bytes, path: bytes, body: bytes, models: Sequence[str], loaded: Sequence[str] | None
) -> tuple[int, Any] | None:
    """The status and JSON document of a request that is not inference, or None for inference
    (a POST other than an ``/api/show`` of a model the engine lacks)."""
    if method == b"GET":
        answer = listing(path, models, loaded)
        if answer is not None:
            return answer
    if method == b"POST" and path == b"/api/show":
        wanted = _requested_model(body)
        if wanted not in models and f"{wanted}:latest" not in models:
            return 404, {"error": f"model '{wanted}' not found"}
    if method == b"GET" and path == b"/api/tags":
        return 200, {"models": [{"name": m, "model": m} for m in models]}
    if method == b"GET" and path == b"/v1/models":
        return 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}
    if method == b"DELETE" and path == b"/api/delete":
        return None  # model management: answered like inference, through the policy
    if method != b"POST":
        return 200, {"version": "0.0.0-simulated"}
    return None


def control_answer(
    path: bytes, body: bytes, models: Sequence[str], loaded: Sequence[str] | None
) -> tuple[int, Any, list[str]] | None:
    """Loading and unloading a model (docs/behaviour.md §13.3) as the engines answer it: the
    status, the document and what is loaded afterwards; None for any other request.

    Ollama: ``/api/generate`` with neither ``prompt`` nor ``messages`` loads the model
    (``done_reason: load``), with ``keep_alive: 0`` unloads it (``unload``). LM Studio 0.4+:
    ``/api/v1/models/load`` ``{model}`` and ``/api/v1/models/unload`` ``{instance_id}``.
    """
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    resident = [] if loaded is None else list(loaded)
    if path == b"/api/generate" and "prompt" not in parsed and "messages" not in parsed:
        model = parsed.get("model")
        if not isinstance(model, str) or model not in models:
            return 404, {"error": f"model '{model}' not found"}, resident
        unloading = parsed.get("keep_alive") in (0, "0", "0s")
        after = [m for m in resident if m != model] if unloading else [*resident, model]
        answer = {"model": model, "response": "", "done": True}
        answer["done_reason"] = "unload" if unloading else "load"
        return 200, answer, list(dict.fromkeys(after))
    if path == b"/api/v1/models/load":
        model = parsed.get("model")
        if not isinstance(model, str) or model not in models:
            return 404, {"error": f"model '{model}' not found"}, resident
        done = {"model_instance_id": model, "load_time_seconds": 0.0}
        return 200, done, list(dict.fromkeys([*resident, model]))
    if path == b"/api/v1/models/unload":
        instance = parsed.get("instance_id")
        if instance not in resident:
            return 404, {"error": f"no loaded instance '{instance}'"}, resident
        return 200, {"instance_id": instance}, [m for m in resident if m != instance]
    return None


def listing(
    path: bytes, models: Sequence[str], loaded: Sequence[str] | None
) -> tuple[int, Any] | None:
    """The GET routes answered from the engine's models: ``/api/ps`` (the ``loaded`` ones),
    LM Studio's ``/api/v0/models`` (every model with its ``state``) — both 404 while
    ``loaded`` is None — and ``/api/v0/models/{id}`` (404 for a model it lacks)."""
    resident = () if loaded is None else tuple(loaded)
    names = list(dict.fromkeys([*models, *resident]))
    records = [
        {
            "id": m,
            "object": "model",
            "type": "llm",
            "state": "loaded" if m in resident else "not-loaded",
        }
        for m in names
    ]
    if path.startswith(b"/api/v0/models/"):
        wanted = path[len(b"/api/v0/models/") :].decode("utf-8", "replace")
        for record in records:
            if record["id"] == wanted:
                return 200, record
        return 404, {"error": f"model '{wanted}' not found"}
    if path not in (b"/api/ps", b"/api/v0/models"):
        return None
    if loaded is None:
        return 404, {"error": "not found"}
    if path == b"/api/ps":
        return 200, {"models": [{"name": m, "model": m, "size_vram": 1} for m in resident]}
    return 200, {"object": "list", "data": records}


def _requested_model(body: bytes) -> str:
    """The ``model`` (else ``name``) of an ``/api/show`` body, or ``""``."""
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    wanted = parsed.get("model") or parsed.get("name") if isinstance(parsed, dict) else ""
    return wanted if isinstance(wanted, str) else ""


def _ollama_style(path: bytes) -> bool:
    """Ollama's own routes; LM Studio's ``/api/v0/...`` and ``/api/v1/...`` answer OpenAI-style."""
    return path.startswith(b"/api/") and not path.startswith((b"/api/v0/", b"/api/v1/"))


_OLLAMA_STREAMS = (b"/api/chat", b"/api/generate", b"/api/pull", b"/api/create")
_MANAGEMENT = (b"/api/pull", b"/api/create", b"/api/copy", b"/api/delete")


def progress_frames(path: bytes, streaming: bool, chunks: int) -> list[bytes]:
    """Ollama's progress for a pull or a create, as it streams it (one JSON object per line),
    ending with ``{"status": "success"}``; not streaming, that last object alone. Copy and
    delete answer 200 with no body."""
    if path in (b"/api/copy", b"/api/delete"):
        return []
    digest = "sha256:" + "5a" * 32
    total = 1000 * chunks
    if path == b"/api/pull":
        steps: list[dict[str, Any]] = [{"status": "pulling manifest"}]
        steps += [
            {"status": "downloading", "digest": digest, "total": total, "completed": 1000 * i}
            for i in range(1, chunks + 1)
        ]
        steps += [{"status": "verifying sha256 digest"}, {"status": "writing manifest"}]
    else:
        steps = [{"status": f"using existing layer {digest}"}]
        steps += [{"status": "writing manifest"}] * max(0, chunks - 2)
    steps.append({"status": "success"})
    if not streaming:
        return [json.dumps(steps[-1]).encode()]
    return [json.dumps(step).encode() + b"\n" for step in steps]


def stream_kind(path: bytes, body: bytes) -> tuple[bool, bytes]:
    """Whether a request to ``path`` with ``body`` streams, and the answer's content type.

    Ollama routes (``/api/...``) stream unless ``"stream": false``; OpenAI-style routes stream
    only with ``"stream": true``.
    """
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    if _ollama_style(path):
        streaming = bool(parsed.get("stream", True)) and path in _OLLAMA_STREAMS
        return streaming, b"application/x-ndjson" if streaming else b"application/json"
    streaming = bool(parsed.get("stream", False))
    return streaming, b"text/event-stream" if streaming else b"application/json"


def reply_frames(
    path: bytes, streaming: bool, chunks: int, text: str, *, response_id: str = "resp_1"
) -> list[bytes]:
    """The frames of one answer: ``chunks`` NDJSON lines or SSE events and the closing frame
    (``done`` / ``[DONE]`` / ``response.completed``) when streaming, else one JSON document.
    ``/v1/responses`` answers carry ``response_id``; ``/api/show`` answers a model's details."""
    if path == b"/api/show":
        return [json.dumps({"modelfile": "# simulated", "details": {"family": "sim"}}).encode()]
    if path in _MANAGEMENT:
        return progress_frames(path, streaming, chunks)
    if path == b"/v1/responses":
        return _responses_frames(streaming, chunks, text, response_id)
    if _ollama_style(path):
        if not streaming:
            return [
                json.dumps(
                    {"message": {"role": "assistant", "content": text}, "done": True}
                ).encode()
            ]
        parts = [
            json.dumps(
                {"message": {"role": "assistant", "content": f"{text}{i}"}, "done": False}
            ).encode()
            + b"\n"
            for i in range(chunks)
        ]
        return [*parts, json.dumps({"done": True, "done_reason": "stop"}).encode() + b"\n"]
    if not streaming:
        return [
            json.dumps(
                {
                    "object": "chat.completion",
                    "choices": [{"message": {"role": "assistant", "content": text}}],
                }
            ).encode()
        ]
    parts = [
        b"data: "
        + json.dumps({"choices": [{"delta": {"content": f"{text}{i}"}}]}).encode()
        + b"\n\n"
        for i in range(chunks)
    ]
    return [*parts, b"data: [DONE]\n\n"]


def _responses_frames(streaming: bool, chunks: int, text: str, response_id: str) -> list[bytes]:
    """An OpenAI Responses API answer: SSE events from ``response.created`` to
    ``response.completed``, or the response object."""
    done = {
        "id": response_id,
        "object": "response",
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
    }
    if not streaming:
        return [json.dumps(done).encode()]

    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    created = {"id": response_id, "object": "response", "status": "in_progress", "output": []}
    parts = [event("response.output_text.delta", {"delta": f"{text}{i}"}) for i in range(chunks)]
    return [
        event("response.created", {"response": created}),
        *parts,
        event("response.completed", {"response": done}),
    ]
