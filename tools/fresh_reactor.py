"""pytest plugin for mutation runs (``-p tools.fresh_reactor``): a fresh reactor per pytest session.

mutmut runs pytest several times in one process (statistics, the clean run) and forks each mutant's
run from that process. pytest-twisted starts the global reactor once per session and stops it at
the end, and a Twisted reactor cannot run twice (``ReactorNotRestartable``). Before pytest-twisted
configures a session, this installs a new reactor of the same type if the current one has already
run. The tests never hold the global reactor (the ``reactor`` fixture imports it per test), so they
all get the fresh one.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

__all__ = ["pytest_configure"]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    current: Any = sys.modules.get("twisted.internet.reactor")
    if current is None or not getattr(current, "_startedBefore", False) or current.running:
        return
    import twisted.internet
    from twisted.internet.main import installReactor

    del sys.modules["twisted.internet.reactor"]
    del twisted.internet.reactor
    installReactor(type(current)())
