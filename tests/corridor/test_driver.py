"""The driver (nvpair_tw.corridor._driver): the one owner of the Twisted ``Request`` past the door,
the phases it publishes as the exchange moves, the one record it publishes, and a bug answered once.

The socket-free playbooks of the exchange are tests/corridor/test_exchange_machine.py; here the
driver runs the real corridor in memory."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from nvpair_tw.corridor import _answering
from nvpair_tw.corridor._exchange import Stage
from nvpair_tw.simulated import Behaviour, SimulatedEngine, always
from nvpair_tw.testing import MemoryCluster

Make = Callable[..., MemoryCluster]
PACKAGE = Path(__file__).resolve().parents[2] / "nvpair_tw"
STREAM = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def phases(cluster: MemoryCluster) -> list[tuple[str, str | None, str | None]]:
    return [
        (e.payload["phase"], e.payload["node_id"], e.payload["model"])
        for e in cluster.events
        if e.name == "request/phase"
    ]


def test_a_streamed_request_publishes_each_phase_with_its_node_then_one_record(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock, chunks=3)})
    response = cluster.fetch("POST", "/api/chat", json=STREAM)
    assert response.status == 200 and response.complete
    assert phases(cluster) == [
        ("waiting-headers", "a", "llama3"),
        ("reading-prompt", "a", "llama3"),
        ("streaming", "a", "llama3"),
    ]
    names = [e.name for e in cluster.events if e.name in ("request/phase", "proxy/request")]
    assert names[-1] == "proxy/request" and names.count("proxy/request") == 1


def test_a_failover_goes_back_to_waiting_for_headers_on_the_next_node(
    memory_cluster: Make,
) -> None:
    clock = Clock()
    engines = {
        "a": SimulatedEngine(clock, policy=always(Behaviour.STATUS_503)),
        "b": SimulatedEngine(clock, chunks=2),
    }
    cluster = memory_cluster(clock, engines)
    assert cluster.fetch("POST", "/api/chat", json=STREAM).status == 200
    assert phases(cluster) == [
        ("waiting-headers", "a", "llama3"),
        ("waiting-headers", "b", "llama3"),
        ("reading-prompt", "b", "llama3"),
        ("streaming", "b", "llama3"),
    ]


def test_a_model_list_answers_in_one_phase_of_its_own(memory_cluster: Make) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock)})
    assert cluster.fetch("GET", "/api/tags").status == 200
    assert phases(cluster) == [("answering", None, None)]


def test_a_bug_in_a_stage_is_a_500_recorded_once_and_the_proxy_keeps_serving(
    memory_cluster: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    cluster = memory_cluster(clock, {"a": SimulatedEngine(clock)})

    async def broken(asked: Any, step: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setitem(_answering._STAGES, Stage.MODEL_LIST, broken)
    response = cluster.fetch("GET", "/api/tags")
    assert response.status == 500
    assert response.json() == {"error": "internal proxy error", "code": "internal-error"}
    [record] = cluster.named("proxy/request")
    assert (record["status"], record["error"]) == (500, "internal-error")
    monkeypatch.undo()
    assert cluster.fetch("GET", "/api/tags").status == 200
    assert len(cluster.named("proxy/request")) == 2


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE.parent)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_only_the_door_and_the_writer_of_the_corridor_hold_the_twisted_request() -> None:
    """No corridor module but the facade and its writer imports ``twisted.web.server.Request``
    (``inbound/_limits`` defines the ``Request`` the site makes; nothing else of the proxy's
    request path receives one)."""
    holders = {
        name
        for name, text in _sources().items()
        if re.search(r"^from twisted\.web\.server import .*\bRequest\b", text, re.M)
        and (name.startswith("nvpair_tw/corridor/") or name.startswith("nvpair_tw/inbound/"))
    }
    assert holders == {
        "nvpair_tw/corridor/_facade.py",
        "nvpair_tw/corridor/_writer.py",
        "nvpair_tw/inbound/_cors.py",
    }


def test_every_error_body_is_shaped_in_one_place_and_written_by_one_writer() -> None:
    """The proxy's own error bodies are made by ``core.error_body`` alone, and only the
    corridor's writer and the connection layer (where no ``Request`` exists yet) write them."""
    makers = {
        name
        for name, text in _sources().items()
        if re.search(r"\b(error_body|raw_error_response)\(", text)
        and not name.startswith("nvpair_tw/core/")
    }
    assert makers == {"nvpair_tw/corridor/_writer.py", "nvpair_tw/inbound/_limits.py"}


def test_the_record_is_made_in_one_place_and_published_from_one() -> None:
    sources = _sources()
    built = r"(?<!class )(?<!case )\bProxyRequest\((?!\))"
    made = {n for n, text in sources.items() if re.search(built, text)}
    assert made == {"nvpair_tw/corridor/_record.py"}
    published = {n for n, text in sources.items() if re.search(r"\bbus\.publish\(record\)", text)}
    assert published == {"nvpair_tw/corridor/_driver.py"}
    callers = {n for n, text in sources.items() if re.search(r"\bpublish\(\w+\.bus, ", text)}
    assert callers <= {"nvpair_tw/corridor/_driver.py", "nvpair_tw/corridor/_facade.py"}
