# -*- test-case-name: tests.test_events -*-
"""The events the proxy publishes, one frozen class each (docs/behaviour.md §7).

Each class carries its fields as typed attributes, its wire name as ``name`` and gives, with
``to_json``, the JSON object the control channel's notifications, ``GET /events`` on the admin
listener and the log lines send. That object is made on first asking and kept, so a consumer that
reads attributes (the usage recorder, the metrics, traces) never pays for it and those that send it
share one.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

from attrs import frozen

from nvpair_tw.core import IdentityEnum

__all__ = [
    "EVENT_KINDS",
    "FAN_OUT_PROGRESS",
    "NODE_COOLDOWN",
    "NODE_COOLDOWN_ENDED",
    "NODE_CORDON",
    "NODE_UNCORDON",
    "PROXY_REQUEST",
    "REQUEST_PHASE",
    "WORKLOAD_COMPLETED",
    "WORKLOAD_ERRORED",
    "WORKLOAD_QUEUED",
    "WORKLOAD_STARTED",
    "Attempt",
    "AttemptOutcome",
    "BusEvent",
    "Choice",
    "FanOutProgress",
    "NodeCooldown",
    "NodeCooldownEnded",
    "NodeCordon",
    "NodeUncordon",
    "Outcome",
    "PartProgress",
    "PartState",
    "Phase",
    "ProxyRequest",
    "RequestPhase",
    "StatusOutcome",
    "WorkloadCompleted",
    "WorkloadErrored",
    "WorkloadInfo",
    "WorkloadQueued",
    "WorkloadStarted",
    "WorkloadState",
    "outcome_named",
]

# The names of the events the proxy publishes: the bus, the control channel's notifications,
# ``GET /events`` on the admin listener and the log lines all use them (docs/behaviour.md §7).
WORKLOAD_QUEUED = "workload:queued"
"""A workload waits in the proxy's admission queue, before any dispatch."""
WORKLOAD_STARTED = "workload:started"
"""A workload is dispatched to a node (again each time an attempt moves to another node)."""
WORKLOAD_COMPLETED = "workload:completed"
"""A workload's committed 2xx answer was relayed to the end."""
WORKLOAD_ERRORED = "workload:errored"
"""A workload ended ``failed`` or ``cancelled``."""
PROXY_REQUEST = "proxy/request"
"""The record of one request, rejections included; it follows every request."""
NODE_COOLDOWN = "node/cooldown"
"""A node stalled and is skipped until its cooldown ends."""
NODE_COOLDOWN_ENDED = "node/cooldown-ended"
"""A node's cooldown ended (``why``: ``success`` or ``expired``)."""
NODE_CORDON = "node/cordon"
"""A node was cordoned: it takes no new work (§13.1; ``reason``, ``since``, ``origin``)."""
NODE_UNCORDON = "node/uncordon"
"""A node's cordon was lifted."""
REQUEST_PHASE = "request/phase"
"""A request moved to another phase of its exchange (queued, waiting for headers, ...)."""
FAN_OUT_PROGRESS = "fan-out/progress"
"""A pull or create fanned out to several nodes moved on (§13.2): each node's part, how far."""

Wire = dict[str, Any]
_WIRE = "_wire"


# The event classes keep a ``__dict__`` (``slots=False``): a frozen attrs class fills it with
# plain stores, twice as fast as a slotted one's ``object.__setattr__`` for each field (one
# ``ProxyRequest`` a request), and the wire object is kept there, outside the fields.
@frozen(slots=False)
class BusEvent:
    """What every published event has: its wire name and its wire object, made once."""

    name: ClassVar[str]

    def to_json(self) -> Wire:
        """The event's JSON object as sent (made on first asking and kept: do not change it)."""
        kept = self.__dict__
        wire: Wire | None = kept.get(_WIRE)
        if wire is None:
            wire = kept[_WIRE] = self._build()
        return wire

    def _build(self) -> Wire:
        raise NotImplementedError


class WorkloadState(IdentityEnum):
    """The ``state`` of a workload once queued or dispatched."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@frozen(slots=False)
class WorkloadInfo:
    """The ``workloadInfo`` of docs/behaviour.md §7 at one moment (times in ms since the epoch)."""

    id: int
    run_id: str
    engine: str
    model: str
    state: WorkloadState | None
    scheduled_on: str | None
    created_at: int
    started_at: int | None
    completed_at: int | None
    error: str | None
    seq: int

    def to_json(self) -> Wire:
        """The ``workloadInfo`` object."""
        return {
            "id": self.id,
            "runId": self.run_id,
            "engine": self.engine,
            "model": self.model,
            "state": None if self.state is None else self.state.value,
            "scheduledOn": self.scheduled_on,
            "createdAt": self.created_at,
            "startedAt": self.started_at,
            "completedAt": self.completed_at,
            "error": self.error,
            "seq": self.seq,
        }


@frozen(slots=False)
class _WorkloadEvent(BusEvent):
    workload: WorkloadInfo

    def _build(self) -> Wire:
        return {"workload": self.workload.to_json()}


@frozen(slots=False)
class WorkloadQueued(_WorkloadEvent):
    """``workload:queued``: the workload waits for a free slot."""

    name: ClassVar[str] = WORKLOAD_QUEUED


@frozen(slots=False)
class WorkloadStarted(_WorkloadEvent):
    """``workload:started``: the workload was dispatched to ``workload.scheduled_on``."""

    name: ClassVar[str] = WORKLOAD_STARTED


@frozen(slots=False)
class WorkloadCompleted(_WorkloadEvent):
    """``workload:completed``."""

    name: ClassVar[str] = WORKLOAD_COMPLETED


@frozen(slots=False)
class WorkloadErrored(_WorkloadEvent):
    """``workload:errored``: the workload ended failed or cancelled (``workload.error`` says why)."""

    name: ClassVar[str] = WORKLOAD_ERRORED


@frozen(slots=False)
class NodeCooldown(BusEvent):
    """``node/cooldown``: the node stalled; ``cooling_until`` is in ms since the epoch.
    ``renewed``: still no answer at the previous expiry (§6.3); ``origin``: the peer of the fleet
    that stalled, None for this process (§6.6)."""

    name: ClassVar[str] = NODE_COOLDOWN
    engine: str
    node_id: str
    reason: str
    cooling_until: int
    renewed: bool = False
    origin: str | None = None

    def _build(self) -> Wire:
        wire: Wire = {
            "engine": self.engine,
            "node_id": self.node_id,
            "reason": self.reason,
            "coolingUntil": self.cooling_until,
        }
        if self.renewed:
            wire["renewed"] = True
        if self.origin is not None:
            wire["origin"] = self.origin
        return wire


@frozen(slots=False)
class NodeCooldownEnded(BusEvent):
    """``node/cooldown-ended``; ``why``: ``success`` or ``expired``."""

    name: ClassVar[str] = NODE_COOLDOWN_ENDED
    engine: str
    node_id: str
    why: str

    def _build(self) -> Wire:
        return {"engine": self.engine, "node_id": self.node_id, "why": self.why}


@frozen(slots=False)
class NodeCordon(BusEvent):
    """``node/cordon`` (§13.1): ``since`` in ms since the epoch, None for the nodes file's."""

    name: ClassVar[str] = NODE_CORDON
    engine: str
    node_id: str
    reason: str
    since: int | None
    origin: str

    def _build(self) -> Wire:
        return {
            "engine": self.engine,
            "node_id": self.node_id,
            "reason": self.reason,
            "since": self.since,
            "origin": self.origin,
        }


@frozen(slots=False)
class NodeUncordon(BusEvent):
    """``node/uncordon``."""

    name: ClassVar[str] = NODE_UNCORDON
    engine: str
    node_id: str

    def _build(self) -> Wire:
        return {"engine": self.engine, "node_id": self.node_id}


class AttemptOutcome(IdentityEnum):
    """How one attempt ended, when not with a status (docs/behaviour.md §6.1, §7)."""

    CONNECT_ERROR = "connect-error"
    STALL = "stall"
    DROPPED = "dropped"
    FIRST_BODY_TIMEOUT = "first-body-timeout"
    COMMITTED = "committed"
    CANCELLED = "cancelled"
    UNFINISHED = "unfinished"
    """Still open when the next attempt started or the request ended."""

    @property
    def stalled(self) -> bool:
        """Whether the node stalled (both kinds cool it, §6.3)."""
        return self in _STALLED


_STALLED = frozenset({AttemptOutcome.STALL, AttemptOutcome.FIRST_BODY_TIMEOUT})


@frozen
class StatusOutcome:
    """An attempt answered with a status that moved on (or was the answer): ``status-<code>``."""

    code: int

    @property
    def value(self) -> str:
        """Its name in ``proxy/request``: ``status-<code>``."""
        return f"status-{self.code}"

    @property
    def stalled(self) -> bool:
        """A status is never a stall."""
        return False


Outcome = AttemptOutcome | StatusOutcome
"""How an attempt ended, typed to the edge: its ``value`` is the name a record carries."""


def outcome_named(name: str) -> Outcome:
    """The outcome a record names ``name`` (``stall``, ``status-503``, ...); ValueError for a name
    no outcome has."""
    prefix, _, code = name.partition("status-")
    if not prefix and code.isdigit():
        return StatusOutcome(int(code))
    return AttemptOutcome(name)


@frozen
class Attempt:
    """One closed attempt of a request."""

    node_id: str
    outcome: Outcome
    ms: int
    busy_waits: int = 0
    """Header-deadline periods waited because the node showed progress elsewhere (§6.4)."""

    def to_json(self) -> Wire:
        """The attempt in ``proxy/request``'s ``attempts``."""
        return {
            "node_id": self.node_id,
            "outcome": self.outcome.value,
            "ms": self.ms,
            "busy_waits": self.busy_waits,
        }


class Phase(IdentityEnum):
    """Where a request is in its exchange (the exchange's states, docs/behaviour.md §7)."""

    RECEIVED = "received"
    """Its head passed; its body is being read and its route decided."""
    ANSWERING = "answering"
    """The proxy answers it itself: a model list, a probe, a fan-out, a preload, a tunnel."""
    QUEUED = "queued"
    """It waits in the proxy for a node's free slot (§6.4)."""
    WAITING_HEADERS = "waiting-headers"
    """Sent to a node, which has not answered its head yet."""
    READING_PROMPT = "reading-prompt"
    """The node answered its head and reads the prompt: no token yet."""
    STREAMING = "streaming"
    """The answer is on its way to the client."""
    DONE = "done"
    """It ended: its record is published."""


class Choice(Enum):
    """Why the node that served a request was asked first (docs/behaviour.md §5, §15)."""

    TARGET = "target"
    """``X-NVPair-Node`` named it."""
    PIN = "pin"
    """The operator's manual selection (``node/select``)."""
    AFFINITY = "affinity"
    """It holds the conversation's prefix (§5.3)."""
    SESSION = "session"
    """It is the home of the session the client named (§5.3)."""
    CONVERSATION = "conversation"
    """It holds the stored response the request continues (``previous_response_id``)."""
    PREDICTION = "prediction"
    """It was predicted to answer first (§15.2)."""
    ORDER = "order"
    """The candidate order (§5.1, §5.2) put it first."""
    FAILOVER = "failover"
    """An earlier candidate failed before commit (§6.1)."""
    FALLBACK = "fallback"
    """A fallback model served (§16.2)."""


@frozen(slots=False)
class RequestPhase(BusEvent):
    """``request/phase``: a request moved to ``phase`` (its node once it has one, its model as
    records name it, its key's name); ``since`` in ms since the epoch."""

    name: ClassVar[str] = REQUEST_PHASE
    id: str
    engine: str
    phase: Phase
    since: int
    method: str
    path: str
    node_id: str | None = None
    model: str | None = None
    key: str | None = None

    def _build(self) -> Wire:
        return {
            "id": self.id,
            "engine": self.engine,
            "phase": self.phase.value,
            "since": self.since,
            "method": self.method,
            "path": self.path,
            "node_id": self.node_id,
            "model": self.model,
            "key": self.key,
        }


@frozen(slots=False)
class ProxyRequest(BusEvent):
    """``proxy/request``: the record of one request (docs/behaviour.md §7, §12.3).

    Durations are in ms. ``model`` is None for a request naming no model: the fields after it are
    then not sent. ``fan_out``, ``fallback_from``, ``key`` and ``warm_node`` are sent only when
    set, ``context_fit`` only when False, ``predicted_ms`` and ``measured_ms`` only with a
    prediction. ``status`` None: the record has none (usage counts it as an error).
    """

    name: ClassVar[str] = PROXY_REQUEST
    id: str
    engine: str
    node_id: str | None
    method: str
    path: str
    status: int | None
    duration_ms: int | None
    ttfb_ms: int | None
    error: str | None
    attempts: tuple[Attempt, ...]
    cache_affinity: bool
    queued_ms: int
    fan_out: tuple[str, ...] | None = None
    fallback_from: str | None = None
    key: str | None = None
    model: str | None = None
    model_local: str | None = None
    translated: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_ms: int | None = None
    tokens_per_s: float | None = None
    context_fit: bool = True
    predicted_ms: int | None = None
    measured_ms: int | None = None
    chosen_by: Choice | None = None
    """Why the node that served was asked (docs/behaviour.md §7); None when no node was."""
    workload_id: int | None = None
    """The request's workload (§7), for traces (§12.5); not in the wire object."""
    cached_tokens: int | None = None
    """The prompt tokens the serving engine said it found in its cache (§12.2; part of
    ``prompt_tokens``); None when it said nothing of a cache."""
    warm_node: str | None = None
    """The node the proxy expected to hold the prompt's prefix (§5.3); None: none expected."""

    def _build(self) -> Wire:
        wire: Wire = {
            "id": self.id,
            "engine": self.engine,
            "node_id": self.node_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "ttfb_ms": self.ttfb_ms,
            "error": self.error,
            "attempts": [a.to_json() for a in self.attempts],
            "cache_affinity": self.cache_affinity,
            "queued_ms": self.queued_ms,
        }
        if self.fan_out is not None:
            wire["fan_out"] = list(self.fan_out)
        if self.fallback_from is not None:
            wire["fallback_from"] = self.fallback_from
        if self.key is not None:
            wire["key"] = self.key
        if self.chosen_by is not None:
            wire["chosen_by"] = self.chosen_by.value
        if self.model is not None:
            wire["model"] = self.model
            wire["model_local"] = self.model_local
            wire["translated"] = self.translated
            wire["prompt_tokens"] = self.prompt_tokens
            wire["completion_tokens"] = self.completion_tokens
            wire["cached_tokens"] = self.cached_tokens
            wire["ttft_ms"] = self.ttft_ms
            wire["tokens_per_s"] = self.tokens_per_s
            if self.warm_node is not None:
                wire["warm_node"] = self.warm_node
            if not self.context_fit:
                wire["context_fit"] = False
            if self.predicted_ms is not None:
                wire["predicted_ms"] = self.predicted_ms
                wire["measured_ms"] = self.measured_ms
        return wire


class PartState(Enum):
    """Where one node's part of a fan-out stands (docs/behaviour.md §13.2)."""

    ASKED = "asked"
    """Sent to the node, no progress line yet."""
    RUNNING = "running"
    """Its progress lines arrive."""
    SUCCEEDED = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"
    """The client left."""

    @property
    def ended(self) -> bool:
        """Whether the part is over."""
        return self not in _UNDER_WAY


_UNDER_WAY = frozenset({PartState.ASKED, PartState.RUNNING})


@frozen
class PartProgress:
    """One node's part of a fan-out: its state, the bytes done and to do over every layer its
    progress lines named (``completed`` and ``total``; both 0 while none did) and, when it
    failed, why (the engine's own ``error`` message, capped, or a transport reason)."""

    node_id: str
    state: PartState
    completed: int = 0
    total: int = 0
    error: str | None = None

    def to_json(self) -> Wire:
        """The part in ``fan-out/progress``'s ``nodes``."""
        return {
            "node_id": self.node_id,
            "state": self.state.value,
            "completed": self.completed,
            "total": self.total,
            "error": self.error,
        }


@frozen(slots=False)
class FanOutProgress(BusEvent):
    """``fan-out/progress``: where a streamed fan-out (pull, create) stands on each of its nodes;
    published when it starts, when a part ends and, while lines arrive, at most every half a
    second. ``id`` is the fan-out's own (unique in the process); ``since`` in ms since the epoch;
    ``model`` as the body named it (it passed the model rule, §14.1). The event whose parts have
    all ended is its last."""

    name: ClassVar[str] = FAN_OUT_PROGRESS
    id: str
    engine: str
    path: str
    model: str | None
    since: int
    parts: tuple[PartProgress, ...]

    @property
    def ended(self) -> bool:
        """Whether every part is over (no further event follows)."""
        return all(part.state.ended for part in self.parts)

    def _build(self) -> Wire:
        return {
            "id": self.id,
            "engine": self.engine,
            "path": self.path,
            "model": self.model,
            "since": self.since,
            "nodes": [part.to_json() for part in self.parts],
        }


EVENT_KINDS: tuple[type[BusEvent], ...] = (
    WorkloadQueued,
    WorkloadStarted,
    WorkloadCompleted,
    WorkloadErrored,
    ProxyRequest,
    RequestPhase,
    NodeCooldown,
    NodeCooldownEnded,
    NodeCordon,
    NodeUncordon,
    FanOutProgress,
)
"""Every kind of event the proxy publishes."""
