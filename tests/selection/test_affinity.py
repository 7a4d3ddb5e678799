"""Tests for nvpair_tw.selection._affinity: request digests and the warm-node LRU table."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.selection._affinity import AffinityKey, AffinityTable, affinity_key

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are terse."}


def chat_key(messages: Any, path: str = CHAT, model: str = "m", **fields: Any) -> AffinityKey:
    key = affinity_key(path, model, {"model": model, "messages": messages, **fields})
    assert key is not None
    return key


def turn(n: int) -> list[dict[str, str]]:
    """The messages a client sends for turn ``n`` (1-based) of one conversation."""
    messages = [SYSTEM]
    for i in range(1, n + 1):
        messages.append({"role": "user", "content": f"question {i}"})
        if i < n:
            messages.append({"role": "assistant", "content": f"answer {i}"})
    return messages


def test_every_later_turn_finds_the_node_that_served_turn_one() -> None:
    """Turns 2-5 of a conversation look up the node that served turn 1 (only turn 1 recorded)."""
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1)), "node-a")
    for n in range(2, 6):
        assert table.lookup(chat_key(turn(n))) == "node-a", n


def test_a_conversation_stays_on_its_node_as_each_turn_is_recorded() -> None:
    """Recording every turn keeps the conversation on the same node through five turns."""
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1)), "node-a")
    for n in range(2, 6):
        key = chat_key(turn(n))
        node = table.lookup(key)
        assert node == "node-a", n
        table.record(key, node)


def test_longest_known_prefix_wins() -> None:
    """When two prefixes are known, the longer one (the latest turn) is chosen."""
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1)), "node-a")
    table.record(chat_key(turn(2)), "node-b")
    assert table.lookup(chat_key(turn(3))) == "node-b"


def test_exact_resend_is_looked_up_first() -> None:
    """The key itself is the first lookup, then earlier boundaries longest first (one per message
    after the system prompt, which is the preamble's)."""
    key = chat_key(turn(2))
    assert key.lookups[0] == key.key
    assert len(key.lookups) == len(turn(2)) - 1
    assert chat_key(turn(1)).key in key.lookups[1:]
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1)), "node-a")
    table.record(key, "node-b")
    assert table.lookup(key) == "node-b"


def test_unrelated_conversation_misses() -> None:
    """A conversation with a different first message finds nothing."""
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1)), "node-a")
    other = [SYSTEM, {"role": "user", "content": "something else"}]
    assert table.lookup(chat_key(other)) is None


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.2},
        {"max_tokens": 5},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"top_p": 0.5, "seed": 7, "stop": ["\n"], "keep_alive": "5m", "user": "u"},
    ],
)
def test_generation_settings_keep_the_key(settings: dict[str, Any]) -> None:
    """Sampling, length and stream settings do not change the key."""
    assert chat_key(turn(2), **settings) == chat_key(turn(2))


def test_tools_schema_changes_the_key() -> None:
    """A different ``tools`` schema is a different prefix."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    other = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
    assert chat_key(turn(1), tools=[tool]).key != chat_key(turn(1)).key
    assert chat_key(turn(1), tools=[tool]).key != chat_key(turn(1), tools=[other]).key


def test_key_ignores_field_order() -> None:
    """Canonical JSON: reordered object keys give the same digest."""
    a = [{"role": "user", "content": "hi"}]
    b = [{"content": "hi", "role": "user"}]
    assert chat_key(a, tools=[{"x": 1, "y": 2}]) == chat_key(b, tools=[{"y": 2, "x": 1}])


@pytest.mark.parametrize(
    "path", ["/api/chat", "/api/v0/chat/completions", "/v1/messages", "/v1/responses"]
)
def test_the_route_is_not_part_of_the_key(path: str) -> None:
    """The same messages on another conversation route are the same conversation."""
    assert chat_key(turn(2), path=path) == chat_key(turn(2))


def test_different_model_misses() -> None:
    """A node warm for one model is not warm for another."""
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1), model="llama3:latest"), "node-a")
    assert table.lookup(chat_key(turn(2), model="qwen3:latest")) is None
    assert table.lookup(chat_key(turn(2), model="llama3:latest")) == "node-a"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/embeddings",
        "/api/embed",
        "/api/tags",
        "/v1/chat",
        "/api/v0/embeddings",
        "/v1/messages/count_tokens",
    ],
)
def test_other_paths_have_no_affinity(path: str) -> None:
    """Only conversation and completion paths have affinity (embeddings keep nothing warm)."""
    assert (
        affinity_key(path, "m", {"model": "m", "messages": turn(1), "prompt": "x" * 2000}) is None
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/v0/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        ),
        ("/api/v0/completions", {"model": "m", "prompt": "x" * 2000}),
    ],
)
def test_lmstudio_native_chat_and_completions_have_affinity(
    path: str, body: dict[str, Any]
) -> None:
    """LM Studio's ``/api/v0`` chat and completions key like their ``/v1`` twins."""
    assert affinity_key(path, "m", body) is not None


def test_query_string_is_ignored() -> None:
    """A query on the path does not change the key."""
    assert affinity_key(CHAT + "?a=1", "m", {"messages": turn(1)}) == chat_key(turn(1))


@pytest.mark.parametrize(
    "messages",
    [
        None,
        "hello",
        {"role": "user"},
        [],
        ["hello"],
        [{"role": "user", "content": "hi"}, None],
        [[{"role": "user"}]],
    ],
)
def test_malformed_messages_give_none(messages: Any) -> None:
    """Non-list messages, empty lists and non-object messages give None, not an exception."""
    assert affinity_key(CHAT, "m", {"model": "m", "messages": messages}) is None


def test_missing_messages_give_none() -> None:
    """A chat body without messages has no affinity."""
    assert affinity_key("/api/chat", "m", {"model": "m"}) is None


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"content": "\ud800"}]},
        {"messages": turn(1), "tools": {1: "x", "a": "y"}},
        {"messages": turn(1), "tools": [object()]},
        {"prompt": "\ud800" * 2000},
    ],
)
def test_unserialisable_bodies_give_none(body: dict[str, Any]) -> None:
    """Lone surrogates, mixed-type keys and non-JSON values give None, not an exception."""
    path = CHAT if "messages" in body else "/v1/completions"
    assert affinity_key(path, "m", body) is None


def test_non_mapping_body_gives_none() -> None:
    """A body that is not an object (e.g. a JSON list) gives None."""
    assert affinity_key(CHAT, "m", ["not", "a", "dict"]) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["/v1/completions", "/api/generate"])
def test_short_prompt_has_no_affinity(path: str) -> None:
    """A prompt of 1,023 bytes is too short for affinity."""
    assert affinity_key(path, "m", {"prompt": "x" * 1023}) is None


@pytest.mark.parametrize("path", ["/v1/completions", "/api/generate"])
def test_prompt_of_1024_bytes_has_a_key(path: str) -> None:
    """A prompt of exactly 1,024 bytes gets a key, looked up only by itself."""
    key = affinity_key(path, "m", {"prompt": "x" * 1024})
    assert key is not None
    assert key.lookups == (key.key,)


def test_prompt_length_counts_utf8_bytes() -> None:
    """The threshold is in UTF-8 bytes, not characters."""
    assert affinity_key("/v1/completions", "m", {"prompt": "é" * 511 + "x"}) is None
    assert affinity_key("/v1/completions", "m", {"prompt": "é" * 512}) is not None


def test_prompts_sharing_the_first_1024_bytes_share_the_key() -> None:
    """Only the first 1,024 bytes of a prompt matter."""
    head = "p" * 1024
    a = affinity_key("/v1/completions", "m", {"prompt": head + " tail one", "temperature": 1})
    b = affinity_key("/v1/completions", "m", {"prompt": head + " another tail"})
    c = affinity_key("/v1/completions", "m", {"prompt": "q" + head})
    assert a is not None and b is not None and c is not None
    assert a.key == b.key
    assert a.key != c.key


def test_non_string_prompt_gives_none() -> None:
    """A prompt list (token ids) or a missing prompt has no affinity."""
    assert affinity_key("/v1/completions", "m", {"prompt": [1, 2, 3] * 1000}) is None
    assert affinity_key("/v1/completions", "m", {}) is None


def test_context_tokens_win_over_prompt() -> None:
    """On /api/generate a non-empty context array is the key; the prompt is then ignored."""
    long_prompt = "x" * 2000
    a = affinity_key("/api/generate", "m", {"prompt": "short", "context": [1, 2, 3]})
    b = affinity_key("/api/generate", "m", {"prompt": long_prompt, "context": [1, 2, 3]})
    c = affinity_key("/api/generate", "m", {"prompt": long_prompt, "context": [1, 2, 4]})
    plain = affinity_key("/api/generate", "m", {"prompt": long_prompt})
    assert a is not None and b is not None and c is not None and plain is not None
    assert a.key == b.key
    assert a.key != c.key
    assert b.key != plain.key


def test_empty_context_falls_back_to_prompt() -> None:
    """An empty context array is ignored in favour of the prompt."""
    prompt = "x" * 2000
    assert affinity_key("/api/generate", "m", {"prompt": prompt, "context": []}) == affinity_key(
        "/api/generate", "m", {"prompt": prompt}
    )


def test_context_is_ignored_on_openai_completions() -> None:
    """Only Ollama's /api/generate uses context tokens."""
    assert affinity_key("/v1/completions", "m", {"prompt": "short", "context": [1, 2]}) is None


def test_lru_evicts_the_least_recently_used_at_max_entries() -> None:
    """At max_entries the least recently used entry goes; a lookup counts as a use."""
    table = AffinityTable(Clock(), max_entries=2)
    one, two, three = (chat_key([{"content": str(i)}]) for i in range(3))
    table.record(one, "a")
    table.record(two, "b")
    assert table.lookup(one) == "a"
    table.record(three, "c")
    assert len(table) == 2
    assert table.lookup(two) is None
    assert table.lookup(one) == "a"
    assert table.lookup(three) == "c"


def test_recording_the_same_key_again_replaces_the_node() -> None:
    """A later success on another node moves the key there without growing the table."""
    table = AffinityTable(Clock())
    key = chat_key(turn(1))
    table.record(key, "a")
    table.record(key, "b")
    assert len(table) == 1
    assert table.lookup(key) == "b"


def test_idle_entries_expire() -> None:
    """An entry unused for idle_ttl seconds is gone."""
    clock = Clock()
    table = AffinityTable(clock, idle_ttl=300.0)
    table.record(chat_key(turn(1)), "a")
    clock.advance(299.9)
    assert len(table) == 1
    clock.advance(0.1)
    assert table.lookup(chat_key(turn(2))) is None
    assert len(table) == 0


def test_a_hit_refreshes_the_idle_time() -> None:
    """Each hit restarts the idle clock of the entry it found."""
    clock = Clock()
    table = AffinityTable(clock, idle_ttl=300.0)
    table.record(chat_key(turn(1)), "a")
    for _ in range(3):
        clock.advance(200)
        assert table.lookup(chat_key(turn(2))) == "a"
    clock.advance(299)
    assert table.lookup(chat_key(turn(2))) == "a"


def test_expired_entries_are_dropped_when_recording() -> None:
    """Recording clears idle entries lazily, with no timer."""
    clock = Clock()
    table = AffinityTable(clock, idle_ttl=10.0)
    table.record(chat_key([{"content": "old"}]), "a")
    clock.advance(11)
    table.record(chat_key([{"content": "new"}]), "b")
    assert len(table._entries) == 1
    assert clock.getDelayedCalls() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_entries": 0}, "max_entries"),
        ({"max_entries": True}, "max_entries"),
        ({"max_entries": 1.5}, "max_entries"),
        ({"idle_ttl": 0}, "idle_ttl"),
        ({"idle_ttl": -1.0}, "idle_ttl"),
        ({"idle_ttl": float("nan")}, "idle_ttl"),
    ],
)
def test_invalid_table_settings_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    """max_entries must be >= 1 and idle_ttl > 0, with a clear error."""
    with pytest.raises(ValueError, match=message):
        AffinityTable(Clock(), **kwargs)


def test_table_repr_reveals_no_entries() -> None:
    """The table's repr does not include its digests or node map."""
    table = AffinityTable(Clock())
    table.record(chat_key(turn(1)), "secret-node")
    assert "secret-node" not in repr(table)


def test_a_digest_is_of_the_canonical_form_of_the_conversation() -> None:
    """A one-message chat's key is SHA-256 over the preamble (the system prompt and the tools)
    and the message, each in the prefix-free form: a string as its UTF-8 length and bytes, a
    list and an object with their counts (an object by sorted key). Digests stay the same bytes
    from one release to the next, so a fleet's proxies meet in one table."""
    body = {
        "model": "m",
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": "é"}}}
        ],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "héllo"},
        ],
    }
    preamble = b"l3:s1:s" + b"l1:s9:Be brief." + b"l1:l4:s1:fs1:fnd2:s1:as2:\xc3\xa9s1:bi1;"
    atom = b"l3:s1:ts4:userl1:s6:h\xc3\xa9llo"
    key = hashlib.sha256(preamble + atom).digest()
    assert affinity_key("/api/chat", "m", body) == AffinityKey("m", key, (key,))


def test_holds_looks_without_refreshing() -> None:
    """``holds`` says whether a key's own entry is remembered and keeps nothing alive: only a
    lookup refreshes (the owner check of docs/behaviour.md §2.1 relies on it)."""
    clock = Clock()
    table = AffinityTable(clock, idle_ttl=10.0)
    key = AffinityKey("m", b"k", (b"other", b"k"))
    assert not table.holds(key)
    table.record(key, "n1")
    clock.advance(6)
    assert table.holds(key)
    clock.advance(4)
    assert not table.holds(key)  # 10 s idle: the holds at 6 s refreshed nothing
    table.record(key, "n1")
    assert not table.holds(AffinityKey("m", b"other", (b"k",)))  # its own digest only
