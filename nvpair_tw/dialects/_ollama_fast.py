# -*- test-case-name: tests.dialects.test_answers -*-
"""The fast path of :class:`~nvpair_tw.dialects._ollama_stream.OllamaStream`: plain content
events (nothing but one non-empty content delta of choice 0) recognised on their bytes and their
JSON string literal copied into the Ollama chunk, without parsing the event.

- :func:`content_literal`: one event's content literal, or None.
- :func:`matched_run`: a run of such whole events at the start of a read, by regular expression.
- :class:`Learned`: the bytes around the content learned from a stream's first plain event, and
  the runs of later events split and counted on them (no regular expression).
"""

from __future__ import annotations

import re

__all__ = ["Learned", "content_literal", "matched_run"]

_CHOICE_DELTA = b'"choices":[{"index":0,"delta":{'
_ROLE = b'"role":"assistant",'
_CONTENT = b'"content":"'
_REST = b'},"finish_reason":null}]}'
_REST_LOGPROBS = b'},"logprobs":null,"finish_reason":null}]}'


def content_literal(event: bytes) -> bytes | None:
    """The JSON string literal of the content, when ``event`` holds nothing but one non-empty
    content delta of choice 0 in the member order Ollama, vLLM and LM Studio send
    (``{<members without objects>,"choices":[{"index":0,"delta":{["role":"assistant",]"content":
    "…"}[,"logprobs":null],"finish_reason":null}]}``); else None (and the event is parsed). The
    literal is copied into the Ollama chunk as it is: JSON escapes are the same in both."""
    at = event.find(_CHOICE_DELTA)
    if at < 0:
        return None
    start = at + 31
    if event.startswith(_ROLE, start):
        start += 19
    if not event.startswith(_CONTENT, start):
        return None
    start += 10  # the opening quote
    end = start + 1
    while True:
        end = event.find(b'"', end)
        if end < 0:
            return None
        back = end - 1
        while event[back] == 92:  # a backslash
            back -= 1
        if (end - 1 - back) % 2 == 0:
            break
        end += 1
    rest = len(event) - end - 1
    if end == start + 1 or not (
        (rest == len(_REST) and event.endswith(_REST))
        or (rest == len(_REST_LOGPROBS) and event.endswith(_REST_LOGPROBS))
    ):
        return None
    # the members before "choices" hold no object (no usage, no error): "{" only at the start
    if event.find(b"{", 1, at) >= 0:
        return None
    return event[start : end + 1]


# One whole one-line SSE event that content_literal() copies (the same shape: members without
# objects before "choices", choice 0's delta with an optional role and a non-empty content string,
# an optional null logprobs, a null finish_reason, nothing after): group 1 is the content literal.
# No newline or CR inside, so a run of these is a run of whole events, each "data: …\n\n".
_EVENT = (
    rb'data: \{[^{\n\r]*"choices":\[\{"index":0,"delta":\{(?:"role":"assistant",)?"content":'
    rb'("(?:[^"\\\n\r]|\\[^\n\r])+")\}(?:,"logprobs":null)?,"finish_reason":null\}\]\}\n\n'
)
_EVENTS = re.compile(_EVENT)
_RUN = re.compile(rb"(?:" + _EVENT + rb")+")
# The body of a non-empty JSON string with escapes (no unescaped quote, no lone last backslash).
_BODY = re.compile(rb'(?:[^"\\\n\r]|\\[^\n\r])+')


def matched_run(data: bytes) -> tuple[int, list[bytes]] | None:
    """The end of the run of whole plain content events that starts ``data`` and their content
    string bodies (without their quotes); None when ``data`` does not start with one."""
    run = _RUN.match(data)
    if run is None:
        return None
    end = run.end()
    return end, [b[1:-1] for b in _EVENTS.findall(data, 0, end)]


class Learned:
    """The plain content event's bytes around its content, learned from the stream."""

    __slots__ = ("_prefix", "_quotes", "_sep", "_suffix")

    def __init__(self) -> None:
        self._prefix = self._suffix = self._sep = b""
        self._quotes = 0

    def learn(self, data: bytes) -> None:
        """The bytes around the content of the plain event that starts ``data``: engines repeat
        them in every event of a stream (id, object, created, model; the rest of the choice)."""
        event = _EVENTS.match(data)
        if event is not None:
            start, end = event.span(1)
            prefix, suffix = data[: start + 1], data[end - 1 : event.end()]
            self._prefix, self._suffix, self._sep = prefix, suffix, suffix + prefix
            self._quotes = prefix.count(b'"') + suffix.count(b'"')

    def run(self, data: bytes) -> tuple[int, list[bytes] | None]:
        """The content string bodies (without their quotes) of the run of events that starts
        ``data`` when every one of them is the learned prefix, a non-empty JSON string body and
        the learned suffix (so each is an event :func:`content_literal` copies); with the end
        of the run. Splitting and counting only (no regular expression over the events): every
        newline is an event's end, every quote is the prefix's or the suffix's (or escaped, in
        a body checked on its own)."""
        prefix, suffix = self._prefix, self._suffix
        if not prefix or not data.startswith(prefix):
            return 0, None
        end = len(data)
        size = len(prefix)
        if data.endswith(suffix) and data.count(b"\n") == 2:
            # one event (what most engines send per read): no search for the separator, whose
            # set-up alone costs more than the event
            if end < size + len(suffix) or data.find(b"\r") >= 0:
                return 0, None
            bodies = [data[size : end - len(suffix)]]
        else:
            if not data.endswith(suffix):
                # a read that ends inside an event, or with other events (finish, usage, [DONE])
                end = data.rfind(suffix) + len(suffix)
                if end < len(suffix):
                    return 0, None
            # (bytes.split with the long prefix + suffix separator is slow: split at each
            # suffix, then check that every suffix but the last is followed by the prefix)
            events = data[:end].split(suffix)
            events.pop()  # the empty rest after the last suffix
            count = len(events)
            if (
                data.count(b"\n", 0, end) != 2 * count
                or data.find(b"\r", 0, end) >= 0
                or data.count(self._sep, 0, end) != count - 1
            ):
                return 0, None
            bodies = [event[size:] for event in events]
        count = len(bodies)
        quotes = data.count(b'"', 0, end)
        if data.find(b"\\", 0, end) >= 0:
            for body in bodies:
                if b"\\" in body:
                    if _BODY.fullmatch(body) is None:
                        return 0, None
                    quotes -= body.count(b'"')
        if quotes != count * self._quotes or b"" in bodies:
            return 0, None
        return end, bodies
