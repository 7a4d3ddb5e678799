"""Tool calls across translations (docs/behaviour.md §17.3, §17.4) on real engines, read by the
engines' official clients: a ``twist nvpair`` subprocess in front of a real ``llama-server``
started with a tool-capable chat template (``tests.engines.llamacpp.TOOL_TEMPLATE``), and a real
Ollama 0.9.3 with the same template in Go (``tests.engines.ollama.TOOL_MODEL``).

- ``llama-server`` itself: ``tool_choice: "required"`` does not force a call in this build, the
  few-shot prompt (``tests.engines.llamacpp.tool_prompt``) at temperature 0 does.
- The ``ollama`` facade translating ``/api/chat`` with tools to that node (``kind = openai``), the
  call parsed by the official ``ollama`` client, whole and streamed.
- ``/v1/messages`` with a tool through the ``openai`` facade to that node, which serves Messages
  itself, read by the official ``anthropic`` client.
- ``/v1/messages`` with a tool translated to the real Ollama 0.9.3, which has no Messages route.

The engines' own answers are the references. Engines that cannot be installed or started fail
the tests, never skip them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer, RealOllama
from tests.engines import llamacpp
from tests.engines import ollama as ollama_engine

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

TOKENS = 48
CALL = {"city": llamacpp.ASKED_CITY}
# Each test's own bound (engine fixtures have their own); a request to the real Ollama evaluates
# the 169-token prompt at a few tokens a second on one shared core.
BOUND = pytest.mark.timeout(180, func_only=True)
OLLAMA_BOUND = pytest.mark.timeout(420, func_only=True)


@pytest.fixture(scope="module")
def llama() -> Iterator[RealLlamaServer]:
    server = RealLlamaServer.start(slots=1, chat_template=llamacpp.TOOL_TEMPLATE)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ProxyProcess]]:
    """Starts proxies (each stopped at the end of the module; its log must hold no traceback and
    no prompt text)."""
    started: list[ProxyProcess] = []

    def start(args: Sequence[str]) -> ProxyProcess:
        proxy = ProxyProcess(list(args), tmp_path_factory.mktemp("proxy"))
        started.append(proxy)
        proxy.wait_ready(1)
        return proxy

    yield start
    for proxy in started:
        output = proxy.stop()
        assert "Traceback" not in output, output
        assert "weather" not in output, "a prompt was logged"


def _over(engine: str, node: str, kind: str) -> list[str]:
    return ["--engine", engine, "--node", f"n={node}", "--node-kind", f"n={kind}"]


def _chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    with httpx.Client(timeout=300) as client:
        answer = client.post(f"{url}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    message: dict[str, Any] = answer.json()["choices"][0]["message"]
    return message


def _only_call(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    [call] = message["tool_calls"]
    return call["function"]["name"], json.loads(call["function"]["arguments"])


@BOUND
def test_the_few_shot_prompt_makes_the_real_llama_server_call_the_tool_and_required_does_not(
    llama: RealLlamaServer,
) -> None:
    tools, messages = llamacpp.tool_prompt()
    settings = {"model": llamacpp.ALIAS, "tools": tools, "temperature": 0, "max_tokens": TOKENS}
    caps = httpx.get(f"{llama.url}/props", timeout=10).json()["chat_template_caps"]
    assert caps["supports_tools"] and caps["supports_tool_calls"]
    forced = _chat(llama.url, {**settings, "messages": messages[-1:], "tool_choice": "required"})
    assert not forced.get("tool_calls") and forced["content"]
    assert _only_call(_chat(llama.url, {**settings, "messages": messages})) == (
        llamacpp.TOOL_NAME,
        CALL,
    )


def _ollama_shape(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The OpenAI-shaped prompt as the ``ollama`` client writes it (arguments as objects)."""
    shaped = []
    for message in messages:
        calls = [
            {
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"]["arguments"]),
                }
            }
            for c in message.get("tool_calls", ())
        ]
        shaped.append(
            {"role": message["role"], "content": message["content"]}
            | ({"tool_calls": calls} if calls else {})
        )
    return shaped


@BOUND
def test_the_ollama_client_parses_a_real_tool_call_translated_from_an_openai_node(
    llama: RealLlamaServer, proxies: Callable[..., ProxyProcess]
) -> None:
    proxy = proxies(_over("ollama", llama.url, "openai"))
    tools, messages = llamacpp.tool_prompt()
    client = ollama.Client(host=proxy.url, timeout=300)
    options = {"temperature": 0, "num_predict": TOKENS}
    shaped = _ollama_shape(messages)
    whole = client.chat(llamacpp.ALIAS, shaped, tools=tools, options=options)
    [call] = whole.message.tool_calls or []
    assert (call.function.name, dict(call.function.arguments)) == (llamacpp.TOOL_NAME, CALL)
    assert whole.done and whole.done_reason == "stop"
    parts = list(client.chat(llamacpp.ALIAS, shaped, tools=tools, options=options, stream=True))
    streamed = [c for part in parts for c in part.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [
        (llamacpp.TOOL_NAME, CALL)
    ]
    assert parts[-1].done and not any(part.done for part in parts[:-1])


def _messages_shape(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The OpenAI-shaped prompt in Anthropic Messages' shape (calls as ``tool_use`` blocks)."""
    shaped: list[dict[str, Any]] = []
    for message in messages:
        uses = [
            {
                "type": "tool_use",
                "id": f"toolu_{c['id']}",
                "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"]),
            }
            for c in message.get("tool_calls", ())
        ]
        shaped.append({"role": message["role"], "content": uses or message["content"]})
    return shaped


def _messages_tools() -> list[Any]:
    tools, _ = llamacpp.tool_prompt()
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]


def _assert_tool_use(base: str, model: str) -> None:
    """The official ``anthropic`` client, whole and streamed (``messages.stream`` accumulates the
    events, the ``input_json`` deltas included, into the final message itself)."""
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=300)
    _, messages = llamacpp.tool_prompt()
    asked: dict[str, Any] = {
        "model": model,
        "max_tokens": TOKENS,
        "tools": _messages_tools(),
        "messages": _messages_shape(messages),
        "extra_body": {"temperature": 0},  # this client has no temperature argument of its own
    }
    whole = client.messages.create(**asked)
    assert whole.stop_reason == "tool_use"
    [use] = [block for block in whole.content if block.type == "tool_use"]
    assert (use.name, use.input) == (llamacpp.TOOL_NAME, CALL)
    with client.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    [streamed] = [block for block in final.content if block.type == "tool_use"]
    assert (streamed.name, streamed.input) == (llamacpp.TOOL_NAME, CALL)


@BOUND
def test_the_anthropic_client_reads_a_tool_use_from_a_llama_server_through_the_openai_facade(
    llama: RealLlamaServer, proxies: Callable[..., ProxyProcess]
) -> None:
    """``llama-server`` serves ``/v1/messages`` itself (its ``tool_use`` is the reference)."""
    proxy = proxies(_over("openai", llama.url, "openai"))
    _assert_tool_use(llama.url, llamacpp.ALIAS)
    _assert_tool_use(proxy.url, llamacpp.ALIAS)
    [*_, record] = proxy.events("proxy/request")
    assert record["path"] == "/v1/messages" and record["status"] == 200


@pytest.fixture(scope="module")
def tool_ollama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealOllama]:
    """A real Ollama with a model store of its own, where :data:`ollama_engine.TOOL_MODEL` is
    registered (no other server lists it)."""
    store: Path = tmp_path_factory.mktemp("ollama-store")
    node = RealOllama.start({"OLLAMA_MODELS": str(store)})
    try:
        ollama_engine.register_tool_model(node.port)
        yield node
    finally:
        node.stop()


@OLLAMA_BOUND
def test_messages_with_a_tool_are_translated_to_the_real_ollama(
    tool_ollama: RealOllama, proxies: Callable[..., ProxyProcess]
) -> None:
    proxy = proxies(_over("ollama", tool_ollama.url, "ollama"))
    with httpx.Client(timeout=30) as plain:
        direct = plain.post(
            f"{tool_ollama.url}/v1/messages",
            json={"model": ollama_engine.TOOL_MODEL, "max_tokens": 1, "messages": []},
        )
    assert direct.status_code == 404
    _assert_tool_use(proxy.url, ollama_engine.TOOL_MODEL)
