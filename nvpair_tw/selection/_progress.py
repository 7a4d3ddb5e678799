# -*- test-case-name: tests.selection.test_progress -*-
"""When each node last delivered response body bytes to this process (docs/behaviour.md §6.4),
and how many pieces of body it has delivered (§15.2: the first tokens of a node's first answer
for a model show its speed before the answer ends).

A :class:`ProgressBook` is kept per facade. Every inference attempt's body gate touches it for
every chunk it receives, before and after commit, through the plain callback :meth:`toucher`
returns (one clock read and one dict store per chunk). The header deadline asks
:meth:`delivered_within` when it expires: a node that delivered bytes to another attempt within
the last deadline period is working, not stalled, and the attempt keeps waiting (a *busy wait*,
counted here per node for ``/metrics`` and ``nodes/list``).

In a fleet (``--state``, docs/behaviour.md §6.6) the book is :meth:`shared`: each touch is also
offered to the fleet store (which sends at most one update per node per second), and a peer's
report of bytes from a node counts as progress here too.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime

__all__ = ["ProgressBook"]


class ProgressBook:
    """Per node: the clock time body bytes last arrived, and how many busy waits were granted."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}
        self._chunks: dict[str, int] = {}
        self._busy_waits: dict[str, int] = {}
        self._tell: Callable[[str], None] | None = None
        self._peer: Callable[[str], float | None] | None = None

    def shared(
        self, tell: Callable[[str], None], peer: Callable[[str], float | None]
    ) -> ProgressBook:
        """Share with a fleet: ``tell(node)`` on every touch, ``peer(node)`` is when a peer last saw
        bytes from the node (clock seconds, or None)."""
        self._tell, self._peer = tell, peer
        return self

    def toucher(self, node_id: str) -> Callable[[], None]:
        """The per-chunk callback for ``node_id``: records "bytes arrived now", and counts them."""
        last, chunks = self._last, self._chunks
        seconds = self._clock.seconds
        tell = self._tell

        def touch() -> None:
            last[node_id] = seconds()
            chunks[node_id] = chunks.get(node_id, 0) + 1

        def touch_and_tell() -> None:
            last[node_id] = seconds()
            chunks[node_id] = chunks.get(node_id, 0) + 1
            tell(node_id)  # type: ignore[misc]

        return touch if tell is None else touch_and_tell

    def last(self, node_id: str) -> float | None:
        """When ``node_id`` last delivered body bytes (clock seconds), or None if never."""
        return self._last.get(node_id)

    def chunks(self, node_id: str) -> int:
        """How many pieces of response body ``node_id`` delivered to this process so far (a
        streamed token is usually one)."""
        return self._chunks.get(node_id, 0)

    def delivered_within(self, node_id: str, period: float) -> bool:
        """Whether ``node_id`` delivered body bytes within the last ``period`` seconds (inclusive),
        to this process or, in a fleet, to a peer."""
        seen = [self._last.get(node_id), self._peer(node_id) if self._peer is not None else None]
        latest = max((t for t in seen if t is not None), default=None)
        return latest is not None and self._clock.seconds() - latest <= period

    def busy_waited(self, node_id: str) -> None:
        """One more deadline period was waited on ``node_id`` because it showed progress."""
        self._busy_waits[node_id] = self._busy_waits.get(node_id, 0) + 1

    def busy_waits(self, node_id: str) -> int:
        """Busy waits granted on ``node_id`` since the process started (a counter)."""
        return self._busy_waits.get(node_id, 0)
