# -*- test-case-name: tests.dialects.test_usage -*-
"""Token counts from the engines' own numbers, and the first content, read off the client-bound
bytes (docs/behaviour.md §12.2, §12.3). Never by tokenising.

:class:`UsageMeter` watches the answer the client gets, in the client's dialect (after any
translation):

=================================  ==========================================================
route family                       where the counts are
=================================  ==========================================================
Ollama ``/api/chat``, ``generate``  the final object: ``prompt_eval_count``, ``eval_count``
                                    (and ``eval_duration`` for the engine's own rate)
Ollama ``/api/embed``               ``prompt_eval_count``
OpenAI chat / completions, v0       ``usage`` (a stream's usage chunk), cached:
                                    ``prompt_tokens_details.cached_tokens``; llama.cpp's
                                    ``timings``: ``predicted_per_second`` for the rate, and in
                                    a stream without a usage chunk the counts (``cache_n``
                                    cached plus ``prompt_n`` read, ``predicted_n``)
OpenAI / v0 embeddings              ``usage.prompt_tokens``
``/v1/responses``                   ``response.completed``'s ``response.usage`` (whole: ``usage``)
                                    ``input_tokens`` / ``output_tokens``, cached:
                                    ``input_tokens_details.cached_tokens``
``/v1/messages``                    ``message_start``'s ``input_tokens``, ``message_delta``'s
                                    ``output_tokens`` (whole: ``usage``); cached:
                                    ``cache_read_input_tokens``, which Anthropic's
                                    ``input_tokens`` leaves out (the prompt is the sum, with
                                    ``cache_creation_input_tokens``)
=================================  ==========================================================

The prompt tokens the engine found in its cache (``cached_tokens``) are read only where it says
so: Ollama (0.9.3, and its source to v0.33) and LM Studio state none, so theirs stay unknown
(None), never 0.

The cost is at the stream's ends: the first lines are parsed until one carries content (its time
is the first token), then only the last 64 chunks are kept, and the counts are read from them when
the stream ends, parsing from the end only the lines that name a count. A stream cut before its counts leaves them unknown (None), never zero.

:class:`UsageStripper` removes the usage chunk the proxy asked for itself (the client did not ask
for ``stream_options.include_usage``), so the client receives the stream it asked for; the test per
chunk is a search for the last event's end and one substring search, and only a chunk holding
``"usage"`` is parsed.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from attrs import frozen

from nvpair_tw.core import (
    EVENT_ENDS,
    Framing,
    Lines,
    after_last_event,
    event_end,
    line_around,
    line_start,
)

__all__ = ["Chain", "Usage", "UsageMeter", "UsageStripper", "asks_usage"]

TAIL = 64 << 10
"""The longest unfinished first line looked at for the first content."""
END_BYTES = 16 << 10
"""The bytes of a stream's end its counts are looked for in (a usage chunk or a final object
is well under 1 KiB)."""
NEAR_END = 1 << 10
"""The end of a stream searched first for a count's name (the last frame or two)."""
TAIL_CHUNKS = 64
"""Chunks of a stream's end kept to read its counts from."""
LOOK_WINDOW = 4 << 10
"""Bytes of a read's complete lines split at a time while looking for the first content."""
WHOLE_CAP = 8 << 20
"""A whole answer longer than this is not parsed for its counts (they stay unknown)."""


@frozen
class Counts:
    """What one frame states: token counts and the engine's own timings (None where silent):
    its decode rate, its prefill rate (prompt tokens a second) and the seconds it spent loading
    the model for this answer (docs/behaviour.md §15.1)."""

    prompt: int | None = None
    completion: int | None = None
    rate: float | None = None
    prefill: float | None = None
    load: float | None = None
    cached: int | None = None
    """The prompt tokens the engine says it found cached (part of ``prompt``)."""

    @property
    def stated(self) -> bool:
        return self.prompt is not None or self.completion is not None


_SILENT = Counts()


@frozen
class Usage:
    """What one answer said of its tokens: counts (None: unknown), the clock time of its first
    content-bearing chunk and of its last chunk, and the engine's own generation rate."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_content_at: float | None = None
    last_at: float | None = None
    engine_rate: float | None = None
    engine_prefill: float | None = None
    """The engine's own prompt tokens a second (Ollama ``prompt_eval_*``, llama.cpp
    ``timings.prompt_per_second``)."""
    engine_load: float | None = None
    """Seconds the engine says it spent loading the model for this answer (Ollama
    ``load_duration``)."""
    paced: bool = False
    """Whether the answer came as a stream, token by token: only then do its first and last
    content times measure a rate (a whole JSON answer's arrive together)."""
    cached_tokens: int | None = None
    """The prompt tokens the engine says it found in its cache (part of ``prompt_tokens``);
    None when it said nothing of a cache."""

    def noted(self, frame: dict[str, Any]) -> Usage:
        """These counts completed by a usage frame removed on the way (:class:`UsageStripper`)."""
        said = _counts(frame)
        return Usage(
            self.prompt_tokens if said.prompt is None else said.prompt,
            self.completion_tokens if said.completion is None else said.completion,
            self.first_content_at,
            self.last_at,
            self.engine_rate if said.rate is None else said.rate,
            self.engine_prefill if said.prefill is None else said.prefill,
            self.engine_load if said.load is None else said.load,
            self.paced,
            self.cached_tokens if said.cached is None else said.cached,
        )

    def tokens_per_second(self) -> float | None:
        """The engine's own rate where given, else completion tokens over first-to-last token."""
        if self.engine_rate is not None:
            return self.engine_rate
        if not self.paced or self.completion_tokens is None or self.first_content_at is None:
            return None
        if self.last_at is None or self.last_at <= self.first_content_at:
            return None
        return self.completion_tokens / (self.last_at - self.first_content_at)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _has_content(event: dict[str, Any]) -> bool:
    """Whether a frame carries generated content (text, thinking or a tool call)."""
    message = event.get("message")
    if isinstance(message, dict) and (
        message.get("content") or message.get("thinking") or message.get("tool_calls")
    ):
        return True
    if event.get("response") and isinstance(event.get("response"), str):
        return True
    choices = event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        delta = first.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        ):
            return True
        if first.get("text"):
            return True
    kind = event.get("type")
    return kind in ("response.output_text.delta", "content_block_delta")


def _per_second(count: int | None, nanoseconds: int | None) -> float | None:
    return count / (nanoseconds / 1e9) if count and nanoseconds else None


def _counts(event: dict[str, Any]) -> Counts:
    """What one frame or whole answer states (:class:`Counts`; None where silent)."""
    if "prompt_eval_count" in event or "eval_count" in event:
        count, prompt = _int(event.get("eval_count")), _int(event.get("prompt_eval_count"))
        loading = _int(event.get("load_duration"))
        return Counts(
            prompt,
            count,
            _per_second(count, _int(event.get("eval_duration"))),
            _per_second(prompt, _int(event.get("prompt_eval_duration"))),
            None if loading is None else loading / 1e9,
        )
    kind = event.get("type")
    member = _ANSWER_IN.get(kind) if isinstance(kind, str) else None
    inner = event.get(member) if member is not None else None
    event = inner if isinstance(inner, dict) else event
    usage, stats, timings = event.get("usage"), event.get("stats"), event.get("timings")
    stats = stats if isinstance(stats, dict) else {}
    timings = timings if isinstance(timings, dict) else {}
    if not isinstance(usage, dict):
        if stats:
            return _lmstudio_counts(stats)
        return _timings_counts(timings) if timings else _SILENT
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    cached = _cached(usage, timings)
    if "cache_read_input_tokens" in usage and prompt is not None:
        # Anthropic's input_tokens is the part read after the cache (and written to it)
        prompt += (cached or 0) + (_int(usage.get("cache_creation_input_tokens")) or 0)
    return Counts(
        prompt,
        _int(usage.get("completion_tokens", usage.get("output_tokens"))),
        _rate(timings.get("predicted_per_second")) or _rate(stats.get("tokens_per_second")),
        _rate(timings.get("prompt_per_second")) or _prefill(prompt, stats),
        cached=cached,
    )


def _cached(usage: dict[str, Any], timings: dict[str, Any]) -> int | None:
    """The prompt tokens found cached, as an answer's ``usage`` says (OpenAI chat and
    completions, Responses, Anthropic), else as llama.cpp's ``timings`` do; None when silent."""
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    if isinstance(details, dict) and "cached_tokens" in details:
        return _int(details["cached_tokens"])
    if "cache_read_input_tokens" in usage:
        return _int(usage["cache_read_input_tokens"])
    return _int(timings.get("cache_n"))


def _timings_counts(timings: dict[str, Any]) -> Counts:
    """llama.cpp's ``timings`` alone (a stream without its usage chunk): ``cache_n`` prompt tokens
    found cached and ``prompt_n`` read, ``predicted_n`` generated."""
    cached, read = _int(timings.get("cache_n")), _int(timings.get("prompt_n"))
    return Counts(
        None if cached is None or read is None else cached + read,
        _int(timings.get("predicted_n")),
        _rate(timings.get("predicted_per_second")),
        _rate(timings.get("prompt_per_second")),
        cached=cached,
    )


_ANSWER_IN = {"response.completed": "response", "message_start": "message", "chat.end": "result"}
"""The member in which an event of each type keeps the answer that states counts: the Responses
API's ``response.completed``, Anthropic's ``message_start``, LM Studio's ``/api/v1/chat``
``chat.end``."""


def _lmstudio_counts(stats: dict[str, Any]) -> Counts:
    """LM Studio's own ``stats`` (``/api/v1/chat``: ``input_tokens``, ``total_output_tokens``,
    ``tokens_per_second``, ``time_to_first_token_seconds``, ``model_load_time_seconds``)."""
    prompt = _int(stats.get("input_tokens"))
    loading = stats.get("model_load_time_seconds")
    return Counts(
        prompt,
        _int(stats.get("total_output_tokens")),
        _rate(stats.get("tokens_per_second")),
        _prefill(prompt, stats),
        _rate(loading),
    )


def _prefill(prompt: int | None, stats: dict[str, Any]) -> float | None:
    """Prompt tokens a second from LM Studio's time to first token (``/api/v0``:
    ``time_to_first_token``, ``/api/v1``: ``time_to_first_token_seconds``)."""
    first = _rate(stats.get("time_to_first_token_seconds", stats.get("time_to_first_token")))
    return _rate(prompt / first) if prompt and first else None


def _rate(value: Any) -> float | None:
    """A positive finite figure (a JSON ``Infinity``, or a count over a vanishing time, is none)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    return None


_COUNT_MARKS = (b"usage", b"eval_count", b"stats")
"""A frame stating counts holds one of these (the others are never parsed at the end)."""
_NEAR_MARKS = (*_COUNT_MARKS, b"timings")
"""Near the end, also llama.cpp's ``timings`` alone: a stream without its usage chunk states its
counts there, in its finish chunk, the last event before ``[DONE]`` (looked for only near the
end, so a stream stating no count costs no more to end than before)."""


def _last_counts(text: bytes, floor: int = 0) -> Counts:
    """The counts of the last frame of ``text`` stating any, found from the end by searching for a
    count's name (in C) at or after ``floor``; only the lines holding one are parsed (whole)."""
    end = len(text)
    while end > floor:
        mark = _last_mark(text, floor, end)
        if mark < 0:
            break
        start, stop = line_around(text, mark)
        for frame in _frames(text[start:stop]):
            said = _counts(frame)
            if said.stated:
                return said
        end = start
    return _SILENT


def _last_mark(text: bytes, floor: int, end: int) -> int:
    """Where the last count's name in ``text[floor:end]`` starts (-1: none): looked for in the
    last :data:`NEAR_END` bytes first, where the counts are, so the names a dialect never writes
    are not searched for through the whole tail."""
    near = max(floor, end - NEAR_END)
    mark = max(text.rfind(name, near, end) for name in _NEAR_MARKS)
    if mark < 0 and near > floor:
        mark = max(text.rfind(name, floor, end) for name in _COUNT_MARKS)
    return mark


def _frames(text: bytes) -> list[dict[str, Any]]:
    """Every JSON object of NDJSON lines or SSE ``data:`` lines in ``text`` (others skipped)."""
    out: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{"):
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


_UNUSED_TAIL: deque[bytes] = deque(maxlen=0)
_UNUSED_HEAD = Lines(TAIL)


class UsageMeter:
    """Reads counts and the first content from one answer as the client receives it.

    ``framing`` is the answer's stream framing (``Framing.of`` its content type): None when it
    is one JSON document.
    """

    def __init__(self, framing: Framing | None, clock: Callable[[], float]) -> None:
        self._streaming = framing is not None
        self._clock = clock
        # The last chunks (the counts are in the last two events; a deque with a length bound
        # drops the oldest in C, so a chunk costs one append). A whole answer touches neither
        # these nor the head: it shares empty ones, never fed.
        streaming = self._streaming
        self._tail: deque[bytes] = deque(maxlen=TAIL_CHUNKS) if streaming else _UNUSED_TAIL
        self._head = Lines(TAIL) if streaming else _UNUSED_HEAD  # a stream's start, unparsed
        self._looking = True
        self._first: float | None = None
        self._prompt: int | None = None  # a count stated at the stream's start (message_start)
        self._cached: int | None = None  # and the cached part of it
        self._whole: list[bytes] = []
        self._whole_size = 0

    def feed(self, data: bytes) -> None:
        if self._looking and data:
            if not self._streaming:
                self._first = self._clock()
                self._looking = False
            else:
                self._look(data)
        if self._streaming:
            self._tail.append(data)
        else:
            self._whole_size += len(data)
            if self._whole_size <= WHOLE_CAP:
                self._whole.append(data)

    def _look(self, data: bytes) -> None:
        """Parse the stream's complete lines until one carries content."""
        run = self._head.complete(data)
        for line in chain.from_iterable(_windows(run)):  # usually the first line has it
            for frame in _frames(line):
                said = _counts(frame)
                if said.prompt is not None:
                    self._prompt, self._cached = said.prompt, said.cached
                if _has_content(frame):
                    self._first = self._clock()
                    self._looking = False
                    self._head.clear()
                    return
        if self._head.over:  # no line end in sight: give up looking
            self._looking = False
            self._head.clear()

    def end(self) -> Usage:
        """The counts the answer stated (None when it never did, e.g. a stream cut before them)."""
        if self._streaming:
            tail = _last_bytes(self._tail, END_BYTES)
            # The line crossing the start of the last END_BYTES is read whole, not a last read of 50 KiB.
            said = _last_counts(tail, line_start(tail, len(tail) - END_BYTES))
        elif self._whole_size <= WHOLE_CAP:
            whole = b"".join(self._whole).replace(b"\n", b" ").replace(b"\r", b" ")
            said = _last_counts(whole)
        else:
            said = _SILENT
        prompt = self._prompt if said.prompt is None else said.prompt
        cached = self._cached if said.prompt is None else said.cached
        # The answer ends as its last chunk is relayed: that is its last token's time.
        return Usage(
            prompt,
            said.completion,
            self._first,
            self._clock(),
            said.rate,
            said.prefill,
            said.load,
            self._streaming,
            cached,
        )


def _windows(run: bytes) -> Iterator[list[bytes]]:
    """The lines of ``run`` (complete lines), split about :data:`LOOK_WINDOW` bytes at a time:
    the first content is usually in the first line, and a read of a whole stream is not split
    into a line object per event to find it (a line longer than the window is split with the
    rest of the run)."""
    pos, size = 0, len(run)
    while pos < size:
        stop = pos + LOOK_WINDOW
        if stop < size:
            cut = max(run.rfind(b"\n", pos, stop), run.rfind(b"\r", pos, stop)) + 1
            stop = cut if cut > pos else size
        yield run[pos:stop].splitlines()  # a CRLF cut after its CR: the next starts with b""
        pos = stop


def _last_bytes(chunks: deque[bytes], wanted: int) -> bytes:
    """The last chunks joined, as few as hold ``wanted`` bytes (a read can be 50 KiB: joining
    all 64 kept ones at every answer's end cost more than the stream's own relaying)."""
    taken: list[bytes] = []
    size = 0
    for chunk in reversed(chunks):
        taken.append(chunk)
        size += len(chunk)
        if size >= wanted:
            break
    return b"".join(reversed(taken))


def asks_usage(parsed: dict[str, Any]) -> bool:
    """Whether an OpenAI request asked for the usage chunk itself."""
    options = parsed.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


_USAGE = b'"usage"'
"""What a read is searched for, from the end: CPython's ``rfind`` runs about three times faster
than ``in`` or ``find`` over a read of many events (they use a two-way search for a needle this
long); both are C, neither makes a Python object per event."""


class UsageStripper:
    """Removes the usage chunk (``"choices": []`` with ``usage``) from an OpenAI SSE stream the
    client did not ask it for; every other byte passes as it came."""

    def __init__(
        self, content_type: bytes | None, noted: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.content_type = content_type or b"text/event-stream"
        self._held = b""
        self._noted = noted

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return None, None

    def feed(self, data: bytes) -> bytes:
        # Whole events pass on (an engine writes one or more whole events per chunk, so this is
        # one test of the chunk's end and no copy); an unfinished event waits for its end, so a
        # "usage" cut across two chunks is still seen whole.
        # "usage" is searched from the end: see _USAGE.
        if not self._held and data.endswith(EVENT_ENDS) and data.rfind(_USAGE) < 0:
            return data
        if self._held:
            data, self._held = self._held + data, b""
        end = after_last_event(data)
        if end == 0:
            self._held = data
            return b""
        if end != len(data):
            data, self._held = data[:end], data[end:]
        if data.rfind(_USAGE) < 0:
            return data
        return self._without_usage(data)

    def end(self) -> bytes:
        held, self._held = self._held, b""
        return self._without_usage(held)

    def _without_usage(self, events: bytes) -> bytes:
        """``events`` without the usage chunk (handed to ``noted`` for the counts): each
        ``"usage"`` is found in C, from the end (where the usage chunk is, and faster: see
        :data:`_USAGE`), and only the event around it is parsed; chunks removed are
        handed on in the stream's order."""
        removed: list[dict[str, Any]] = []
        at = events.rfind(_USAGE)
        while at >= 0:
            start = after_last_event(events, at)
            end = event_end(events, at)
            frame = _usage_chunk(events[start:end])
            if frame is not None:
                removed.append(frame)
                events = events[:start] + events[end:]
            at = events.rfind(_USAGE, 0, start)
        if self._noted is not None:
            for frame in reversed(removed):
                self._noted(frame)
        return events


def _usage_chunk(event: bytes) -> dict[str, Any] | None:
    frames = _frames(event)
    if len(frames) == 1 and frames[0].get("choices") == [] and "usage" in frames[0]:
        return frames[0]
    return None


class Chain:
    """Two transducers one after the other (renaming, then the usage chunk's removal)."""

    def __init__(self, first: Any, second: Any) -> None:
        self._first = first
        self._second = second
        self.content_type = second.content_type

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return self._first.tokens  # type: ignore[no-any-return]

    def feed(self, data: bytes) -> bytes:
        return self._second.feed(self._first.feed(data))  # type: ignore[no-any-return]

    def end(self) -> bytes:
        return self._second.feed(self._first.end()) + self._second.end()  # type: ignore[no-any-return]
