"""Conversations and sessions through the corridor (docs/behaviour.md §5.3), in memory on one clock:
a resent conversation goes back to its node on every inference route of every facade, and across
routes; a named session leads home, per header and per caller; Claude Code's billing block is not
what a node receives.

Turn one is pinned to node ``b`` (the pin keeps affinity's bookkeeping: its node is recorded);
the pin is lifted, and the next turn goes back to ``b`` where the candidate order alone puts
``a`` first (a different conversation sent then goes to ``a``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.core import Settings
from nvpair_tw.testing import MemoryCluster, MemoryResponse, SimulatedEngine

pytestmark = pytest.mark.timeout(30)

Make = Callable[..., MemoryCluster]
MODEL = "qwen3:8b"
SYSTEM = "You are a careful coding agent working in a Python repository. " * 40
UUID = "0b9c7e0a-6b1e-4c7e-9a55-2f7d3c1e8a41"
BILLING = "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch={};"
READ = {"name": "read", "description": "Read a file.", "parameters": {"type": "object"}}

Turns = list[tuple[str, Any]]
FIRST: Turns = [("user", "What does app.py do? " * 30)]
SECOND: Turns = [
    *FIRST,
    ("call", {"path": "app.py"}),
    ("result", "def main():\n    serve()\n" * 20),
    ("assistant", "It starts the server."),
    ("user", "And the tests?"),
]
THIRD: Turns = [*SECOND, ("assistant", "They cover the routes."), ("user", "Run them.")]
OTHER: Turns = [("user", "Summarise the README. " * 30)]


def chat_completions(turns: Turns, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for n, (kind, value) in enumerate(turns):
        if kind == "call":
            call = {"name": READ["name"], "arguments": json.dumps(value)}
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}],
                }
            )
        elif kind == "result":
            messages.append({"role": "tool", "tool_call_id": f"call_{n - 1}", "content": value})
        else:
            messages.append({"role": kind, "content": value})
    tools = [{"type": "function", "function": READ}]
    return {"model": MODEL, "stream": False, "tools": tools, "messages": messages} | extra


def ollama_chat(turns: Turns, **extra: Any) -> dict[str, Any]:
    body = chat_completions(turns, **extra)
    for message in body["messages"]:
        for call in message.get("tool_calls") or ():
            del call["id"], call["type"]
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        message.pop("tool_call_id", None)
    return body


def messages(turns: Turns, *, billing: str | None = None, **extra: Any) -> dict[str, Any]:
    said: list[dict[str, Any]] = []
    for n, (kind, value) in enumerate(turns):
        if kind == "call":
            block = {"type": "tool_use", "id": f"toolu_{n}", "name": READ["name"], "input": value}
            said.append({"role": "assistant", "content": [block]})
        elif kind == "result":
            block = {"type": "tool_result", "tool_use_id": f"toolu_{n - 1}", "content": value}
            said.append({"role": "user", "content": [block]})
        else:
            text = {"type": "text", "text": value, "cache_control": {"type": "ephemeral"}}
            said.append({"role": kind, "content": [text]})
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    if billing is not None:
        system.insert(0, {"type": "text", "text": billing})
    tools = [
        {"name": "read", "description": READ["description"], "input_schema": READ["parameters"]}
    ]
    body = {"model": MODEL, "max_tokens": 64, "system": system, "tools": tools, "messages": said}
    return {**body, **extra}


def responses(turns: Turns, **extra: Any) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for n, (kind, value) in enumerate(turns):
        if kind == "call":
            arguments = json.dumps(value)
            call = {
                "type": "function_call",
                "call_id": f"c{n}",
                "name": "read",
                "arguments": arguments,
            }
            items.append(call)
        elif kind == "result":
            items.append({"type": "function_call_output", "call_id": f"c{n - 1}", "output": value})
        elif kind == "assistant":
            text = [{"type": "output_text", "text": value}]
            items.append({"type": "message", "role": "assistant", "content": text})
        else:
            items.append({"role": "user", "content": [{"type": "input_text", "text": value}]})
    tools = [{"type": "function", **READ}]
    return {"model": MODEL, "instructions": SYSTEM, "tools": tools, "input": items, **extra}


def lmstudio_chat(turns: Turns, **extra: Any) -> dict[str, Any]:
    """LM Studio's ``/api/v1/chat`` carries one message (its state lives on the node): a resend
    is the same request again."""
    return {"model": MODEL, "system_prompt": SYSTEM, "input": turns[0][1], **extra}


RENDER: dict[str, Callable[..., dict[str, Any]]] = {
    "/v1/chat/completions": chat_completions,
    "/api/v0/chat/completions": chat_completions,
    "/api/chat": ollama_chat,
    "/v1/messages": messages,
    "/v1/responses": responses,
    "/api/v1/chat": lmstudio_chat,
}
OPENAI_ROUTES = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]
ROUTES = {
    "ollama": [*OPENAI_ROUTES, "/api/chat"],
    "lmstudio": [*OPENAI_ROUTES, "/api/v0/chat/completions", "/api/v1/chat"],
    "omlx": OPENAI_ROUTES,
    "openai": OPENAI_ROUTES,
}
"""The conversation routes of every facade. The completion routes keep their prompt-prefix key
(recorded, and the warm node named to the prediction), but §15.2 credits a warm prefix only for
conversations: a completion's node is chosen by prediction alone."""
MATRIX = [(facade, route) for facade, routes in ROUTES.items() for route in routes]


def two_nodes(make: Make, facade: str, kind: str | None = None, **kw: Any) -> MemoryCluster:
    clock = Clock()
    engines = {n: SimulatedEngine(clock, (MODEL,), kind=kind) for n in ("a", "b")}
    return make(clock, engines, facades=(facade,), **kw)


def send(
    cluster: MemoryCluster, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> str | None:
    response = cluster.fetch("POST", path, json=body, headers=headers)
    assert response.status == 200, (path, response.body[:300])
    return response.header("x-nvpair-node")


def pinned(cluster: MemoryCluster, node: str, path: str, body: dict[str, Any], **kw: Any) -> None:
    """One turn served by ``node`` (the operator's pin), then the pin lifted."""
    facade = cluster.facade()
    facade.pin = node
    assert send(cluster, path, body, **kw) == node
    facade.pin = None


def chosen(cluster: MemoryCluster) -> list[str | None]:
    return [r["chosen_by"] for r in cluster.named("proxy/request")]


# --- one conversation, one node --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("facade", "route"), MATRIX)
def test_a_resent_conversation_returns_to_its_node_on_every_route(
    memory_cluster: Make, facade: str, route: str, stream: bool
) -> None:
    """Streamed too: a stream is recorded once its terminal event passed, whatever the dialect.
    The nodes are of the facade's kind (an Ollama 0.9.3 node has no ``/v1/responses``: behind the
    ollama facade they serve every route)."""
    cluster = two_nodes(memory_cluster, facade, kind=None if facade == "ollama" else facade)
    render = RENDER[route]
    pinned(cluster, "b", route, render(FIRST, stream=stream))
    later = render(SECOND if route != "/api/v1/chat" else FIRST, stream=stream)
    assert send(cluster, route, later) == "b"
    assert send(cluster, route, render(OTHER, stream=stream)) == "a"  # one b never saw
    assert chosen(cluster) == ["pin", "affinity", "prediction"]


@pytest.mark.parametrize("facade", ["ollama", "openai"])
def test_one_conversation_keeps_its_node_across_routes(memory_cluster: Make, facade: str) -> None:
    """Turn one as chat completions, turn two as Messages, turn three as Responses: one chain."""
    cluster = two_nodes(memory_cluster, facade)
    pinned(cluster, "b", "/v1/chat/completions", chat_completions(FIRST))
    assert send(cluster, "/v1/messages", messages(SECOND)) == "b"
    assert send(cluster, "/v1/responses", responses(THIRD)) == "b"
    assert (
        send(
            cluster,
            "/api/chat" if facade == "ollama" else "/v1/chat/completions",
            (ollama_chat if facade == "ollama" else chat_completions)(THIRD),
        )
        == "b"
    )


def test_messages_translated_for_ollama_nodes_keep_the_conversation_on_its_node(
    memory_cluster: Make,
) -> None:
    """Ollama 0.9.3 nodes lack ``/v1/messages``: the translated turns keep the chain too."""
    cluster = two_nodes(memory_cluster, "ollama", kind="ollama")
    pinned(cluster, "b", "/api/chat", ollama_chat(FIRST))
    assert send(cluster, "/v1/messages", messages(SECOND)) == "b"
    assert send(cluster, "/v1/chat/completions", chat_completions(THIRD)) == "b"


# --- what changes every turn is not the conversation ------------------------------------------------


def received(cluster: MemoryCluster, node: str) -> list[dict[str, Any]]:
    engine = cluster.engines[node]
    assert isinstance(engine, SimulatedEngine)
    return [json.loads(r.body) for r in engine.received if r.method == b"POST"]


def test_claude_codes_billing_block_moves_nothing_and_reaches_no_node(memory_cluster: Make) -> None:
    """Each turn's ``cch`` differs; the conversation stays on its node, and the node receives
    ``system`` without the block (the rest of the body as the client sent it)."""
    cluster = two_nodes(memory_cluster, "openai", kind="openai")
    pinned(cluster, "b", "/v1/messages", messages(FIRST, billing=BILLING.format("1a2b3")))
    assert send(cluster, "/v1/messages", messages(SECOND, billing=BILLING.format("9f8e7"))) == "b"
    for body in received(cluster, "b"):
        assert [block["text"] for block in body["system"]] == [SYSTEM]
        assert body["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_the_billing_block_is_removed_before_a_translation_too(memory_cluster: Make) -> None:
    cluster = two_nodes(memory_cluster, "ollama", kind="ollama")
    send(cluster, "/v1/messages", messages(FIRST, billing=BILLING.format("1a2b3")))
    [body] = received(cluster, "a")
    assert "x-anthropic-billing-header" not in json.dumps(body)
    assert body["messages"][0] == {"role": "system", "content": SYSTEM}


def test_the_billing_block_is_kept_with_billing_block_keep(memory_cluster: Make) -> None:
    cluster = two_nodes(
        memory_cluster, "openai", kind="openai", settings=Settings(billing_block="keep")
    )
    first = BILLING.format("1a2b3")
    pinned(cluster, "b", "/v1/messages", messages(FIRST, billing=first))
    assert send(cluster, "/v1/messages", messages(SECOND, billing=BILLING.format("9f8e7"))) == "b"
    assert [block["text"] for block in received(cluster, "b")[0]["system"]] == [first, SYSTEM]


# --- sessions the client names -----------------------------------------------------------------------

SESSION_SOURCES: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    ("/v1/chat/completions", {"X-Session-Id": UUID}, {}),
    ("/v1/messages", {"X-Claude-Code-Session-Id": UUID}, {}),
    ("/v1/responses", {"session_id": UUID}, {}),
    ("/v1/responses", {"conversation_id": UUID}, {}),
    ("/v1/responses", {}, {"prompt_cache_key": UUID}),
    ("/v1/messages", {}, {"metadata": {"user_id": f"user_{'ab' * 32}_account__session_{UUID}"}}),
    (
        "/v1/messages",
        {},
        {"metadata": {"user_id": json.dumps({"device_id": "d", "session_id": UUID})}},
    ),
    ("/v1/chat/completions", {"X-Team-Thread": UUID}, {}),
]


@pytest.mark.parametrize(("route", "headers", "fields"), SESSION_SOURCES)
def test_a_named_session_goes_home_when_its_prefix_changed(
    memory_cluster: Make, route: str, headers: dict[str, str], fields: dict[str, Any]
) -> None:
    """History compacted: the next turn shares no prefix with the last, and its session still
    leads it home; the same turn without the session goes where the order puts it."""
    settings = Settings(session_header=b"x-team-thread")
    cluster = two_nodes(memory_cluster, "openai", settings=settings)
    render = RENDER[route]
    pinned(cluster, "b", route, render(SECOND, **fields), headers=headers)
    assert send(cluster, route, render(OTHER, **fields), headers=headers) == "b"
    assert send(cluster, route, render([("user", "A question never asked.")])) == "a"
    assert chosen(cluster) == ["pin", "session", "prediction"]


def test_a_session_outlives_the_affinity_idle_time(memory_cluster: Make) -> None:
    cluster = two_nodes(memory_cluster, "openai")
    session = {"X-Session-Id": UUID}
    pinned(cluster, "b", "/v1/messages", messages(FIRST), headers=session)
    cluster.advance(Settings().affinity_ttl + 60)  # its prefix is forgotten, its session is not
    assert len(cluster.facade().affinity) == 0
    assert send(cluster, "/v1/messages", messages(SECOND), headers=session) == "b"
    cluster.advance(Settings().session_ttl)
    assert send(cluster, "/v1/messages", messages(THIRD), headers=session) == "a"


def test_a_session_whose_home_is_cordoned_is_served_elsewhere_and_moves(
    memory_cluster: Make,
) -> None:
    """Its home cordoned, the session is served on a; uncordoned, b would be warm for it had the
    home not moved: the next turn (its prefix changed) goes to a, as the session's."""
    cluster = two_nodes(memory_cluster, "openai")
    session = {"X-Session-Id": UUID}
    pinned(cluster, "b", "/v1/messages", messages(FIRST), headers=session)
    facade = cluster.facade()
    facade.cordons.cordon("b", "maintenance")
    assert send(cluster, "/v1/messages", messages(SECOND), headers=session) == "a"
    facade.cordons.uncordon("b")
    assert send(cluster, "/v1/messages", messages(OTHER), headers=session) == "a"
    assert chosen(cluster)[-1] == "session"


ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"
KEYS = f"""
[[key]]
name = "alice"
key = "{ALICE}"

[[key]]
name = "bob"
key = "{BOB}"
"""


def keyed(make: Make, tmp_path: Path, **settings: Any) -> MemoryCluster:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS)
    path.chmod(0o600)
    return two_nodes(make, "openai", keys_file=str(path), settings=Settings(**settings))


def as_key(key: str, name: str = UUID) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "X-Session-Id": name}


def test_a_session_of_one_key_cannot_steer_anothers(memory_cluster: Make, tmp_path: Path) -> None:
    """Bob names alice's session: his turn goes where the order puts it, and alice's session
    stays home on b."""
    cluster = keyed(memory_cluster, tmp_path)
    pinned(cluster, "b", "/v1/messages", messages(FIRST), headers=as_key(ALICE))
    assert send(cluster, "/v1/messages", messages(OTHER), headers=as_key(BOB)) == "a"
    again = messages([("user", "compacted")])
    assert send(cluster, "/v1/messages", again, headers=as_key(ALICE)) == "b"


def test_a_session_of_one_key_cannot_evict_anothers(memory_cluster: Make, tmp_path: Path) -> None:
    """Bob floods the table with sessions past its bound: alice's session is still home."""
    cluster = keyed(memory_cluster, tmp_path, affinity_max_entries=2)
    pinned(cluster, "b", "/v1/messages", messages(FIRST), headers=as_key(ALICE))
    for n in range(4):
        flood = messages([("user", f"flood {n}")])
        send(cluster, "/v1/messages", flood, headers=as_key(BOB, f"bob-{n}"))
    again = messages([("user", "compacted")])
    assert send(cluster, "/v1/messages", again, headers=as_key(ALICE)) == "b"


def test_no_session_name_is_kept_in_the_table(memory_cluster: Make) -> None:
    cluster = two_nodes(memory_cluster, "openai")
    send(cluster, "/v1/messages", messages(FIRST), headers={"X-Session-Id": UUID})
    assert UUID not in repr(cluster.facade().sessions._books)


def test_a_response_reaches_the_client_as_the_node_sent_it(memory_cluster: Make) -> None:
    """The session header is forwarded to the node like every end-to-end header."""
    cluster = two_nodes(memory_cluster, "openai", kind="openai")
    response: MemoryResponse = cluster.fetch(
        "POST", "/v1/messages", json=messages(FIRST), headers={"X-Session-Id": UUID}
    )
    assert response.status == 200
    engine = cluster.engines["a"]
    assert isinstance(engine, SimulatedEngine)
    [sent] = [r for r in engine.received if r.method == b"POST"]
    assert sent.headers.get(b"x-session-id") == [UUID.encode()]


def test_a_conversation_past_the_digest_bound_still_goes_home(memory_cluster: Make) -> None:
    """Three MiB of tool results: the chain is made of the first two (the bound), which the next
    turn shares, so it still finds its node; the walk stops at the bound."""
    cluster = two_nodes(memory_cluster, "openai", kind="openai")
    big: Turns = [("user", "Read every file.")]
    for n in range(48):
        big += [("call", {"path": f"f{n}.py"}), ("result", f"{n:03}" + "x" * (64 << 10))]
    pinned(cluster, "b", "/v1/chat/completions", chat_completions(big))
    more = [*big, ("assistant", "Read."), ("user", "Now fix them.")]
    assert send(cluster, "/v1/chat/completions", chat_completions(more)) == "b"


def test_a_session_leads_a_conversation_too_long_for_a_chain(memory_cluster: Make) -> None:
    """A first message past the digest bound gives no chain: the session alone is remembered,
    and leads the next turn home."""
    cluster = two_nodes(memory_cluster, "openai", kind="openai")
    session = {"X-Claude-Code-Session-Id": UUID}
    huge: Turns = [("user", "x" * (3 << 20))]
    pinned(cluster, "b", "/v1/messages", messages(huge), headers=session)
    assert len(cluster.facade().affinity) == 0
    later = messages([*huge, ("assistant", "Done."), ("user", "Next?")])
    assert send(cluster, "/v1/messages", later, headers=session) == "b"
    assert chosen(cluster)[-1] == "session"


def test_a_stored_response_outlives_the_affinity_idle_time(memory_cluster: Make) -> None:
    """A conversation continued from a stored response (``previous_response_id``) comes back after
    an agent's pause like a session does: its node is remembered for the session time, not the
    affinity idle time (§2.1)."""
    cluster = two_nodes(memory_cluster, "openai")
    facade = cluster.facade()
    facade.pin = "b"
    made = cluster.fetch("POST", "/v1/responses", json={"model": MODEL, "input": "hi"})
    facade.pin = None
    assert made.status == 200 and made.header("x-nvpair-node") == "b"
    stored = json.loads(made.body)["id"]
    follow = {"model": MODEL, "input": "more", "previous_response_id": stored}
    cluster.advance(Settings().affinity_ttl + 60)
    assert send(cluster, "/v1/responses", follow) == "b"
    assert chosen(cluster)[-1] == "conversation"
    cluster.advance(Settings().session_ttl + 60)
    send(cluster, "/v1/responses", follow)
    assert chosen(cluster)[-1] != "conversation"
