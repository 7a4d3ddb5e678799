"""A simulated LM Studio 0.4 over real loopback sockets: ``/api/v1/models`` and ``/api/v1/chat`` in
the shapes of LM Studio's REST documentation (docs/engines/lmstudio.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted

from tests.simulated.test_kinds import Serve, client, serve

__all__ = ["client", "serve"]

pytestmark = pytest.mark.timeout(30)

CHAT = {"model": "qwen", "input": "say hi to me", "system_prompt": "be brief"}


def _named_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``event:`` names and their ``data:`` documents."""
    events = []
    for block in body.decode().split("\n\n"):
        if block:
            event, data = block.split("\n")
            events.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


@pytest_twisted.ensureDeferred
async def test_v1_models_are_the_documented_records_with_loaded_instances(serve: Serve) -> None:
    """Every model once; a loaded one has one instance whose config carries the context it was
    loaded with, the model record its ``max_context_length``; an embedding model has no
    ``architecture`` or ``capabilities``."""
    served = serve(
        "lmstudio",
        models=("qwen", "text-embedding-nomic"),
        loaded=["qwen"],
        context_length=32768,
        loaded_context=4096,
    )
    answer = await served.ask("GET", "/api/v1/models")
    assert answer.status == 200 and answer.content_type == "application/json"
    qwen, nomic = answer.json()["models"]
    assert (qwen["key"], qwen["type"], qwen["max_context_length"]) == ("qwen", "llm", 32768)
    assert qwen["loaded_instances"][0]["id"] == "qwen"
    assert qwen["loaded_instances"][0]["config"]["context_length"] == 4096
    assert set(qwen) >= {"publisher", "display_name", "quantization", "size_bytes", "format"}
    assert qwen["capabilities"] == {"vision": False, "trained_for_tool_use": True}
    assert (nomic["type"], nomic["loaded_instances"]) == ("embedding", [])
    assert "architecture" not in nomic and "capabilities" not in nomic


@pytest_twisted.ensureDeferred
async def test_v1_models_is_404_without_residency_like_an_older_lm_studio(serve: Serve) -> None:
    refused = await serve("lmstudio").ask("GET", "/api/v1/models")
    assert refused.status == 404
    assert refused.json() == {"error": "Unexpected endpoint or method. (GET /api/v1/models)"}


@pytest_twisted.ensureDeferred
async def test_v1_chat_whole_answer_has_output_stats_and_loads_the_model(serve: Serve) -> None:
    served = serve("lmstudio", models=("qwen",), loaded=[], reply_text="hello")
    answer = (await served.ask("POST", "/api/v1/chat", CHAT)).json()
    assert answer["model_instance_id"] == "qwen"
    assert answer["output"] == [{"type": "message", "content": "hello"}]
    assert answer["stats"]["input_tokens"] == 6 and answer["stats"]["total_output_tokens"] == 3
    assert served.engine.loaded == ["qwen"]  # just in time


@pytest_twisted.ensureDeferred
async def test_v1_chat_streams_named_events_from_chat_start_to_chat_end(serve: Serve) -> None:
    served = serve("lmstudio", models=("qwen",), loaded=["qwen"], chunks=2, reply_text="hi")
    answer = await served.ask("POST", "/api/v1/chat", {**CHAT, "stream": True})
    assert answer.content_type == "text/event-stream"
    events = _named_events(answer.body)
    assert [name for name, _ in events] == [
        "chat.start",
        "prompt_processing.start",
        "prompt_processing.end",
        "message.start",
        "message.delta",
        "message.delta",
        "message.end",
        "chat.end",
    ]
    assert all(data["type"] == name for name, data in events)
    assert [d["content"] for n, d in events if n == "message.delta"] == ["hi0", "hi1"]
    assert events[-1][1]["result"]["output"] == [{"type": "message", "content": "hi0hi1"}]
