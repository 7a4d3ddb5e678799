"""Anthropic Messages requests as chat completions requests (docs/behaviour.md §17.3, §17.4): the
request table of ``_messages_request``, on bodies shaped as Anthropic's API reference shows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvpair_tw.dialects import Untranslatable, translate, untranslatable_field

pytestmark = pytest.mark.timeout(60)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"location": {"type": "string"}},
    "required": ["location"],
}


def upstream(body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    t = translate("/v1/messages", body, local_model="smollm2:135m", client_model="claude-local")
    return t.path, json.loads(t.body), t.streams


def test_a_simple_request_is_a_chat_request_asking_a_stream_with_usage() -> None:
    path, body, streams = upstream(
        {
            "model": "claude-local",
            "max_tokens": 1024,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello, Claude"}],
            "stop_sequences": ["\n\nHuman:"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "metadata": {"user_id": "u-1"},
        }
    )
    assert path == "/v1/chat/completions" and streams is False
    assert body == {
        "model": "smollm2:135m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello, Claude"},
        ],
        "max_tokens": 1024,
        "stop": ["\n\nHuman:"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_stream_true_is_a_streamed_answer_for_the_client() -> None:
    _, _, streams = upstream(
        {
            "model": "m",
            "max_tokens": 5,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    assert streams is True


def test_system_blocks_text_blocks_and_images_become_parts() -> None:
    _, body, _ = upstream(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [
                {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Answer in English."},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/jpeg",
                                "data": "/9j/4A",
                            },
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}},
                        {"type": "text", "text": "What is in these images?"},
                    ],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "Two cats."}]},
            ],
        }
    )
    assert body["messages"] == [
        {"role": "system", "content": "You are terse.\n\nAnswer in English."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4A"}},
                {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
                {"type": "text", "text": "What is in these images?"},
            ],
        },
        {"role": "assistant", "content": "Two cats."},
    ]


def test_tools_tool_use_and_tool_results_become_tool_calls_and_tool_messages() -> None:
    """§17.4: the definitions, the assistant's calls (input as a JSON string) and the results
    (each its own ``tool`` message, before the rest of the user's turn)."""
    _, body, _ = upstream(
        {
            "model": "m",
            "max_tokens": 100,
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Get the current weather in a given location",
                    "input_schema": WEATHER_SCHEMA,
                }
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [
                {"role": "user", "content": "Weather in Paris and Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Two calls.", "signature": "abc"},
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "toolu_01A",
                            "name": "get_weather",
                            "input": {"location": "Paris"},
                        },
                        {
                            "type": "tool_use",
                            "id": "toolu_01B",
                            "name": "get_weather",
                            "input": {"location": "Oslo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "15 °C"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_01B",
                            "content": [{"type": "text", "text": "no station"}],
                            "is_error": True,
                        },
                        {"type": "text", "text": "Thanks."},
                    ],
                },
            ],
        }
    )
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_SCHEMA,
                "description": "Get the current weather in a given location",
            },
        }
    ]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two calls.",
            "tool_calls": [
                {
                    "id": "toolu_01A",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'},
                },
                {
                    "id": "toolu_01B",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01A", "content": "15 °C"},
        {"role": "tool", "tool_call_id": "toolu_01B", "content": "Error: no station"},
        {"role": "user", "content": "Thanks."},
    ]


def test_a_turn_of_only_tool_results_is_only_tool_messages() -> None:
    _, body, _ = upstream(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
            ],
        }
    )
    assert body["messages"] == [{"role": "tool", "tool_call_id": "t1", "content": ""}]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice_is_translated(choice: dict[str, Any], expected: Any) -> None:
    _, body, _ = upstream({"model": "m", "max_tokens": 5, "messages": [], "tool_choice": choice})
    assert body["tool_choice"] == expected and "parallel_tool_calls" not in body


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, {"reasoning_effort": "low"}),
        ({"type": "enabled", "budget_tokens": 4096}, {"reasoning_effort": "medium"}),
        ({"type": "enabled", "budget_tokens": 16384}, {"reasoning_effort": "high"}),
        ({"type": "adaptive"}, {"reasoning_effort": "medium"}),
        ({"type": "disabled"}, {"chat_template_kwargs": {"enable_thinking": False}}),
    ],
)
def test_thinking_config_becomes_reasoning_effort(
    thinking: dict[str, Any], expected: dict[str, Any]
) -> None:
    _, body, _ = upstream({"model": "m", "max_tokens": 5, "messages": [], "thinking": thinking})
    got = {k: body[k] for k in ("reasoning_effort", "chat_template_kwargs") if k in body}
    assert got == expected


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "text", "data": "x"}}],
                    }
                ]
            },
            "messages",
        ),
        (
            {"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools",
        ),
        ({"messages": [], "mcp_servers": [{"type": "url", "url": "https://x"}]}, "mcp_servers"),
        ({"messages": [], "system": [{"type": "image"}]}, "system"),
    ],
)
def test_what_has_no_counterpart_is_untranslatable(body: dict[str, Any], field: str) -> None:
    full = {"model": "m", "max_tokens": 5, **body}
    assert untranslatable_field("/v1/messages", full) == field
    with pytest.raises(Untranslatable):
        upstream(full)


def test_an_assistant_turn_of_tool_use_blocks_alone_has_null_content() -> None:
    """§17.4: as OpenAI writes it; Ollama 0.9.3's ``/v1/chat/completions`` drops the calls of an
    assistant message whose content is a string, even an empty one (tests/e2e/test_real_tools)."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}
    _, body, _ = upstream(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": "And now?"},
            ],
        }
    )
    assert body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            }
        ],
    }
