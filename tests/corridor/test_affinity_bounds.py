"""Prefix affinity stays off for bodies too large to digest on the reactor (docs/affinity.md,
docs/behaviour.md §14.1)."""

from __future__ import annotations

import pytest

from nvpair_tw.corridor._route import AFFINITY_MAX_BODY, AFFINITY_MAX_MESSAGES, _affine

pytestmark = pytest.mark.timeout(10)


def test_an_ordinary_conversation_has_affinity() -> None:
    messages = [{"role": "user", "content": "hi"}] * AFFINITY_MAX_MESSAGES
    assert _affine(b"x" * AFFINITY_MAX_BODY, {"messages": messages})
    assert _affine(b"{}", {"prompt": "p"})


def test_a_body_over_the_bound_has_none() -> None:
    assert not _affine(b"x" * (AFFINITY_MAX_BODY + 1), {"messages": []})


def test_a_conversation_over_the_bound_has_none() -> None:
    messages = [{"role": "user", "content": "hi"}] * (AFFINITY_MAX_MESSAGES + 1)
    assert not _affine(b"{}", {"messages": messages})
