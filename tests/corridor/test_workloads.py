"""Tests for nvpair_tw.corridor._workloads: lifecycle events, the terminal guard, the registry, the record."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

import pytest
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from nvpair_tw.corridor._driver import publish
from nvpair_tw.corridor._record import Facts
from nvpair_tw.corridor._workloads import Workload, WorkloadRegistry, WorkloadState
from nvpair_tw.events import AttemptOutcome, Event, EventBus, StatusOutcome

T0 = 1_700_000_000.0
INFO_KEYS = {
    "id",
    "runId",
    "engine",
    "model",
    "state",
    "scheduledOn",
    "createdAt",
    "startedAt",
    "completedAt",
    "error",
    "seq",
}


class Harness:
    """A clock, a bus, a registry and every event published."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.advance(T0)
        self.bus = EventBus(self.clock)
        self.events: list[Event] = []
        self.bus.subscribe(self.events.append, name="test")
        self.registry = WorkloadRegistry(self.clock, self.bus, run_id="run")

    def workload_events(self) -> list[tuple[str, int, int, str | None, str | None]]:
        """(name, id, seq, state, scheduledOn) of each workload event."""
        return [
            (
                e.name,
                e.payload["workload"]["id"],
                e.payload["workload"]["seq"],
                e.payload["workload"]["state"],
                e.payload["workload"]["scheduledOn"],
            )
            for e in self.events
            if e.name.startswith("workload:")
        ]


@pytest.fixture
def h() -> Harness:
    """A fresh harness."""
    return Harness()


def test_failover_runs_on_a_then_b_and_completes_on_b(h: Harness) -> None:
    """A stall on A then success on B: started(A), started(B), completed(B); one id, seq 1-3."""
    wl = h.registry.create("ollama", "llama3")
    facts = Facts(h.registry.next_request_id(), "ollama", "POST", "/api/chat", h.clock.seconds())
    h.clock.advance(0.010)
    wl.running("A")
    facts.attempts.start("A", h.clock.seconds())
    h.clock.advance(30)
    facts.attempts.close(AttemptOutcome.STALL, h.clock.seconds())
    wl.running("B")
    facts.attempts.start("B", h.clock.seconds())
    h.clock.advance(0.250)
    facts.first_byte_at = h.clock.seconds()
    facts.attempts.close(AttemptOutcome.COMMITTED, h.clock.seconds())
    h.clock.advance(1.5)
    assert wl.complete() is True
    publish(h.bus, facts.record(h.clock.seconds(), 200, "B", None))

    assert h.workload_events() == [
        ("workload:started", 1, 1, "running", "A"),
        ("workload:started", 1, 2, "running", "B"),
        ("workload:completed", 1, 3, "completed", "B"),
    ]
    done = h.events[2].payload["workload"]
    assert done["runId"] == "run"
    assert done["createdAt"] == 1_700_000_000_000
    assert done["startedAt"] == 1_700_000_000_010
    assert done["completedAt"] == 1_700_000_031_760
    assert done["error"] is None
    [request] = [e for e in h.events if e.name == "proxy/request"]
    assert request.payload == {
        "id": "run-1",
        "engine": "ollama",
        "node_id": "B",
        "method": "POST",
        "path": "/api/chat",
        "status": 200,
        "duration_ms": 31760,
        "ttfb_ms": 30260,
        "error": None,
        "attempts": [
            {"node_id": "A", "outcome": "stall", "ms": 30000, "busy_waits": 0},
            {"node_id": "B", "outcome": "committed", "ms": 250, "busy_waits": 0},
        ],
        "cache_affinity": False,
        "queued_ms": 0,
    }
    assert h.registry.live() == []


def test_running_again_on_the_same_node_emits_nothing(h: Harness) -> None:
    """Only a move to another node re-emits workload:started."""
    wl = h.registry.create("ollama", "m")
    wl.running("A")
    wl.running("A")
    assert [e[0:3] for e in h.workload_events()] == [("workload:started", 1, 1)]


def test_a_created_workload_is_live_and_silent_until_dispatched(h: Harness) -> None:
    """create() registers the workload with state None and publishes nothing."""
    wl = h.registry.create("lmstudio", "qwen")
    assert h.events == []
    assert h.registry.live() == [wl]
    assert h.registry.get(wl.id) is wl
    assert wl.state is None
    assert wl.info()["state"] is None
    assert wl.info()["startedAt"] is None


ENDINGS: dict[str, Callable[[Workload], bool]] = {
    "complete": lambda wl: wl.complete(),
    "fail": lambda wl: wl.fail("upstream 503"),
    "cancel": lambda wl: wl.cancel("client left"),
}


@pytest.mark.parametrize("first", sorted(ENDINGS))
@pytest.mark.parametrize("second", sorted(ENDINGS))
def test_only_the_first_terminal_call_ends_the_workload(
    h: Harness, first: str, second: str
) -> None:
    """Any terminal call after the first returns False and publishes nothing."""
    wl = h.registry.create("ollama", "m")
    wl.running("A")
    assert ENDINGS[first](wl) is True
    state = wl.state
    assert ENDINGS[second](wl) is False
    assert ENDINGS[first](wl) is False
    wl.running("B")
    assert [e[0] for e in h.workload_events()] == [
        "workload:started",
        "workload:completed" if first == "complete" else "workload:errored",
    ]
    assert wl.state is state
    assert wl.terminal
    assert wl.scheduled_on == "A"


def test_failed_and_cancelled_are_errored_events_with_their_error_text(h: Harness) -> None:
    """fail and cancel publish workload:errored with state failed/cancelled and the error text."""
    failed = h.registry.create("ollama", "m")
    cancelled = h.registry.create("ollama", "m")
    failed.running("A")
    cancelled.running("A")
    failed.fail("all nodes failed")
    cancelled.cancel("client left")
    errored = [e.payload["workload"] for e in h.events if e.name == "workload:errored"]
    assert [(w["id"], w["state"], w["error"], w["seq"]) for w in errored] == [
        (1, "failed", "all nodes failed", 2),
        (2, "cancelled", "client left", 2),
    ]


def test_a_workload_can_end_before_its_first_dispatch(h: Harness) -> None:
    """Failing before any node was tried publishes one errored event with no node."""
    wl = h.registry.create("ollama", "m")
    assert wl.fail("no eligible node") is True
    assert h.workload_events() == [("workload:errored", 1, 1, "failed", None)]
    assert h.registry.live() == []


def test_terminal_event_subscribers_no_longer_see_the_workload_live(h: Harness) -> None:
    """The workload leaves live() before its terminal event is delivered."""
    seen: list[list[Workload]] = []
    h.bus.subscribe(lambda e: seen.append(h.registry.live()), name="watcher")
    wl = h.registry.create("ollama", "m")
    wl.running("A")
    wl.complete()
    assert seen == [[wl], []]
    assert h.registry.get(wl.id) is None


def test_simulated_run_of_200_workloads_ends_each_exactly_once() -> None:
    """200 random interleavings with extra terminal calls: one right terminal each, none live."""
    rng = random.Random(20240611)
    h = Harness()
    nodes = ["A", "B", "C"]
    intended: dict[int, WorkloadState] = {}
    steps: dict[int, list[Callable[[], object]]] = {}
    kinds = [WorkloadState.CANCELLED, WorkloadState.FAILED, WorkloadState.COMPLETED]
    for i in range(200):
        wl = h.registry.create("ollama", f"m{i % 7}")
        kind = kinds[i % 3]
        intended[wl.id] = kind
        hops = [partial(wl.running, n) for n in rng.sample(nodes, rng.randint(0, 3))]
        ends: dict[WorkloadState, Callable[[], object]] = {
            WorkloadState.CANCELLED: partial(h.registry.cancel, wl.id, "client left"),
            WorkloadState.FAILED: partial(wl.fail, "upstream error"),
            WorkloadState.COMPLETED: wl.complete,
        }
        late: list[Callable[[], object]] = [
            wl.complete,
            partial(wl.fail, "late"),
            partial(wl.cancel, "late"),
            partial(h.registry.cancel, wl.id),
            partial(wl.running, "Z"),
        ]
        end = ends[kind]
        extras = [rng.choice(late) for _ in range(rng.randint(1, 3))]
        steps[wl.id] = [*hops, end, *extras]
    while steps:
        wid = rng.choice(list(steps))
        steps[wid].pop(0)()
        if not steps[wid]:
            del steps[wid]

    terminals: dict[int, list[str]] = {wid: [] for wid in intended}
    last_seq: dict[int, int] = {}
    for event in h.events:
        info = event.payload["workload"]
        assert info["seq"] == last_seq.get(info["id"], 0) + 1
        last_seq[info["id"]] = info["seq"]
        if event.name != "workload:started":
            terminals[info["id"]].append(info["state"])
        else:
            assert not terminals[info["id"]], "running after terminal"
    assert terminals == {wid: [state.value] for wid, state in intended.items()}
    assert sum(1 for s in intended.values() if s is WorkloadState.CANCELLED) == 67
    assert h.registry.live() == []


def test_registry_cancel_calls_the_hook_with_the_reason(h: Harness) -> None:
    """cancel() hands the reason to the workload's hook, which ends it through the request path."""
    wl = h.registry.create("ollama", "m")
    wl.running("A")
    reasons: list[str] = []

    def hook(reason: str) -> None:
        reasons.append(reason)
        wl.cancel(reason)

    wl.cancel_hook = hook
    assert h.registry.cancel(wl.id, "operator") is True
    assert reasons == ["operator"]
    assert h.workload_events()[-1][0:4] == ("workload:errored", 1, 2, "cancelled")
    assert h.registry.cancel(wl.id) is False
    assert reasons == ["operator"]


@pytest.mark.parametrize(
    "end",
    [lambda w: w.complete(), lambda w: w.fail("failed"), lambda w: w.cancel("cancelled")],
    ids=["complete", "fail", "cancel"],
)
def test_an_ended_workload_lets_go_of_its_cancel_hook(
    h: Harness, end: Callable[[Workload], bool]
) -> None:
    """However it ends, the workload drops its hook: nothing reaches the request through it."""
    wl = h.registry.create("ollama", "m")
    wl.running("A")
    wl.cancel_hook = lambda _reason: None
    assert end(wl) is True
    assert wl.cancel_hook is None


def test_registry_cancel_of_an_unknown_id_is_false(h: Harness) -> None:
    """No live workload with that id: False and no event."""
    assert h.registry.cancel(42) is False
    assert h.events == []


def test_registry_cancel_without_a_hook_cancels_directly(h: Harness) -> None:
    """A workload with no hook is cancelled by the registry with the default reason."""
    wl = h.registry.create("ollama", "m")
    assert h.registry.cancel(wl.id) is True
    assert wl.state is WorkloadState.CANCELLED
    assert wl.error == "cancelled by request"


def test_registry_cancel_with_a_raising_hook_still_cancels(h: Harness) -> None:
    """A hook that raises is logged at error and the workload is cancelled anyway."""
    wl = h.registry.create("ollama", "m")

    def hook(reason: str) -> None:
        raise RuntimeError("gone")

    wl.cancel_hook = hook
    with capturedLogs() as logs:
        assert h.registry.cancel(wl.id, "operator") is True
    assert wl.state is WorkloadState.CANCELLED
    assert [e["log_level"] for e in logs] == [LogLevel.error]
    assert logs[0]["workload_id"] == wl.id


def test_ids_count_up_and_request_ids_are_unique_per_run(h: Harness) -> None:
    """Workload ids are 1, 2, …; request ids are <run_id>-<n>; run ids are random by default."""
    assert [h.registry.create("ollama", "m").id for _ in range(3)] == [1, 2, 3]
    assert [h.registry.next_request_id() for _ in range(2)] == ["run-1", "run-2"]
    one = WorkloadRegistry(h.clock, h.bus)
    two = WorkloadRegistry(h.clock, h.bus)
    assert one.run_id != two.run_id
    assert len(one.run_id) >= 16


def test_info_has_exactly_the_documented_keys(h: Harness) -> None:
    """workloadInfo never carries anything beyond the documented metadata keys."""
    wl = h.registry.create("ollama", "m")
    assert set(wl.info()) == INFO_KEYS
    wl.running("A")
    wl.fail("boom")
    for event in h.events:
        assert set(event.payload) == {"workload"}
        assert set(event.payload["workload"]) == INFO_KEYS


def test_a_record_made_with_no_attempt_and_no_first_byte(h: Harness) -> None:
    """A refusal's record: its status and error, no attempts, no time to first byte."""
    facts = Facts("r", "ollama", "GET", "/api/tags", h.clock.seconds())
    publish(h.bus, facts.record(h.clock.seconds(), 503, None, "no nodes"))
    [event] = h.events
    assert event.name == "proxy/request"
    assert event.payload["status"] == 503
    assert event.payload["error"] == "no nodes"
    assert event.payload["attempts"] == []
    assert event.payload["ttfb_ms"] is None
    assert event.payload["duration_ms"] == 0


def test_a_record_closes_an_open_attempt_as_unfinished(h: Harness) -> None:
    """An attempt left open at the next attempt or at the end is recorded as unfinished."""
    facts = Facts("r", "ollama", "POST", "/api/chat", h.clock.seconds())
    facts.attempts.close(AttemptOutcome.STALL, h.clock.seconds())  # none open: nothing
    facts.attempts.start("A", h.clock.seconds())
    h.clock.advance(1)
    facts.attempts.start("B", h.clock.seconds())
    h.clock.advance(2)
    facts.cache_affinity = True
    publish(h.bus, facts.record(h.clock.seconds(), 499, "B", "client left"))
    payload = h.events[0].payload
    assert payload["attempts"] == [
        {"node_id": "A", "outcome": "unfinished", "ms": 1000, "busy_waits": 0},
        {"node_id": "B", "outcome": "unfinished", "ms": 2000, "busy_waits": 0},
    ]
    assert payload["cache_affinity"] is True


def test_attempt_outcomes_render_as_documented() -> None:
    """Outcome strings are stable: the enum values and status-<code>."""
    assert [o.value for o in AttemptOutcome] == [
        "connect-error",
        "stall",
        "dropped",
        "first-body-timeout",
        "committed",
        "cancelled",
        "unfinished",
    ]
    assert StatusOutcome(503).value == "status-503"
    assert [o for o in AttemptOutcome if o.stalled] == [
        AttemptOutcome.STALL,
        AttemptOutcome.FIRST_BODY_TIMEOUT,
    ]
    assert not StatusOutcome(504).stalled
