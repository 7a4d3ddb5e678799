"""Simulated engines that misbehave on purpose, for ``--demo``, the benchmarks and the tests."""

from __future__ import annotations

from nvpair_tw.simulated._engine import (
    Behaviour,
    Policy,
    Received,
    SimulatedEngine,
    alternate,
    always,
)
from nvpair_tw.simulated._replies import reply_frames, stream_kind

__all__ = [
    "Behaviour",
    "Policy",
    "Received",
    "SimulatedEngine",
    "alternate",
    "always",
    "reply_frames",
    "stream_kind",
]
