"""End to end: an answer the proxy assembles from a real Ollama's stream equals the engine's own
non-streaming answer in every field except timings, ids and timestamps (docs/behaviour.md §6.5).

The engine is started as in ``test_e2e_real_engine`` (``tests/engines/ollama.py``; the tests
fail, never skip, when it cannot start). The proxy runs in this process over loopback; each request
is sent once straight to the engine and once through the proxy, at temperature 0 with a fixed seed.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import Event
from nvpair_tw.nodes._directory import Node
from nvpair_tw.testing import Clusters, ProxyCluster
from tests.e2e.test_real_engine import engine  # noqa: F401  (the real engine fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]


MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
PROMPT = "Count: one, two,"
OLLAMA_OPTIONS = {"temperature": 0, "seed": 42, "num_predict": 24}
# Timings, ids and timestamps: what differs between any two runs of the same request.
VOLATILE = {
    "created_at",
    "total_duration",
    "load_duration",
    "prompt_eval_duration",
    "eval_duration",
    "id",
    "created",
}

CASES = {
    "/api/chat": {"model": MODEL, "messages": MESSAGES, "stream": False, "options": OLLAMA_OPTIONS},
    "/api/generate": {"model": MODEL, "prompt": PROMPT, "stream": False, "options": OLLAMA_OPTIONS},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": MESSAGES,
        "temperature": 0,
        "seed": 42,
        "max_tokens": 24,
    },
    "/v1/completions": {
        "model": MODEL,
        "prompt": PROMPT,
        "temperature": 0,
        "seed": 42,
        "max_tokens": 24,
    },
}


@pytest.fixture(scope="module")
def engine_url(request: pytest.FixtureRequest) -> str:
    """The real engine's base URL (the ``engine`` fixture of ``test_e2e_real_engine``)."""
    url = request.getfixturevalue("engine")
    assert isinstance(url, str)
    return url


def _stable(document: Any) -> Any:
    """``document`` without its volatile fields (at any depth)."""
    if isinstance(document, dict):
        return {k: _stable(v) for k, v in document.items() if k not in VOLATILE}
    if isinstance(document, list):
        return [_stable(v) for v in document]
    return document


def _post(url: str, body: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    response = httpx.post(url, json=body, timeout=600)
    return response.status_code, response.headers.get("content-type", ""), response.json()


@pytest.mark.parametrize("path", list(CASES))
@pytest_twisted.ensureDeferred
async def test_assembled_answer_equals_the_engines_own(
    reactor: Any, clusters: Clusters, engine_url: str, path: str
) -> None:
    cluster = clusters(ProxyCluster)
    await cluster.start_proxy(
        [Node("a", engine_url, (f"{MODEL}:latest",))], Settings(response_header_timeout=60.0)
    )
    body = CASES[path]
    assert cluster.proxy is not None
    concluded: Deferred[Event] = Deferred()

    def record(event: Event) -> None:
        if event.name == "proxy/request" and not concluded.called:
            concluded.callback(event)

    cluster.proxy.runtime.shared.bus.subscribe(record, name="concluded")

    def both() -> tuple[tuple[int, str, dict[str, Any]], ...]:
        _post(engine_url + path, body)  # warm the model, so both answers come from a loaded one
        return _post(engine_url + path, body), _post(cluster.url + path, body)

    direct, proxied = await deferToThread(both)
    assert direct[0] == proxied[0] == 200
    assert proxied[1] == "application/json; charset=utf-8"
    assert direct[1].startswith("application/json")
    assert _stable(proxied[2]) == _stable(direct[2]), json.dumps(
        {"direct": direct[2], "proxied": proxied[2]}, indent=1
    )
    assert set(proxied[2]) == set(direct[2])  # and no field missing or added, volatile or not
    # The record is published when the node's body has ended (just after the client's answer).
    received = await concluded
    assert [a["outcome"] for a in received.payload["attempts"]] == ["committed"]
