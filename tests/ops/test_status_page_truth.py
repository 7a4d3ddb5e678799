"""The status page tells the truth, read from the rendered page in a real headless Chromium.

A node whose URL refuses connections is unreachable (with the error, its URL and since when),
never green "ready"; refused and failed requests are counted by key and by model and listed with
their node and why that node; every request in flight shows its phase as the exchange publishes
it (queued, waiting for headers, reading the prompt, streaming); a pull fanned out to several
nodes shows its progress per node; the page names the version and the address clients use, and
fits a phone's 390 px. Screenshots at 1280 and 390 px go to the test's own tmp dir (keep them with
``--basetemp DIR`` and look at them when the page changes).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
from attrs import frozen
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.internet.threads import blockingCallFromThread, deferToThread
from twisted.python.failure import Failure

from nvpair_tw import __version__
from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import Event, ProxyRequest
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import AdminService
from nvpair_tw.runtime import Runtime
from nvpair_tw.testing import (
    Behaviour,
    EngineHandle,
    ProxyHandle,
    SimulatedEngine,
    always,
    start_engine,
    start_proxy,
)
from tests.dialects import engine_answers as real
from tests.ops.browser import DESKTOP, PHONE, opened, require_browser

SECRET = "s3cret-userinfo-9d2b"
CANARY = "CANARY-PROMPT-51c0e7-do-not-display"
WAIT_MS = 10_000

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


async def _admin(reactor: Any, runtime: Runtime) -> tuple[AdminService, str]:
    admin = AdminService(reactor, runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
    return admin, f"http://127.0.0.1:{port}"


@frozen
class _Staged:
    """The proxy of a truth test, its status page's address and its engines."""

    proxy: ProxyHandle
    url: str
    engines: list[EngineHandle]


@asynccontextmanager
async def _staged(
    reactor: Any,
    engines: Sequence[SimulatedEngine],
    nodes: Callable[[list[str]], list[Node]],
    settings: Settings | None = None,
) -> AsyncIterator[_Staged]:
    """The engines on loopback, a proxy over the nodes made from their URLs (one facade,
    ``ollama``) and its admin listener; all stopped after, the engines' timers cancelled."""
    handles = [await start_engine(reactor, engine) for engine in engines]
    proxy = await start_proxy(reactor, {"ollama": nodes([h.url for h in handles])}, settings)
    admin, url = await _admin(reactor, proxy.runtime)
    try:
        yield _Staged(proxy, url, handles)
    finally:
        await admin.stopService()
        await proxy.stop()
        for handle in handles:
            handle.engine.stop()
            await handle.stop()


async def _refusing_port(reactor: Any) -> int:
    """A loopback port nothing listens on (it was just closed): connecting is refused."""
    port = reactor.listenTCP(0, ClientFactory(), interface="127.0.0.1")
    number = int(port.getHost().port)
    await maybeDeferred(port.stopListening)
    return number


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    """In a worker thread: POST ``body``, read the whole answer; its status (errors included)."""
    request = urllib.request.Request(
        url, data=body, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.read()
        return int(error.code)


def _chat(model: str, stream: bool = False) -> bytes:
    message = {"role": "user", "content": CANARY}
    return json.dumps({"model": model, "messages": [message], "stream": stream}).encode()


def _live(page: Any) -> None:
    page.wait_for_function(
        "() => document.getElementById('connection').textContent === 'live'", timeout=WAIT_MS
    )


def _row_cells(page: Any, selector: str) -> list[list[str]]:
    return cast(
        list[list[str]],
        page.eval_on_selector_all(
            selector, "rows => rows.map(r => Array.from(r.cells, c => c.textContent.trim()))"
        ),
    )


def _state(page: Any, node: str) -> dict[str, str]:
    """A node's state cell: its class names and its text."""
    cell = f'tr[data-node="ollama/{node}"] td.state'
    page.wait_for_selector(cell, timeout=WAIT_MS)
    return {
        "class": cast(str, page.get_attribute(cell, "class")),
        "text": cast(str, page.inner_text(cell)),
    }


def _layout(page: Any) -> dict[str, Any]:
    """How wide the page is against the viewport, and whether every node's state cell is on
    screen without scrolling sideways."""
    return cast(
        dict[str, Any],
        page.evaluate(
            """() => ({
                viewport: window.innerWidth,
                page: document.documentElement.scrollWidth,
                body: document.body.scrollWidth,
                states: Array.from(document.querySelectorAll('td.state'),
                    c => Math.round(c.getBoundingClientRect().right)),
            })"""
        ),
    )


def _boxes(page: Any) -> list[list[Any]]:
    """Each scrolling box: its table's id (or its facade's engine), the table's width and the
    box's: a table wider than its box scrolls sideways."""
    return cast(
        list[list[Any]],
        page.evaluate(
            """() => Array.from(document.querySelectorAll('.scroll'), b => {
                const t = b.querySelector('table');
                return [t.id || t.dataset.engine || '', t.scrollWidth, b.clientWidth];
            })"""
        ),
    )


def _shots(page: Any, path: str, seen: dict[str, Any], name: str) -> None:
    """Full-page screenshots at desktop and phone width, and the layout at each."""
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.wait_for_timeout(150)  # one layout pass after the resize (not an event to wait on)
        seen[f"{name}_{label}"] = _layout(page)
        page.screenshot(path=f"{path}/{name}-{label}.png", full_page=True)
    page.set_viewport_size(DESKTOP)


# -- an unreachable node ------------------------------------------------------------------------


def _watch_unreachable(admin_url: str, proxy_url: str, shots: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with opened(admin_url, seen) as page:
        _live(page)
        page.wait_for_selector('tr[data-node="ollama/gone"] td.state.unreachable', timeout=WAIT_MS)
        seen["before"] = {n: _state(page, n) for n in ("gone", "spare", "up")}
        _shots(page, shots, seen, "unreachable")
        body = _chat("llama3")
        seen["targeted"] = _post(proxy_url + "/api/chat", body, {"X-NVPair-Node": "spare"})
        page.wait_for_selector('tr[data-node="ollama/spare"] td.state.unreachable', timeout=WAIT_MS)
        seen["after"] = _state(page, "spare")
        seen["html"] = page.content()
    return seen


@pytest.mark.browser
@on_reactor
async def test_a_node_that_refuses_connections_is_unreachable_never_ready(
    reactor: Any, tmp_path: Any
) -> None:
    """A polled node whose URL refuses connections: "unreachable", the poll's error in plain
    words, its URL without the userinfo, since when. A node with a static list no request has
    reached: "not heard from yet", not green; once a request could not connect to it,
    unreachable too. A node that answers its poll: "ready"."""
    require_browser()
    refused = await _refusing_port(reactor)

    def nodes(urls: list[str]) -> list[Node]:
        return [
            Node("gone", f"http://ops:{SECRET}@127.0.0.1:{refused}"),
            Node("spare", f"http://127.0.0.1:{refused}", ("llama3:latest",)),
            Node("up", urls[0]),
        ]

    async with _staged(reactor, [SimulatedEngine(reactor)], nodes) as staged:
        await staged.proxy.runtime.facades["ollama"].inventory.poll_now()
        watch = (staged.url, staged.proxy.url(), str(tmp_path))
        seen = await deferToThread(_watch_unreachable, *watch)
    assert seen["errors"] == [] and seen["console"] == []
    gone, spare, ready = seen["before"]["gone"], seen["before"]["spare"], seen["before"]["up"]
    assert "unreachable" in gone["class"].split()
    assert gone["text"].startswith("unreachable")
    assert "connection refused" in gone["text"]
    assert f"http://127.0.0.1:{refused}" in gone["text"] and "since" in gone["text"]
    assert "unknown" in spare["class"].split() and "not heard from yet" in spare["text"]
    assert "ready" not in gone["class"].split() + spare["class"].split()
    assert "ready" in ready["class"].split() and ready["text"].startswith("ready")
    assert seen["targeted"] == 502
    assert "unreachable" in seen["after"]["class"].split()
    assert "could not connect" in seen["after"]["text"]
    assert SECRET not in seen["html"] and CANARY not in seen["html"]
    for width, layout in ((1280, seen["unreachable_desktop"]), (390, seen["unreachable_phone"])):
        assert layout["viewport"] == width and layout["page"] <= width, layout
        assert all(right <= width for right in layout["states"]), layout


# -- refused and failed requests ----------------------------------------------------------------

CHOSEN = {
    "target": "named by X-NVPair-Node",
    "pin": "pinned by the operator",
    "affinity": "holds the conversation's prefix",
    "session": "home of the client's session",
    "conversation": "holds the response it continues",
    "prediction": "predicted to answer first",
    "order": "first in the candidate order",
    "failover": "an earlier node failed",
    "fallback": "a fallback model",
}


def _count_requests(admin_url: str, proxy_url: str, shots: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"statuses": []}
    with opened(admin_url, seen) as page:
        _live(page)
        for body in (_chat("qwen2"), _chat("qwen2"), _chat("qwen2"), b"{not json"):
            seen["statuses"].append(_post(proxy_url + "/api/chat", body))
        seen["statuses"].append(_post(proxy_url + "/api/chat", _chat("llama3")))
        page.wait_for_function(
            "() => document.querySelectorAll('#recent tbody tr[data-id]').length === 5",
            timeout=WAIT_MS,
        )
        page.wait_for_function(
            "() => / ms /.test(document.querySelector("
            "'tr[data-node=\"ollama/ok\"] td.ttft').textContent)",
            timeout=WAIT_MS,
        )
        seen["by_key"] = _row_cells(page, "#requests-by-key tbody tr[data-key]")
        seen["by_model"] = _row_cells(page, "#requests-by-model tbody tr[data-model]")
        seen["recent"] = _row_cells(page, "#recent tbody tr[data-id]")
        seen["recent_head"] = _row_cells(page, "#recent thead tr")
        seen["ttft"] = page.inner_text('tr[data-node="ollama/ok"] td.ttft')
        seen["failed_words"] = page.inner_text("#requests-explained")
        _shots(page, shots, seen, "requests")
        seen["html"] = page.content()
    return seen


@pytest.mark.browser
@on_reactor
async def test_refused_and_failed_requests_are_counted_by_key_and_model_and_listed(
    reactor: Any, tmp_path: Any
) -> None:
    """Three requests a sick node answers 503, one refused for a bad body, one answered: the
    page counts them by key and by model (answered, refused, failed) and lists each with its
    status, its node, why that node in plain words, its time to first token and its rate; the
    node that answered shows its time to first token."""
    require_browser()
    sick = SimulatedEngine(reactor, models=("qwen2:latest",), policy=always(Behaviour.STATUS_503))
    healthy = SimulatedEngine(reactor, chunks=4, chunk_delay=0.02, kind="ollama")
    records: list[ProxyRequest] = []

    def keep(event: Event) -> None:
        if isinstance(event.value, ProxyRequest):
            records.append(event.value)

    def nodes(urls: list[str]) -> list[Node]:
        return [Node("sick", urls[0], ("qwen2:latest",)), Node("ok", urls[1], ("llama3:latest",))]

    async with _staged(reactor, [sick, healthy], nodes) as staged:
        staged.proxy.runtime.shared.bus.subscribe(keep, name="test")
        watch = (staged.url, staged.proxy.url(), str(tmp_path))
        seen = await deferToThread(_count_requests, *watch)
    assert seen["errors"] == [] and seen["console"] == []
    failed_status = seen["statuses"][0]
    assert failed_status >= 500 and seen["statuses"][1:] == [failed_status] * 2 + [400, 200]
    # key, requests, answered, refused, failed, cancelled
    assert seen["by_key"] == [["local", "5", "1", "1", "3", "0"]]
    assert seen["by_model"] == [
        ["llama3", "1", "1", "0", "0", "0"],
        ["qwen2", "3", "0", "0", "3", "0"],
        ["no model", "1", "0", "1", "0", "0"],
    ]
    assert seen["recent_head"][0][:5] == ["status", "node", "why that node", "first token", "tok/s"]
    answered, refused, *failed = seen["recent"]  # newest first
    served = records[-1]
    assert served.status == 200 and served.chosen_by is not None
    assert answered[:3] == ["200", "ok", CHOSEN[served.chosen_by.value]]
    assert re.fullmatch(r"\d+ ms", answered[3]) and re.fullmatch(r"[\d.]+", answered[4])
    assert refused[0] == "400" and refused[1] == "—" and "bad-body" in " ".join(refused)
    assert [row[:2] for row in failed] == [[str(failed_status), "sick"]] * 3
    assert re.fullmatch(r"\d+ ms \(median of 1\)", seen["ttft"])
    assert "5xx" in seen["failed_words"] and "499" in seen["failed_words"]
    assert CANARY not in seen["html"]
    for width, layout in ((1280, seen["requests_desktop"]), (390, seen["requests_phone"])):
        assert layout["page"] <= width, layout


# -- each phase of a request in flight ----------------------------------------------------------

PHASES = {
    "frozen": "waiting for headers",
    "silent": "reading the prompt",
    "slow": "streaming",
}


class _Held(Protocol):
    """A raw HTTP request over a real socket, kept open until :meth:`drop`."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.closed: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.raw)

    def dataReceived(self, data: bytes) -> None:
        """The answer is not read: the request is held in whatever phase it reached."""

    def drop(self) -> None:
        if self.transport is not None:
            cast(ITCPTransport, self.transport).abortConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not self.closed.called:
            self.closed.callback(None)


class _Once(ClientFactory):
    """Builds the one protocol it is given."""

    def __init__(self, protocol: _Held) -> None:
        self._protocol = protocol

    def buildProtocol(self, addr: object) -> _Held:  # type: ignore[override]
        return self._protocol


def _raw_chat(port: int, node: str) -> bytes:
    body = _chat("llama3", stream=True)
    head = (
        f"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nX-NVPair-Node: {node}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _hold(reactor: Any, port: int, nodes: list[str], held: list[_Held]) -> None:
    """On the reactor: one streamed chat to each of ``nodes`` (named by ``X-NVPair-Node``)."""
    for node in nodes:
        protocol = _Held(_raw_chat(port, node))
        held.append(protocol)
        reactor.connectTCP("127.0.0.1", port, _Once(protocol))


def _phases(page: Any) -> dict[str, list[str]]:
    rows = _row_cells(page, "#inflight tbody tr[data-id]")
    return {"|".join(row[:2]): row for row in rows}


def _watch_phases(
    admin_url: str, start: Callable[[], None], drop: Callable[[], None], shots: str
) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    wanted = [f"{label}|{node}" for node, label in PHASES.items()] + ["queued|—"]
    ready = (
        "() => { const rows = Array.from(document.querySelectorAll('#inflight tbody tr[data-id]'),"
        " r => r.cells[0].textContent.trim() + '|' + r.cells[1].textContent.trim());"
        f" return {json.dumps(wanted)}.every(w => rows.includes(w)); }}"
    )
    with opened(admin_url, seen) as page:
        _live(page)
        seen["empty"] = page.inner_text("#inflight tbody")
        start()
        page.wait_for_function(ready, timeout=WAIT_MS)  # live, from the phase events
        seen["live"] = _phases(page)
        page.reload()
        _live(page)
        page.wait_for_function(ready, timeout=WAIT_MS)  # from the snapshot
        seen["snapshot"] = _phases(page)
        seen["in_flight"] = {
            n: page.inner_text(f'tr[data-node="ollama/{n}"] td.inflight') for n in PHASES
        }
        seen["states"] = {node: _state(page, node) for node in PHASES}
        seen["version"] = page.inner_text("#version")
        seen["addresses"] = page.inner_text("#addresses")
        seen["labels"] = page.inner_text("#nodes-explained")
        _shots(page, shots, seen, "phases")
        drop()
        page.wait_for_function(
            "() => document.querySelectorAll('#inflight tbody tr[data-id]').length === 0",
            timeout=WAIT_MS,
        )
        seen["html"] = page.content()
    return seen


@pytest.mark.browser
@on_reactor
async def test_each_request_in_flight_shows_the_phase_its_exchange_publishes(
    reactor: Any, tmp_path: Any
) -> None:
    """Streamed chats held in each phase by the engine they are sent to (a frozen head, headers
    then silence, a slow stream with one slot, and a second request queued behind it): the page
    shows each with its phase and node, live and after a reload, the slow node is busy, and the
    rows go when the clients leave. The page names its version and the address clients use."""
    require_browser()
    engines = {
        "frozen": SimulatedEngine(reactor, policy=always(Behaviour.FROZEN)),
        "silent": SimulatedEngine(reactor, policy=always(Behaviour.HEADERS_ONLY)),
        "slow": SimulatedEngine(reactor, chunks=600, chunk_delay=0.1),
    }

    def nodes(urls: list[str]) -> list[Node]:
        return [
            Node(name, url, ("llama3:latest",), slots=1 if name == "slow" else 0)
            for name, url in zip(engines, urls, strict=True)
        ]

    held: list[_Held] = []

    def drop_all() -> None:
        for h in held:
            h.drop()

    def drop() -> None:
        blockingCallFromThread(reactor, drop_all)

    settings = Settings(response_header_timeout=60)
    async with _staged(reactor, list(engines.values()), nodes, settings) as staged:
        port = staged.proxy.ports["ollama"].getHost().port  # type: ignore[attr-defined]
        proxy_url = staged.proxy.url()

        def start() -> None:
            blockingCallFromThread(reactor, _hold, reactor, port, [*PHASES, "slow"], held)

        try:
            seen = await deferToThread(_watch_phases, staged.url, start, drop, str(tmp_path))
        finally:
            drop_all()
    assert seen["errors"] == [] and seen["console"] == []
    assert "no request in flight" in seen["empty"]
    for rows in (seen["live"], seen["snapshot"]):
        # a queued request has no node yet: its phase event names none
        assert set(rows) == {f"{label}|{node}" for node, label in PHASES.items()} | {"queued|—"}
        for row in rows.values():
            assert row[2] == "llama3" and row[3] == "local"
            assert re.fullmatch(r"\d+(\.\d)? s", row[4]), row
    assert seen["in_flight"] == {"frozen": "1", "silent": "1", "slow": "1"}
    frozen, silent, slow = (seen["states"][node] for node in PHASES)
    assert "unknown" in frozen["class"].split()  # taken, never answered: not "ready"
    assert "ready" in silent["class"].split()  # its headers came: it answers
    assert "busy" in slow["class"].split()
    assert "1 of 1 slots taken" in slow["text"] and "1 waiting" in slow["text"]
    assert seen["version"] == f"nvpair-tw {__version__.public()}"
    assert f"ollama: {proxy_url}" in seen["addresses"]
    assert f"OpenAI-style clients: {proxy_url}/v1" in seen["addresses"]
    for word in ("busy waits", "reservations", "cooling", "cordoned"):
        assert word in seen["labels"]
    assert CANARY not in seen["html"]
    for width, layout in ((1280, seen["phases_desktop"]), (390, seen["phases_phone"])):
        assert layout["page"] <= width, layout
        assert all(right <= width for right in layout["states"]), layout


# -- a pull fanned out to every node ------------------------------------------------------------


def _watch_pull(admin_url: str, proxy_url: str, shots: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with opened(admin_url, seen) as page:
        _live(page)
        body = json.dumps({"model": "llama3"}).encode()
        headers = {"X-NVPair-Node": "*"}
        result: dict[str, int] = {}
        sender = threading.Thread(
            target=lambda: result.update(status=_post(proxy_url + "/api/pull", body, headers))
        )
        sender.start()
        running = (
            "() => Array.from(document.querySelectorAll('#pulls tr[data-node] td.progress'))"
            ".filter(c => /\\d+%/.test(c.textContent) && !/100%/.test(c.textContent))"
            ".length === 2"
        )
        page.wait_for_function(running, timeout=WAIT_MS)
        seen["running"] = _row_cells(page, "#pulls tr[data-node]")
        page.wait_for_selector('tr[data-node="ollama/gpu1"] td.state.ready', timeout=WAIT_MS)
        seen["answering"] = {n: _state(page, n)["class"] for n in ("gpu0", "gpu1")}
        seen["title"] = page.inner_text("#pulls .fan-out-title")
        _shots(page, shots, seen, "pull")
        sender.join(30)
        seen["status"] = result.get("status")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('#pulls tr[data-node] td.result'))"
            ".filter(c => c.textContent === 'success').length === 2",
            timeout=WAIT_MS,
        )
        seen["done"] = _row_cells(page, "#pulls tr[data-node]")
    return seen


@pytest.mark.browser
@on_reactor
async def test_a_pull_fanned_out_to_every_node_shows_its_progress_per_node(
    reactor: Any, tmp_path: Any
) -> None:
    """``X-NVPair-Node: *`` with ``/api/pull`` to two nodes that pull slowly: while it runs the
    page shows, per node, how far it is (bytes and a percentage, from the progress lines'
    ``completed`` and ``total``) and the nodes, whose parts run, as ready; when it ends, each
    node's result."""
    require_browser()
    engines = [SimulatedEngine(reactor, chunks=40, chunk_delay=0.1) for _ in range(2)]

    def nodes(urls: list[str]) -> list[Node]:
        return [Node(f"gpu{i}", u, ("llama3:latest",)) for i, u in enumerate(urls)]

    async with _staged(reactor, engines, nodes) as staged:
        seen = await deferToThread(_watch_pull, staged.url, staged.proxy.url(), str(tmp_path))
    assert seen["errors"] == [] and seen["console"] == []
    assert seen["status"] == 200
    assert "/api/pull llama3 on 2 nodes" in seen["title"]
    assert sorted(row[0] for row in seen["running"]) == ["gpu0", "gpu1"]
    # static lists, never heard from before: their parts running say they answer
    assert seen["answering"] == {"gpu0": "state ready", "gpu1": "state ready"}
    for row in seen["running"]:
        assert re.search(r"[\d.]+ kB of 40 kB \(\d+%\)", row[1]), row
    assert sorted(seen["done"]) == [
        ["gpu0", "40 kB of 40 kB (100%)", "success"],
        ["gpu1", "40 kB of 40 kB (100%)", "success"],
    ]
    for width, layout in ((1280, seen["pull_desktop"]), (390, seen["pull_phone"])):
        assert layout["page"] <= width, layout


# -- each node's prompt cache, as its engine said it --------------------------------------------


def _llama_answers() -> Callable[[bytes, bool, bytes], list[bytes]]:
    """The real llama-server's streams (the facade asks a whole answer as a stream, §6.5): a
    new question after a system prompt it had read (40 of 48 prompt tokens cached), then the
    same request again (47 of 48), one event a write (tests/dialects/engine_answers.py)."""
    streams = [real.LLAMA_CHAT_STREAM_PREFIX, real.LLAMA_CHAT_STREAM_WARM]

    def script(path: bytes, streaming: bool, body: bytes) -> list[bytes]:
        stream = streams.pop(0) if len(streams) > 1 else streams[0]
        return [event + b"\n\n" for event in stream.split(b"\n\n") if event]

    return script


def _watch_cache(admin_url: str, proxy_url: str, shots: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"statuses": []}
    with opened(admin_url, seen) as page:
        _live(page)
        seen["before"] = page.inner_text('tr[data-node="ollama/llama"] td.cache')
        for node, path in (("llama", "/v1/chat/completions"),) * 2 + (("ollama", "/api/chat"),):
            seen["statuses"].append(
                _post(proxy_url + path, _chat("llama3:latest"), {"X-NVPair-Node": node})
            )
        page.wait_for_function(
            "() => document.querySelectorAll('#recent tbody tr[data-id]').length === 3"
            " && /%/.test(document.querySelector("
            "'tr[data-node=\"ollama/llama\"] td.cache').textContent)"
            " && document.querySelector('#usage-by-model tbody tr[data-model]') !== null",
            timeout=WAIT_MS,
        )
        seen["cache"] = {
            n: page.inner_text(f'tr[data-node="ollama/{n}"] td.cache') for n in ("llama", "ollama")
        }
        seen["head"] = _row_cells(page, "#facades thead tr")[0]
        seen["recent_head"] = _row_cells(page, "#recent thead tr")[0]
        seen["recent"] = _row_cells(page, "#recent tbody tr[data-id]")
        seen["usage_head"] = _row_cells(page, "#usage-by-model thead tr")[0]
        seen["usage"] = _row_cells(page, "#usage-by-model tbody tr[data-model]")
        seen["explained"] = page.inner_text("#nodes-explained")
        seen["boxes"] = _boxes(page)
        _shots(page, shots, seen, "cache")
        seen["html"] = page.content()
    return seen


@pytest.mark.browser
@on_reactor
async def test_each_nodes_prompt_cache_is_shown_as_its_engine_said_it(
    reactor: Any, tmp_path: Any
) -> None:
    """A llama.cpp node answering as the real llama-server did (40, then 47 of 48 prompt tokens
    cached) and an Ollama node, which says nothing of its cache: the llama.cpp
    node's row shows the share of its prompt tokens its engine found cached, the Ollama node's
    that its engine does not say (never 0 %); each recent request shows its cached tokens, and
    the last 24 hours the cached tokens per model."""
    require_browser()
    llama = SimulatedEngine(reactor, kind="openai", script=_llama_answers())
    ollama = SimulatedEngine(reactor, kind="ollama")

    def nodes(urls: list[str]) -> list[Node]:
        return [
            Node("llama", urls[0], ("llama3:latest",), kind="openai"),
            Node("ollama", urls[1], ("llama3:latest",)),
        ]

    async with _staged(reactor, [llama, ollama], nodes) as staged:
        seen = await deferToThread(_watch_cache, staged.url, staged.proxy.url(), str(tmp_path))
    assert seen["errors"] == [] and seen["console"] == []
    assert seen["statuses"] == [200, 200, 200]
    assert seen["before"] == "—"
    assert "prompt cache" in seen["head"] and "prompt cache" in seen["explained"]
    assert seen["cache"]["llama"] == "91 % cached: 87 of 96 prompt tokens (2 answers)"
    assert seen["cache"]["ollama"] == "not said by its engine (1 answer)"
    cached = seen["recent_head"].index("cached")
    assert [row[cached] for row in seen["recent"]] == ["—", "47 of 48", "40 of 48"]  # newest first
    column = seen["usage_head"].index("cached tokens")
    [(model, *_), *others] = seen["usage"]
    assert (model, others) == ("llama3:latest", [])
    assert seen["usage"][0][column] == "87 (1 not said)"
    assert CANARY not in seen["html"]
    assert [box for box in seen["boxes"] if box[1] > box[2]] == []  # every table fits at 1280 px
    for width, layout in ((1280, seen["cache_desktop"]), (390, seen["cache_phone"])):
        assert layout["page"] <= width, layout
        assert all(right <= width for right in layout["states"]), layout
