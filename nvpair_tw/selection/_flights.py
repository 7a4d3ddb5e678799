# -*- test-case-name: tests.selection.test_flights -*-
"""The requests in flight on each node, as the prediction of docs/behaviour.md §15.2 needs them.

A :class:`Flight` is one attempt on one node, from dispatch to its last token. The book keeps, per
node, how many are in flight, the time integral of that count (so a finished flight knows the mean
number of requests it shared the node with: :attr:`Sample.concurrency`), and each flight's predicted
end, so the work still queued ahead on a node is the sum of its flights' predicted remaining time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attrs import define, field
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.selection._speed import Start

__all__ = ["Flight", "FlightBook", "Landing", "Trip"]


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
    """Seconds the prediction gave it, from dispatch to its last token."""
    _area: float
    landed: bool = False

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
    _nodes: dict[str, _Node] = field(init=False, factory=dict)

    def take_off(self, node_id: str, predicted: float) -> Flight:
        """A request is dispatched to ``node_id`` now, predicted to take ``predicted`` seconds."""
        now = self._clock.seconds()
        node = self._nodes.setdefault(node_id, _Node(since=now))
        node.advance(now)
        node.count += 1
        flight = Flight(self, node_id, now, predicted, node.area)
        node.flights.add(flight)
        return flight

    def in_flight(self, node_id: str) -> int:
        """Requests of this facade on ``node_id`` now."""
        node = self._nodes.get(node_id)
        return 0 if node is None else node.count

    def remaining(self, node_id: str) -> float:
        """The predicted seconds of work left on ``node_id``: each flight's predicted end minus
        now (a flight already past its prediction counts as 0)."""
        node = self._nodes.get(node_id)
        if node is None:
            return 0.0
        now = self._clock.seconds()
        return sum(max(0.0, f.started + f.predicted - now) for f in node.flights)

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
    _flight: Flight | None = None
    _start: Start = Start.PLAIN

    def attempt(self, node_id: str) -> None:
        """An attempt on ``node_id`` is dispatched now."""
        self.land()
        self._start = self._start_of(node_id)
        ahead = self._service if self._service is not None else self._predicted
        self._flight = self._book.take_off(node_id, ahead.get(node_id, 0.0))

    def land(self) -> Landing | None:
        """The last attempt ends now; None when none is in flight."""
        flight, self._flight = self._flight, None
        if flight is None:
            return None
        predicted = self._predicted.get(flight.node_id, 0.0)
        return Landing(flight.node_id, predicted, flight.land(), self._start)
