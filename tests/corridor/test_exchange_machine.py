"""The exchange as a machine (nvpair_tw.corridor._exchange), as playbooks: events in, steps out, the
phase after each, and the one record at the end. No socket, no reactor: the values the driver would
hand over are made here, and time is a ``Clock`` the playbook moves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
from attrs import evolve
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers

from nvpair_tw.core import IllegalCall, ProxyBug, RouteKind
from nvpair_tw.corridor._attempts import Abandoned, AttemptPlan, Committed, Exhausted
from nvpair_tw.corridor._dialect import AsIs, Wire
from nvpair_tw.corridor._exchange import (
    TRANSITIONS,
    Admit,
    Admitted,
    Answer,
    Answered,
    AttemptEnded,
    AttemptsEnded,
    AttemptStarted,
    Begun,
    BodyRead,
    BusyWaited,
    ClientGone,
    Cut,
    Ended,
    Ending,
    Exchange,
    Finish,
    HeadersArrived,
    Permit,
    Permitted,
    ReadBody,
    Relay,
    Relayed,
    Route,
    Routed,
    Stage,
    Stop,
    Try,
    Understood,
    Wait,
    Waited,
    WorkloadEnd,
)
from nvpair_tw.corridor._fallback import Served
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._record import Facts
from nvpair_tw.corridor._relay import RelayEnd, RelayOutcome
from nvpair_tw.corridor._roles import Channel, Targeting
from nvpair_tw.corridor._route import Route as RouteValue
from nvpair_tw.dialects import Usage
from nvpair_tw.events import AttemptOutcome, Choice, Phase, StatusOutcome
from nvpair_tw.inbound import LOCAL, Rejection, Target, parse_target
from nvpair_tw.nodes import Node
from nvpair_tw.selection import Admission, QueueFull, QueueTimeout, Slot, Waiter

A, B = Node("a", "http://a.test"), Node("b", "http://b.test")
CHAT = b'{"model": "llama3", "messages": []}'


def head(path: bytes = b"/api/chat", kind: RouteKind = RouteKind.INFERENCE) -> Head:
    target = parse_target(path)
    assert isinstance(target, Target)
    return Head(b"POST", target, kind, Channel.HTTP, LOCAL, Targeting.NONE, (), Headers(), None)


def inbound(model: str | None = "llama3") -> Inbound:
    return Inbound(head(), CHAT, {"model": model, "messages": []}, model)


def served(
    candidates: Sequence[Node] = (A, B),
    *,
    chosen: Choice = Choice.PREDICTION,
    fallback_from: str | None = None,
    warm: str | None = None,
    model: str | None = "llama3",
) -> Served:
    plan = AttemptPlan(
        headers=Headers(),
        sends=AsIs.of(b"POST", b"/api/chat", CHAT),
        inference=True,
        gated=True,
        header_timeout=120.0,
        first_body_timeout=0.0,
    )
    key = cast(Any, "digest") if warm else None
    route = RouteValue(
        plan, model, list(candidates), key, warm, model, chosen=chosen, context_fit=True
    )
    serving = "small" if fallback_from else None
    return Served(inbound(model), route, fallback_from, serving)


def committed(node: Node) -> Committed:
    return Committed(node, cast(Any, None), cast(Any, None), b"{", None)


def relayed(
    status: int = 200,
    end: RelayEnd = RelayEnd.FINISHED,
    *,
    error: str | None = None,
    complete: bool = True,
    gone: str | None = None,
) -> Relayed:
    outcome = RelayOutcome(status, end, error, complete, True, True, 42)
    return Relayed(outcome, Usage(12, 30), None, None, gone)


class Playbook:
    """An exchange, the clock its events happen on, and every phase it went through."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        facts = Facts("run-1", "ollama", "POST", "/api/chat", self.clock.seconds())
        self.exchange = Exchange(facts, self.clock.seconds)
        self.phases: list[Phase] = []

    def __call__(self, event: Any, after: float = 0.0) -> Any:
        """Feed ``event`` ``after`` seconds from now; the step it gives."""
        self.clock.advance(after)
        before = self.exchange.phase
        step = self.exchange.feed(event)
        if self.exchange.phase is not before:
            self.phases.append(self.exchange.phase)
        return step

    def admission(self, slots: int = 1) -> Admission:
        return Admission(self.clock, lambda _: slots, 4, 60.0)

    def slot(self) -> Slot:
        """A slot of a node of its own (admission is not what these playbooks test)."""
        slot = self.admission().admit([A])
        assert isinstance(slot, Slot)
        return slot

    def waiter(self) -> Waiter:
        """A place in a queue behind a full node."""
        admission = self.admission()
        admission.admit([A])
        waiter = admission.admit([A])
        assert isinstance(waiter, Waiter)
        return waiter


def start(book: Playbook, route: Served) -> None:
    """Begun, the body, the route, the limits: the request asks admission for ``route``."""
    assert book(Begun(Stage.FORWARD)) == ReadBody()
    understood = Understood(route.inbound, Stage.FORWARD)
    assert book(BodyRead(understood)) == Route(route.inbound)
    assert book(Routed(route)) == Permit()
    assert book(Permitted(None)) == Admit(route)


def test_a_free_slot_serves_at_once_and_the_record_says_who_served_and_why() -> None:
    book = Playbook()
    route = served()
    start(book, route)
    slot = book.admission().admit([A, B])
    assert isinstance(slot, Slot)
    assert book(Admitted(slot, 7)) == Try(route, slot)
    assert book(AttemptStarted("a")) is None
    assert book(HeadersArrived("a"), after=0.2) is None
    assert book(AttemptEnded("a", AttemptOutcome.COMMITTED), after=0.1) is None
    assert book(AttemptsEnded(committed(A))) == Relay(committed(A), route)
    finish = book(relayed(), after=1.0)
    assert isinstance(finish, Finish)
    assert finish.answer is None and finish.workload == WorkloadEnd(Ending.COMPLETE)
    record = finish.record
    assert (record.status, record.node_id, record.chosen_by) == (200, "a", Choice.PREDICTION)
    assert (record.duration_ms, record.ttfb_ms, record.workload_id) == (1300, 300, 7)
    assert [(x.node_id, x.outcome, x.ms) for x in record.attempts] == [
        ("a", AttemptOutcome.COMMITTED, 300)
    ]
    assert (record.prompt_tokens, record.completion_tokens) == (12, 30)
    assert book.phases == [
        Phase.WAITING_HEADERS,
        Phase.READING_PROMPT,
        Phase.STREAMING,
        Phase.DONE,
    ]


def test_queue_then_serve_counts_the_queue_time_and_waits_in_the_queued_phase() -> None:
    book = Playbook()
    route = served([A])
    admission = book.admission()
    assert isinstance(admission.admit([A]), Slot)  # a's one slot is taken
    start(book, route)
    waiter = admission.admit([A])
    assert isinstance(waiter, Waiter)
    assert book(Admitted(waiter, 3)) == Wait(waiter)
    assert book.exchange.phase is Phase.QUEUED
    slot = book.slot()
    assert book(Waited(slot, 2500), after=2.5) == Try(route, slot)
    book(AttemptStarted("a"))
    book(AttemptsEnded(committed(A)), after=0.5)
    record = book(relayed()).record
    assert (record.queued_ms, record.ttfb_ms, record.duration_ms) == (2500, 3000, 3000)
    assert book.phases == [Phase.QUEUED, Phase.WAITING_HEADERS, Phase.STREAMING, Phase.DONE]


def test_a_full_queue_is_503_with_retry_after_and_no_workload() -> None:
    book = Playbook()
    start(book, served())
    finish = book(Admitted(QueueFull(), None))
    assert isinstance(finish, Finish) and finish.workload is None
    assert isinstance(finish.answer, Rejection)
    assert (finish.answer.status, finish.answer.code) == (503, "queue-full")
    assert finish.answer.headers == ((b"Retry-After", b"1"),)
    assert (finish.record.status, finish.record.error) == (503, "queue-full")


def test_a_queue_timeout_fails_the_workload_with_a_503() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.waiter(), 3))
    finish = book(Waited(QueueTimeout("600s"), 600_000), after=600)
    assert finish.workload == WorkloadEnd(Ending.FAIL, "queue timeout: 600s")
    assert finish.answer.code == "queue-timeout"
    assert finish.record.queued_ms == 600_000


def test_the_client_gone_while_queued_cancels_the_workload_and_no_node_sees_it() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.waiter(), 3))
    assert book(ClientGone("client disconnected"), after=4) == Stop("client disconnected")
    finish = book(Waited("client disconnected", 4000))
    assert finish.workload == WorkloadEnd(Ending.CANCEL, "client disconnected")
    assert finish.answer == Cut()
    assert (finish.record.status, finish.record.error) == (499, "client disconnected")
    assert finish.record.attempts == ()


def test_fail_over_before_commit_records_each_attempt_and_says_failover() -> None:
    """A stalls (the attempts cool it), b commits: one record, both attempts, served by b."""
    book = Playbook()
    route = served()
    start(book, route)
    book(Admitted(book.slot(), 1))
    book(AttemptStarted("a"))
    book(BusyWaited("a"), after=120)
    book(AttemptEnded("a", AttemptOutcome.STALL), after=120)
    book(AttemptStarted("b"))
    book(HeadersArrived("b"), after=0.1)
    book(AttemptEnded("b", AttemptOutcome.COMMITTED), after=0.1)
    book(AttemptsEnded(committed(B)))
    record = book(relayed()).record
    assert [(x.node_id, x.outcome, x.ms, x.busy_waits) for x in record.attempts] == [
        ("a", AttemptOutcome.STALL, 240_000, 1),
        ("b", AttemptOutcome.COMMITTED, 200, 0),
    ]
    assert (record.node_id, record.chosen_by) == ("b", Choice.FAILOVER)
    assert book.phases[:4] == [
        Phase.WAITING_HEADERS,
        Phase.READING_PROMPT,
        Phase.STREAMING,
        Phase.DONE,
    ]


def test_every_owner_failing_asks_for_a_fallback_and_the_fallback_serves() -> None:
    book = Playbook()
    start(book, served([A]))
    book(Admitted(book.slot(), 1))
    book(AttemptStarted("a"))
    book(AttemptEnded("a", StatusOutcome(503)))
    step = book(AttemptsEnded(Exhausted(502, "upstream error: 503")))
    assert step == Route(None, WorkloadEnd(Ending.FAIL, "upstream error: 503"))
    fallback = served([B], fallback_from="big", chosen=Choice.ORDER)
    assert book(Routed(fallback)) == Admit(fallback)  # the limits counted once already
    book(Admitted(book.slot(), 2))
    book(AttemptStarted("b"))
    book(AttemptsEnded(committed(B)))
    record = book(relayed()).record
    assert (record.node_id, record.fallback_from, record.chosen_by) == ("b", "big", Choice.FALLBACK)
    assert record.workload_id == 2


def test_no_fallback_left_after_every_owner_failed_is_the_last_failure_as_502() -> None:
    book = Playbook()
    start(book, served([A]))
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(Exhausted(504, "upstream error: no first body byte")))
    finish = book(Routed(None))
    assert (finish.answer.status, finish.answer.code) == (504, "upstream-timeout")
    assert finish.record.error == "upstream error: no first body byte"
    assert finish.workload is None  # already failed when the fallback was asked for


def test_a_refusal_before_the_body_is_read_is_the_only_step() -> None:
    book = Playbook()
    assert book(Begun(Stage.FORWARD)) == ReadBody()
    refused = Rejection(403, "model-not-allowed", "no")
    finish = book(BodyRead(refused))
    assert finish == Finish(finish.record, refused)
    assert (finish.record.status, finish.record.error, finish.record.attempts) == (
        403,
        "model-not-allowed",
        (),
    )
    assert book.phases == [Phase.DONE]


def test_a_rate_limited_key_is_refused_after_routing_and_no_workload_is_made() -> None:
    book = Playbook()
    route = served()
    book(Begun(Stage.FORWARD))
    book(BodyRead(Understood(route.inbound, Stage.FORWARD)))
    book(Routed(route))
    limited = Rejection(429, "rate-limited", "slow down")
    finish = book(Permitted(limited))
    assert finish.answer == limited and finish.workload is None


def test_a_proxy_bug_before_commit_is_a_500_that_blames_no_node() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptStarted("a"))
    finish = book(AttemptsEnded(ProxyBug(ValueError("x"))))
    assert (finish.answer.status, finish.answer.code) == (500, "proxy-error")
    assert finish.record.node_id is None
    assert finish.workload == WorkloadEnd(Ending.FAIL, "proxy-error")


def test_a_caller_leaving_during_the_attempts_ends_cancelled_with_its_reason() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptStarted("a"))
    assert book(ClientGone("client disconnected")) == Stop("client disconnected")
    finish = book(AttemptsEnded(Abandoned("client disconnected")))
    assert finish.workload == WorkloadEnd(Ending.CANCEL, "client disconnected")
    assert finish.record.status == 499


@pytest.mark.parametrize(
    ("relay", "ending"),
    [
        (relayed(), WorkloadEnd(Ending.COMPLETE)),
        (relayed(500), WorkloadEnd(Ending.FAIL, "upstream answered 500")),
        (
            relayed(end=RelayEnd.TRUNCATED, error="upstream dropped mid-stream", complete=False),
            WorkloadEnd(Ending.FAIL, "upstream dropped mid-stream"),
        ),
        (
            relayed(end=RelayEnd.CALLER_GONE, gone="client stopped reading", complete=False),
            WorkloadEnd(Ending.CANCEL, "client stopped reading"),
        ),
        (relayed(end=RelayEnd.CALLER_GONE, complete=True), WorkloadEnd(Ending.COMPLETE)),
    ],
)
def test_how_the_relay_ended_decides_how_the_workload_ends(
    relay: Relayed, ending: WorkloadEnd
) -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    assert book(relay).workload == ending


@pytest.mark.parametrize(
    ("relay", "warm"),
    [
        (relayed(), True),
        (relayed(500), False),
        (relayed(end=RelayEnd.TRUNCATED, complete=False), False),
    ],
)
def test_only_a_clean_complete_200_makes_the_prefix_warm(relay: Relayed, warm: bool) -> None:
    book = Playbook()
    route = served(warm="a", chosen=Choice.AFFINITY)
    start(book, route)
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    finish = book(relay)
    assert finish.warm is warm
    assert finish.record.cache_affinity is True


@pytest.mark.parametrize(
    ("warm", "node", "cached", "affinity"),
    [
        ("a", A, 9, True),  # expected warm where it served; the engine found 9 tokens cached
        ("b", A, 0, False),  # expected warm at b, served by a: the engine said 0, a count
        (None, A, None, False),  # no warm node expected; the engine said nothing of a cache
    ],
)
def test_the_record_says_where_a_warm_prefix_was_expected_and_what_the_engine_found_cached(
    warm: str | None, node: Node, cached: int | None, affinity: bool
) -> None:
    """docs/behaviour.md §7: ``warm_node`` is the node the proxy expected to hold the prompt's
    prefix, ``cache_affinity`` whether that node served, ``cached_tokens`` the prompt tokens
    the serving engine said it found cached (None when it said nothing: unknown, never 0)."""
    book = Playbook()
    route = served([A, B], warm=warm, chosen=Choice.AFFINITY if warm else Choice.PREDICTION)
    start(book, route)
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(node)))
    outcome = RelayOutcome(200, RelayEnd.FINISHED, None, True, True, True, 42)
    finish = book(Relayed(outcome, Usage(12, 30, cached_tokens=cached), None, None, None))
    record = finish.record
    assert (record.warm_node, record.cache_affinity) == (warm, affinity)
    assert (record.prompt_tokens, record.cached_tokens) == (12, cached)


def test_a_stage_that_answers_by_itself_ends_with_its_own_facts() -> None:
    book = Playbook()
    assert book(Begun(Stage.MODEL_LIST)) == Answer(Stage.MODEL_LIST)
    assert book.exchange.phase is Phase.ANSWERING
    finish = book(Answered(Ended(200, first_byte_at=book.clock.seconds() + 0.0)), after=0.03)
    assert (finish.record.status, finish.record.error, finish.workload) == (200, None, None)
    assert book.phases == [Phase.ANSWERING, Phase.DONE]


def test_a_fan_outs_parts_and_nodes_reach_the_record() -> None:
    book = Playbook()
    book(Begun(Stage.FORWARD))
    fan = cast(Any, object())
    understood = Understood(inbound(), Stage.FAN_OUT, fan)
    assert book(BodyRead(understood)) == Answer(Stage.FAN_OUT, understood.inbound, fan)
    parts = (evolve_attempt("a"), evolve_attempt("b"))
    finish = book(Answered(Ended(207, None, "partial", parts, ("a", "b"))))
    assert finish.record.fan_out == ("a", "b") and finish.record.attempts == parts


def evolve_attempt(node_id: str) -> Any:
    from nvpair_tw.events import Attempt

    return Attempt(node_id, AttemptOutcome.COMMITTED, 5)


def test_an_event_not_legal_in_the_phase_is_an_illegal_call() -> None:
    book = Playbook()
    with pytest.raises(IllegalCall, match="Relayed in phase received"):
        book(relayed())
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    book(relayed())
    with pytest.raises(IllegalCall, match="ClientGone in phase done"):
        book(ClientGone("late"))


def test_the_table_names_every_phase_but_done_as_one_a_client_may_leave() -> None:
    live = {phase for (phase, kind) in TRANSITIONS if kind is ClientGone}
    assert live == set(Phase) - {Phase.DONE}
    assert all(isinstance(key[0], Phase) for key in TRANSITIONS)


def test_a_model_list_record_is_not_made_from_a_route() -> None:
    """The served route's model names the phases; a request without one has none."""
    book = Playbook()
    route = served(model=None)
    start(book, evolve(route))
    assert book.exchange.served is not None and book.exchange.served.route.label is None


@pytest.mark.parametrize(
    ("usage", "first_token_at", "rate"),
    [
        (Usage(12, 30, 1000.0, 1001.0, paced=True), None, 30.0),
        (Usage(12, 30, 1000.0, 1000.0001, paced=False), None, None),
        (Usage(12, 30, 1000.5, 1001.0, paced=False), 1000.0, 30.0),
    ],
    ids=["a stream", "a whole answer", "a stream the proxy assembled"],
)
def test_tokens_per_second_are_measured_only_where_tokens_came_one_after_another(
    usage: Usage, first_token_at: float | None, rate: float | None
) -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    outcome = RelayOutcome(200, RelayEnd.FINISHED, None, True, True, True, 42)
    record = book(Relayed(outcome, usage, first_token_at, None)).record
    assert record.tokens_per_s == rate


# --- the paths the mutation run of 2026-12-06 found unasserted -------------------------------------


def test_a_queue_timeout_is_503_with_retry_after_and_says_how_long_it_waited() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.waiter(), 3))
    finish = book(Waited(QueueTimeout("600s"), 600_000), after=600)
    why = "queue timeout: 600s"
    assert finish.answer == Rejection(503, "queue-timeout", why, ((b"Retry-After", b"1"),))
    assert (finish.record.status, finish.record.error) == (503, "queue-timeout")


def test_a_fallback_that_takes_a_queued_request_is_admitted_and_named_in_the_record() -> None:
    """§16.2: after fallback_after in the queue the fallback model takes the request: it asks
    admission again (the queued workload cancelled, not failed), and the record says so."""
    book = Playbook()
    start(book, served([A]))
    book(Admitted(book.waiter(), 3))
    fallback = served([B], fallback_from="big", chosen=Choice.ORDER)
    reason = "served by a fallback after waiting fallback_after"
    step = book(Waited(fallback, 2000), after=2)
    assert step == Admit(fallback, WorkloadEnd(Ending.CANCEL, reason))
    assert book.exchange.phase is Phase.RECEIVED and book.exchange.served is fallback
    book(Admitted(book.slot(), 4))
    book(AttemptStarted("b"))
    book(AttemptsEnded(committed(B)))
    record = book(relayed()).record
    assert (record.node_id, record.fallback_from, record.chosen_by) == ("b", "big", Choice.FALLBACK)
    assert (record.queued_ms, record.workload_id) == (2000, 4)


def test_a_refusal_from_the_route_is_the_answer_and_the_record() -> None:
    book = Playbook()
    book(Begun(Stage.FORWARD))
    book(BodyRead(Understood(inbound(), Stage.FORWARD)))
    refused = Rejection(404, "model-not-found", "model 'llama3' not found")
    finish = book(Routed(refused))
    assert finish.answer == refused and finish.workload is None
    assert (finish.record.status, finish.record.error) == (404, "model-not-found")


@pytest.mark.parametrize(
    ("exhausted", "answer"),
    [
        (
            Exhausted(502, "upstream error: 503"),
            Rejection(502, "upstream-error", "upstream error: 503"),
        ),
        (
            Exhausted(504, "no first body byte"),
            Rejection(504, "upstream-timeout", "no first body byte"),
        ),
        (Exhausted(503, "every node busy"), Rejection(503, "upstream-error", "every node busy")),
    ],
)
def test_every_owner_failing_with_no_fallback_answers_the_last_failure(
    exhausted: Exhausted, answer: Rejection
) -> None:
    book = Playbook()
    start(book, served([A]))
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(exhausted))
    finish = book(Routed(None))
    assert finish.answer == answer
    assert (finish.record.status, finish.record.error) == (answer.status, answer.message)


def test_no_candidate_and_no_fallback_is_a_502_that_says_so() -> None:
    book = Playbook()
    book(Begun(Stage.FORWARD))
    book(BodyRead(Understood(inbound(), Stage.FORWARD)))
    finish = book(Routed(None))
    message = "upstream error: no candidate answered"
    assert finish.answer == Rejection(502, "upstream-error", message)
    assert (finish.record.status, finish.record.error) == (502, message)


def test_a_proxy_bug_before_commit_says_the_proxy_failed() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    finish = book(AttemptsEnded(ProxyBug(ValueError("x"))))
    assert finish.answer == Rejection(500, "proxy-error", "the proxy failed on the answer")
    assert finish.record.status == 500


def test_a_caller_gone_during_the_attempts_is_cut_and_recorded_with_its_reason() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptStarted("a"), after=1)
    book(ClientGone("client disconnected"))
    finish = book(AttemptsEnded(Abandoned("client disconnected")))
    assert finish.answer == Cut()
    assert (finish.record.status, finish.record.error) == (499, "client disconnected")


def test_the_record_names_the_model_as_the_node_was_asked_and_whether_it_was_translated() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    wire = Wire(b"POST", b"/v1/chat/completions", b"{}", None, translated=True, local_model="l3")
    book(AttemptsEnded(evolve(committed(A), wire=wire)))
    record = book(relayed()).record
    assert (record.model, record.model_local, record.translated) == ("llama3", "l3", True)


def test_a_node_other_than_the_first_candidate_serving_is_a_failover_and_the_first_is_not() -> None:
    chosen = {}
    for node in (A, B):
        book = Playbook()
        start(book, served([A, B], chosen=Choice.SESSION))
        book(Admitted(book.slot(), 1))
        book(AttemptsEnded(committed(node)))
        chosen[node.id] = book(relayed()).record.chosen_by
    assert chosen == {"a": Choice.SESSION, "b": Choice.FAILOVER}


def test_the_record_keeps_the_prediction_it_was_served_by() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    outcome = RelayOutcome(200, RelayEnd.FINISHED, None, True, True, True, 42)
    record = book(Relayed(outcome, Usage(12, 30), None, (900, 1100))).record
    assert (record.predicted_ms, record.measured_ms) == (900, 1100)


@pytest.mark.parametrize(
    ("keyed", "terminal_seen", "streaming", "warm"),
    [
        ("session", True, True, True),  # a session alone names the conversation
        (None, True, True, False),  # nothing names it: nothing is warm
        ("key", False, True, False),  # a stream that never showed its end
        ("key", False, False, True),  # a whole answer has no terminal event to see
    ],
)
def test_what_makes_a_conversation_warm_where_it_was_served(
    keyed: str | None, terminal_seen: bool, streaming: bool, warm: bool
) -> None:
    book = Playbook()
    route = served()
    key = cast(Any, "digest") if keyed == "key" else None
    session = cast(Any, "session") if keyed == "session" else None
    route = evolve(route, route=evolve(route.route, key=key, session=session))
    start(book, route)
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    outcome = RelayOutcome(200, RelayEnd.FINISHED, None, True, terminal_seen, streaming, 42)
    assert book(Relayed(outcome, Usage(12, 30), None, None)).warm is warm


@pytest.mark.parametrize(
    ("outcome", "ending"),
    [
        (
            RelayOutcome(299, RelayEnd.FINISHED, None, True, True, True, 1),
            WorkloadEnd(Ending.COMPLETE),
        ),
        (
            RelayOutcome(300, RelayEnd.FINISHED, None, True, True, True, 1),
            WorkloadEnd(Ending.FAIL, "upstream answered 300"),
        ),
        (
            RelayOutcome(300, RelayEnd.CALLER_GONE, None, True, True, True, 1),
            WorkloadEnd(Ending.CANCEL, "cancelled"),
        ),
        (
            RelayOutcome(200, RelayEnd.TRUNCATED, None, False, False, True, 1),
            WorkloadEnd(Ending.FAIL, "upstream dropped mid-stream"),
        ),
        (
            RelayOutcome(200, RelayEnd.TRUNCATED, "reset by peer", False, False, True, 1),
            WorkloadEnd(Ending.FAIL, "reset by peer"),
        ),
    ],
)
def test_the_workload_ending_at_the_edges_of_a_success(
    outcome: RelayOutcome, ending: WorkloadEnd
) -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    finish = book(Relayed(outcome, None, None, None))
    assert finish.workload == ending
    assert (finish.record.status, finish.record.error) == (outcome.status, outcome.error)


@pytest.mark.parametrize(
    ("first_content", "ttft_ms"),
    [(1003.0, 3000), (999.0, 0)],  # a first token stamped before dispatch counts as at once
)
def test_the_time_to_first_token_is_from_dispatch_in_whole_milliseconds(
    first_content: float, ttft_ms: int
) -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptStarted("a"))
    book(AttemptsEnded(committed(A)), after=0.5)
    usage = Usage(12, 30, first_content, first_content + 3.0, paced=True)
    record = book(
        Relayed(RelayOutcome(200, RelayEnd.FINISHED, None, True, True, True, 1), usage, None, None)
    ).record
    assert record.ttft_ms == ttft_ms
    assert record.tokens_per_s == 10.0


def test_an_engine_stated_rate_wins_and_is_kept_to_two_decimals() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    usage = evolve(Usage(12, 30, 1000.0, 1003.0, paced=True), engine_rate=41.23456)
    record = book(
        Relayed(RelayOutcome(200, RelayEnd.FINISHED, None, True, True, True, 1), usage, None, None)
    ).record
    assert record.tokens_per_s == 41.23
    assert (record.prompt_tokens, record.completion_tokens) == (12, 30)


def test_a_rate_is_not_made_from_tokens_that_came_at_one_instant() -> None:
    book = Playbook()
    start(book, served())
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    usage = Usage(12, 30, 1000.0, 1000.0, paced=True)
    record = book(
        Relayed(RelayOutcome(200, RelayEnd.FINISHED, None, True, True, True, 1), usage, None, None)
    ).record
    assert record.tokens_per_s is None


def test_a_stage_that_answers_by_itself_records_its_node_its_error_and_its_first_byte() -> None:
    book = Playbook()
    book(Begun(Stage.MODEL_LIST))
    first = book.clock.seconds() + 0.01
    finish = book(Answered(Ended(502, "a", "upstream error", first_byte_at=first)), after=0.03)
    record = finish.record
    assert (record.status, record.node_id, record.error, record.ttfb_ms) == (
        502,
        "a",
        "upstream error",
        10,
    )


def test_a_stage_that_answers_by_itself_may_refuse() -> None:
    book = Playbook()
    book(Begun(Stage.MODEL_LIST))
    refused = Rejection(503, "inventory-unavailable", "no inventory")
    finish = book(Answered(refused))
    assert finish.answer == refused
    assert (finish.record.status, finish.record.error) == (503, "inventory-unavailable")


@pytest.mark.parametrize("fits", [True, False])
def test_the_record_says_whether_the_request_fit_the_context_it_was_served_with(fits: bool) -> None:
    book = Playbook()
    route = served()
    route = evolve(route, route=evolve(route.route, context_fit=fits))
    start(book, route)
    book(Admitted(book.slot(), 1))
    book(AttemptsEnded(committed(A)))
    assert book(relayed()).record.context_fit is fits
