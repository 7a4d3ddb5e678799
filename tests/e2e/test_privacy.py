"""No prompt, reply or credential reaches an event, a log line or a request record (docs/behaviour.md §7, §9).

Canary strings ride in system and user messages, in the engine's reply and in API keys and
caller tokens, through failover, a 404, a 413, a malformed body and the key checks; every bus
event and every ``twisted.logger`` event of the run is rendered and searched for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from attrs import define, field
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IAddress
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from zope.interface import implementer

from nvpair_tw.core._resolved import Settings
from nvpair_tw.corridor._facade import FacadeResource
from nvpair_tw.events import Event
from nvpair_tw.testing import (
    Behaviour,
    Clusters,
    ProxyCluster,
    SimulatedEngine,
    always,
)
from tests.helpers import proxy_request

pytestmark = pytest.mark.e2e

MODEL = ("llama3:latest",)
SYSTEM = "cnry-system-5f0d1c"
USER = "cnry-user-9b27e4"
REPLY = "cnry-reply-c4a8e1"
KEY = "cnry-key-71d3b6"
WRONG_KEY = "cnry-wrongkey-2e9f0a"
OWN_TOKEN = "cnry-owntoken-8d4c2f"
CANARIES = (SYSTEM, USER, REPLY, KEY, WRONG_KEY, OWN_TOKEN)


class ForeignPeer(ProtocolWrapper):
    """Makes the wrapped channel see a non-loopback TCP peer."""

    def getPeer(self) -> IAddress:
        return IPv4Address("TCP", "192.0.2.20", 40124)


def chat(model: str = "llama3", *, stream: bool = True, pad: int = 0) -> bytes:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER + " " * pad},
    ]
    return json.dumps({"model": model, "stream": stream, "messages": messages}).encode()


@implementer(ILogObserver)
class Capture:
    """Every bus event and every log event while the proxy runs, rendered as text."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.logs: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.logs.append(event)

    def texts(self) -> list[str]:
        rendered = [json.dumps(dict(e.payload)) + repr(e) for e in self.events]
        rendered += [str(formatEvent(e)) + repr(e) for e in self.logs]
        return rendered


@define
class Proxy(ProxyCluster):
    """A FROZEN node and a healthy one whose reply is a canary, behind a keyed proxy; every bus and
    log event is captured."""

    capture: Capture = field(factory=Capture)
    foreign_url: str = ""

    def __attrs_post_init__(self) -> None:
        self.capture.events = self.events

    async def start_canaries(self, listen: Callable[[Any], int]) -> None:
        """Start the engines and the proxy, plus a site on the facade that sees a foreign peer."""
        frozen = SimulatedEngine(self.reactor, MODEL, always(Behaviour.FROZEN))
        healthy = SimulatedEngine(self.reactor, MODEL, reply_text=REPLY)
        globalLogPublisher.addObserver(self.capture)
        await self.start(
            [frozen, healthy],
            Settings(response_header_timeout=0.3, max_body_size=4096),
            environ={"NVPAIR_PROXY_API_KEYS": KEY},
        )
        factory = WrappingFactory(FacadeResource(self.facade).site(clock=self.reactor))
        factory.protocol = ForeignPeer
        self.foreign_url = f"http://127.0.0.1:{listen(factory)}"

    @property
    def healthy(self) -> SimulatedEngine:
        return self.handles[1].engine

    async def send(
        self, url: str, data: bytes, path: str = "/api/chat", **headers: str
    ) -> tuple[int, bytes]:
        """POST ``data`` to ``url``; status and body."""
        code, body, _ = await self.post(data, path, url=url, headers=headers)
        return code, body

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            globalLogPublisher.removeObserver(self.capture)


@pytest.fixture
def proxy(clusters: Clusters) -> Proxy:
    """The canary proxy, stopped (and the log observer removed) after the test."""
    return clusters(Proxy)


@pytest_twisted.ensureDeferred
async def test_no_canary_reaches_events_logs_or_request_records(
    reactor: Any, proxy: Proxy, listen: Callable[[Any], int]
) -> None:
    """Prompts, replies, API keys and callers' tokens, sent through failover, errors and the key
    checks, appear in no bus event, request record or log event."""
    await proxy.start_canaries(listen)
    url, foreign = proxy.url, proxy.foreign_url
    bearer = f"Bearer {OWN_TOKEN}"
    malformed = (
        b'{"model": "llama3", "messages": [{"role": "system", "content": "' + SYSTEM.encode()
    )

    results = [
        await proxy.send(url, chat()),  # failover past the FROZEN node
        await proxy.send(url, chat(stream=False), "/v1/chat/completions", Authorization=bearer),
        await proxy.send(url, chat("no-such-model")),  # 404: no node has the model
        await proxy.send(url, chat(pad=5000)),  # 413
        await proxy.send(url, malformed),
        await proxy.send(foreign, chat(), Authorization=f"Bearer {KEY}"),
        await proxy.send(foreign, chat(), **{"X-Api-Key": WRONG_KEY}),
        await proxy.send(foreign, chat(), **{"X-Api-Key": KEY, "Authorization": bearer}),
    ]

    # The malformed body is refused at the boundary (400 bad-body, docs/behaviour.md §14.1).
    assert [code for code, _ in results] == [200, 200, 404, 413, 400, 200, 401, 200]
    assert all(REPLY.encode() in body for code, body in results if code == 200)
    assert b"cnry" not in b"".join(body for code, body in results if code != 200)
    bodies = [r.body for r in proxy.healthy.received if r.method == b"POST"]
    assert all(SYSTEM.encode() in b and USER.encode() in b for b in bodies[:2])
    tokens = [r.headers.get(b"authorization") for r in proxy.healthy.received]
    assert tokens.count([bearer.encode()]) == 2, "the callers' own tokens reached the engine"

    capture = proxy.capture
    records = [e.payload for e in capture.events if e.name == "proxy/request"]
    # The 413 is refused by the channel before the facade sees it; the site still records it.
    assert [r["status"] for r in records] == [200, 200, 404, 413, 400, 200, 401, 200]
    assert [a["outcome"] for a in records[0]["attempts"]] == ["stall", "committed"]
    assert any(e.name == "workload:completed" for e in capture.events)
    assert capture.logs, "the observer saw the proxy's log events"
    for text in capture.texts():
        for canary in CANARIES:
            assert canary not in text, (canary, text[:500])


@pytest.mark.parametrize("canary", CANARIES)
def test_capture_finds_a_canary_that_is_logged(canary: str) -> None:
    """Control: the capture's rendering does contain a canary that a log event carries."""
    capture = Capture()
    capture.logs.append({"log_format": "saw {thing}", "thing": canary, "log_namespace": "x"})
    capture.events.append(Event("proxy/request", proxy_request(error="x"), 0.0))
    assert any(canary in text for text in capture.texts())
