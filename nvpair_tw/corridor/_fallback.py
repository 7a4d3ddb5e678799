# -*- test-case-name: tests.corridor.test_fallback -*-
"""The models that may serve one request, in order (docs/behaviour.md §16.1, §16.2).

:class:`Fallbacks` is made once per forwarded request. :meth:`Fallbacks.first` routes the model the
client asked for, as its own table wants it (§16.1); when no node can take it (none owns it, every
owner is cordoned, none of a kind that serves the route), it routes the first fallback that can.
Later, before anything is committed, :meth:`Fallbacks.next` gives the next fallback that can take
the request: after every owner failed (the exchange's ``Exhausted``), or when the request waited
in the queue longer than ``fallback_after`` (:meth:`Fallbacks.waited`; until predictions exist,
§15, the queue wait is the measure).

A fallback is asked with the client's own body renamed to the fallback's public name and edited by
the fallback's table, never the asked model's (the served model's table applies). One level deep:
a fallback's own fallbacks are not followed. Fallbacks outside the caller's scope (§12.1) are
skipped. A request naming a node (``X-NVPair-Node``) or no model has no fallbacks. The answer
names the fallback (its body's ``model`` is the fallback's name); the :class:`Served` value says
which model the client asked for and which serves, so the record says ``fallback_from`` and the
response carries ``X-NVPair-Model``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from attrs import define, evolve, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nvpair_tw.core import RouteKind
from nvpair_tw.corridor._attempts import LastStatus
from nvpair_tw.corridor._defaults import served
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._route import Route
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.inbound import Rejection
from nvpair_tw.selection import Slot, Waiter

__all__ = ["MODEL_HEADER", "Fallbacks", "RouteOf", "Served"]

MODEL_HEADER = b"x-nvpair-model"
"""The response header naming the model that served a fallen-back request."""

RouteOf: TypeAlias = Callable[[FacadeState, Inbound], "Route | Rejection"]
"""How a request is routed (``corridor._route.route``): given to :meth:`Fallbacks.of`."""

_NO_NODE = frozenset(
    {"model-not-found", "model-unavailable", "node-cordoned", "no-route-owner", "untranslatable"}
)
"""The route's refusals that mean no node can take the model (a fallback may)."""

_FALLS_BACK = (RouteKind.INFERENCE, RouteKind.MODEL_ROUTED)


@frozen
class Served:
    """A model's request and its route: what the admission and the attempts take."""

    inbound: Inbound
    route: Route
    fallback_from: str | None = None
    """The public name the client asked for, when a fallback serves (§16.2)."""
    serving: str | None = None
    """The fallback's public name (``X-NVPair-Model``), when a fallback serves."""


@define
class Fallbacks:
    """One request's way down its model's fallbacks (state: the fallbacks not yet tried)."""

    _facade: FacadeState
    _client: Inbound
    _route_of: RouteOf
    _asked: str | None
    _left: list[str]
    _after: float | None
    serving: str | None = field(default=None, init=False)
    """The public name of the fallback serving now; None while the asked model does."""

    @classmethod
    def of(cls, facade: FacadeState, inbound: Inbound, route_of: RouteOf) -> Fallbacks:
        """The fallbacks of ``inbound``'s model that its caller may use."""
        model = inbound.model
        if model is None or inbound.kind not in _FALLS_BACK:
            return cls(facade, inbound, route_of, None, [], None)
        catalogue = facade.directory.catalogue
        asked = catalogue.public(model)
        policy = catalogue.policy(asked)
        left: list[str] = []
        if inbound.node is None:
            rules = inbound.caller.rules
            left = [p for p in map(catalogue.public, policy.fallbacks) if rules.allows(p)]
        return cls(facade, inbound, route_of, asked, left, policy.fallback_after)

    def first(self) -> Served | Rejection:
        """The asked model's route, or the first fallback's that can take the request, or the
        asked model's refusal."""
        catalogue = self._facade.directory.catalogue
        policy = catalogue.policy(self._asked) if self._asked is not None else None
        inbound = served(self._client, policy) if policy is not None else self._client
        route = self._route_of(self._facade, inbound)
        if not isinstance(route, Rejection):
            return self._served(inbound, route)
        if route.code in _NO_NODE:
            fallback = self.next()
            if fallback is not None:
                return fallback
        return route

    def next(self) -> Served | None:
        """The next fallback that a node can take the request for, or None (none left)."""
        catalogue = self._facade.directory.catalogue
        while self._left:
            name = self._left.pop(0)
            inbound = served(self._client, catalogue.policy(name), name)
            route = self._route_of(self._facade, inbound)
            if isinstance(route, Rejection):
                continue
            self.serving = name
            return self._served(inbound, route)
        return None

    def _served(self, inbound: Inbound, route: Route) -> Served:
        """The route, whose last candidate's 5xx fails over to a fallback while one is left."""
        if self._left:
            route = evolve(route, plan=evolve(route.plan, last_status=LastStatus.FAILS))
        if self.serving is None:
            return Served(inbound, route)
        return Served(inbound, route, self._asked, self.serving)

    def waited(self, waiter: Waiter, clock: IReactorTime) -> Deferred[Slot | Served]:
        """The waiter's slot, or — once it has waited ``fallback_after`` and a fallback can take
        the request — that fallback (the waiter then leaves the queue). Cancelling the result
        cancels the wait."""
        after = self._after
        if after is None or not self._left:
            return waiter.bound.addCallback(_as_ticket)
        result: Deferred[Slot | Served] = Deferred(lambda _: waiter.bound.cancel())

        def overdue() -> None:
            fallback = self.next()
            if fallback is not None:
                result.callback(fallback)
                waiter.bound.cancel()

        timer = clock.callLater(max(0.0, after - (clock.seconds() - waiter.since)), overdue)

        def bound(slot: Slot) -> None:
            if timer.active():
                timer.cancel()
            result.callback(slot)

        def failed(failure: Failure) -> None:
            if timer.active():
                timer.cancel()
            if not result.called:
                result.errback(failure)

        waiter.bound.addCallbacks(bound, failed)
        return result


def _as_ticket(slot: Slot) -> Slot | Served:
    return slot
