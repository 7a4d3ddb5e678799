# -*- test-case-name: tests.test_events -*-
"""The events the proxy publishes, typed (docs/behaviour.md §7), and the bus that carries them.

Publishers build one frozen value per event (`ProxyRequest`, `WorkloadStarted`, `NodeCooldown`,
...); consumers match on its class and read its attributes. Its wire object (``to_json``), the one
the control channel's notifications, ``GET /events`` on the admin listener and the log lines send,
is made only when one of them asks, once.
"""

from nvpair_tw.events._bus import Event, EventBus, Subscription
from nvpair_tw.events._kinds import (
    NODE_COOLDOWN,
    NODE_COOLDOWN_ENDED,
    NODE_CORDON,
    NODE_UNCORDON,
    PROXY_REQUEST,
    WORKLOAD_COMPLETED,
    WORKLOAD_ERRORED,
    WORKLOAD_QUEUED,
    WORKLOAD_STARTED,
    Attempt,
    BusEvent,
    NodeCooldown,
    NodeCooldownEnded,
    NodeCordon,
    NodeUncordon,
    ProxyRequest,
    WorkloadCompleted,
    WorkloadErrored,
    WorkloadInfo,
    WorkloadQueued,
    WorkloadStarted,
    WorkloadState,
)
from nvpair_tw.events._log import log_events

__all__ = [
    "NODE_COOLDOWN",
    "NODE_COOLDOWN_ENDED",
    "NODE_CORDON",
    "NODE_UNCORDON",
    "PROXY_REQUEST",
    "WORKLOAD_COMPLETED",
    "WORKLOAD_ERRORED",
    "WORKLOAD_QUEUED",
    "WORKLOAD_STARTED",
    "Attempt",
    "BusEvent",
    "Event",
    "EventBus",
    "NodeCooldown",
    "NodeCooldownEnded",
    "NodeCordon",
    "NodeUncordon",
    "ProxyRequest",
    "Subscription",
    "WorkloadCompleted",
    "WorkloadErrored",
    "WorkloadInfo",
    "WorkloadQueued",
    "WorkloadStarted",
    "WorkloadState",
    "log_events",
]
