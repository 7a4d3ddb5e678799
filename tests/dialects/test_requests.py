"""Ollama and LM Studio v0 requests as OpenAI-compatible requests: the translation table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvpair_tw.dialects import TRANSLATED_ROUTES, Untranslatable, translate, untranslatable_field

pytestmark = pytest.mark.timeout(60)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"
JPEG = "/9j/4AAQSkZJRgABAQ"


def upstream(path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    t = translate(path, body, local_model="smollm2:135m", client_model="tiny")
    return t.path, json.loads(t.body), t.streams


def test_chat_golden_translation_with_options_format_and_tools() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    path, body, streams = upstream(
        "/api/chat",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "format": "json",
            "keep_alive": "5m",
            "think": True,
            "options": {
                "temperature": 0.2,
                "top_p": 0.9,
                "seed": 7,
                "stop": ["\n"],
                "frequency_penalty": 0.1,
                "presence_penalty": 0.3,
                "num_predict": 64,
                "top_k": 40,
                "min_p": 0.05,
                "repeat_penalty": 1.1,
                "num_ctx": 8192,
                "mirostat": 1,
            },
        },
    )
    assert path == "/v1/chat/completions"
    assert streams is True
    assert body == {
        "model": "smollm2:135m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["\n"],
        "frequency_penalty": 0.1,
        "presence_penalty": 0.3,
        "max_tokens": 64,
        "top_k": 40,
        "min_p": 0.05,
        "repeat_penalty": 1.1,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "medium",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_stream_false_is_still_streamed_upstream_and_whole_for_the_client() -> None:
    _, body, streams = upstream("/api/chat", {"model": "tiny", "messages": [], "stream": False})
    assert streams is False
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_negative_num_predict_is_omitted() -> None:
    _, body, _ = upstream(
        "/api/chat", {"model": "tiny", "messages": [], "options": {"num_predict": -1}}
    )
    assert "max_tokens" not in body


def test_a_schema_format_becomes_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    _, body, _ = upstream("/api/chat", {"model": "tiny", "messages": [], "format": schema})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }


def test_images_become_data_url_parts_typed_from_their_magic() -> None:
    _, body, _ = upstream(
        "/api/chat",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "what?", "images": [PNG, JPEG, "AAAA"]}],
        },
    )
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "what?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]


def test_tool_calls_get_ids_and_string_arguments_and_tool_messages_answer_them() -> None:
    _, body, _ = upstream(
        "/api/chat",
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": "weather and time?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"function": {"name": "get_time", "arguments": {}}},
                    ],
                },
                {"role": "tool", "content": "12:00", "tool_name": "get_time"},
                {"role": "tool", "content": "sunny"},
            ],
        },
    )
    assistant, time_answer, weather_answer = body["messages"][1:]
    assert assistant["content"] is None  # "" beside calls: Ollama's /v1 drops the calls
    assert assistant["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    assert time_answer == {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}
    assert weather_answer == {"role": "tool", "content": "sunny", "tool_call_id": "call_0"}


def test_a_tool_message_answering_no_call_is_untranslatable() -> None:
    body = {"model": "tiny", "messages": [{"role": "tool", "content": "x"}]}
    assert untranslatable_field("/api/chat", body) == "messages"


def test_generate_becomes_chat_with_system_and_image_parts() -> None:
    path, body, streams = upstream(
        "/api/generate",
        {"model": "tiny", "prompt": "describe", "system": "be brief", "images": [PNG]},
    )
    assert path == "/v1/chat/completions"
    assert streams is True
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "describe"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
    ]


def test_raw_or_suffix_generate_becomes_completions() -> None:
    path, body, _ = upstream(
        "/api/generate", {"model": "tiny", "prompt": "def f(", "suffix": "):", "stream": False}
    )
    assert path == "/v1/completions"
    assert body == {
        "model": "smollm2:135m",
        "prompt": "def f(",
        "suffix": "):",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert upstream("/api/generate", {"model": "tiny", "prompt": "x", "raw": True})[0] == (
        "/v1/completions"
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "hi", "context": [1, 2, 3]}, "context"),
        ({"prompt": "hi", "template": "{{ .Prompt }}"}, "template"),
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "raw": True, "images": [PNG]}, "images"),
        ({"prompt": "x", "format": 3}, "format"),
    ],
)
def test_untranslatable_generate_requests_name_their_field(
    body: dict[str, Any], field: str
) -> None:
    request = {"model": "tiny", **body}
    assert untranslatable_field("/api/generate", request) == field
    with pytest.raises(Untranslatable) as caught:
        translate("/api/generate", request, local_model="a", client_model="b")
    assert caught.value.field == field
    assert repr(field) in str(caught.value)


def test_an_empty_context_is_translatable() -> None:
    assert (
        untranslatable_field("/api/generate", {"model": "t", "prompt": "x", "context": []}) is None
    )


def test_embed_and_legacy_embeddings_become_v1_embeddings() -> None:
    assert upstream("/api/embed", {"model": "tiny", "input": ["a", "b"], "truncate": True}) == (
        "/v1/embeddings",
        {"model": "smollm2:135m", "input": ["a", "b"]},
        False,
    )
    assert upstream("/api/embeddings", {"model": "tiny", "prompt": "a"})[1] == {
        "model": "smollm2:135m",
        "input": "a",
    }
    assert untranslatable_field("/api/embed", {"model": "tiny"}) == "input"


def test_v0_routes_go_to_their_v1_twin_with_only_the_model_changed() -> None:
    raw = b'{ "model" : "tiny",\n "messages": [], "stream": true, "x":1.50 }'
    t = translate(
        "/api/v0/chat/completions",
        json.loads(raw),
        local_model="smollm2:135m",
        client_model="tiny",
        body=raw,
    )
    assert (t.path, t.streams) == ("/v1/chat/completions", True)
    assert t.body == b'{ "model" : "smollm2:135m",\n "messages": [], "stream": true, "x":1.50 }'
    assert (
        translate(
            "/api/v0/embeddings", {"model": "t", "input": "a"}, local_model="m", client_model="t"
        ).path
        == "/v1/embeddings"
    )


def test_translated_routes_are_the_table_and_others_are_refused() -> None:
    assert (
        frozenset(
            {
                "/api/chat",
                "/api/generate",
                "/api/embed",
                "/api/embeddings",
                "/api/v0/chat/completions",
                "/api/v0/completions",
                "/api/v0/embeddings",
                "/v1/messages",
            }
        )
        == TRANSLATED_ROUTES
    )
    with pytest.raises(ValueError):
        translate("/api/pull", {}, local_model="a", client_model="b")


@pytest.mark.parametrize(
    ("think", "expected"),
    [
        ("low", {"reasoning_effort": "low"}),
        ("medium", {"reasoning_effort": "medium"}),
        ("high", {"reasoning_effort": "high"}),
        (True, {"reasoning_effort": "medium"}),
        (False, {"chat_template_kwargs": {"enable_thinking": False}}),
        ("extreme", {}),
    ],
)
def test_think_becomes_reasoning_effort_or_disables_the_template_thinking(
    think: Any, expected: dict[str, Any]
) -> None:
    """docs/behaviour.md §17.4, on chat and generate alike."""
    for path, body in (
        ("/api/chat", {"model": "tiny", "messages": [], "think": think}),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "think": think}),
    ):
        _, sent, _ = upstream(path, body)
        got = {k: sent[k] for k in ("reasoning_effort", "chat_template_kwargs") if k in sent}
        assert got == expected


def test_an_assistant_messages_thinking_becomes_its_reasoning_content() -> None:
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "two and two"},
        {"role": "user", "content": "and 3+3?", "thinking": "not an assistant's"},
    ]
    _, body, _ = upstream("/api/chat", {"model": "tiny", "messages": messages})
    assert body["messages"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
        {"role": "user", "content": "and 3+3?"},
    ]
