"""Token counts and first content read off the client-bound bytes (docs/behaviour.md §12.2, §12.3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair_tw.core import Framing
from nvpair_tw.dialects import Chain, UsageMeter, UsageStripper, asks_usage, renamer
from nvpair_tw.dialects._usage import (
    END_BYTES,
    NEAR_END,
    _has_content,
    _last_counts,
    _windows,
)
from tests.dialects import engine_answers as real

pytestmark = pytest.mark.timeout(60)


def sse(*frames: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames] + [b"data: [DONE]\n\n"]


def ndjson(*frames: dict[str, Any]) -> list[bytes]:
    return [json.dumps(f).encode() + b"\n" for f in frames]


def delta(content: str | None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}, **extra}]}


RESPONSES_USAGE = {"input_tokens": 5, "output_tokens": 9}
USAGE = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}
OPENAI_STREAM = sse(
    {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
    delta("Hel"),
    delta("lo"),
    delta("", finish_reason="stop"),
    USAGE,
)


class Ticks:
    """A clock that moves one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def metered(chunks: list[bytes], framing: Framing | None = Framing.SSE) -> Any:
    """What a meter reads from ``chunks`` framed as ``framing`` (None: one JSON document)."""
    meter = UsageMeter(framing, Ticks())
    for chunk in chunks:
        meter.feed(chunk)
    return meter.end()


def test_an_openai_streams_counts_and_first_content() -> None:
    usage = metered(OPENAI_STREAM)
    assert (usage.prompt_tokens, usage.completion_tokens) == (11, 3)
    # the clock is read twice: at the first content (the role-only chunk carries none) and at
    # the end (the last chunk relayed)
    assert (usage.first_content_at, usage.last_at) == (1.0, 2.0)
    assert usage.tokens_per_second() == 3.0


def test_an_ollama_streams_final_object_gives_counts_and_the_engines_rate() -> None:
    final = {"done": True, "prompt_eval_count": 7, "eval_count": 40, "eval_duration": 2_000_000_000}
    chunks = ndjson({"message": {"role": "assistant", "content": "x"}, "done": False}, final)
    usage = metered(chunks, Framing.NDJSON)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.engine_rate) == (7, 40, 20.0)
    assert usage.tokens_per_second() == 20.0


def test_an_ollama_final_object_gives_the_engines_prefill_rate_and_load_time() -> None:
    """docs/behaviour.md §15.1: the engine's own figures, where it reports them."""
    final = {
        "done": True,
        "prompt_eval_count": 300,
        "prompt_eval_duration": 500_000_000,
        "load_duration": 1_250_000_000,
        "eval_count": 40,
        "eval_duration": 2_000_000_000,
    }
    usage = metered(ndjson({"message": {"content": "x"}, "done": False}, final), Framing.NDJSON)
    assert (usage.engine_prefill, usage.engine_load) == (600.0, 1.25)


def test_llama_cpp_timings_give_the_engines_prefill_rate() -> None:
    last = {
        "choices": [],
        "usage": {"prompt_tokens": 300, "completion_tokens": 40},
        "timings": {"predicted_per_second": 57.7, "prompt_per_second": 812.5},
    }
    usage = metered(sse({"choices": [{"delta": {"content": "x"}}]}, last))
    assert (usage.engine_rate, usage.engine_prefill, usage.engine_load) == (57.7, 812.5, None)


def test_lmstudio_v0_stats_give_the_engines_rate_and_prefill() -> None:
    """docs/behaviour.md §15.1: LM Studio's ``/api/v0`` whole answer states its decode rate and
    its time to first token beside the OpenAI ``usage``."""
    whole = {
        "choices": [{"message": {"content": "hi"}}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 40},
        "stats": {"tokens_per_second": 42.5, "time_to_first_token": 0.25, "generation_time": 1},
    }
    usage = metered([json.dumps(whole).encode()], None)
    assert (usage.prompt_tokens, usage.completion_tokens) == (300, 40)
    assert (usage.engine_rate, usage.engine_prefill, usage.engine_load) == (42.5, 1200.0, None)


LMSTUDIO_V1_STATS = {
    "input_tokens": 120,
    "total_output_tokens": 30,
    "reasoning_output_tokens": 0,
    "tokens_per_second": 25.0,
    "time_to_first_token_seconds": 0.5,
    "model_load_time_seconds": 2.5,
}


def test_lmstudio_v1_chat_states_its_counts_only_in_stats() -> None:
    """``POST /api/v1/chat`` has no ``usage``: counts, rates and load time are its ``stats``,
    whole or in the stream's ``chat.end`` result."""
    whole = {"output": [{"type": "message", "content": "hi"}], "stats": LMSTUDIO_V1_STATS}
    said = metered([json.dumps(whole).encode()], None)
    end = {"type": "chat.end", "result": whole}
    delta_event = b'event: message.delta\ndata: {"type":"message.delta","content":"hi"}\n\n'
    end_event = b"event: chat.end\ndata: " + json.dumps(end).encode() + b"\n\n"
    streamed = metered([delta_event, end_event])
    for usage in (said, streamed):
        assert (usage.prompt_tokens, usage.completion_tokens) == (120, 30)
        assert (usage.engine_rate, usage.engine_prefill, usage.engine_load) == (25.0, 240.0, 2.5)


@pytest.mark.parametrize(
    ("frames", "counts"),
    [
        (  # /v1/responses
            [
                {"type": "response.output_text.delta", "delta": "x"},
                {
                    "type": "response.completed",
                    "response": {"usage": {"input_tokens": 5, "output_tokens": 2}},
                },
            ],
            (5, 2),
        ),
        (  # /v1/messages: the prompt count comes first, the completion count last
            [
                {
                    "type": "message_start",
                    "message": {"usage": {"input_tokens": 9, "output_tokens": 1}},
                },
                {"type": "content_block_delta", "delta": {"text": "x"}},
                {"type": "message_delta", "usage": {"output_tokens": 4}},
            ],
            (9, 4),
        ),
        (  # llama.cpp's own rate
            [delta("x"), {**USAGE, "timings": {"predicted_per_second": 61.5}}],
            (11, 3),
        ),
    ],
)
def test_every_api_family_states_its_counts(frames: list[dict[str, Any]], counts: Any) -> None:
    usage = metered(sse(*frames))
    assert (usage.prompt_tokens, usage.completion_tokens) == counts


def events_of(stream: bytes) -> list[bytes]:
    """A captured SSE stream as the reads an engine writes: one event a read."""
    return [event + b"\n\n" for event in stream.split(b"\n\n") if event]


@pytest.mark.parametrize(
    ("answer", "framing", "said"),
    [
        (real.LLAMA_CHAT_COLD, None, (48, 8, 0)),
        (real.LLAMA_CHAT_WARM, None, (48, 8, 47)),
        (real.LLAMA_CHAT_STREAM_WARM, Framing.SSE, (48, 4, 47)),
        (real.LLAMA_COMPLETIONS_WARM, None, (12, 3, 11)),
        (real.LLAMA_RESPONSES_STREAM_WARM, Framing.SSE, (47, 3, 46)),
        # Anthropic's input_tokens leaves the cached tokens out: the prompt is both together
        (real.LLAMA_MESSAGES_WARM, None, (48, 4, 47)),
        (real.LLAMA_MESSAGES_STREAM_WARM, Framing.SSE, (48, 4, 47)),
    ],
)
def test_llama_cpp_states_the_prompt_tokens_it_found_cached_in_every_dialect(
    answer: bytes, framing: Framing | None, said: tuple[int, int, int]
) -> None:
    """docs/behaviour.md §12.2: what the real llama-server said of a prompt sent twice, read as
    it said it: the whole prompt, the completion and the part of the prompt it found cached (a
    cold prompt's stated 0 is a count, not unknown)."""
    chunks = events_of(answer) if framing is not None else [answer]
    usage = metered(chunks, framing)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == said


def test_a_llama_cpp_stream_without_its_usage_chunk_states_its_counts_in_timings() -> None:
    """Without ``include_usage`` llama-server sends no usage chunk: its finish chunk's
    ``timings`` say how many prompt tokens it found cached (``cache_n``) and how many it read
    (``prompt_n``), so the prompt is both together, and how many it generated."""
    usage = metered(events_of(real.LLAMA_CHAT_STREAM_TIMINGS_ONLY))
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (48, 3, 47)
    assert usage.engine_rate == pytest.approx(20.0176155)


def test_ollama_states_no_cached_count_so_it_stays_unknown() -> None:
    """Ollama 0.9.3 found the prompt cached (its prompt took 0.14 s, not 3.7) but says so
    nowhere: its ``prompt_eval_count`` is still the whole prompt, and the cached count is
    unknown, never 0."""
    usage = metered([real.OLLAMA_CHAT_WARM], None)
    assert (usage.prompt_tokens, usage.completion_tokens) == (48, 4)
    assert usage.cached_tokens is None


def test_a_removed_usage_chunk_keeps_its_cached_count() -> None:
    """The usage chunk the proxy asked for on the client's behalf is removed on the way
    (§12.2), and its cached count is kept with the others."""
    chunks = events_of(real.LLAMA_CHAT_STREAM_WARM)
    out, noted = strip(chunks)
    usage = metered(events_of(out))
    assert (usage.prompt_tokens, usage.cached_tokens) == (None, None)
    completed = usage.noted(noted[0])
    assert (completed.prompt_tokens, completed.cached_tokens) == (48, 47)


def test_counts_without_a_cached_count_leave_it_unknown() -> None:
    """An answer stating its prompt and nothing of a cache (an OpenAI stream's usage without
    details, the proxy's own Messages translation) has an unknown cached count."""
    translated = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 0, "output_tokens": 0}}},
        {"type": "content_block_delta", "delta": {"text": "x"}},
        {"type": "message_delta", "usage": {"input_tokens": 30, "output_tokens": 4}},
    ]
    for usage in (metered(OPENAI_STREAM), metered(sse(*translated))):
        assert usage.prompt_tokens is not None and usage.cached_tokens is None
    assert metered(OPENAI_STREAM[:3]).cached_tokens is None


def test_streams_metered_at_once_keep_their_own_unfinished_lines() -> None:
    """Each stream's meter holds its own unfinished line: two streams whose first content line
    is cut across two reads, fed turn about, each find their first content and counts."""
    clock = Ticks()
    other = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
    streams = [b"".join(OPENAI_STREAM), b"".join(sse(delta("Hi"), other))]
    meters = [UsageMeter(Framing.SSE, clock), UsageMeter(Framing.SSE, clock)]
    cuts = [stream.index(b"Hel" if n == 0 else b"Hi") for n, stream in enumerate(streams)]
    for n, meter in enumerate(meters):
        meter.feed(streams[n][: cuts[n]])
    for n, meter in enumerate(meters):
        meter.feed(streams[n][cuts[n] :])
    first, second = (meter.end() for meter in meters)
    assert (first.first_content_at, first.prompt_tokens, first.completion_tokens) == (1.0, 11, 3)
    assert (second.first_content_at, second.prompt_tokens, second.completion_tokens) == (2.0, 7, 2)


def test_whole_answers_and_embeddings() -> None:
    whole = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": USAGE["usage"]})
    usage = metered([whole[:10].encode(), whole[10:].encode()], None)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.first_content_at) == (11, 3, 1.0)
    embed = json.dumps({"embeddings": [[0.1]], "prompt_eval_count": 4}).encode()
    assert metered([embed], None).prompt_tokens == 4
    legacy = json.dumps({"embedding": [0.1]}).encode()
    assert metered([legacy], None).prompt_tokens is None


def test_a_stream_cut_before_its_counts_leaves_them_unknown() -> None:
    usage = metered(OPENAI_STREAM[:3])
    assert (usage.prompt_tokens, usage.completion_tokens) == (None, None)
    assert usage.first_content_at is not None and usage.tokens_per_second() is None


def test_only_the_tail_is_kept_after_the_first_content() -> None:
    """The meter's memory stays bounded on a long stream, and the counts at its end are read."""
    meter = UsageMeter(Framing.SSE, Ticks())
    for _ in range(20_000):
        meter.feed(b'data: {"choices":[{"delta":{"content":"token"}}]}\n\n')
    for chunk in sse(USAGE):
        meter.feed(chunk)
    assert len(meter._tail) <= 64
    assert meter.end().completion_tokens == 3


def test_a_stream_read_whole_gives_its_first_content_past_many_silent_lines() -> None:
    """The first content is looked for line by line however far into one read it is (the read
    is split a window at a time, not whole)."""
    silent = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}] * 500
    usage = metered([b"".join(sse(*silent, delta("x"), USAGE))])
    assert (usage.first_content_at, usage.completion_tokens) == (1.0, 3)


LINE_ENDS = pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])


@LINE_ENDS
def test_counts_at_the_head_of_a_last_line_longer_than_the_tail_read_are_read(end: bytes) -> None:
    """The counts are read from the stream's last ``END_BYTES``; the line crossing their start is
    read whole, so a final frame that states its counts before a long answer still gives them,
    in one read or many."""
    answer = {"usage": RESPONSES_USAGE, "output": [{"text": "x" * (2 * END_BYTES)}]}
    final = {"type": "response.completed", "response": answer}
    events = sse(delta("x"), final)
    stream = [e.replace(b"\n", end) for e in events]
    for chunks in ([b"".join(stream)], stream):
        usage = metered(chunks)
        assert (usage.prompt_tokens, usage.completion_tokens) == (5, 9)


@LINE_ENDS
def test_counts_further_from_the_end_than_the_tail_read_are_not_read(end: bytes) -> None:
    """Only the stream's last ``END_BYTES`` are read for counts, however the stream was read."""
    events = sse(delta("x"), USAGE, *[delta("y" * 1000)] * (END_BYTES // 1000 + 1))
    chunks = [e.replace(b"\n", end) for e in events]
    for read in ([b"".join(chunks)], chunks):
        assert metered(read).completion_tokens is None


@pytest.mark.parametrize("shift", range(-8, 9))
def test_a_count_name_at_any_distance_from_the_end_is_found(shift: int) -> None:
    """The counts' names are looked for near the end first, then through the rest: a name lying
    across that edge, or before it, is found all the same."""
    frame = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    at = frame.index(b"usage")
    pad = NEAR_END - (len(frame) - at) + shift  # bytes after the frame: the name meets the edge
    text = frame + b": " + b"x" * (pad - 3) + b"\n"
    said = _last_counts(b'data: {"x":1}\n\n' + text)
    assert (said.prompt, said.completion) == (1, 2)


def strip(chunks: list[bytes]) -> tuple[bytes, list[dict[str, Any]]]:
    noted: list[dict[str, Any]] = []
    stripper = UsageStripper(b"text/event-stream", noted.append)
    out = b"".join(stripper.feed(c) for c in chunks) + stripper.end()
    return out, noted


def test_the_stripper_removes_only_the_usage_chunk_and_hands_it_on() -> None:
    out, noted = strip(OPENAI_STREAM)
    assert out == b"".join(c for c in OPENAI_STREAM if b'"usage"' not in c)
    assert noted == [USAGE]


def test_a_content_chunk_mentioning_usage_is_left_alone() -> None:
    chunks = sse(delta('the "usage" of words'), USAGE)
    out, _ = strip(chunks)
    assert out == chunks[0] + chunks[-1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), max_size=12))
def test_any_split_of_the_stream_is_stripped_alike(cuts: list[int]) -> None:
    whole = b"".join(OPENAI_STREAM)
    points = sorted({c % len(whole) for c in cuts})
    pieces = [whole[a:b] for a, b in zip([0, *points], [*points, len(whole)], strict=True)]
    out, noted = strip([p for p in pieces if p])
    assert out == b"".join(c for c in OPENAI_STREAM if b'"usage"' not in c)
    assert noted == [USAGE]


def test_usage_chunks_of_one_read_are_all_removed_and_handed_on_in_stream_order() -> None:
    """The read is searched from its end; every usage chunk in it goes, content that mentions
    ``"usage"`` stays, and ``noted`` sees the chunks in the order the engine sent them."""
    first = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    chunks = sse(delta("a"), first, delta('the "usage" of words'), USAGE, delta("b"))
    out, noted = strip([b"".join(chunks)])
    assert out == chunks[0] + chunks[2] + chunks[4] + chunks[5]
    assert noted == [first, USAGE]


def test_renaming_then_stripping_chain() -> None:
    chunks = sse({"model": "local", **delta("x")}, {"model": "local", **USAGE})
    chain = Chain(renamer("local", "public", b"text/event-stream"), UsageStripper(None))
    out = b"".join(chain.feed(c) for c in chunks) + chain.end()
    assert b'"local"' not in out and b'"usage"' not in out and out.endswith(b"data: [DONE]\n\n")


def test_asks_usage() -> None:
    assert asks_usage({"stream_options": {"include_usage": True}})
    assert not asks_usage({"stream_options": {"include_usage": False}})
    assert not asks_usage({})


def test_events_ended_by_crlf_pass_at_once_and_lose_only_the_usage_chunk() -> None:
    """SSE may end its events with CRLF blank lines: nothing is held back for them."""
    crlf = [c.replace(b"\n", b"\r\n") for c in OPENAI_STREAM]
    noted: list[dict[str, Any]] = []
    stripper = UsageStripper(b"text/event-stream", noted.append)
    assert stripper.feed(crlf[1]) == crlf[1]
    out = stripper.feed(b"".join(crlf[2:])) + stripper.end()
    assert out == b"".join(c for c in crlf[2:] if b'"usage"' not in c)
    assert noted == [USAGE]


@pytest.mark.parametrize("kind", [[1], {"a": 1}])
def test_a_frame_whose_type_is_not_a_string_is_silent_not_a_crash(kind: Any) -> None:
    # An engine's frame is read strictly (docs/behaviour.md §14): a "type" that is a list or an
    # object states nothing; it must not raise out of the relay.
    odd = {"type": kind, "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    usage = metered(sse(odd, delta("hi"), odd))
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 2)
    whole = metered([json.dumps(odd).encode()], framing=None)
    assert (whole.prompt_tokens, whole.completion_tokens) == (5, 2)


def test_an_engine_rate_that_is_not_finite_is_not_taken() -> None:
    # A learnt rate is shared with the fleet and shown in nodes/list as JSON: an infinite one
    # would stick in the node's mean for good and is no JSON number (docs/behaviour.md §15.1).
    stats = {
        "input_tokens": 100,
        "total_output_tokens": 5,
        "tokens_per_second": 20.0,
        "time_to_first_token_seconds": 1e-320,  # 100 over it overflows to inf
    }
    lmstudio = metered([json.dumps({"choices": [], "stats": stats}).encode()], framing=None)
    assert lmstudio.prompt_tokens == 100
    assert lmstudio.engine_prefill is None
    timings = b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2},'
    timings += b' "timings": {"predicted_per_second": Infinity, "prompt_per_second": 1e999}}'
    llama = metered([timings], framing=None)
    assert (llama.engine_rate, llama.engine_prefill) == (None, None)


_CONTENT_FRAMES: list[tuple[dict[str, Any], bool]] = [
    ({"message": {"content": "x"}}, True),  # Ollama chat
    ({"message": {"thinking": "x"}}, True),
    ({"message": {"tool_calls": [{"function": {}}]}}, True),
    ({"message": {"content": "", "thinking": "", "tool_calls": []}}, False),
    ({"message": "x"}, False),
    ({"response": "x"}, True),  # Ollama generate
    ({"response": ""}, False),
    ({"response": ["x"]}, False),
    ({"choices": [{"delta": {"content": "x"}}]}, True),  # OpenAI chat
    ({"choices": [{"delta": {"reasoning_content": "x"}}]}, True),
    ({"choices": [{"delta": {"tool_calls": [{}]}}]}, True),
    ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False),
    ({"choices": [{"delta": "x"}]}, False),
    ({"choices": [{"text": "x"}]}, True),  # OpenAI completions
    ({"choices": [{"text": ""}]}, False),
    ({"choices": [{"finish_reason": "stop"}, {"delta": {"content": "x"}}]}, False),
    ({"choices": []}, False),
    ({"choices": ["x"]}, False),
    ({"choices": {"delta": {"content": "x"}}}, False),
    ({"type": "response.output_text.delta"}, True),  # Responses
    ({"type": "content_block_delta"}, True),  # Anthropic Messages
    ({"type": "response.completed"}, False),
    ({"type": "message_start"}, False),
    ({}, False),
]


@pytest.mark.parametrize(("frame", "content"), _CONTENT_FRAMES)
def test_a_frame_carries_content_when_it_holds_text_thinking_or_a_tool_call(
    frame: dict[str, Any], content: bool
) -> None:
    """The first such frame is the answer's first token (§12.2), in each dialect's shape; an
    empty role delta, a finish frame or a lifecycle event is not one."""
    assert _has_content(frame) is content


_WORDS = st.sampled_from(["hi", " there", "usage", "eval_count", "stats", "é", "\n", '"', "{"])


@st.composite
def _metered_streams(draw: st.DrawFn) -> tuple[Framing, list[bytes], int, int, int]:
    """A streamed answer (OpenAI SSE or Ollama NDJSON, LF, CRLF or CR line ends): frames without
    content first (one maybe longer than the look window), then content, then the counts; cut
    into reads anywhere. Also where its first content frame's line ends, and its counts."""
    sse, end = draw(st.booleans()), draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    pad = "x" * draw(st.sampled_from([0, 40, 5000]))
    texts = draw(st.lists(st.lists(_WORDS, min_size=1, max_size=4).map("".join), min_size=1))
    prompt, completion = draw(st.integers(1, 10**6)), draw(st.integers(1, 10**6))
    if sse:
        lead: list[dict[str, Any]] = [
            {"choices": [{"delta": {"role": "assistant", "content": ""}}], "pad": pad}
        ]
        said: list[dict[str, Any]] = [{"choices": [{"delta": {"content": t}}]} for t in texts]
        final: list[dict[str, Any]] = [
            {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
        ]
        lines = [
            b"data: " + json.dumps(f, ensure_ascii=False).encode() for f in lead + said + final
        ]
        lines = [*lines, b"data: [DONE]"]
        stream = b"".join(line + end + end for line in lines)
    else:
        lead = [{"message": {"role": "assistant", "content": ""}, "done": False, "pad": pad}]
        said = [{"message": {"content": text}, "done": False} for text in texts]
        counts = {"prompt_eval_count": prompt, "eval_count": completion}
        final = [{"message": {"content": ""}, "done": True, **counts}]
        stream = b"".join(json.dumps(f).encode() + end for f in lead + said + final)
    first_line = stream.index(b'"content": ' + json.dumps(texts[0], ensure_ascii=not sse).encode())
    first_end = min(
        i for i in (stream.find(b"\n", first_line), stream.find(b"\r", first_line)) if i >= 0
    )
    cuts = sorted(set(draw(st.lists(st.integers(1, len(stream) - 1), max_size=12))))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    framing = Framing.SSE if sse else Framing.NDJSON
    return framing, reads, first_end, prompt, completion


@settings(max_examples=300)
@given(_metered_streams())
def test_any_split_of_a_stream_meters_its_counts_and_the_read_of_its_first_content(
    case: tuple[Framing, list[bytes], int, int, int],
) -> None:
    """The meter (§12.2) reads the counts the stream's last frame states and times the first
    content at the read that completes its line, however the stream is cut into reads."""
    framing, reads, first_end, prompt, completion = case
    now = [0]
    meter = UsageMeter(framing, lambda: float(now[0]))
    offset, first_read = 0, None
    for index, data in enumerate(reads):
        now[0] = index
        meter.feed(data)
        if first_read is None and offset <= first_end < offset + len(data):
            first_read = index
        offset += len(data)
    now[0] = len(reads)
    usage = meter.end()
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    assert usage.first_content_at == first_read
    assert usage.last_at == len(reads)


@given(st.lists(st.sampled_from([b"x" * 3000, b"ab", b"", b"\n", b"\r\n", b"\r"]), max_size=12))
def test_the_look_windows_hold_every_line_of_the_run_in_order(pieces: list[bytes]) -> None:
    """Split a few KiB at a time or not, the lines looked at are the run's lines (a CRLF cut
    after its CR gives an empty line, which holds no frame)."""
    run = b"".join(pieces) + b"\n"
    seen = [line for window in _windows(run) for line in window if line]
    assert seen == [line for line in run.splitlines() if line]
