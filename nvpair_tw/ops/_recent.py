# -*- test-case-name: tests.ops.test_board -*-
"""What the status page keeps of requests, from their ``request/phase`` events and their
``proxy/request`` records (docs/operations.md, "The status page"), every part bounded.

- In flight: each request's last phase event, as the exchange published it (its phase, node,
  model, key's name), until its record ends it; at most :data:`MAX_IN_FLIGHT` (the oldest is
  dropped first, should a record never come).
- Recent: the last :data:`RECENT` records, newest first, as rows: status, verdict, node, why that
  node, time to first token, tokens per second, model, key name, path, error code.
- Counts since start by key and by model (:class:`~nvpair_tw.ops._tally.Tally`). A record that
  names no model (one that failed before an answer began) is counted under the model its phase
  events named, if any.
- Per node: the last :data:`TTFT_SAMPLES` times to first token (of answers below 400), and how its last attempt went
  (:class:`Contact`: from the records' attempts, and from a phase event or a fan-out's progress
  saying the node answered), which is all the proxy knows of a node it does not poll.
- Per node, its prompt cache over its last :data:`CACHE_SAMPLES` answers (:class:`Cached`): the
  prompt tokens of those whose engine said what it found cached, the cached ones, and how many
  answers went to it because the proxy expected it to hold the prompt's prefix.

Nothing of a body, a prompt or a key is here: records and phase events carry none.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from enum import Enum
from statistics import median
from typing import Any

from attrs import frozen

from nvpair_tw.events import (
    AttemptOutcome,
    FanOutProgress,
    PartState,
    Phase,
    ProxyRequest,
    RequestPhase,
)
from nvpair_tw.ops._tally import Tally, Verdict, verdict_of

__all__ = [
    "CACHE_SAMPLES",
    "MAX_IN_FLIGHT",
    "RECENT",
    "TTFT_SAMPLES",
    "Cached",
    "Contact",
    "LastContact",
    "RequestBook",
]

RECENT = 50
"""Records in the recent-requests panel."""
MAX_IN_FLIGHT = 4096
"""Requests in flight followed at once (more than the facades' connection limit)."""
TTFT_SAMPLES = 20
"""Times to first token kept per node for its median."""
CACHE_SAMPLES = 20
"""Answers per node its prompt cache is shown over."""

NodeKey = tuple[str, str]
"""``(engine, node_id)``."""


class Contact(Enum):
    """How the proxy's last attempt to a node went, as far as reaching it goes."""

    CONNECTED = "connected"
    """The node took the connection (whatever it answered, or failed to)."""
    NO_CONNECTION = "no-connection"
    """The connection could not be made (refused, no route, a connect timeout)."""


_NOT_CONTACT = frozenset({AttemptOutcome.CANCELLED, AttemptOutcome.UNFINISHED})
_ANSWERED = frozenset({Phase.READING_PROMPT, Phase.STREAMING})
"""The phases a request reaches once its node has answered."""


@frozen
class LastContact:
    """A node's last contact, and since when (clock seconds) its contacts have been so."""

    contact: Contact
    since: float


@frozen
class Cached:
    """What one answer said of the node's prompt cache: its prompt tokens and the cached ones
    (None: the engine did not say), and whether the proxy expected the node to hold its prefix."""

    prompt: int | None
    cached: int | None
    expected: bool

    @classmethod
    def of(cls, record: ProxyRequest) -> Cached:
        return cls(record.prompt_tokens, record.cached_tokens, record.cache_affinity)


def _cache_json(answers: list[Cached]) -> dict[str, int]:
    """``{"answers", "stated", "promptTokens", "cachedTokens", "expectedWarm"}``: the prompt and
    cached tokens summed over the answers whose engine said both."""
    stated = [a for a in answers if a.prompt is not None and a.cached is not None]
    return {
        "answers": len(answers),
        "stated": len(stated),
        "promptTokens": sum(a.prompt or 0 for a in stated),
        "cachedTokens": sum(a.cached or 0 for a in stated),
        "expectedWarm": sum(a.expected for a in answers),
    }


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _ttft(record: ProxyRequest) -> int | None:
    """The record's time to first token, where its answer was one (a status below 400): the
    time a node took to answer 503 is no time to a first token."""
    status = record.status
    return record.ttft_ms if status is not None and status < 400 else None


_Ended = tuple[ProxyRequest, float, str | None, Verdict]
"""A recent request as it ended: its record, when (clock seconds), the model it is counted under
and its verdict, as a tuple (a value made per request costs more than one): its row is made when
the page asks (:func:`_row`), not per request."""


def _row(ended: _Ended) -> dict[str, Any]:
    """The request's row in the recent-requests panel."""
    record, at, model, verdict = ended
    attempts = record.attempts
    node = record.node_id or (attempts[-1].node_id if attempts else None)
    chosen = record.chosen_by
    return {
        "at": _ms(at),
        "id": record.id,
        "engine": record.engine,
        "status": record.status,
        "verdict": verdict.value,
        "node": node,
        "chosenBy": None if chosen is None else chosen.value,
        "ttftMs": _ttft(record),
        "tokensPerS": record.tokens_per_s,
        "promptTokens": record.prompt_tokens,
        "cachedTokens": record.cached_tokens,
        "expectedWarm": record.cache_affinity,
        "model": model,
        "key": record.key,
        "method": record.method,
        "path": record.path,
        "error": record.error,
        "durationMs": record.duration_ms,
        "attempts": len(attempts),
    }


class RequestBook:
    """Requests in flight and recent, their counts, and what they told of each node."""

    def __init__(self) -> None:
        self.in_flight: OrderedDict[str, RequestPhase] = OrderedDict()
        self.recent: deque[_Ended] = deque(maxlen=RECENT)
        self.by_key = Tally("key")
        self.by_model = Tally("model")
        self._ttft: dict[NodeKey, deque[int]] = {}
        self._cache: dict[NodeKey, deque[ProxyRequest]] = {}
        self._contacts: dict[NodeKey, LastContact] = {}

    def phase(self, event: RequestPhase) -> None:
        """A request moved to another phase (or node)."""
        self.in_flight[event.id] = event
        self.in_flight.move_to_end(event.id)
        while len(self.in_flight) > MAX_IN_FLIGHT:
            self.in_flight.popitem(last=False)
        if event.phase in _ANSWERED and event.node_id is not None:
            self._contact((event.engine, event.node_id), Contact.CONNECTED, event.since / 1000)

    def fan_out(self, event: FanOutProgress, at: float) -> None:
        """A fan-out moved on: a node whose part runs or succeeded has answered."""
        for part in event.parts:
            if part.state in (PartState.RUNNING, PartState.SUCCEEDED):
                self._contact((event.engine, part.node_id), Contact.CONNECTED, at)

    def record(self, record: ProxyRequest, at: float) -> None:
        """A request ended (``at``: its record's publish time, clock seconds)."""
        last = self.in_flight.pop(record.id, None)
        model = record.model or (last.model if last is not None else None)
        verdict = verdict_of(record)
        self.by_key.add(record.key, verdict)
        self.by_model.add(model, verdict)
        self.recent.appendleft((record, at, model, verdict))
        self._learn(record, at)

    def _learn(self, record: ProxyRequest, at: float) -> None:
        """Each attempt's contact with its node, the served node's time to first token."""
        for attempt in record.attempts:
            outcome = attempt.outcome
            if outcome in _NOT_CONTACT:
                continue
            refused = outcome is AttemptOutcome.CONNECT_ERROR
            contact = Contact.NO_CONNECTION if refused else Contact.CONNECTED
            self._contact((record.engine, attempt.node_id), contact, at)
        ttft, node_id = _ttft(record), record.node_id
        if ttft is not None and node_id is not None:
            key = (record.engine, node_id)
            samples = self._ttft.get(key)
            if samples is None:
                samples = self._ttft[key] = deque(maxlen=TTFT_SAMPLES)
            samples.append(ttft)
        status = record.status
        if node_id is not None and record.model is not None and status is not None and status < 400:
            key = (record.engine, node_id)
            answers = self._cache.get(key)
            if answers is None:
                answers = self._cache[key] = deque(maxlen=CACHE_SAMPLES)
            answers.append(record)  # its `Cached` is made when the page asks

    def _contact(self, key: NodeKey, contact: Contact, at: float) -> None:
        before = self._contacts.get(key)
        if before is None or before.contact is not contact:
            self._contacts[key] = LastContact(contact, at)

    def contact(self, engine: str, node_id: str) -> LastContact | None:
        """How the last attempt to the node went, or None if no request has tried it."""
        return self._contacts.get((engine, node_id))

    def ttft(self, engine: str, node_id: str) -> dict[str, int] | None:
        """``{"medianMs", "lastMs", "samples"}`` over the node's last answers, None before any."""
        samples = self._ttft.get((engine, node_id))
        if not samples:
            return None
        return {"medianMs": round(median(samples)), "lastMs": samples[-1], "samples": len(samples)}

    def cache(self, engine: str, node_id: str) -> dict[str, int] | None:
        """The node's prompt cache over its last answers (:func:`_cache_json`), None before any."""
        answers = self._cache.get((engine, node_id))
        return _cache_json([Cached.of(record) for record in answers]) if answers else None

    def forget(self, known: set[NodeKey]) -> None:
        """Drop what is kept of nodes no longer in any directory (bounds it by the nodes)."""
        for book in (self._ttft, self._cache, self._contacts):
            for key in [k for k in book if k not in known]:
                del book[key]

    def to_json(self) -> dict[str, Any]:
        """``{"inFlight": [phase events, oldest first], "recent": [rows, newest first],
        "byKey": [...], "byModel": [...]}``."""
        return {
            "inFlight": [event.to_json() for event in self.in_flight.values()],
            "recent": [_row(ended) for ended in self.recent],
            "byKey": self.by_key.to_json(),
            "byModel": self.by_model.to_json(),
        }
