"""Simulated engines that misbehave on purpose, for ``--demo``, the benchmarks and the tests."""

from __future__ import annotations

from nvpair_tw.simulated._engine import (
    Behaviour,
    Policy,
    Received,
    SimulatedEngine,
    alternate,
    always,
    once,
)
from nvpair_tw.simulated._machine import Machine
from nvpair_tw.simulated._pace import Pace
from nvpair_tw.simulated._replies import reply_frames, stream_kind

__all__ = [
    "Behaviour",
    "Machine",
    "Pace",
    "Policy",
    "Received",
    "SimulatedEngine",
    "alternate",
    "always",
    "once",
    "reply_frames",
    "stream_kind",
]
