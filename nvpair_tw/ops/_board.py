# -*- test-case-name: tests.ops.test_board, tests.ops.test_admin -*-
"""The status board: what the status page shows beyond the runtime's live state, kept from the
event bus, and the ``/api/state`` snapshot it renders first (docs/operations.md, "The status
page").

From the bus: recent failovers, each node's last success, the per-node throughput of the last 15
minutes (:mod:`~nvpair_tw.ops._throughput`), the requests in flight with their phase, the recent
requests and their counts by key and model, each node's time to first token and last contact
(:mod:`~nvpair_tw.ops._recent`), and the running and last ended fan-outs' progress. From the
runtime: each node's state (:mod:`~nvpair_tw.ops._nodestate`), slots, queue, inventory,
reachability, residency and rates, the version and where clients reach each facade. Every part is
bounded; nothing in it is a body, a prompt, a key or a URL's userinfo.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from nvpair_tw._version import __version__
from nvpair_tw.corridor import FacadeState
from nvpair_tw.events import Event, FanOutProgress, ProxyRequest, RequestPhase, Subscription
from nvpair_tw.nodes import Node
from nvpair_tw.ops._maintenance import in_flight
from nvpair_tw.ops._nodestate import node_state
from nvpair_tw.ops._queues import queue_json
from nvpair_tw.ops._recent import RequestBook
from nvpair_tw.ops._throughput import Throughput, completion_tokens
from nvpair_tw.runtime import Runtime, openai_url
from nvpair_tw.selection import shown_contexts

__all__ = ["FAN_OUTS_ENDED", "FAN_OUTS_RUNNING", "FanOuts", "Listening", "StatusBoard"]

RECENT_FAILOVERS = 20
FAN_OUTS_RUNNING = 16
"""Running fan-outs followed at once (the oldest is dropped first, should it never end)."""
FAN_OUTS_ENDED = 5
"""Ended fan-outs kept to show how they ended."""

Listening = Callable[[str], bool]
"""Whether a facade (by engine) has a listening port."""


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


class FanOuts:
    """The latest progress of the running fan-outs, and of the last ones that ended."""

    def __init__(self) -> None:
        self._running: OrderedDict[str, FanOutProgress] = OrderedDict()
        self._ended: deque[FanOutProgress] = deque(maxlen=FAN_OUTS_ENDED)

    def progress(self, event: FanOutProgress) -> None:
        """A fan-out moved on (or ended: its parts all have)."""
        if event.ended:
            self._running.pop(event.id, None)
            self._ended.appendleft(event)
            return
        self._running[event.id] = event
        while len(self._running) > FAN_OUTS_RUNNING:
            self._running.popitem(last=False)

    def to_json(self) -> list[dict[str, Any]]:
        """Each fan-out's ``fan-out/progress`` object with ``ended``: the running ones, newest
        first, then the ended ones, last ended first."""
        running = [{**e.to_json(), "ended": False} for e in reversed(self._running.values())]
        return [*running, *({**e.to_json(), "ended": True} for e in self._ended)]


class StatusBoard:
    """Follows the bus for the status page, and makes its snapshot."""

    def __init__(self, runtime: Runtime, keep: int = RECENT_FAILOVERS) -> None:
        self._runtime = runtime
        self.failovers: deque[dict[str, Any]] = deque(maxlen=keep)
        self.last_success: dict[tuple[str, str], int] = {}
        self.throughput = Throughput()
        self.requests = RequestBook()
        self.fan_outs = FanOuts()
        self._subscription: Subscription | None = runtime.shared.bus.subscribe(
            self._observe, name="status-board", kinds=(RequestPhase, FanOutProgress, ProxyRequest)
        )

    def close(self) -> None:
        """Stop following the bus."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def _observe(self, event: Event) -> None:
        value = event.value
        if isinstance(value, RequestPhase):
            self.requests.phase(value)
        elif isinstance(value, FanOutProgress):
            self.fan_outs.progress(value)
            self.requests.fan_out(value, event.time)
        elif isinstance(value, ProxyRequest):
            self._record(value, event.time)

    def _record(self, record: ProxyRequest, time: float) -> None:
        """A request ended at clock seconds ``time`` (its record's publish time)."""
        self.requests.record(record, time)
        engine, node_id, status = record.engine, record.node_id, record.status
        if status is not None and 200 <= status < 300 and node_id is not None:
            self.last_success[(engine, node_id)] = int(time * 1000)
        completion = completion_tokens(record.completion_tokens)
        if completion is not None and node_id is not None:
            # the publish time on the runtime's clock: the request's end
            self.throughput.add(time, engine, node_id, completion)
        if len(record.attempts) > 1:
            self.failovers.appendleft(
                {
                    "at": int(time * 1000),
                    "id": record.id,
                    "engine": engine,
                    "path": record.path,
                    "node_id": node_id,
                    "status": status,
                    "attempts": [a.to_json() for a in record.attempts],
                }
            )

    def state(self, listening: Listening) -> dict[str, Any]:
        """The ``/api/state`` snapshot: the version, facades (their address, queue and nodes),
        live workloads, the requests (:meth:`RequestBook.to_json`), fan-outs, recent failovers
        and ``throughput`` (:meth:`Throughput.to_json`)."""
        runtime = self._runtime
        now = runtime.reactor.seconds()
        known = {(e, n.id) for e, f in runtime.facades.items() for n in f.directory.nodes()}
        self.requests.forget(known)
        return {
            "now": _ms(now),
            "version": __version__.public(),
            "runId": runtime.shared.workloads.run_id,
            "facades": [self._facade(f, listening) for f in runtime.facades.values()],
            "workloads": [w.info() for w in runtime.shared.workloads.live()],
            "requests": self.requests.to_json(),
            "fanOuts": self.fan_outs.to_json(),
            "failovers": list(self.failovers),
            "store": None if runtime.fleet is None else runtime.fleet.status(),
            "throughput": self.throughput.to_json(now),
        }

    def _facade(self, facade: FacadeState, listening: Listening) -> dict[str, Any]:
        engine = facade.engine
        url = self._runtime.facade_urls.get(engine)
        return {
            "engine": engine,
            "listening": listening(engine),
            "address": None if url is None else {"url": url, "openai": openai_url(url)},
            "pin": facade.pin,
            "queueDepth": facade.admission.queue_depth,
            "queue": queue_json(facade),
            "nodes": [self._node(facade, node) for node in facade.directory.nodes()],
        }

    def _node(self, facade: FacadeState, node: Node) -> dict[str, Any]:
        """One node as the page shows it (``None`` where a value is not known)."""
        engine, shared, inventory = facade.engine, facade.shared, facade.inventory
        cooldown, cordon = facade.stalls.cooldown(node.id), facade.cordons.of(node)
        loaded, reach = inventory.loaded(node.id), inventory.reachability(node.id)
        contact = self.requests.contact(engine, node.id)
        return {
            "id": node.id,
            "url": node.public_url,
            "source": node.source,
            "kind": node.kind_of(facade.profile).name,
            "state": node_state(facade, node, contact).to_json(),
            "reach": None if reach is None else {**reach.to_json(), "since": _ms(reach.since)},
            "models": sorted(inventory.models(node.id)),
            "inventoryKnown": inventory.known(node.id),
            "inventoryAt": _ms(inventory.last_success(node.id)),
            "lastSuccess": self.last_success.get((engine, node.id)),
            "ttft": self.requests.ttft(engine, node.id),
            "cache": self.requests.cache(engine, node.id),
            "inFlight": in_flight(facade, node.id),
            "tunnels": shared.tunnels.count(engine, node.id),
            "reservations": shared.ledger.reservations(node.id),
            "slots": facade.admission.slots(node.id),
            "slotsInUse": facade.admission.slots_in_use(node.id),
            "waiting": facade.admission.waiting_for(node.id),
            "busyWaits": facade.progress.busy_waits(node.id),
            "loaded": None if loaded is None else sorted(loaded),
            "cooling": None
            if cooldown is None
            else {"until": _ms(cooldown.until), "reason": cooldown.reason},
            "cordon": None if cordon is None else cordon.to_json(),
            "rates": facade.speeds.to_json(node.id),
            "contexts": shown_contexts(
                inventory.facts.contexts(node.id), inventory.models(node.id)
            ),
        }
