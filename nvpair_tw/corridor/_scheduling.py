# -*- test-case-name: tests.corridor.test_state, tests.corridor.test_scheduling -*-
"""The fastest answer, per request (docs/behaviour.md §15): a request's candidates ranked by their
predicted time to the last token, the flights of its attempts, and what its complete answer
teaches — over one facade's books (:class:`~nvpair_tw.corridor._state.FacadeState`)."""

from __future__ import annotations

from collections.abc import Mapping

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

__all__ = ["Ranked", "learn", "rank", "reloading", "trip"]


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
    reloads: frozenset[str] = frozenset()
    """The candidates that would reload the model to serve the context the request asks (§15.2):
    predicted cold, and their answer's start counted as a load."""


def reloading(
    facade: FacadeState, nodes: list[Node], model: str, size: RequestSize
) -> frozenset[str]:
    """The nodes whose kind reloads a model for another context (``context_reloads``) and whose
    known loaded context for ``model`` is not the ``num_ctx`` the request asks (§15.2)."""
    asked = size.num_ctx
    if asked is None:
        return frozenset()
    inventory = facade.inventory
    return frozenset(
        n.id
        for n in nodes
        if n.kind_of(facade.profile).context_reloads
        and (loaded := inventory.context_length(n.id, model)) is not None
        and loaded != asked
    )


def rank(
    facade: FacadeState,
    nodes: list[Node],
    model: str,
    size: RequestSize,
    affinity_hint: str | None,
    pushing: Mapping[str, float] | None = None,
) -> Ranked:
    """The order of an inference request for ``model`` (§15.2): only the nodes it fits
    (§15.3), an eligible pin first, then the least predicted time to the last token, cooling
    nodes last. A node that would reload the model for the asked context is predicted cold.
    ``pushing``: per node, seconds added where ordering and waiting compare (§5.3.1)."""
    ledger = facade.shared.ledger
    loads: dict[str, Load] = {}
    reloads = reloading(facade, nodes, model, size)

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
            False if node_id in reloads else facade.inventory.resident(node_id, model),
        )
        return known

    ids = [n.id for n in nodes]
    # A request that sets its own num_ctx is served with it wherever it goes (§15.3).
    known = (
        (lambda n: None) if size.num_ctx else (lambda n: facade.inventory.context_length(n, model))
    )
    fitted = fit(ids, size.needed, known)
    ids = fitted.nodes
    warm = None if affinity_hint in reloads else affinity_hint  # a reload drops the cache
    predicted = predict_all(ids, model, size, facade.speeds, load, warm)
    costs = {n: t + (pushing or {}).get(n, 0.0) for n, t in predicted.items()}
    ordering = order_candidates(
        ids,
        pin=facade.pin or None,
        snapshot=ledger.in_force,
        ledger_view=ledger,
        affinity_hint=affinity_hint,
        head_selection=True,
        cooling=facade.stalls.cooling(),
        predicted=costs,
    )
    by_id = {n.id: n for n in nodes}
    nodes = [by_id[i] for i in ordering.nodes]
    waiting = None
    if len(ids) > 1:  # with one candidate there is no better node to wait for
        waits = {n: slot_wait(load(n)) for n in ids}
        waiting = patience(list(ordering.nodes), costs, waits, facade.shared.clock.seconds())
    return Ranked(nodes, ordering.affinity, predicted, fitted.fits, waiting, reloads)


def trip(
    facade: FacadeState,
    model: str | None,
    predicted: dict[str, float],
    warm: str | None,
    waiting: Patience | None = None,
    reloads: frozenset[str] = frozenset(),
) -> Trip:
    """The flights of one request (§15.2): how each attempt starts is read at its dispatch (a
    node of ``reloads`` loads the model again); each counts as work ahead its prediction from
    dispatch (``waiting``'s, when it has one)."""

    def start(node_id: str) -> Start:
        if node_id in reloads:
            return Start.LOADED
        if node_id == warm:
            return Start.CACHED
        if model and facade.inventory.resident(node_id, model) is False:
            return Start.LOADED
        return Start.PLAIN

    # A request naming no model is not counted as work on a node (a fresh book keeps it).
    book = facade.flights if model else FlightBook(facade.shared.clock)
    return Trip(book, predicted, start, None if waiting is None else waiting.service)


def learn(
    facade: FacadeState,
    landing: Landing,
    model: str,
    answer: Answer,
    prompt_bytes: int | None = None,
) -> None:
    """Fold one complete answer into the serving node's rates (§15.1), and into the model's bytes
    per token the request's ``prompt_bytes`` (:attr:`RequestSize.prompt_bytes`, measured at the
    route) over the prompt tokens the engine stated."""
    node_id = landing.node_id
    prefill = facade.speeds.rates(node_id, model).prefill
    sample = sample_of(answer, landing.start, landing.concurrency, prefill, prompt_bytes)
    facade.speeds.learn(node_id, model, sample)
