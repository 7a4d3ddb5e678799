"""Which node, in which order, when: inventory and its poller, prefix affinity, stall cooldowns,
reservations, the ordering function, body progress and admission; learnt speeds, flights and
predicted times to answer (docs/behaviour.md §15).
"""

from __future__ import annotations

from nvpair_tw.selection._admission import (
    RETRY_AFTER_SECONDS,
    Admission,
    Cordons,
    QueueFull,
    QueueTimeout,
    Slot,
    Waited,
    Waiter,
    slot_limit,
)
from nvpair_tw.selection._affinity import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    AffinityKey,
    AffinityTable,
    Match,
    affinity_key,
)
from nvpair_tw.selection._caches import CacheBook, Capacity, CapacitySource, Place
from nvpair_tw.selection._canonical import BILLING_PREFIX, is_billing_block
from nvpair_tw.selection._contexts import Fit, fit, shown_contexts
from nvpair_tw.selection._cordons import Cordon, CordonBook, CordonListener
from nvpair_tw.selection._flights import FirstRun, FlightBook, Landing, Trip
from nvpair_tw.selection._gaps import RouteGaps
from nvpair_tw.selection._inventory import InventoryBook
from nvpair_tw.selection._ordering import order_candidates
from nvpair_tw.selection._patience import HOLD_MAX, Outlook, Patience
from nvpair_tw.selection._polling import PROBE_BOUND, expiry_probe
from nvpair_tw.selection._predict import (
    EXPLORE,
    Load,
    RequestSize,
    expected_completion,
    predict,
    predict_all,
    request_size,
    slot_wait,
)
from nvpair_tw.selection._progress import ProgressBook
from nvpair_tw.selection._reachability import Reach, Reachability
from nvpair_tw.selection._reservations import Booking, ReservationLedger, make_rank
from nvpair_tw.selection._routers import spare_busy_routers, would_evict_busy_work
from nvpair_tw.selection._sessions import (
    SESSION_HEADERS,
    Home,
    Session,
    SessionTable,
    Warm,
    session_name,
    warm_node,
)
from nvpair_tw.selection._slots import priority_note
from nvpair_tw.selection._speed import Answer, Rates, Sample, SpeedBook, Start, sample_of
from nvpair_tw.selection._stalls import (
    Cooldown,
    CooldownListener,
    IStallTracker,
    Probe,
    StallTracker,
)

__all__ = [
    "BILLING_PREFIX",
    "CHAT_PATHS",
    "COMPLETION_PATHS",
    "EXPLORE",
    "HOLD_MAX",
    "PROBE_BOUND",
    "RETRY_AFTER_SECONDS",
    "SESSION_HEADERS",
    "Admission",
    "AffinityKey",
    "AffinityTable",
    "Answer",
    "Booking",
    "CacheBook",
    "Capacity",
    "CapacitySource",
    "Cooldown",
    "CooldownListener",
    "Cordon",
    "CordonBook",
    "CordonListener",
    "Cordons",
    "FirstRun",
    "Fit",
    "FlightBook",
    "Home",
    "IStallTracker",
    "InventoryBook",
    "Landing",
    "Load",
    "Match",
    "Outlook",
    "Patience",
    "Place",
    "Probe",
    "ProgressBook",
    "QueueFull",
    "QueueTimeout",
    "Rates",
    "Reach",
    "Reachability",
    "RequestSize",
    "ReservationLedger",
    "RouteGaps",
    "Sample",
    "Session",
    "SessionTable",
    "Slot",
    "SpeedBook",
    "StallTracker",
    "Start",
    "Trip",
    "Waited",
    "Waiter",
    "Warm",
    "affinity_key",
    "expected_completion",
    "expiry_probe",
    "fit",
    "is_billing_block",
    "make_rank",
    "order_candidates",
    "predict",
    "predict_all",
    "priority_note",
    "request_size",
    "sample_of",
    "session_name",
    "shown_contexts",
    "slot_limit",
    "slot_wait",
    "spare_busy_routers",
    "warm_node",
    "would_evict_busy_work",
]
