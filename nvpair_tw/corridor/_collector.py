# -*- test-case-name: tests.corridor.test_collector -*-
"""Python's cyclic garbage collector kept off a large body's objects (docs/behaviour.md §14.1).

A 32 MiB body of a million small objects makes a million containers. While they are built, each
full collection walks all of them (measured: 79 ms to 300 ms a pass, on the reactor); while the
request lives, a later full pass would walk them again. A JSON document holds no reference cycle,
so the collector has nothing to find there: :class:`QuietCollector` turns automatic collection off
while large bodies are parsed, then moves what was built into the permanent generation
(``gc.freeze``), where no pass walks it; reference counting still frees it when the request ends.
When the last request holding such a body ends, the permanent generation is handed back
(``gc.unfreeze``) so any cycle frozen by chance is collected as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

from attrs import define
from twisted.internet.interfaces import IReactorTime

__all__ = ["QuietCollector", "let_go"]

_SLICE = 20_000
"""Items freed per reactor turn (a million small objects freed at once held it 93 ms)."""


@define
class QuietCollector:
    """Counts the large bodies being parsed and those still alive in a request."""

    parsing: int = 0
    holding: int = 0
    _was_enabled: bool = True

    def parse_started(self) -> None:
        """A large body's parse begins: no automatic collection until the last one ends."""
        if self.parsing == 0 and self.holding == 0:
            self._was_enabled = gc.isenabled()
        self.parsing += 1
        gc.disable()

    def parse_ended(self) -> None:
        """The parse ended (done or refused): what it built is frozen, collection resumes; the
        caller holds the body until :meth:`released`."""
        self.parsing -= 1
        self.holding += 1
        if self.parsing == 0:
            gc.freeze()
            if self._was_enabled:
                gc.enable()

    def released(self) -> None:
        """A request that held a large body ended."""
        self.holding -= 1
        if self.holding == 0 and self.parsing == 0:
            gc.unfreeze()


def let_go(doc: dict[str, Any], clock: IReactorTime) -> None:
    """Free a large parsed document a slice at a time, one slice a reactor turn (freeing a
    million objects at once holds it as long as building them). ``doc`` must be held by nothing
    else: it is emptied."""
    work = _emptied(doc)

    def step() -> None:
        if next(work, _DONE) is not _DONE:
            clock.callLater(0, step)

    clock.callLater(0, step)


_DONE = object()


def _emptied(doc: dict[str, Any]) -> Iterator[None]:
    for key in list(doc):
        value = doc.pop(key)
        if isinstance(value, list):
            while value:
                del value[-_SLICE:]
                yield None
        del value
        yield None
