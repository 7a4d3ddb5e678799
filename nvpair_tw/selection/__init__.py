"""Which node, in which order, when: inventory and its poller, prefix affinity, stall cooldowns,
reservations, the ordering function, body progress and admission.
"""

from __future__ import annotations

from nvpair_tw.selection._admission import (
    RETRY_AFTER_SECONDS,
    Admission,
    QueueFull,
    QueueTimeout,
    Slot,
    Waiter,
    slot_limit,
)
from nvpair_tw.selection._affinity import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    AffinityKey,
    AffinityTable,
    affinity_key,
)
from nvpair_tw.selection._cordons import Cordon, CordonBook, CordonListener
from nvpair_tw.selection._inventory import InventoryBook
from nvpair_tw.selection._ordering import order_candidates
from nvpair_tw.selection._polling import PROBE_BOUND, expiry_probe
from nvpair_tw.selection._progress import ProgressBook
from nvpair_tw.selection._reservations import Booking, ReservationLedger, make_rank
from nvpair_tw.selection._routers import spare_busy_routers, would_evict_busy_work
from nvpair_tw.selection._stalls import (
    Cooldown,
    CooldownListener,
    IStallTracker,
    Probe,
    StallTracker,
)

__all__ = [
    "CHAT_PATHS",
    "COMPLETION_PATHS",
    "PROBE_BOUND",
    "RETRY_AFTER_SECONDS",
    "Admission",
    "AffinityKey",
    "AffinityTable",
    "Booking",
    "Cooldown",
    "CooldownListener",
    "Cordon",
    "CordonBook",
    "CordonListener",
    "IStallTracker",
    "InventoryBook",
    "Probe",
    "ProgressBook",
    "QueueFull",
    "QueueTimeout",
    "ReservationLedger",
    "Slot",
    "StallTracker",
    "Waiter",
    "affinity_key",
    "expiry_probe",
    "make_rank",
    "order_candidates",
    "slot_limit",
    "spare_busy_routers",
    "would_evict_busy_work",
]
