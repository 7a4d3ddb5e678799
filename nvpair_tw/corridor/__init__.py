"""One request's walk: facade, route, attempts, relay; the facade's state, workloads, the tunnel,
model-list aggregation and terminal-frame detection.
"""

from __future__ import annotations

from nvpair_tw.corridor._facade import FacadeResource
from nvpair_tw.corridor._preload import ask_node
from nvpair_tw.corridor._state import FacadeState, Shared
from nvpair_tw.corridor._workloads import WorkloadRegistry, WorkloadState

__all__ = [
    "FacadeResource",
    "FacadeState",
    "Shared",
    "WorkloadRegistry",
    "WorkloadState",
    "ask_node",
]
