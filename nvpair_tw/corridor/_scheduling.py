# -*- test-case-name: tests.corridor.test_state -*-
"""The fastest answer, per request (docs/behaviour.md §15): a request's candidates ranked by their
predicted time to the last token, the flights of its attempts, and what its complete answer
teaches — over one facade's books (:class:`~nvpair_tw.corridor._state.FacadeState`)."""

from __future__ import annotations

from attrs import frozen

from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    Answer,
    FlightBook,
    Landing,
    Load,
    Patience,
    RequestSize,
    Start,
    Trip,
    fit,
    order_candidates,
    patience,
    predict_all,
    sample_of,
    slot_wait,
)

__all__ = ["Ranked", "learn", "rank", "trip"]


@frozen
class Ranked:
    """Candidates in order of their predicted time to the last token (docs/behaviour.md §15.2),
    whether the warm node heads them, and each node's prediction in seconds."""

    nodes: list[Node]
    affinity: bool
    predicted: dict[str, float]
    context_fit: bool = True
    """False when no candidate's known context holds the request: the largest is used (§15.3)."""
    patience: Patience | None = None
    """How long a queued request waits for its best node while a worse one frees (§15.2)."""


def rank(
    facade: FacadeState, nodes: list[Node], model: str, size: RequestSize, affinity_hint: str | None
) -> Ranked:
    """The order of an inference request for ``model`` (§15.2): only the nodes it fits
    (§15.3), an eligible pin first, then the least predicted time to the last token, cooling
    nodes last."""
    ledger = facade.shared.ledger
    loads: dict[str, Load] = {}

    def load(node_id: str) -> Load:
        # The fleet's reservations (§6.6) count too: a peer's requests share the node. Read
        # once per node and request (the prediction and the patience both ask).
        known = loads.get(node_id)
        if known is not None:
            return known
        here = max(facade.flights.in_flight(node_id), facade.admission.slots_in_use(node_id))
        busy = max(here, ledger.reservations(node_id))
        known = loads[node_id] = Load(
            busy + ledger.pending(node_id),
            facade.admission.slots(node_id),
            facade.flights.remaining(node_id) + facade.admission.queued_for(node_id),
            facade.inventory.resident(node_id, model),
        )
        return known

    ids = [n.id for n in nodes]
    # A request that sets its own num_ctx is served with it wherever it goes (§15.3).
    known = (
        (lambda n: None) if size.num_ctx else (lambda n: facade.inventory.context_length(n, model))
    )
    fitted = fit(ids, size.needed, known)
    ids = fitted.nodes
    predicted = predict_all(ids, model, size, facade.speeds, load, affinity_hint)
    ordering = order_candidates(
        ids,
        pin=facade.pin or None,
        snapshot=ledger.in_force,
        ledger_view=ledger,
        affinity_hint=affinity_hint,
        head_selection=True,
        cooling=facade.stalls.cooling(),
        predicted=predicted,
    )
    by_id = {n.id: n for n in nodes}
    nodes = [by_id[i] for i in ordering.nodes]
    waiting = None
    if len(ids) > 1:  # with one candidate there is no better node to wait for
        waits = {n: slot_wait(load(n)) for n in ids}
        waiting = patience(list(ordering.nodes), predicted, waits, facade.shared.clock.seconds())
    return Ranked(nodes, ordering.affinity, predicted, fitted.fits, waiting)


def trip(
    facade: FacadeState,
    model: str | None,
    predicted: dict[str, float],
    warm: str | None,
    waiting: Patience | None = None,
) -> Trip:
    """The flights of one request (§15.2): how each attempt starts is read at its dispatch;
    each counts as work ahead its prediction from dispatch (``waiting``'s, when it has one)."""

    def start(node_id: str) -> Start:
        if node_id == warm:
            return Start.CACHED
        if model and facade.inventory.resident(node_id, model) is False:
            return Start.LOADED
        return Start.PLAIN

    # A request naming no model is not counted as work on a node (a fresh book keeps it).
    book = facade.flights if model else FlightBook(facade.shared.clock)
    return Trip(book, predicted, start, None if waiting is None else waiting.service)


def learn(facade: FacadeState, landing: Landing, model: str, answer: Answer) -> None:
    """Fold one complete answer into the serving node's rates (§15.1)."""
    node_id = landing.node_id
    prefill = facade.speeds.rates(node_id, model).prefill
    sample = sample_of(answer, landing.start, landing.concurrency, prefill)
    facade.speeds.learn(node_id, model, sample)
