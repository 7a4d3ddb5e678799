"""Operating the proxy: the admin listener, metrics, the JSON-RPC control channel and its methods,
graceful drain.
"""

from __future__ import annotations

from nvpair_tw.ops._admin import admin_service
from nvpair_tw.ops._control import control_service
from nvpair_tw.ops._drain import adopt_all, drain_service
from nvpair_tw.ops._token import ControlToken, needs_token, read_control_token

__all__ = [
    "ControlToken",
    "admin_service",
    "adopt_all",
    "control_service",
    "drain_service",
    "needs_token",
    "read_control_token",
]
