"""The shared test helpers (tests/helpers.py): ``eventually`` waits for its condition and no longer
than its bound, on whatever reactor it is given."""

from __future__ import annotations

import json

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from tests.helpers import POLL_INTERVAL, NotReached, chat, chat_body, eventually


def test_eventually_returns_once_the_condition_holds() -> None:
    clock = Clock()
    looks: list[int] = []

    def check() -> bool:
        looks.append(1)
        return len(looks) > 3

    done = Deferred.fromCoroutine(eventually(clock, check, within=1.0))
    clock.advance(POLL_INTERVAL)
    clock.advance(POLL_INTERVAL)
    assert not done.called
    clock.advance(POLL_INTERVAL)
    assert done.called and len(looks) == 4
    assert clock.getDelayedCalls() == []


def test_eventually_fails_naming_what_it_waited_for_at_its_bound() -> None:
    clock = Clock()
    outcome: list[object] = []
    done = Deferred.fromCoroutine(eventually(clock, lambda: False, within=0.5, what="the thing"))
    done.addBoth(outcome.append)
    clock.advance(0.5 - POLL_INTERVAL)
    assert outcome == []
    clock.advance(POLL_INTERVAL)
    [failure] = outcome
    assert isinstance(failure, Failure) and failure.check(NotReached)
    assert str(failure.value) == "the thing not reached within 0.5 s"
    assert clock.getDelayedCalls() == []


def test_eventually_looks_before_it_waits() -> None:
    clock = Clock()
    done = Deferred.fromCoroutine(eventually(clock, lambda: True, within=0.0))
    assert done.called and clock.getDelayedCalls() == []
    failed: list[Failure] = []
    Deferred.fromCoroutine(eventually(clock, lambda: False, within=0.0)).addErrback(failed.append)
    assert [f.type for f in failed] == [NotReached]


def test_chat_takes_turns_and_says_hi_when_given_nothing() -> None:
    assert chat("m") == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    turns = chat("m", "a", "b", "c", stream=True)
    assert [m["role"] for m in turns["messages"]] == ["user", "assistant", "user"]
    assert turns["stream"] is True
    assert json.loads(chat_body("m", "a")) == chat("m", "a")
