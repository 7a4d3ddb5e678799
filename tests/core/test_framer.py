"""The one framer of streamed answers: line ends, the bound on a held line, SSE events, the stream
errors and what a frame is written as."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair_tw.core import (
    AnswerTooLarge,
    Events,
    Framing,
    Lines,
    MalformedStream,
    ProxyBug,
    StreamCut,
    after_last_event,
    dump,
    event_end,
    line_around,
    line_start,
    media_type,
)

pytestmark = pytest.mark.timeout(60)


def feed_all(lines: Lines, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(lines.feed(chunk))
    rest = lines.rest()
    return [*out, rest] if rest else out


def test_lf_crlf_and_cr_each_end_a_line() -> None:
    lines = Lines(100)
    assert not lines.truncated
    assert lines.feed(b"a\nb\r\nc\rd\n") == [b"a", b"b", b"c", b"d"]


def test_blank_lines_are_lines() -> None:
    assert Lines(100).feed(b"a\n\nb\r\n\r\n\r\r") == [b"a", b"", b"b", b"", b"", b""]


def test_a_crlf_split_across_two_reads_is_one_line_end() -> None:
    lines = Lines(100)
    assert lines.feed(b"a\r") == [b"a"]
    assert not lines.idle
    assert lines.feed(b"") == []
    assert lines.feed(b"\nb\n") == [b"b"]
    assert lines.idle


def test_a_cr_then_a_read_without_lf_starts_the_next_line() -> None:
    lines = Lines(100)
    assert lines.feed(b"a\r") == [b"a"]
    assert lines.feed(b"b\n") == [b"b"]


def test_a_lone_lf_after_a_cr_read_ends_nothing_more() -> None:
    lines = Lines(100)
    lines.feed(b"a\r")
    assert lines.feed(b"\n") == []
    assert lines.held == 0


def test_the_unfinished_line_is_held_until_its_end() -> None:
    lines = Lines(100)
    assert lines.feed(b"ab") == []
    assert lines.held == 2
    assert lines.feed(b"c") == []
    assert lines.feed(b"d\ne") == [b"abcd"]
    assert lines.held == 1
    assert lines.rest() == b"e"
    assert lines.held == 0
    assert lines.rest() == b""


def test_complete_hands_whole_lines_back_as_one_run_with_their_ends() -> None:
    lines = Lines(100)
    chunk = b"a\r\nb\n"
    assert lines.complete(chunk) is chunk  # nothing held: the read itself, no copy
    assert lines.complete(b"c\rd") == b"c\r"
    assert lines.complete(b"e\n") == b"de\n"


def test_a_held_line_past_the_bound_keeps_its_head() -> None:
    lines = Lines(4)
    assert lines.feed(b"abc") == []
    assert not lines.over
    assert lines.feed(b"de") == []
    assert lines.over
    assert lines.held == 4
    assert lines.feed(b"fgh") == []
    assert lines.held == 4
    assert lines.feed(b"ij\nkl\n") == [b"abcd", b"kl"]
    assert lines.truncated
    assert not lines.over
    assert lines.feed(b"m\n") == [b"m"]
    assert not lines.truncated


def test_a_cut_line_ended_by_cr_keeps_the_lines_after_it() -> None:
    lines = Lines(2)
    lines.feed(b"abc")
    assert lines.feed(b"d\re\nf") == [b"ab", b"e"]
    assert lines.truncated


def test_a_cut_line_ended_by_crlf_is_one_line() -> None:
    lines = Lines(2)
    lines.feed(b"abc")
    assert lines.feed(b"d\r\ne\n") == [b"ab", b"e"]


def test_a_held_line_of_exactly_the_bound_is_whole() -> None:
    lines = Lines(3)
    lines.feed(b"abc")
    assert not lines.over
    assert lines.feed(b"\n") == [b"abc"]
    assert not lines.truncated


def test_a_line_within_one_read_is_never_bounded() -> None:
    lines = Lines(2)
    assert lines.feed(b"abcdef\nxy") == [b"abcdef"]
    assert not lines.over


def test_the_rest_of_a_cut_line_is_its_head() -> None:
    lines = Lines(2)
    lines.feed(b"abc")
    assert lines.rest() == b"ab"
    assert lines.truncated
    assert lines.rest() == b""
    assert not lines.truncated


def test_clear_forgets_the_held_line_and_a_half_seen_crlf() -> None:
    lines = Lines(2)
    lines.feed(b"a\rbcd")
    lines.clear()
    assert lines.held == 0
    assert not lines.over
    assert lines.idle
    assert lines.feed(b"\n") == [b""]


def test_the_bound_is_at_least_one_byte() -> None:
    with pytest.raises(ValueError, match=r"^a line bound must be at least 1 byte$"):
        Lines(0)
    assert Lines(1).feed(b"x\n") == [b"x"]


@given(
    st.lists(st.sampled_from([b"ab", b"c", b"\n", b"\r", b"\r\n", b"", b"d\n"]), max_size=30),
    st.data(),
)
def test_lines_do_not_depend_on_where_reads_are_split(
    parts: list[bytes], data: st.DataObject
) -> None:
    whole = b"".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=6)))
    chunks = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    assert feed_all(Lines(1000), chunks) == whole.splitlines()


def test_events_join_data_lines_and_skip_everything_else() -> None:
    events = Events(1000)
    got = events.feed(b"retry: 5\n:c\ndata: a\ndata:b\r\nevent: x\n\ndata: tail")
    assert got == [b"a\nb"]
    assert not events.idle
    assert events.end() == [b"tail"]
    assert events.idle


def test_a_one_line_event_read_alone_is_its_data() -> None:
    events = Events(1000)
    assert events.feed(b'data: {"a":1}\n\n') == [b'{"a":1}']
    assert events.idle


def test_an_event_not_followed_by_its_blank_line_counts_at_the_end() -> None:
    events = Events(1000)
    assert events.feed(b"data: [DONE]\n") == []
    assert events.end() == [b"[DONE]"]


def test_events_end_nothing_when_nothing_is_held() -> None:
    assert Events(10).end() == []


def test_events_with_cr_line_ends() -> None:
    events = Events(1000)
    assert events.feed(b"data: a\r") == []
    assert events.feed(b"\r") == [b"a"]
    assert events.feed(b"\ndata: b\r\r") == [b"b"]


def test_an_unfinished_line_past_the_bound_is_over() -> None:
    events = Events(10)
    assert events.feed(b"data: " + b"x" * 20) == []
    assert events.over
    with pytest.raises(AnswerTooLarge, match="passed 10 bytes"):
        events.check()


def test_an_event_whose_data_passes_the_bound_is_over_even_when_whole() -> None:
    events = Events(10)
    events.feed(b"data: 123456\ndata: 123456\n\n")
    assert events.over
    small = Events(12)
    small.feed(b"data: 123456\ndata: 123456\n\n")
    assert not small.over
    small.check()


def test_a_one_line_event_longer_than_the_bound_is_over() -> None:
    events = Events(4)
    assert events.feed(b"data: 12345\n\n") == [b"12345"]
    assert events.over


def test_events_held_counts_the_line_and_the_gathered_data() -> None:
    events = Events(100)
    events.feed(b"data: abc\ndata: de")
    assert events.held == 3 + len(b"data: de")


def test_stream_errors_are_one_hierarchy() -> None:
    assert issubclass(AnswerTooLarge, StreamCut)
    assert issubclass(MalformedStream, StreamCut)
    assert not issubclass(ProxyBug, StreamCut)


def test_a_proxy_bug_names_what_the_reader_raised() -> None:
    cause = KeyError("x")
    bug = ProxyBug(cause)
    assert bug.error is cause
    assert str(bug) == "a stream reader failed: KeyError: 'x'"


def test_dump_is_compact_utf8() -> None:
    assert dump({"a": ["é", 1]}) == '{"a":["é",1]}'.encode()


@pytest.mark.parametrize(
    ("content_type", "media", "framing"),
    [
        (b"Text/Event-Stream; charset=utf-8", b"text/event-stream", Framing.SSE),
        (b" application/x-ndjson ", b"application/x-ndjson", Framing.NDJSON),
        (b"application/json", b"application/json", None),
        (None, b"", None),
    ],
)
def test_media_types_and_framings(
    content_type: bytes | None, media: bytes, framing: Framing | None
) -> None:
    assert media_type(content_type) == media
    assert Framing.of(content_type) is framing
    text = None if content_type is None else content_type.decode()
    assert Framing.of(text) is framing


def test_event_ends_after_lf_crlf_and_cr_lines() -> None:
    data = b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d"
    assert after_last_event(data) == data.index(b"data: d")
    assert after_last_event(data, data.index(b"data: c")) == data.index(b"data: c")
    assert after_last_event(b"data: a") == 0
    assert event_end(data, data.index(b"b")) == data.index(b"data: c")
    assert event_end(data, 0) == len(b"data: a\n\n")
    assert event_end(data, data.index(b"data: d")) == len(data)


def test_a_held_line_grows_by_every_read() -> None:
    lines = Lines(100)
    lines.feed(b"ab")
    lines.feed(b"c")
    assert lines.held == 3
    assert not lines.truncated


def test_a_run_after_a_cut_line_is_not_truncated() -> None:
    lines = Lines(2)
    lines.feed(b"abc")
    lines.feed(b"\n")
    assert lines.truncated
    assert lines.feed(b"x\ny") == [b"x"]
    assert not lines.truncated


@pytest.mark.parametrize(
    ("rest", "expected"),
    [
        (b"\nx\n", [b"ab", b"x"]),
        (b"\rx\n", [b"ab", b"x"]),
        (b"d\re\rf\n", [b"ab", b"e", b"f"]),
        (b"d\ne\rf\n", [b"ab", b"e", b"f"]),
    ],
)
def test_a_cut_line_ends_at_its_first_line_end(rest: bytes, expected: list[bytes]) -> None:
    lines = Lines(2)
    lines.feed(b"abc")
    assert lines.feed(rest) == expected


def test_end_gives_the_unfinished_line_as_a_line() -> None:
    lines = Lines(100)
    lines.feed(b"a\nb")
    assert lines.end() == [b"b"]
    assert lines.end() == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"data: a\ndata: b\n\n", [b"a\nb"]),
        (b"data: x\r\n\n", [b"x"]),
        (b"data: x\n\n\n", [b"x"]),
    ],
)
def test_a_read_that_only_looks_like_one_one_line_event(data: bytes, expected: list[bytes]) -> None:
    """Reads starting with ``data: `` and ending with a blank line that are not one LF-ended data
    line take the general way: several lines, a CR, a blank line more."""
    events = Events(1000)
    assert events.feed(data) == expected
    assert events.held == 0
    assert events.idle


def test_a_one_line_event_read_completes_the_event_gathered_before() -> None:
    events = Events(1000)
    assert events.feed(b"data: a\n") == []
    assert events.feed(b"data: b\n\n") == [b"a\nb"]


def test_a_proxy_bug_chains_its_cause() -> None:
    cause = ValueError("x")
    assert ProxyBug(cause).__cause__ is cause


def test_media_type_ignores_every_parameter_and_odd_characters() -> None:
    assert media_type(b"text/event-stream; a=b; c=d") == b"text/event-stream"
    assert Framing.of("application/x-ndjson; x=\u2603") is Framing.NDJSON


def test_event_ends_at_the_start_and_the_first_end_after_a_point() -> None:
    data = b"\n\ndata: a\n\ndata: b\n\ndata: c"
    assert after_last_event(data) == data.index(b"data: c")
    assert after_last_event(b"\n\ndata: x") == 2
    assert event_end(data, 0) == 2
    assert event_end(data, 2) == data.index(b"data: b")


def test_the_line_around_a_point_ends_at_lf_cr_or_crlf_and_an_open_one_at_the_end() -> None:
    data = b"a\r\ndata: [DONE]\rnext\nlast"
    head, end = line_around(data, data.index(b"[DONE]"))
    assert data[head:end] == b"data: [DONE]"
    head, end = line_around(data, data.index(b"last") + 2)
    assert data[head:end] == b"last"
    assert line_around(data, 0) == (0, 1)


@pytest.mark.parametrize(
    ("text", "at", "start"),
    [
        (b"ab", 0, 0),
        (b"ab", -5, 0),
        (b"ab", 1, 0),
        (b"\nab", 1, 1),
        (b"\nab", 2, 1),
        (b"\n\rab", 3, 2),
        (b"a\r\nbc", 4, 3),
        (b"a\rbc", 3, 2),
        (b"a\nb\rc", 5, 4),
    ],
)
def test_a_line_starts_after_the_last_lf_or_cr_before_the_point(
    text: bytes, at: int, start: int
) -> None:
    """The usage meter reads the counts from the line crossing its tail's start, whole (§12.2);
    a point before the data is in its first line."""
    assert line_start(text, at) == start
