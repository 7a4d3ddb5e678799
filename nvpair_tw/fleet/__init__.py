"""A fleet of proxies sharing what they learn through Redis or Valkey (docs/behaviour.md §6.6)."""

from __future__ import annotations

from nvpair_tw.fleet._config import StateConfig, parse_state_url, read_secret
from nvpair_tw.fleet._store import FleetStore

__all__ = ["FleetStore", "StateConfig", "parse_state_url", "read_secret"]
