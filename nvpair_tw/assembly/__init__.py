"""Whole answers assembled from streamed work (docs/behaviour.md §6.5): the gate, the line splitter and
one folder per dialect.
"""

from __future__ import annotations

from nvpair_tw.assembly._frames import Dialect
from nvpair_tw.assembly._gate import AssemblyGate
from nvpair_tw.assembly._whole import Assembly, plan_assembly, rewrite_body, rewrite_outlined

__all__ = [
    "Assembly",
    "AssemblyGate",
    "Dialect",
    "plan_assembly",
    "rewrite_body",
    "rewrite_outlined",
]
