"""Fixtures shared by the end-to-end modules (a module may define its own of the same name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.realnodes import RealOllama


@pytest.fixture(scope="module")
def real_ollama() -> Iterator[RealOllama]:
    """One real Ollama for the module that asks for it, stopped after the module's last test."""
    node = RealOllama.start()
    try:
        yield node
    finally:
        node.stop()
