# -*- test-case-name: tests.core.test_hints -*-
"""The closest valid name to a mistyped one, for the hint that ends an error line
("did you mean 'url'?"), found by the standard library's :func:`difflib.get_close_matches`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]

CUTOFF = 0.65
"""The least similarity (difflib's ratio) of a hint: ``ulr`` → ``url`` is 0.67, while ``vllm``
is 0.6 from ``ollama`` and gets no hint."""


def did_you_mean(given: str, choices: Iterable[str], shown: str = "{!r}") -> str:
    """``"; did you mean 'url'?"`` when one of ``choices`` is close to ``given`` (difflib's
    similarity of ``CUTOFF`` or more), else ``""``. ``shown`` formats the choice: ``"{!r}"`` (a field
    or a value, quoted) or ``"--{}"`` (a flag)."""
    close = difflib.get_close_matches(given, sorted(choices), n=1, cutoff=CUTOFF)
    return f"; did you mean {shown.format(close[0])}?" if close else ""
