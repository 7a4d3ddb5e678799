"""Model-routed answers synthesised from a node's own list (docs/behaviour.md §11.3, last row)."""

from __future__ import annotations

import json

import pytest

from nvpair_tw.dialects import AnswerTooLarge, MalformedAnswer, synthesis

pytestmark = pytest.mark.timeout(10)

V0 = json.dumps(
    {
        "data": [
            {"id": "nomic", "type": "embeddings", "state": "loaded", "max_context_length": 2048},
            {"id": "qwen", "type": "vlm", "state": "not-loaded"},
        ]
    }
).encode()


def answer(route: str, list_path: str, body: bytes, model: str, status: int = 200) -> bytes:
    plan = synthesis(route, list_path, local_model=model, client_model="public", limit=1 << 16)
    transducer = plan.answer(status, b"application/json")
    half = len(body) // 2
    assert transducer.feed(body[:half]) == b"" and transducer.feed(body[half:]) == b""
    return transducer.end()


def test_show_says_what_the_list_says_of_the_model() -> None:
    shown = json.loads(answer("/api/show", "/api/v0/models", V0, "nomic"))
    assert shown == {"details": {}, "capabilities": ["embedding"]}
    assert json.loads(answer("/api/show", "/api/v0/models", V0, "qwen"))["capabilities"] == [
        "completion",
        "vision",
    ]


def test_a_model_the_list_lacks_is_answered_from_its_name_alone() -> None:
    body = json.dumps({"object": "list", "data": [{"id": "other"}]}).encode()
    shown = json.loads(answer("/api/show", "/v1/models", body, "missing"))
    assert shown == {"details": {}, "capabilities": ["completion"]}


def test_an_lmstudio_record_names_the_model_as_the_client_did() -> None:
    record = json.loads(answer("/api/v0/models/qwen", "/api/v0/models", V0, "qwen"))
    assert record == {"id": "public", "object": "model", "type": "vlm", "state": "not-loaded"}


def test_a_failed_list_passes_through_and_a_bad_one_is_refused() -> None:
    assert (
        answer("/api/show", "/v1/models", b'{"error": "x"}', "m", status=500) == b'{"error": "x"}'
    )
    with pytest.raises(MalformedAnswer):
        answer("/api/show", "/v1/models", b"[1, 2]", "m")
    plan = synthesis("/api/show", "/v1/models", local_model="m", client_model="m", limit=4)
    with pytest.raises(AnswerTooLarge):
        plan.answer(200, None).feed(b"12345")
    with pytest.raises(ValueError, match="not answered from a model list"):
        synthesis("/api/chat", "/v1/models", local_model="m", client_model="m")
