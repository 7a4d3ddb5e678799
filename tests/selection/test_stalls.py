"""Tests for nvpair_tw.selection._stalls: the per-facade stall cooldown, driven by a ``task.Clock``."""

from __future__ import annotations

from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from nvpair_tw.selection._stalls import Cooldown, IStallTracker, NeverCools, StallTracker

PERIOD = 10.0


class Announcements:
    """An ``on_change`` listener that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Cooldown | None, str]] = []

    def __call__(self, node_id: str, cooldown: Cooldown | None, reason: str) -> None:
        self.calls.append((node_id, cooldown, reason))


def tracker() -> tuple[StallTracker, Clock, Announcements]:
    clock = Clock()
    announced = Announcements()
    return StallTracker(clock, PERIOD, announced), clock, announced


def test_both_trackers_provide_the_interface() -> None:
    """The real tracker and the negative control both satisfy IStallTracker."""
    assert verifyObject(IStallTracker, StallTracker(Clock(), PERIOD))
    assert verifyObject(IStallTracker, NeverCools())


def test_cooled_node_cools_for_exactly_one_period() -> None:
    """A stalled node is cooling until one period has passed, and not a moment longer."""
    stalls, clock, announced = tracker()
    clock.advance(3)
    stalls.cool("n0", "no headers")
    assert stalls.cooling() == frozenset({"n0"})
    assert stalls.cooldown("n0") == Cooldown("n0", 3 + PERIOD, "no headers")
    clock.advance(PERIOD - 0.001)
    assert stalls.cooling() == frozenset({"n0"})
    clock.advance(0.001)
    assert stalls.cooling() == frozenset()
    assert stalls.cooldown("n0") is None
    assert clock.getDelayedCalls() == []
    assert announced.calls == [
        ("n0", Cooldown("n0", 3 + PERIOD, "no headers"), "no headers"),
        ("n0", None, "expired"),
    ]


def test_cooling_one_node_leaves_the_others_ready() -> None:
    """Cooldowns are per node: cooling n0 does not demote n1."""
    stalls, _clock, _ = tracker()
    stalls.cool("n0", "stall")
    assert stalls.cooling() == frozenset({"n0"})
    assert stalls.cooldown("n1") is None


def test_clear_restores_early_and_announces_success() -> None:
    """A success ends the cooldown at once, cancels its timer and says why."""
    stalls, clock, announced = tracker()
    stalls.cool("n0", "stall")
    clock.advance(1)
    stalls.clear("n0")
    assert stalls.cooling() == frozenset()
    assert clock.getDelayedCalls() == []
    assert announced.calls[-1] == ("n0", None, "success")
    clock.advance(PERIOD)
    assert len(announced.calls) == 2


def test_clear_of_a_ready_node_announces_nothing() -> None:
    """Clearing a node that is not cooling is a no-op (every success calls clear)."""
    stalls, _clock, announced = tracker()
    stalls.clear("n0")
    assert announced.calls == []


def test_recooling_extends_the_cooldown() -> None:
    """A second stall restarts the period from now, with a single timer."""
    stalls, clock, announced = tracker()
    stalls.cool("n0", "first")
    clock.advance(6)
    stalls.cool("n0", "second")
    assert len(clock.getDelayedCalls()) == 1
    assert stalls.cooldown("n0") == Cooldown("n0", 6 + PERIOD, "second")
    clock.advance(PERIOD - 1)
    assert stalls.cooling() == frozenset({"n0"})
    clock.advance(1)
    assert stalls.cooling() == frozenset()
    assert [reason for _, _, reason in announced.calls] == ["first", "second", "expired"]


def test_stop_cancels_every_timer_silently() -> None:
    """Shutdown drops all cooldowns and leaves no timer; nothing is announced."""
    stalls, clock, announced = tracker()
    stalls.cool("n0", "stall")
    stalls.cool("n1", "stall")
    stalls.stop()
    assert clock.getDelayedCalls() == []
    assert stalls.cooling() == frozenset()
    clock.advance(PERIOD)
    assert len(announced.calls) == 2


def test_never_cools_never_demotes() -> None:
    """The negative control accepts every call and never reports a cooling node."""
    stalls = NeverCools()
    stalls.cool("n0", "stall")
    assert stalls.cooling() == frozenset()
    assert stalls.cooldown("n0") is None
    stalls.clear("n0")
    assert stalls.cooling() == frozenset()


def test_a_tracker_without_a_listener_cools_clears_and_expires_silently() -> None:
    """``on_change`` is optional: cooling, a success and an expiry all work without one."""
    clock = Clock()
    stalls = StallTracker(clock, PERIOD)
    stalls.cool("n0", "stall")
    stalls.cool("n1", "stall")
    stalls.clear("n1")
    clock.advance(PERIOD)
    assert stalls.cooling() == frozenset()
    assert clock.getDelayedCalls() == []
