"""Tests for nvpair_tw.corridor._terminal: terminal frames of SSE and NDJSON streams, across any chunking."""

from __future__ import annotations

import json

import pytest

from nvpair_tw.corridor._terminal import BATCH, TerminalFrameDetector

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"

OPENAI_STREAM = (
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
    b"data: [DONE]\n\n"
)
ANTHROPIC_EVENT_STREAM = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","delta":{"text":"hi"}}\n\n'
    b"event: message_stop\n\n"
)
ANTHROPIC_DATA_STREAM = (
    b'data: {"type":"content_block_delta","delta":{"text":"hi"}}\n\n'
    b'data: {"type": "message_stop"}\n\n'
)
RESPONSES_STREAM = (
    b"event: response.created\n"
    b'data: {"type":"response.created","response":{"id":"resp_1"}}\n\n'
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","delta":"response.completed"}\n\n'
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"id":"resp_1"}}\n\n'
)
OLLAMA_STREAM = (
    b'{"model":"m","message":{"role":"assistant","content":"Hel"},"done":false}\n'
    b'{"model":"m","message":{"role":"assistant","content":"lo"},"done":false}\n'
    b'{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}\n'
)


def feed_all(detector: TerminalFrameDetector, chunks: list[bytes]) -> TerminalFrameDetector:
    for chunk in chunks:
        detector.feed(chunk)
    return detector


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def byte_by_byte(data: bytes) -> list[bytes]:
    return pieces(data, 1)


@pytest.mark.parametrize(
    ("content_type", "stream"),
    [
        (SSE, OPENAI_STREAM),
        (SSE, ANTHROPIC_EVENT_STREAM),
        (SSE, ANTHROPIC_DATA_STREAM),
        (SSE, RESPONSES_STREAM),
        (NDJSON, OLLAMA_STREAM),
    ],
)
def test_terminal_frame_is_seen_whole_and_byte_by_byte(content_type: str, stream: bytes) -> None:
    """Each terminal frame is found in one chunk and when split byte by byte."""
    assert feed_all(TerminalFrameDetector(content_type), [stream]).seen
    assert feed_all(TerminalFrameDetector(content_type), byte_by_byte(stream)).seen


@pytest.mark.parametrize(
    ("content_type", "stream"),
    [
        (SSE, OPENAI_STREAM),
        (SSE, ANTHROPIC_EVENT_STREAM),
        (SSE, ANTHROPIC_DATA_STREAM),
        (NDJSON, OLLAMA_STREAM),
    ],
)
def test_crlf_line_ends_are_accepted(content_type: str, stream: bytes) -> None:
    """CRLF line ends work as LF ones do, even with the CR and LF in different chunks."""
    crlf = stream.replace(b"\n", b"\r\n")
    assert feed_all(TerminalFrameDetector(content_type), [crlf]).seen
    cr_then_lf = crlf.replace(b"\r\n", b"\r\0\n").split(b"\0")
    assert feed_all(TerminalFrameDetector(content_type), cr_then_lf).seen
    assert feed_all(TerminalFrameDetector(content_type), byte_by_byte(crlf)).seen


@pytest.mark.parametrize(
    ("content_type", "stream"),
    [
        (SSE, OPENAI_STREAM),
        (SSE, ANTHROPIC_EVENT_STREAM),
        (SSE, ANTHROPIC_DATA_STREAM),
        (NDJSON, OLLAMA_STREAM),
    ],
)
def test_stream_cut_before_its_terminal_frame_is_not_seen(content_type: str, stream: bytes) -> None:
    """Everything up to the terminal line (a truncated answer) never counts as complete."""
    cut = stream[: stream.rstrip(b"\n").rfind(b"\n") + 1]
    assert not feed_all(TerminalFrameDetector(content_type), [cut]).seen
    assert not feed_all(TerminalFrameDetector(content_type), byte_by_byte(cut)).seen


def test_terminal_frame_split_across_arbitrary_chunk_boundaries() -> None:
    """Every two-way split of a stream still finds the terminal frame."""
    for stream, content_type in ((OPENAI_STREAM, SSE), (OLLAMA_STREAM, NDJSON)):
        for cut in range(len(stream) + 1):
            detector = feed_all(TerminalFrameDetector(content_type), [stream[:cut], stream[cut:]])
            assert detector.seen, (content_type, cut)


def test_responses_stream_ends_at_any_of_its_three_terminal_events() -> None:
    """``response.completed``, ``response.failed`` and ``response.incomplete`` end a Responses API
    stream, as an ``event:`` line or as the ``data:`` object's type; a delta that mentions one and
    ``response.in_progress`` do not."""
    head = RESPONSES_STREAM.rsplit(b"event: response.completed", 1)[0]
    assert not feed_all(TerminalFrameDetector(SSE), byte_by_byte(head)).seen
    assert not feed_all(
        TerminalFrameDetector(SSE), [b'data: {"type":"response.in_progress"}\n\n']
    ).seen
    for kind in (b"response.completed", b"response.failed", b"response.incomplete"):
        assert feed_all(TerminalFrameDetector(SSE), [head, b"event: " + kind + b"\n\n"]).seen
        data = b'data: {"type":"' + kind + b'","response":{}}\n\n'
        assert feed_all(TerminalFrameDetector(SSE), byte_by_byte(head + data)).seen


def test_lm_studio_chat_stream_ends_at_chat_end() -> None:
    """LM Studio's ``/api/v1/chat`` stream ends with its ``chat.end`` event (docs/behaviour.md
    §5.3: a conversation is recorded only then); ``message.end`` and a delta mentioning it do not."""
    head = (
        b'event: chat.start\ndata: {"type":"chat.start","model_instance_id":"m"}\n\n'
        b'event: message.delta\ndata: {"type":"message.delta","content":"chat.end"}\n\n'
        b'event: message.end\ndata: {"type":"message.end"}\n\n'
    )
    assert not feed_all(TerminalFrameDetector(SSE), byte_by_byte(head)).seen
    end = b'event: chat.end\ndata: {"type":"chat.end","result":{"output":[]}}\n\n'
    assert feed_all(TerminalFrameDetector(SSE), byte_by_byte(head + end)).seen
    assert feed_all(TerminalFrameDetector(SSE), [head, b"event: chat.end\n\n"]).seen


@pytest.mark.parametrize(
    "line",
    [
        b'data: {"choices":[{"delta":{"content":"[DONE]"}}]}',
        b'data: {"choices":[{"delta":{"content":"message_stop"}}]}',
        b'data: {"type":"message_delta","note":"message_stop"}',
        b"event: content_block_stop",
        b": comment [DONE]",
        b"id: message_stop",
    ],
)
def test_sse_lines_that_only_mention_the_marker_are_not_terminal(line: bytes) -> None:
    """Text that merely contains ``[DONE]`` or ``message_stop`` is not a terminal frame."""
    assert not feed_all(TerminalFrameDetector(SSE), [line + b"\n\n"]).seen


@pytest.mark.parametrize(
    "line",
    [
        {"model": "m", "message": {"content": '"done": true'}, "done": False},
        {"model": "m", "message": {"tool_calls": [{"arguments": {"done": True}}]}, "done": False},
        {"model": "m", "done": "true"},
        {"model": "m", "done": 1},
        {"done": "yes", "message": {"args": {"done": True}}},
        ["done", True],
        [{"done": True}],
    ],
)
def test_ndjson_lines_without_top_level_done_true_are_not_terminal(line: object) -> None:
    """Only a top-level ``"done": true`` (the boolean) ends an NDJSON stream."""
    detector = TerminalFrameDetector(NDJSON)
    detector.feed(json.dumps(line).encode() + b"\n")
    assert not detector.seen


def test_ndjson_done_with_spaces_is_terminal() -> None:
    """``"done" : true`` with whitespace, as a pretty encoder writes it, is terminal."""
    assert feed_all(TerminalFrameDetector(NDJSON), [b'{"done" : true}\n']).seen


def test_sse_data_without_space_is_terminal() -> None:
    """``data:[DONE]`` (no optional space) is terminal, as the SSE format allows."""
    assert feed_all(TerminalFrameDetector(SSE), [b"data:[DONE]\n\n"]).seen


def test_sse_markers_are_not_terminal_in_an_ndjson_stream() -> None:
    """The frame grammar follows the content type: ``data: [DONE]`` does not end NDJSON."""
    assert not feed_all(TerminalFrameDetector(NDJSON), [b"data: [DONE]\n\n"]).seen
    assert not feed_all(TerminalFrameDetector(SSE), [b'{"done":true}\n']).seen


@pytest.mark.parametrize(
    ("content_type", "streaming"),
    [
        ("text/event-stream", True),
        ("Text/Event-Stream; charset=utf-8", True),
        ("text/event-stream; charset=utf-8; profile=x", True),
        ("application/x-ndjson", True),
        (" APPLICATION/X-NDJSON ;charset=UTF-8", True),
        ("application/json", False),
        ("text/plain", False),
        ("", False),
        (None, False),
    ],
)
def test_streaming_follows_the_media_type(content_type: str | None, streaming: bool) -> None:
    """SSE and NDJSON are streams (case and parameters ignored); anything else is not."""
    assert TerminalFrameDetector(content_type).streaming is streaming


def test_non_streaming_body_is_ignored() -> None:
    """For a non-stream content type feed does nothing and seen stays False."""
    detector = feed_all(TerminalFrameDetector("application/json"), [b'{"done":true}\n'])
    assert not detector.seen
    assert detector.buffered == 0


def test_only_the_unfinished_tail_is_buffered() -> None:
    """Complete lines are dropped; just the partial last line is kept."""
    detector = TerminalFrameDetector(NDJSON)
    detector.feed(b'{"done":false}\n{"done":false}\n{"do')
    assert detector.buffered == len(b'{"do')
    detector.feed(b'ne":false}\n')
    assert detector.buffered == 0
    assert not detector.seen


def test_buffer_is_capped_for_an_endless_line() -> None:
    """A line without an end never holds more than max_line_bytes."""
    detector = TerminalFrameDetector(NDJSON, max_line_bytes=1000)
    for _ in range(100):
        detector.feed(b"x" * 700)
    assert detector.buffered == 1000
    detector.feed(b"\n")
    assert detector.buffered == 0
    assert not detector.seen


def test_oversized_final_ollama_frame_is_seen() -> None:
    """A final frame longer than the cap (a huge ``context``) is recognised from its head."""
    final = json.dumps(
        {"model": "m", "response": "", "done": True, "context": list(range(300_000))}
    ).encode()
    detector = TerminalFrameDetector(NDJSON, max_line_bytes=4096)
    for piece in pieces(final, 1000):
        detector.feed(piece)
        assert detector.buffered <= 4096
    detector.feed(b"\n")
    assert detector.seen


def test_oversized_line_with_nested_or_quoted_done_is_not_terminal() -> None:
    """In an over-long line only a top-level ``"done": true`` counts, not one in text or nesting."""
    line = json.dumps(
        {
            "message": {"content": 'say "done": true', "args": {"done": True}},
            "done": False,
            "context": list(range(10_000)),
        }
    ).encode()
    detector = feed_all(TerminalFrameDetector(NDJSON, max_line_bytes=200), pieces(line + b"\n", 50))
    assert not detector.seen


def test_oversized_line_with_done_past_the_cap_is_not_terminal() -> None:
    """A ``"done": true`` beyond the kept head cannot be seen (memory stays bounded)."""
    line = b'{"padding":"' + b"x" * 500 + b'","done":true}'
    detector = feed_all(TerminalFrameDetector(NDJSON, max_line_bytes=100), pieces(line + b"\n", 50))
    assert not detector.seen


def test_long_line_within_one_chunk_is_parsed_whole() -> None:
    """A complete line inside one chunk is not subject to the cap: it is examined in full."""
    line = b'{"padding":"' + b"x" * 500 + b'","done":true}\n'
    assert feed_all(TerminalFrameDetector(NDJSON, max_line_bytes=100), [line]).seen


def test_seen_stays_true_after_the_terminal_frame() -> None:
    """Bytes after the terminal frame change nothing and are not buffered."""
    detector = feed_all(TerminalFrameDetector(SSE), [b"data: [DONE]\n\n", b"trailing junk"])
    assert detector.seen
    assert detector.buffered == 0


def test_finish_examines_an_unterminated_last_line() -> None:
    """At a clean end of body a final line without a newline still counts."""
    detector = TerminalFrameDetector(NDJSON)
    detector.feed(b'{"done":false}\n{"done":true}')
    assert not detector.seen
    detector.finish()
    assert detector.seen


def test_finish_without_a_terminal_tail_leaves_seen_false() -> None:
    """finish on an unfinished non-terminal line does not mark the stream complete."""
    detector = TerminalFrameDetector(SSE)
    detector.feed(b'data: {"choices":[]}')
    detector.finish()
    assert not detector.seen


def test_max_line_bytes_must_be_positive() -> None:
    """A cap below one byte is rejected with a clear error; one byte is allowed."""
    with pytest.raises(ValueError, match=r"^max_line_bytes must be at least 1$"):
        TerminalFrameDetector(SSE, max_line_bytes=0)
    assert feed_all(TerminalFrameDetector(NDJSON, max_line_bytes=1), [b'{"done":true}\n']).seen


@pytest.mark.parametrize(
    ("head", "terminal"),
    [
        (b'{"a":[],"done":true,', True),
        (b'{"a":{},"done":true,', True),
        (b'{"a":[{}],"b":{"c":[]},"done":true,', True),
        (b'{"a":{"b":{},"done":true},', False),
        (b'{"a":1}{"done":true,', False),
        (b'"text" {"done":true,', False),
    ],
)
def test_oversized_line_head_counts_containers_to_find_a_top_level_done(
    head: bytes, terminal: bool
) -> None:
    """In an over-long line's head, closed arrays and objects before ``"done": true`` leave it at
    the top level; one inside a nested object, or after the first value has closed, is not."""
    line = head + b'"padding":"' + b"x" * 500 + b'"}\n'
    detector = feed_all(TerminalFrameDetector(NDJSON, max_line_bytes=100), pieces(line, 30))
    assert detector.seen is terminal


@pytest.mark.parametrize(
    ("content_type", "chunks"),
    [
        (SSE, [b"data: [DO", b"NE]\nid: 7\n\n"]),
        (NDJSON, [b'{"model":"m","done":', b'true}\n{"model":"m"}\n']),
    ],
)
def test_terminal_line_completed_by_a_chunk_that_carries_more_lines(
    content_type: str, chunks: list[bytes]
) -> None:
    """A chunk that ends the held terminal line and goes on with further lines: the held line is
    judged on its own bytes alone."""
    assert feed_all(TerminalFrameDetector(content_type), chunks).seen


@pytest.mark.parametrize(
    ("content_type", "last_line"),
    [
        (NDJSON, b'{"done": true, "message": {"content": "cut'),
        (SSE, b"data: a reply that mentions [DONE]"),
    ],
)
def test_finish_does_not_take_a_last_line_that_only_looks_terminal(
    content_type: str, last_line: bytes
) -> None:
    """At the end of the body an unterminated last line must really be a terminal frame: broken
    JSON with ``"done": true`` in it, or text mentioning the marker, is not."""
    detector = TerminalFrameDetector(content_type)
    detector.feed(last_line)
    detector.finish()
    assert not detector.seen


def test_a_held_line_of_exactly_the_cap_is_judged_whole() -> None:
    """A held line exactly ``max_line_bytes`` long is not truncated: it is parsed as JSON (here
    invalid, so not terminal) rather than judged on its head."""
    line = b'{"done":true,}'
    detector = TerminalFrameDetector(NDJSON, max_line_bytes=len(line))
    detector.feed(line)
    assert detector.buffered == len(line)
    detector.feed(b"\n")
    assert not detector.seen


@pytest.mark.parametrize(
    ("content_type", "event", "terminal"),
    [
        (SSE, b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', b"data: [DONE]\n\n"),
        (NDJSON, b'{"message":{"content":"x"},"done":false}\n', b'{"done":true}\n'),
    ],
)
def test_lines_are_examined_in_batches_and_every_one_counts(
    content_type: str, event: bytes, terminal: bytes
) -> None:
    """Complete lines wait to be examined in batches of about ``BATCH`` bytes: a terminal frame
    anywhere in a batch, even followed by more than a batch of other lines, is seen, and nothing
    is examined twice or skipped at a batch's edge."""
    detector = TerminalFrameDetector(content_type)
    for _ in range(BATCH // len(event) + 1):
        detector.feed(event)
    assert not detector.seen
    detector.feed(terminal)
    for _ in range(2 * (BATCH // len(event) + 1)):
        detector.feed(event)
    assert detector.seen
    assert detector.buffered == 0


def test_what_waits_unexamined_stays_below_a_batch() -> None:
    """Complete lines are examined as soon as a batch is full, so at most ``BATCH`` bytes of them
    wait between two chunks; reading ``seen`` examines what waits."""
    event = b'{"done":false,"pad":"' + b"x" * (128 - 24) + b'"}\n'
    assert len(event) == 128 and BATCH % 128 == 0
    detector = TerminalFrameDetector(NDJSON)
    for count in range(1, 3 * BATCH // 128 + 1):
        detector.feed(event)
        assert detector.waiting == (count * 128) % BATCH
    detector.feed(event)
    assert detector.waiting == 128
    assert not detector.seen
    assert detector.waiting == 0


def test_finish_judges_an_oversized_unterminated_final_frame_on_its_head() -> None:
    """A final Ollama frame longer than the cap and without its newline is judged on its head at
    the end of the body."""
    final = json.dumps({"done": True, "context": list(range(5_000))}).encode()
    detector = feed_all(TerminalFrameDetector(NDJSON, max_line_bytes=100), pieces(final, 64))
    detector.finish()
    assert detector.seen


def test_an_event_line_that_is_not_utf8_is_not_terminal_and_no_error() -> None:
    """An ``event:`` line with bytes that are not UTF-8 is read with replacements: never an
    error on the relay's path, and not a terminal event."""
    assert not feed_all(TerminalFrameDetector(SSE), [b"event: message_stop\xff\n\n"]).seen


@pytest.mark.parametrize(
    "line", [b'data: {"type": ["message_stop"]}', b'data: {"type": {"response.completed": 1}}']
)
def test_an_sse_type_that_is_not_a_string_is_not_terminal_and_does_not_raise(line: bytes) -> None:
    # An engine's frame is hostile input (docs/behaviour.md §14): an odd "type" is no ending.
    detector = TerminalFrameDetector("text/event-stream")
    detector.feed(line + b"\n\n")
    assert detector.seen is False
    detector.feed(b"data: [DONE]\n\n")
    assert detector.seen is True


@pytest.mark.parametrize(
    ("content_type", "terminal", "mention"),
    [
        (SSE, b"data: [DONE]\n\n", b'data: {"choices":[{"delta":{"content":"[DONE]"}}]}\n\n'),
        (SSE, b'data: {"type":"message_stop"}\n\n', b'data: {"text":"message_stop"}\n\n'),
        (NDJSON, b'{"done":true}\n', b'{"message":{"content":"true"},"done":false}\n'),
    ],
)
def test_a_terminal_frame_followed_by_lines_that_only_mention_its_marker_is_seen(
    content_type: str, terminal: bytes, mention: bytes
) -> None:
    """A batch is searched from its end, line by line back to its start: lines after the
    terminal frame that hold its marker without being terminal do not hide it."""
    detector = TerminalFrameDetector(content_type)
    detector.feed(mention + terminal + mention * 3)
    assert detector.seen
