"""Tests for nvpair_tw.selection._stalls: the per-facade stall cooldown, driven by a ``task.Clock``."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from nvpair_tw.selection._stalls import (
    PEER_HOLD_MARGIN,
    Cooldown,
    IStallTracker,
    NeverCools,
    StallTracker,
)

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


# --- paid once until it answers (docs/behaviour.md §6.3): the expiry probe ---

BOUND = 2.0


class Probes:
    """A probe whose answers the test gives: each call is a Deferred the test fires."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Deferred[bool]]] = []
        self.cancelled: list[str] = []

    def __call__(self, node_id: str) -> Deferred[bool]:
        def cancel(_: Deferred[bool]) -> None:
            self.cancelled.append(node_id)

        pending: Deferred[bool] = Deferred(cancel)
        self.asked.append((node_id, pending))
        return pending

    def answer(self, answered: bool) -> None:
        self.asked[-1][1].callback(answered)


def probed_tracker() -> tuple[StallTracker, Clock, Announcements, Probes]:
    clock = Clock()
    announced = Announcements()
    probes = Probes()
    stalls = StallTracker(clock, PERIOD, announced, probe=probes, probe_bound=BOUND)
    return stalls, clock, announced, probes


def test_at_expiry_the_node_is_asked_and_stays_cooling_until_it_answers() -> None:
    """The expiry timer asks the node its question; until an answer the node is still cooling."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD - 0.001)
    assert probes.asked == []
    clock.advance(0.001)
    assert [node for node, _ in probes.asked] == ["n0"]
    assert stalls.cooling() == frozenset({"n0"})
    assert [reason for _, _, reason in announced.calls] == ["no headers"]


def test_an_answer_ends_the_cooldown_as_expired() -> None:
    """Any answer to the probe ends the cooldown (``why: expired``), and no timer is left."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD)
    probes.answer(True)
    assert stalls.cooling() == frozenset()
    assert announced.calls[-1] == ("n0", None, "expired")
    assert clock.getDelayedCalls() == []


def test_no_answer_renews_the_cooldown_for_another_period() -> None:
    """No answer: a renewed cooldown of one more period (``renewed``), then the node is asked again."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD)
    clock.advance(1.5)  # the probe took 1.5 s to give up
    probes.answer(False)
    renewed = Cooldown("n0", PERIOD + 1.5 + PERIOD, "no headers", renewed=True)
    assert stalls.cooldown("n0") == renewed
    assert announced.calls[-1] == ("n0", renewed, "no headers")
    clock.advance(PERIOD - 0.001)
    assert len(probes.asked) == 1
    clock.advance(0.001)
    assert len(probes.asked) == 2
    probes.answer(True)
    assert stalls.cooling() == frozenset()


def test_a_frozen_node_stays_cooling_for_as_many_periods_as_it_is_frozen() -> None:
    """Frozen for five periods: cooling throughout, five probes, one cooldown event per renewal."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    for _ in range(5):
        clock.advance(PERIOD)
        assert stalls.cooling() == frozenset({"n0"})
        probes.answer(False)
    assert len(probes.asked) == 5
    assert [c.renewed for _, c, _ in announced.calls if c is not None] == [False] + [True] * 5
    clock.advance(PERIOD)
    probes.answer(True)
    assert stalls.cooling() == frozenset()


def test_a_probe_that_fails_counts_as_no_answer() -> None:
    """A probe whose Deferred fails (it never should) renews rather than leaving the node stuck."""
    stalls, clock, _, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD)
    probes.asked[-1][1].errback(RuntimeError("bug"))
    cooldown = stalls.cooldown("n0")
    assert cooldown is not None and cooldown.renewed


def test_a_success_during_the_probe_ends_it_and_cancels_the_probe() -> None:
    """A client request served by the node while the probe runs ends the cooldown (``success``);
    the probe is cancelled and its late answer changes nothing."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD)
    stalls.clear("n0")
    assert probes.cancelled == ["n0"]
    assert announced.calls[-1] == ("n0", None, "success")
    assert stalls.cooling() == frozenset()
    assert clock.getDelayedCalls() == []


def test_a_new_stall_during_the_probe_replaces_it() -> None:
    """A new stall while the probe runs starts a fresh cooldown; the old probe is cancelled and its
    late answer is ignored."""
    stalls, clock, _, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD)
    clock.advance(1)
    stalls.cool("n0", "again")
    assert probes.cancelled == ["n0"]
    assert stalls.cooldown("n0") == Cooldown("n0", PERIOD + 1 + PERIOD, "again")


def test_a_late_answer_after_the_cooldown_ended_is_ignored() -> None:
    """An answer arriving for a probe whose entry is gone does nothing."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    clock.advance(PERIOD)
    pending = probes.asked[-1][1]
    stalls.end("n0", "peer-success")
    calls = list(announced.calls)
    if not pending.called:
        pending.callback(False)
    assert announced.calls == calls
    assert stalls.cooling() == frozenset()


def test_a_peer_cooldown_is_held_for_the_probe_bound_not_probed() -> None:
    """A cooldown another proxy shared is not probed here: it is held for the probe's bound and a
    margin for the share to arrive (the prober shares a renewal or the end meanwhile), then
    expires."""
    stalls, clock, announced, probes = probed_tracker()
    stalls.install("n0", "stall", PERIOD, origin="peer")
    clock.advance(PERIOD)
    assert probes.asked == []
    clock.advance(BOUND + PEER_HOLD_MARGIN - 0.001)
    assert stalls.cooling() == frozenset({"n0"})
    clock.advance(0.001)
    assert stalls.cooling() == frozenset()
    assert announced.calls[-1] == ("n0", None, "expired")


def test_a_peer_renewal_during_the_hold_replaces_it() -> None:
    """The prober's renewal arriving during the hold is a fresh peer cooldown."""
    stalls, clock, _, probes = probed_tracker()
    stalls.install("n0", "stall", PERIOD, origin="peer")
    clock.advance(PERIOD + 1)
    stalls.install("n0", "stall", PERIOD, origin="peer")
    clock.advance(BOUND)
    assert stalls.cooling() == frozenset({"n0"})
    assert probes.asked == []


def test_stop_cancels_a_running_probe() -> None:
    """Shutdown cancels the probes in flight and leaves no timer."""
    stalls, clock, _, probes = probed_tracker()
    stalls.cool("n0", "no headers")
    stalls.cool("n1", "no headers")
    clock.advance(PERIOD)
    stalls.stop()
    assert sorted(probes.cancelled) == ["n0", "n1"]
    assert clock.getDelayedCalls() == []
