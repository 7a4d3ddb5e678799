# -*- test-case-name: tests.simulated.test_lmstudio -*-
"""LM Studio 0.4's native REST API (``/api/v1``) as a simulated engine of kind ``lmstudio`` answers
it, in the shapes LM Studio's REST documentation shows (docs/engines/lmstudio.md cites the pages):

- ``GET /api/v1/models``: ``{"models": [...]}``, each with ``type``, ``publisher``, ``key``,
  ``display_name``, ``quantization``, ``size_bytes``, ``params_string``, ``loaded_instances``
  (``id`` and ``config``, whose ``context_length`` is the context the instance was loaded with),
  ``max_context_length`` and ``format``; an LLM also ``architecture``, ``capabilities`` and
  ``description``.
- ``POST /api/v1/chat``: a whole answer ``{"model_instance_id", "output": [{"type": "message",
  "content"}], "stats", "response_id"}``, or with ``"stream": true`` named SSE events from
  ``chat.start`` through ``message.delta`` to ``chat.end`` (whose ``result`` is the whole answer).
"""

from __future__ import annotations

import json
from typing import Any

from nvpair_tw.simulated._asked import Asked
from nvpair_tw.simulated._kinds import lmstudio_facts

__all__ = ["CHAT_PATH", "V1_MODELS", "chat_frames", "v1_model"]

V1_MODELS = b"/api/v1/models"
CHAT_PATH = b"/api/v1/chat"
_SIZE = 4_661_224_676


def v1_model(model: str, max_context: int, loaded_context: int | None) -> dict[str, Any]:
    """The ``/api/v1/models`` record of ``model``; ``loaded_context`` is the context of its one
    loaded instance, or None when it is not loaded."""
    facts = lmstudio_facts(model, max_context)
    embedding = facts["type"] == "embeddings"
    config: dict[str, Any] = {} if loaded_context is None else {"context_length": loaded_context}
    if not embedding and loaded_context is not None:
        config |= {"eval_batch_size": 512, "flash_attention": False, "num_experts": 0}
        config |= {"offload_kv_cache_to_gpu": True}
    record: dict[str, Any] = {
        "type": "embedding" if embedding else "llm",
        "publisher": facts["publisher"],
        "key": model,
        "display_name": model.rpartition("/")[2],
    }
    if not embedding:
        record["architecture"] = facts["arch"]
    record |= {
        "quantization": {"name": facts["quantization"], "bits_per_weight": 4},
        "size_bytes": _SIZE,
        "params_string": None if embedding else "8B",
        "loaded_instances": [] if loaded_context is None else [{"id": model, "config": config}],
        "max_context_length": max_context,
        "format": facts["compatibility_type"],
    }
    if not embedding:
        record["capabilities"] = {"vision": False, "trained_for_tool_use": True}
        record["description"] = None
    return record


def _whole(asked: Asked, text: str) -> dict[str, Any]:
    tokens = asked.completion_tokens
    return {
        "model_instance_id": asked.model,
        "output": [{"type": "message", "content": text}],
        "stats": {
            "input_tokens": asked.prompt_tokens,
            "total_output_tokens": tokens,
            "reasoning_output_tokens": 0,
            "tokens_per_second": 100.0,
            "time_to_first_token_seconds": 0.1,
        },
        "response_id": f"resp_sim{asked.number}",
    }


def chat_frames(asked: Asked) -> list[bytes]:
    """The frames of ``POST /api/v1/chat``: one JSON document, or the named SSE events of a
    stream."""
    if not asked.streaming:
        return [json.dumps(_whole(asked, asked.answer)).encode()]
    whole = _whole(asked, "".join(asked.pieces()))
    instance = {"model_instance_id": asked.model}
    events: list[tuple[str, dict[str, Any]]] = [("chat.start", instance)]
    events += [("prompt_processing.start", {}), ("prompt_processing.end", {})]
    events.append(("message.start", {}))
    events += [("message.delta", {"content": piece}) for piece in asked.pieces()]
    events += [("message.end", {}), ("chat.end", {"result": whole})]
    return [_event(kind, data) for kind, data in events]


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
