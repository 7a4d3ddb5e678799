# -*- test-case-name: tests.core.test_toolcalls -*-
"""Streamed tool calls folded into whole ones, by one rule (docs/behaviour.md §6.5, "Tool calls
without an index"): every translation of an OpenAI-compatible answer places its fragments here.

An OpenAI-compatible stream sends a choice's tool calls as fragments in ``delta.tool_calls``. A
fragment with an integer ``index`` belongs to the call of that index. A fragment without one
(some engines leave it out) belongs by the one rule, **an id starts a call**:
a fragment whose ``id`` is new starts the next call; one without an ``id``, or with the id of the
call before it, continues that call. Within a call the ``function``'s string parts (``name``,
``arguments``) are joined in order; any other member keeps the last value that is neither null
nor empty.

:class:`CallOrder` is the rule alone: which call each fragment belongs to, and whether it starts
that call. :class:`ToolCalls` folds by it (the assembly of a whole OpenAI answer, the translation to
Ollama's chunks, a whole Messages answer); a Messages stream, which passes argument fragments on as
they come, places them by it without folding them (docs/behaviour.md §17.4).
"""

from __future__ import annotations

from typing import Any

from nvpair_tw.core._framer import MalformedStream

__all__ = ["CallOrder", "ToolCalls"]


class CallOrder:
    """Which call of one choice each fragment belongs to, by the one rule (see the module
    docstring); it keeps only each call's id, never its parts."""

    __slots__ = ("_ids", "_last")

    def __init__(self) -> None:
        self._ids: dict[int, Any] = {}  # each call started, by index: its id so far (None: none)
        self._last: int | None = None

    def place(self, fragment: dict[str, Any]) -> tuple[int, bool]:
        """The index of the call ``fragment`` belongs to, and whether it starts that call."""
        index = fragment.get("index")
        ident = fragment.get("id")
        if not isinstance(index, int):
            last = self._last
            if last is not None and (not ident or ident == self._ids[last]):
                index = last
            else:
                index = max(self._ids, default=-1) + 1
        starts = index not in self._ids
        if starts or (ident is not None and ident != ""):
            self._ids[index] = ident  # as the fold keeps it: the last that is not null or empty
        self._last = index
        return index, starts

    def forget(self) -> None:
        """Forget every call: the next fragment starts afresh."""
        self._ids = {}
        self._last = None


class ToolCalls:
    """The tool calls of one choice, folded from its fragments.

    :ivar size: characters of the string parts of ``function`` folded so far (what a cap counts).
    """

    __slots__ = ("_calls", "_order", "size")

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}
        self._order = CallOrder()
        self.size = 0

    def __bool__(self) -> bool:
        """Whether any call was folded (since the last :meth:`take`)."""
        return bool(self._calls)

    def add(self, fragments: list[Any]) -> None:
        """Fold one delta's fragments; :class:`MalformedStream` for a fragment not an object."""
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise MalformedStream("a tool call is not an object")
            index, _ = self._order.place(fragment)
            self._merge(self._calls.setdefault(index, {}), fragment)

    def calls(self) -> list[tuple[int, dict[str, Any]]]:
        """Each call's index and its folded members, in index order."""
        return sorted(self._calls.items())

    def take(self) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`calls`, forgotten here (a call after them starts afresh)."""
        calls = self.calls()
        self._calls = {}
        self._order.forget()
        return calls

    def _merge(self, call: dict[str, Any], fragment: dict[str, Any]) -> None:
        for key, value in fragment.items():
            if key == "function" and isinstance(value, dict):
                function = call.get("function")
                if not isinstance(function, dict):
                    function = call["function"] = {}
                for name, part in value.items():
                    if isinstance(part, str):
                        self.size += len(part)
                        if isinstance(function.get(name), str):
                            function[name] += part
                            continue
                    if name not in function or part is not None:
                        function[name] = part
            elif key not in call or (value is not None and value != ""):
                call[key] = value
