"""From options to a running service: the configuration value, the service wiring and ``--demo``."""

from __future__ import annotations

from nvpair_tw.app._config import Config
from nvpair_tw.app._wiring import assemble

__all__ = ["Config", "assemble"]
