"""pytest plugin for mutation runs (``-p tools.fresh_reactor``): pytest-twisted, run repeatedly in
one process.

mutmut runs pytest several times in one process (statistics, the clean run) and forks each mutant's
run from that process. pytest-twisted starts the global reactor once per session and stops it at
the end, and a Twisted reactor cannot run twice (``ReactorNotRestartable``). Before pytest-twisted
configures a session, this installs a new reactor of the same type if the current one has already
run. The tests never hold the global reactor (the ``reactor`` fixture imports it per test), so they
all get the fresh one.

pytest-twisted also wraps a Hypothesis test's ``inner_test`` in place on every call; the test
modules stay imported between runs, so a second run would wrap the wrapper (and fail with
"blockon cannot be called from the twisted greenlet"). The original is put back after each call.

Runs disable pytest-timeout (mutmut times mutants itself); the ``timeout`` marker some test modules
set is registered here so ``--strict-markers`` still accepts them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["pytest_configure", "pytest_pyfunc_call"]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("timeout"):
        # runs go without pytest-timeout (mutmut has its own): its marker is still known
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's, unused here")
    current: Any = sys.modules.get("twisted.internet.reactor")
    if current is None or not getattr(current, "_startedBefore", False) or current.running:
        return
    import twisted.internet
    from twisted.internet.main import installReactor

    del sys.modules["twisted.internet.reactor"]
    del twisted.internet.reactor
    installReactor(type(current)())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[None]:
    handle = getattr(pyfuncitem.obj, "hypothesis", None)
    original = getattr(handle, "inner_test", None)
    try:
        yield
    finally:
        if handle is not None:
            handle.inner_test = original
