"""The engine double of ``bench/agents.py`` (``bench/kvcache.py``): its slots keep what they read,
a resent prefix is read from the cache, a new prefix evicts the least recently used slot, a
request waits while every slot is busy, and each route states its cached tokens as the engine
it imitates does. The benchmark's figures are only as true as this instrument."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.task import Clock

from bench.kvcache import HostCache, PrefixCache, Taken
from bench.kvengine import CachingEngine, Kind
from bench.kvtemplate import read_conversation, render, reply_to, reply_tokens
from nvpair_tw.testing import MemoryCluster, MemoryResponse

Make = Callable[..., MemoryCluster]
MODEL = "qwen3-coder:30b"
CHAT = "/v1/chat/completions"
PREFILL, DECODE = 1000.0, 100.0


def _words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


def _chat(tag: str, turns: int = 1, system: str = "sys") -> dict[str, Any]:
    """A chat-completions conversation of ``turns`` user turns on the system prompt ``system``,
    each answered as the double answers (text and a tool call) except the last."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": _words(system, 200)}]
    for turn in range(turns):
        messages.append({"role": "user", "content": _words(f"{tag}{turn}x", 300)})
        if turn < turns - 1:
            reply = reply_to(read_conversation("/v1/chat/completions", _body(messages)), "c")
            function = {"name": reply.tool, "arguments": json.dumps(reply.arguments)}
            call = {"id": "c", "type": "function", "function": function}
            messages.append({"role": "assistant", "content": " ".join(reply.text)})
            messages[-1]["tool_calls"] = [call]
    return _body(messages)


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "stream": True}


def _engine(clock: Clock, slots: int = 2) -> CachingEngine:
    return CachingEngine(clock, "e", slots=slots, prefill=PREFILL, decode=DECODE)


def _cluster(make: Make, engine: CachingEngine) -> MemoryCluster:
    return make(engine.clock, {"e": engine}, facades=())


def _send(cluster: MemoryCluster, body: dict[str, Any], path: str = "/v1/chat/completions") -> Any:
    return cluster.request("POST", path, json=body, node="e")


def _answer(
    cluster: MemoryCluster, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> MemoryResponse:
    pending = _send(cluster, body, path)
    cluster.advance(60)
    response = cluster.result(pending)
    assert response.complete, response
    return response


def _prompt(body: dict[str, Any], path: str = "/v1/chat/completions") -> int:
    return len(render(read_conversation(path, body)))


def test_a_resent_conversation_is_read_from_the_cache_and_only_its_new_turn_costs_time(
    memory_cluster: Make,
) -> None:
    """Turn 2 resends turn 1 and the answer to it: all of that is found cached, and the answer
    comes after reading only the new part at the prefill rate."""
    clock = Clock()
    engine = _engine(clock)
    cluster = _cluster(memory_cluster, engine)
    first, second = _chat("a", 1), _chat("a", 2)
    _answer(cluster, first)
    sent = clock.seconds()
    response = _answer(cluster, second)
    held = _prompt(first) + len(
        reply_tokens(reply_to(read_conversation("/v1/chat/completions", first), "c"))
    )
    [_, again] = engine.served
    assert (again.prompt, again.cached) == (_prompt(second), held)
    reading = (again.prompt - held) / PREFILL
    assert response.arrivals[-1] - sent == pytest.approx(reading + 25 / DECODE)


def test_a_new_prefix_evicts_the_least_recently_used_slot(memory_cluster: Make) -> None:
    """Two slots hold conversations a and b (a used longer ago); c, sharing nothing with either,
    takes a's slot: b's next turn finds its first turn cached, a's finds nothing."""
    clock = Clock()
    engine = _engine(clock)
    cluster = _cluster(memory_cluster, engine)
    for tag in "abc":
        _answer(cluster, _chat(tag, 1, system=f"{tag}sys"))
    assert [s.slot for s in engine.served] == [1, 0, 1]
    _answer(cluster, _chat("b", 2, system="bsys"))
    _answer(cluster, _chat("a", 2, system="asys"))
    b, a = engine.served[3:]
    assert b.cached > _prompt(_chat("b", 1, system="bsys"))
    assert a.cached == 1  # the system marker


def test_a_conversation_sharing_the_system_prompt_takes_the_slot_of_another(
    memory_cluster: Make,
) -> None:
    """As in llama-server: b's first turn shares a's system prompt (more than a tenth of b's
    prompt), so it takes a's idle slot rather than the empty one, and a's next turn is read again
    from its system prompt on."""
    clock = Clock()
    engine = _engine(clock)
    cluster = _cluster(memory_cluster, engine)
    _answer(cluster, _chat("a", 1))
    _answer(cluster, _chat("b", 1))
    assert [s.slot for s in engine.served] == [1, 1]
    _answer(cluster, _chat("a", 2))
    assert engine.served[-1].cached == 1 + 200 + 1 + 1  # <|system|>, its words, <|end|>, <|user|>


def test_a_prefix_under_a_tenth_of_the_prompt_does_not_choose_the_slot() -> None:
    """llama-server's slot similarity: a prefix of more than a tenth of the prompt chooses its
    slot; less, and the least recently used idle slot is taken."""
    cache = PrefixCache.of(2)
    assert cache.take(["p"], 0.0) == Taken(1, 0)  # every slot unused: the last
    cache.release(1, ["p"], 1.0)
    assert cache.take(["q", "r"], 2.0) == Taken(0, 0)  # nothing shared: the least recently used
    cache.release(0, ["q", "r"], 3.0)
    assert cache.take(["q", *"0123456789"], 4.0) == Taken(1, 0)  # 1 of 11 shared: not enough
    cache.release(1, ["p"], 1.0)
    assert cache.take(["q", "r", *"012345678"], 5.0) == Taken(0, 2)  # 2 of 11: its slot
    assert cache.take(["x"], 6.0) == Taken(1, 0)
    cache.release(0, ["x"], 7.0)
    assert cache.take(["x"], 8.0) == Taken(0, 0)  # a whole prompt cached: the last token again


def test_a_conversation_pushed_out_of_its_slot_comes_back_from_host_memory(
    memory_cluster: Make,
) -> None:
    """With llama-server's host-memory prompt cache, c's turn pushes a out of its slot into
    host memory; a's next turn has it copied back (at the restore rate) and finds its first turn
    cached, as if it had kept its slot."""
    clock = Clock()
    engine = CachingEngine(clock, "e", prefill=PREFILL, decode=DECODE, host_tokens=10_000)
    cluster = _cluster(memory_cluster, engine)
    for tag in "abc":
        _answer(cluster, _chat(tag, 1, system=f"{tag}sys"))
    sent = clock.seconds()
    response = _answer(cluster, _chat("a", 2, system="asys"))
    a = engine.served[-1]
    first = _chat("a", 1, system="asys")
    held = _prompt(first) + len(reply_tokens(reply_to(read_conversation(CHAT, first), "c")))
    assert (a.restored, a.cached) == (held, held)
    reading = held / engine.restore + (a.prompt - held) / PREFILL
    assert response.arrivals[-1] - sent == pytest.approx(reading + 25 / DECODE)


def test_host_memory_keeps_the_newest_prompts_and_never_one_another_contains() -> None:
    """A prompt a longer one contains is not kept twice; beyond the capacity the oldest go; a
    saved prompt is restored only when the request keeps at least a quarter of it."""
    host = HostCache(capacity=6)
    host.save(["a", "b"])
    host.save(["a", "b", "c"])  # contains the first: it replaces it
    host.save(["a"])  # contained in one kept: not saved
    assert list(host.entries) == [["a", "b", "c"]]
    host.save([*"xyzwv"])
    host.trim()
    assert list(host.entries) == [[*"xyzwv"]]
    assert host.load([], ["x", "q"]) is None  # it would keep a fifth of it
    assert host.load([], ["x", "y", "q"]) == [*"xyzwv"]
    assert not host.entries


def test_a_request_waits_while_every_slot_is_busy(memory_cluster: Make) -> None:
    """With one slot, the second conversation starts when the first ends."""
    clock = Clock()
    engine = _engine(clock, slots=1)
    cluster = _cluster(memory_cluster, engine)
    _send(cluster, _chat("a"))
    _send(cluster, _chat("b"))
    cluster.advance(60)
    first, second = engine.served
    assert second.started == pytest.approx(first.ended)
    assert second.arrived == pytest.approx(0.0)


def test_a_request_naming_a_slot_takes_it_or_waits_for_it(memory_cluster: Make) -> None:
    """llama-server's ``id_slot``: a's next turn names the slot b took, so it reads its prompt
    there from scratch, and c, naming a busy slot, waits while d goes ahead."""
    clock = Clock()
    engine = _engine(clock)
    cluster = _cluster(memory_cluster, engine)
    _answer(cluster, _chat("a", 1, system="asys"))
    _answer(cluster, _chat("b", 1, system="bsys"))
    _answer(cluster, {**_chat("a", 2, system="asys"), "id_slot": 2})  # 2 wraps to slot 0: b's
    assert (engine.served[-1].slot, engine.served[-1].cached) == (0, 1)  # the system marker
    _send(cluster, {**_chat("c", 1, system="csys"), "id_slot": 1})
    _send(cluster, {**_chat("d", 1, system="dsys"), "id_slot": 1})
    _send(cluster, _chat("e", 1, system="esys"))
    cluster.advance(60)
    c, e, d = engine.served[3:]
    assert (c.slot, e.slot, d.slot) == (1, 0, 1)
    assert e.started == c.started == c.arrived
    assert d.started == pytest.approx(c.ended)


def _sse(response: MemoryResponse) -> list[dict[str, Any]]:
    lines = response.body.decode().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


COUNTS: dict[str, Callable[[MemoryResponse], tuple[int, int]]] = {
    "/v1/chat/completions": lambda r: (
        _sse(r)[-1]["usage"]["prompt_tokens_details"]["cached_tokens"],
        _sse(r)[-1]["timings"]["cache_n"],
    ),
    "/v1/messages": lambda r: (
        _sse(r)[0]["message"]["usage"]["cache_read_input_tokens"],
        _sse(r)[0]["message"]["usage"]["input_tokens"],
    ),
    "/v1/responses": lambda r: (
        _sse(r)[-1]["response"]["usage"]["input_tokens_details"]["cached_tokens"],
        _sse(r)[-1]["response"]["usage"]["input_tokens"],
    ),
}


@pytest.mark.parametrize("path", sorted(COUNTS))
def test_each_route_states_the_cached_tokens_as_llama_cpp_does(
    memory_cluster: Make, path: str
) -> None:
    """chat completions: ``prompt_tokens_details.cached_tokens`` and ``timings.cache_n``;
    Messages: ``cache_read_input_tokens`` with ``input_tokens`` the rest; Responses:
    ``input_tokens_details.cached_tokens`` of ``input_tokens``."""
    clock = Clock()
    engine = _engine(clock)
    cluster = _cluster(memory_cluster, engine)
    system = _words("sys", 300)
    bodies = {
        "/v1/chat/completions": lambda text: {
            **_chat("a"), "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
        },
        "/v1/messages": lambda text: {
            "model": MODEL, "stream": True, "max_tokens": 100, "system": system,
            "messages": [{"role": "user", "content": text}],
        },
        "/v1/responses": lambda text: {
            "model": MODEL, "stream": True, "instructions": system, "input": text,
        },
    }  # fmt: skip
    _answer(cluster, bodies[path]("first question"), path)
    response = _answer(cluster, bodies[path]("second question"), path)
    served = engine.served[-1]
    expected = {
        "/v1/chat/completions": (served.cached, served.cached),
        "/v1/messages": (served.cached, served.prompt - served.cached),
        "/v1/responses": (served.cached, served.prompt),
    }
    assert served.cached > 300
    assert COUNTS[path](response) == expected[path]


def test_ollama_states_the_whole_prompt_and_the_time_it_read_the_rest(memory_cluster: Make) -> None:
    """Ollama 0.9.3 states no cached count: ``prompt_eval_count`` is the whole prompt, and
    ``prompt_eval_duration`` the time spent on the part not cached."""
    clock = Clock()
    engine = CachingEngine(clock, "e", kind=Kind.OLLAMA, prefill=PREFILL, decode=DECODE)
    cluster = _cluster(memory_cluster, engine)
    _answer(cluster, _chat("a", 1), "/api/chat")
    response = _answer(cluster, _chat("a", 2), "/api/chat")
    last = json.loads(response.body.splitlines()[-1])
    served = engine.served[-1]
    assert served.cached > 500
    assert last["prompt_eval_count"] == served.prompt
    reading = (served.prompt - served.cached) / PREFILL
    assert last["prompt_eval_duration"] == pytest.approx(reading * 1e9, abs=1)
