# -*- test-case-name: tests.selection.test_flights -*-
"""The requests in flight on each node, as the prediction of docs/behaviour.md §15.2 needs them.

A :class:`Flight` is one attempt on one node, from dispatch to its last token. The book keeps, per
node, how many are in flight, the time integral of that count (so a finished flight knows the mean
number of requests it shared the node with: :attr:`Sample.concurrency`), and each flight's predicted
end, so the work still queued ahead on a node is the sum of its flights' predicted remaining time:
until its predicted end, that end less now; past it (or with no prediction), as long again as it
has run — answers' lengths have a long tail, so the longer one has run past what was expected,
the longer it is likely to run still, and a late node is waited for less and less.

A :class:`FirstRun` is what the book sees of a node's first request for a model while it runs: how
long it has run and how many pieces of body the node has sent since (the
:class:`~nvpair_tw.selection._progress.ProgressBook`'s count), so the first tokens of a node never
measured show its speed before its first answer ends (docs/behaviour.md §15.2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attrs import define, field, frozen
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.selection._progress import ProgressBook
from nvpair_tw.selection._speed import Start

__all__ = ["LIVE_TOKENS", "FirstRun", "Flight", "FlightBook", "Landing", "Trip"]

LIVE_TOKENS = 4
"""Pieces of body a node's first answer must have sent before its rate is read from them."""


@frozen
class FirstRun:
    """A request running on a node not yet measured for its model: seconds since dispatch,
    pieces of body the node sent since, and seconds from dispatch to the last of them."""

    elapsed: float
    tokens: int = 0
    until_last: float = 0.0

    @property
    def rate(self) -> float | None:
        """Tokens a second so far (dispatch to the last piece, its prompt included: a rate no
        higher than the node's), once :data:`LIVE_TOKENS` have come; else None."""
        if self.tokens < LIVE_TOKENS or self.until_last <= 0:
            return None
        return self.tokens / self.until_last


@define
class _Node:
    count: int = 0
    area: float = 0.0
    since: float = 0.0
    flights: set[Flight] = field(factory=set)

    def advance(self, now: float) -> None:
        self.area += self.count * max(0.0, now - self.since)
        self.since = now


@define(eq=False)
class Flight:
    """One request on one node; :meth:`land` once it ends (a second landing does nothing)."""

    _book: FlightBook
    node_id: str
    started: float
    predicted: float
    """Seconds the prediction gave it, from dispatch to its last token (0: none)."""
    _area: float
    model: str | None = None
    chunks_at: int = 0
    """The node's count of body pieces when it took off."""
    seen: FirstRun | None = None
    """The last :class:`FirstRun` of it that showed a rate (kept once others share its node)."""
    landed: bool = False

    def remaining(self, now: float) -> float:
        """Seconds of it predicted still to run: to its predicted end, or once past it (a flight
        without a prediction is past it from its start) as long again as it has run."""
        end = self.started + self.predicted
        return end - now if now < end else now - self.started

    def land(self) -> float:
        """End the flight: the mean number of requests in flight on its node over its life
        (itself included; 1.0 for a flight of no duration)."""
        if self.landed:
            return 1.0
        self.landed = True
        return self._book._land(self)


@define
class FlightBook:
    """The flights of one facade, per node; the clock is the only time source."""

    _clock: IReactorTime
    _progress: ProgressBook | None = None
    """What each node delivered (a :class:`FirstRun`'s tokens); None: nothing is seen."""
    _nodes: dict[str, _Node] = field(init=False, factory=dict)

    def take_off(self, node_id: str, predicted: float, model: str | None = None) -> Flight:
        """A request for ``model`` is dispatched to ``node_id`` now, predicted to take
        ``predicted`` seconds."""
        now = self._clock.seconds()
        node = self._nodes.get(node_id)
        if node is None:  # made only for a node with nothing in flight, not at every take-off
            node = self._nodes[node_id] = _Node(since=now)
        node.advance(now)
        node.count += 1
        chunks = 0 if self._progress is None else self._progress.chunks(node_id)
        flight = Flight(self, node_id, now, predicted, node.area, model, chunks)
        node.flights.add(flight)
        return flight

    def in_flight_for(self, node_id: str, model: str) -> int:
        """Requests of this facade for ``model`` on ``node_id`` now."""
        node = self._nodes.get(node_id)
        return 0 if node is None else sum(1 for f in node.flights if f.model == model)

    def first_run(self, node_id: str, model: str) -> FirstRun | None:
        """The oldest request for ``model`` on ``node_id`` as a :class:`FirstRun` (None: none);
        its tokens are counted only while it is the node's one request of this facade (another's
        body would count as its own)."""
        node = self._nodes.get(node_id)
        if node is None:
            return None
        mine = [f for f in node.flights if f.model == model]
        if not mine:
            return None
        first = min(mine, key=lambda f: f.started)
        elapsed = self._clock.seconds() - first.started
        last = None if self._progress is None else self._progress.last(node_id)
        if node.count > 1 or self._progress is None or last is None or last < first.started:
            seen = first.seen
            return (
                FirstRun(elapsed)
                if seen is None
                else FirstRun(elapsed, seen.tokens, seen.until_last)
            )
        run = FirstRun(
            elapsed, self._progress.chunks(node_id) - first.chunks_at, last - first.started
        )
        if run.rate is not None:
            first.seen = run
        return run

    def in_flight(self, node_id: str) -> int:
        """Requests of this facade on ``node_id`` now."""
        node = self._nodes.get(node_id)
        return 0 if node is None else node.count

    def remaining(self, node_id: str) -> float:
        """The predicted seconds of work left on ``node_id``: the sum of its flights'
        :meth:`Flight.remaining`."""
        node = self._nodes.get(node_id)
        if node is None:
            return 0.0
        now = self._clock.seconds()
        return sum(f.remaining(now) for f in node.flights)

    def _land(self, flight: Flight) -> float:
        now = self._clock.seconds()
        node = self._nodes[flight.node_id]
        node.advance(now)
        node.flights.discard(flight)
        node.count -= 1
        span = now - flight.started
        mean = (node.area - flight._area) / span if span > 0 else 1.0
        if node.count == 0:
            del self._nodes[flight.node_id]
        return max(1.0, mean)


@define
class Landing:
    """Where a request's last attempt ran: the node, the seconds predicted there and the mean
    number of requests in flight on it over the attempt's life, and how it started there (its
    model known cold, its prefix warm, or neither) as known at dispatch."""

    node_id: str
    predicted: float
    concurrency: float
    start: Start


@define
class Trip:
    """One request's flights: each attempt takes off on its node (the previous one lands)."""

    _book: FlightBook
    _predicted: Mapping[str, float]
    """Per node, the prediction made at arrival (what the record shows beside the measured)."""
    _start_of: Callable[[str], Start]
    _service: Mapping[str, float] | None = None
    """Per node, the prediction from dispatch (without the slot wait already spent): what the
    flight counts as work ahead for later requests; None: the arrival prediction."""
    _model: str | None = None
    """The model its flights are for (a node's first request for it is a :class:`FirstRun`)."""
    _flight: Flight | None = None
    _start: Start = Start.PLAIN

    def attempt(self, node_id: str) -> None:
        """An attempt on ``node_id`` is dispatched now."""
        self.land()
        self._start = self._start_of(node_id)
        ahead = self._service if self._service is not None else self._predicted
        self._flight = self._book.take_off(node_id, ahead.get(node_id, 0.0), self._model)

    def land(self) -> Landing | None:
        """The last attempt ends now; None when none is in flight."""
        flight, self._flight = self._flight, None
        if flight is None:
            return None
        predicted = self._predicted.get(flight.node_id, 0.0)
        return Landing(flight.node_id, predicted, flight.land(), self._start)
