# -*- test-case-name: tests.corridor.test_state, tests.corridor.test_scheduling -*-
"""The fastest answer, per request (docs/behaviour.md §15): a request's candidates ranked by their
predicted time to the last token, how it chooses among them while it waits for a slot (its
:class:`~nvpair_tw.selection.Patience`, read again at every look), the flights of its attempts,
and what its complete answer teaches — over one facade's books
(:class:`~nvpair_tw.corridor._state.FacadeState`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attrs import evolve, frozen

from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.nodes import Node
from nvpair_tw.selection import (
    EXPLORE,
    HOLD_MAX,
    Answer,
    FlightBook,
    Landing,
    Load,
    Outlook,
    Patience,
    RequestSize,
    Start,
    Trip,
    expected_completion,
    fit,
    order_candidates,
    predict,
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
    """How the request chooses among its candidates whenever it is looked at (§15.2); None:
    the first free one in order."""
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
        # Read once per node and request; the work queued for the node counts as ahead.
        known = loads.get(node_id)
        if known is None:
            queued = facade.admission.queued_for(node_id)
            known = loads[node_id] = _load(facade, node_id, model, reloads, queued)
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
    # What ordering and waiting compare: the predictions, with what a cache push costs added.
    costs = {n: t + pushing.get(n, 0.0) for n, t in predicted.items()} if pushing else predicted
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
    head = ordering.nodes[0] if ordering.nodes else None
    # With one candidate there is no better node to wait for; a pin or a cooling demotion at
    # the head binds the first free candidate in order, as before (§15.2).
    if len(ids) > 1 and head is not None and costs.get(head) == min(costs.values()):
        order = list(ordering.nodes)
        asked = Asked(model, size, warm, reloads, dict(pushing or {}))
        waiting = Patience(outlook(facade, order, asked))
    return Ranked(nodes, ordering.affinity, predicted, fitted.fits, waiting, reloads)


def _load(
    facade: FacadeState, node_id: str, model: str, reloads: frozenset[str], ahead: float = 0.0
) -> Load:
    """A node's load now as the prediction sees it: the requests in flight there (this
    facade's, or the fleet's reservations (§6.6) when more, plus a scheduler snapshot's
    pending), its slots, the predicted work of its flights (and ``ahead``: the work queued for
    it), the model's residency."""
    ledger = facade.shared.ledger
    here = max(facade.flights.in_flight(node_id), facade.admission.slots_in_use(node_id))
    return Load(
        max(here, ledger.reservations(node_id)) + ledger.pending(node_id),
        facade.admission.slots(node_id),
        facade.flights.remaining(node_id) + ahead,
        False if node_id in reloads else facade.inventory.resident(node_id, model),
    )


@frozen
class Asked:
    """What one request asks of its candidates, fixed when it is ranked (§15.2)."""

    model: str
    size: RequestSize
    warm: str | None
    """The node holding its prefix, which reads only the tail."""
    reloads: frozenset[str]
    pushing: Mapping[str, float]
    """Per node, the seconds its cache's pushed-out conversations cost (§5.3.1)."""


def outlook(
    facade: FacadeState, nodes: list[str], asked: Asked
) -> Callable[[], dict[str, Outlook]]:
    """The outlook of ``asked`` on each of ``nodes``, read again at every look
    (§15.2): its service there with the rates and loads of that moment (and what a cache push
    costs, §5.3.1); the wait for a slot
    (the work of the node's flights over its slots); and a node that has not answered for the
    model since the proxy started, whose first request there has not shown its speed yet (for
    at most :data:`HOLD_MAX`), is held, waited for as long again as that request has run. A
    first request that has shown its tokens lends the node its rate."""

    model, size, reloads = asked.model, asked.size, asked.reloads

    def read() -> dict[str, Outlook]:
        completion = expected_completion(size, facade.speeds.completion_mean(model))
        views = {}
        for node_id in nodes:
            rates, speeds = facade.speeds.rates(node_id, model), facade.speeds
            first = not rates.measured and not speeds.answered(node_id, model)
            run = facade.flights.first_run(node_id, model) if first else None
            live = None if run is None else run.rate
            if live is not None:
                rates = evolve(rates, decode=live)
            load = _load(facade, node_id, model, reloads)
            prompt = size.tail_tokens if node_id == asked.warm else size.prompt_tokens
            service = predict(
                rates, Load(load.in_flight, load.slots, 0.0, load.resident), prompt, completion
            )
            if not rates.measured and live is None:
                service *= EXPLORE
            service += asked.pushing.get(node_id, 0.0)
            wait = slot_wait(load)
            if run is not None and live is None and run.elapsed < HOLD_MAX:
                views[node_id] = Outlook(service, max(wait, run.elapsed), held=True)
            else:
                views[node_id] = Outlook(service, wait)
        return views

    return read


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
    service = None
    if waiting is not None and waiting.last:
        service = {node_id: seen.service for node_id, seen in waiting.last.items()}
    return Trip(book, predicted, start, service, model)


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
    prefill = facade.speeds.prefill(node_id, model)
    sample = sample_of(answer, landing.start, landing.concurrency, prefill, prompt_bytes)
    facade.speeds.learn(node_id, model, sample)
