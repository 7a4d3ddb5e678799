# -*- test-case-name: tests.corridor.test_fanout -*-
"""How far a streamed fan-out (a pull or create on several nodes, docs/behaviour.md §13.2) is on
each node, published as ``fan-out/progress`` events for the status page.

Each node's progress lines name a layer (``digest``) with the bytes done (``completed``) and to do
(``total``); a part's progress is their sums over the layers it named (at most
:data:`MAX_LAYERS`: a node naming more is not followed further). The first event says which
nodes were asked; a line that moves a part on is published at most every
:data:`PROGRESS_INTERVAL` seconds of the clock (a pull sends many lines a second), a part's end at
once; the event in which every part has ended is the last. Only these numbers, the node ids, the
path, the model and a failed part's error text are published, never a line itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import define, field
from twisted.internet.interfaces import IReactorTime

from nvpair_tw.events import EventBus, FanOutProgress, PartProgress, PartState

__all__ = ["MAX_LAYERS", "PROGRESS_INTERVAL", "FanOutWatch"]

PROGRESS_INTERVAL = 0.5
"""Seconds between two progress events of one fan-out while its lines arrive."""
MAX_LAYERS = 64
"""The layers of one node followed (an Ollama model has a handful)."""

_serial = itertools.count(1)
"""The fan-outs of this process, numbered (their events' ``id``)."""


def _count(value: object) -> int | None:
    """A byte count from a progress line: a non-negative integer, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@define
class _Part:
    """One node's part as its lines tell it."""

    state: PartState = PartState.ASKED
    layers: dict[str, tuple[int, int]] = field(factory=dict)
    error: str | None = None

    def seen(self, line: Mapping[str, Any]) -> bool:
        """Take one progress line; whether it moved the part on."""
        before = (self.state, dict(self.layers))
        self.state = PartState.RUNNING
        completed, total = _count(line.get("completed")), _count(line.get("total"))
        digest = line.get("digest")
        layer = digest if isinstance(digest, str) else ""
        if total is not None and (layer in self.layers or len(self.layers) < MAX_LAYERS):
            self.layers[layer] = (min(completed or 0, total), total)
        return before != (self.state, self.layers)

    def progress(self, node_id: str) -> PartProgress:
        done = sum(completed for completed, _ in self.layers.values())
        total = sum(total for _, total in self.layers.values())
        if self.state is PartState.SUCCEEDED:
            done = total  # a layer whose last line was not a full one is done all the same
        return PartProgress(node_id, self.state, done, total, self.error)


@define(eq=False)
class FanOutWatch:
    """Follows one streamed fan-out's parts and publishes where they stand."""

    _bus: EventBus
    _clock: IReactorTime
    _engine: str
    _path: str
    _model: str | None
    _parts: dict[str, _Part]
    _since: int
    _id: str = field(factory=lambda: f"fan-out-{next(_serial)}")
    _published: float | None = field(default=None, init=False)

    @classmethod
    def start(
        cls,
        bus: EventBus,
        clock: IReactorTime,
        engine: str,
        path: str,
        model: str | None,
        nodes: Sequence[str],
    ) -> FanOutWatch:
        """Watch a fan-out to ``nodes`` that starts now, and say so on the bus."""
        since = round(clock.seconds() * 1000)
        parts = {node_id: _Part() for node_id in nodes}
        watch = cls(bus, clock, engine, path, model, parts, since)
        watch._publish()
        return watch

    def line(self, node_id: str, line: Mapping[str, Any]) -> None:
        """A progress line of ``node_id``'s (parsed): published if it moved the part on and the
        last event is :data:`PROGRESS_INTERVAL` old."""
        part = self._parts.get(node_id)
        if part is None or part.state.ended or not part.seen(line):
            return
        last = self._published
        if last is None or self._clock.seconds() - last >= PROGRESS_INTERVAL:
            self._publish()

    def ended(self, node_id: str, state: PartState, error: str | None) -> None:
        """``node_id``'s part ended (``state``: succeeded, failed or cancelled): published now."""
        part = self._parts.get(node_id)
        if part is None or part.state.ended:
            return
        part.state = state
        part.error = error if state is PartState.FAILED else None
        self._publish()

    def _publish(self) -> None:
        self._published = self._clock.seconds()
        parts = tuple(part.progress(node_id) for node_id, part in self._parts.items())
        progress = FanOutProgress(
            self._id, self._engine, self._path, self._model, self._since, parts
        )
        self._bus.publish(progress)
