"""A simulated engine's Site over a real socket: it writes no access log (in ``--demo`` its
lines would fill the proxy's own log with every poll of the demo's nodes)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import pytest_twisted
import treq
from twisted.logger import ILogObserver, globalLogPublisher

from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import start_engine

pytestmark = pytest.mark.timeout(30)


@pytest_twisted.ensureDeferred
async def test_a_simulated_engine_writes_no_access_log_line() -> None:
    from twisted.internet import reactor

    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        lines.append(str(event.get("log_format") or event.get("message") or ""))
        lines.append(str(event.get("log_io") or ""))

    observer = cast(ILogObserver, observe)
    handle = await start_engine(reactor, SimulatedEngine(reactor))
    globalLogPublisher.addObserver(observer)
    try:
        response = await treq.get(handle.url + "/api/tags", persistent=False)
        await treq.content(response)
    finally:
        globalLogPublisher.removeObserver(observer)
        await handle.stop()
    assert response.code == 200
    assert not [line for line in lines if "GET /api/tags" in line], lines
