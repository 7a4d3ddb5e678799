# -*- test-case-name: tests.corridor.test_workloads, tests.corridor.test_exchange_machine -*-
"""What one request's stages found, gathered by its exchange, and the one record made from it.

:class:`Facts` is the exchange's notebook: the stages hand their findings to the exchange as values
(the route's, each attempt's, the relay's), and the exchange writes them here; nothing else holds
it. When the request ends, :meth:`Facts.record` makes the request's one frozen record, the
``proxy/request`` event of docs/behaviour.md §7, which the driver publishes once.
"""

from __future__ import annotations

from attrs import define, field, setters

from nvpair_tw.events import Attempt, AttemptOutcome, Choice, Outcome, ProxyRequest

__all__ = ["AttemptLog", "Facts", "elapsed_ms"]


def _strip_query(path: str) -> str:
    return path.split("?", 1)[0]


def elapsed_ms(start: float, end: float) -> int:
    """Clock seconds ``start`` to ``end`` in whole milliseconds."""
    return round((end - start) * 1000)


@define
class AttemptLog:
    """The attempts of one request: those closed, in order, and the one open now (its node, its
    start and the deadline periods it waited, §6.4)."""

    closed: list[Attempt] = field(factory=list)
    _current: tuple[str, float] | None = field(default=None)
    _busy_waits: int = field(default=0)

    @property
    def current(self) -> str | None:
        """The node of the attempt open now, or None."""
        return self._current[0] if self._current is not None else None

    def start(self, node_id: str, now: float) -> None:
        """An attempt to ``node_id`` starts at ``now`` (one still open is closed ``unfinished``)."""
        self.close(AttemptOutcome.UNFINISHED, now)
        self._current = (node_id, now)
        self._busy_waits = 0

    def busy_wait(self) -> None:
        """The open attempt waits one more deadline period; a no-op if none is open."""
        if self._current is not None:
            self._busy_waits += 1

    def close(self, outcome: Outcome, now: float) -> None:
        """Close the open attempt with ``outcome`` at ``now``; a no-op if none is open."""
        if self._current is None:
            return
        node_id, start = self._current
        self._current = None
        self.closed.append(Attempt(node_id, outcome, elapsed_ms(start, now), self._busy_waits))

    def part(self, node_id: str, outcome: Outcome, since: float, now: float) -> None:
        """One node's part of a fan-out, started at ``since``, ended at ``now``."""
        self.closed.append(Attempt(node_id, outcome, elapsed_ms(since, now)))


@define(on_setattr=setters.NO_OP)
class Facts:
    """What is known of one request so far; ``started`` and the other times are clock seconds.

    Written by the request's exchange only, as its stages report; read once, by :meth:`record`.
    """

    id: str
    engine: str
    method: str
    path: str = field(converter=_strip_query)
    """Never the query string, which can carry secrets."""
    started: float
    key: str | None = None
    model: str | None = None
    model_local: str | None = None
    translated: bool = False
    fallback_from: str | None = None
    context_fit: bool = True
    queued_ms: int = 0
    dispatched_at: float | None = None
    first_byte_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: int | None = None
    tokens_per_s: float | None = None
    predicted_ms: int | None = None
    measured_ms: int | None = None
    fan_out: tuple[str, ...] | None = None
    workload_id: int | None = None
    chosen_by: Choice | None = None
    cache_affinity: bool = False
    warm_node: str | None = None
    attempts: AttemptLog = field(factory=AttemptLog)

    def record(
        self, end: float, status: int | None, node_id: str | None, error: str | None
    ) -> ProxyRequest:
        """The request's one record, ended at clock seconds ``end`` (an attempt still open is
        closed ``unfinished``)."""
        self.attempts.close(AttemptOutcome.UNFINISHED, end)
        first = self.first_byte_at
        return ProxyRequest(
            self.id,
            self.engine,
            node_id,
            self.method,
            self.path,
            status,
            elapsed_ms(self.started, end),
            None if first is None else elapsed_ms(self.started, first),
            error,
            tuple(self.attempts.closed),
            self.cache_affinity,
            self.queued_ms,
            self.fan_out,
            self.fallback_from,
            self.key,
            self.model,
            self.model_local,
            self.translated,
            self.prompt_tokens,
            self.completion_tokens,
            self.ttft_ms,
            self.tokens_per_s,
            self.context_fit,
            self.predicted_ms,
            self.measured_ms,
            self.chosen_by if node_id is not None else None,
            self.workload_id,
            self.cached_tokens,
            self.warm_node,
        )
