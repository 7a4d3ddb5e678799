# -*- test-case-name: tests.core.test_toolcalls -*-
"""Streamed tool calls folded into whole ones, by one rule (docs/behaviour.md §6.5, "Tool calls
without an index"): the assembly of a whole OpenAI answer and the translation to Ollama's chunks
both fold here.

An OpenAI-compatible stream sends a choice's tool calls as fragments in ``delta.tool_calls``. A
fragment with an integer ``index`` belongs to the call of that index. A fragment without one
(some engines leave it out) belongs by the one rule, **an id starts a call**:
a fragment whose ``id`` is new starts the next call; one without an ``id``, or with the id of the
call before it, continues that call. Within a call the ``function``'s string parts (``name``,
``arguments``) are joined in order; any other member keeps the last value that is neither null
nor empty.
"""

from __future__ import annotations

from typing import Any

from nvpair_tw.core._framer import MalformedStream

__all__ = ["ToolCalls"]


class ToolCalls:
    """The tool calls of one choice, folded from its fragments.

    :ivar size: characters of the string parts of ``function`` folded so far (what a cap counts).
    """

    __slots__ = ("_calls", "_last", "size")

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}
        self._last: int | None = None
        self.size = 0

    def __bool__(self) -> bool:
        """Whether any call was folded (since the last :meth:`take`)."""
        return bool(self._calls)

    def add(self, fragments: list[Any]) -> None:
        """Fold one delta's fragments; :class:`MalformedStream` for a fragment not an object."""
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise MalformedStream("a tool call is not an object")
            index = self._index(fragment)
            self._merge(self._calls.setdefault(index, {}), fragment)
            self._last = index

    def calls(self) -> list[tuple[int, dict[str, Any]]]:
        """Each call's index and its folded members, in index order."""
        return sorted(self._calls.items())

    def take(self) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`calls`, forgotten here (a call after them starts afresh)."""
        calls = self.calls()
        self._calls = {}
        self._last = None
        return calls

    def _index(self, fragment: dict[str, Any]) -> int:
        index = fragment.get("index")
        if isinstance(index, int):
            return index
        ident = fragment.get("id")
        last = self._last
        if last is not None and (not ident or ident == self._calls[last].get("id")):
            return last
        return max(self._calls, default=-1) + 1

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
