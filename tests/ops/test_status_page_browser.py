"""The live status page in a real headless Chromium: cooldowns appear and clear live, prompts never show.

Needs the Debian ``chromium`` package (``/usr/bin/chromium``) and the ``playwright`` Python package
(its own browser download is never used). Missing either fails the test with the install commands
(:mod:`tests.ops.browser`).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError
from twisted.internet.threads import deferToThread

from nvpair_tw.core import Priority
from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import AdminService
from nvpair_tw.selection._admission import Slot, Waiter
from nvpair_tw.selection._speed import Sample
from nvpair_tw.testing import Behaviour, SimulatedEngine, always, start_engine, start_proxy
from tests.ops.browser import launch, require_browser

CANARY = "CANARY-PROMPT-7f3a9c-do-not-display"
HEADER_TIMEOUT = 1.0

_Test = TypeVar("_Test", bound=Callable[..., Any])


def on_reactor(test: _Test) -> _Test:
    """``pytest_twisted.ensureDeferred`` with the test's type kept (pytest-twisted is untyped)."""
    return cast(_Test, pytest_twisted.ensureDeferred(test))


def _chat(proxy_url: str) -> int:
    body = json.dumps(
        {"model": "llama3", "messages": [{"role": "user", "content": CANARY}], "stream": False}
    ).encode()
    request = urllib.request.Request(
        proxy_url + "/api/chat", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return int(response.status)


def _drive_browser(admin_url: str, proxy_url: str) -> dict[str, Any]:
    """In a worker thread: load the page, stall a node with a canary request, watch it recover."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"errors": [], "status": None}
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.goto(admin_url + "/")
            frozen = 'tr[data-node="ollama/a-frozen"]'
            # a static list no request has reached yet: not "ready"
            page.wait_for_selector(f"{frozen} td.state.unknown", timeout=10_000)
            page.wait_for_function(
                "document.getElementById('connection').textContent === 'live'", timeout=10_000
            )
            result: dict[str, int] = {}
            sender = threading.Thread(target=lambda: result.update(status=_chat(proxy_url)))
            sender.start()
            cooling = page.wait_for_selector(f"{frozen} td.state.cooling", timeout=10_000)
            assert cooling is not None
            seen["cooling_text"] = cooling.text_content()
            # well before the page's 10 s snapshot refresh: only the cooldown-ended event (which
            # re-reads the snapshot) can do it; it took the connection, so it is ready again
            page.wait_for_selector(f"{frozen} td.state.ready", timeout=HEADER_TIMEOUT * 4000)
            sender.join(30)
            seen["status"] = result.get("status")
            page.wait_for_selector("#failovers tr", timeout=10_000)
            seen["failover_text"] = page.inner_text("#failovers")
            seen["html"] = page.content()
            seen["text"] = page.inner_text("body")
        finally:
            browser.close()
    return seen


@pytest.mark.browser
@on_reactor
async def test_status_page_shows_a_cooldown_come_and_go_and_never_a_prompt(reactor: Any) -> None:
    """A frozen node (a static list, not heard from yet) cools (with time left and reason) then
    is ready, live over /events; the failover is listed; the canary prompt text never appears
    anywhere on the page."""
    require_browser()
    frozen = await start_engine(reactor, SimulatedEngine(reactor, policy=always(Behaviour.FROZEN)))
    healthy = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor,
        {
            "ollama": [
                Node("a-frozen", frozen.url, ("llama3:latest",)),
                Node("b-healthy", healthy.url, ("llama3:latest",)),
            ]
        },
        Settings(response_header_timeout=HEADER_TIMEOUT),
    )
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        seen = await deferToThread(_drive_browser, f"http://127.0.0.1:{port}", proxy.url())
    finally:
        await admin.stopService()
        await proxy.stop()
        await frozen.stop()
        await healthy.stop()
    assert seen["status"] == 200
    assert seen["errors"] == []
    assert "left" in seen["cooling_text"] and "no response headers" in seen["cooling_text"]
    assert "a-frozen stall" in seen["failover_text"]
    assert "b-healthy committed" in seen["failover_text"]
    assert CANARY not in seen["html"] and CANARY not in seen["text"]


HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"


def _read_busy_page(admin_url: str) -> dict[str, Any]:
    """In a worker thread: load the page once the cluster is set up and read the busy columns."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"errors": []}
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.goto(admin_url + "/")
            page.wait_for_selector('tr[data-node="ollama/a-busy"] td.slots', timeout=10_000)
            for node_id in ("a-busy", "b-loaded", "c-unknown", "d-unlimited"):
                row = f'tr[data-node="ollama/{node_id}"]'
                seen[node_id] = {
                    cls: page.inner_text(f"{row} td.{cls}")
                    for cls in ("slots", "busy-waits", "loaded", "contexts", "rates")
                }
            seen["queue"] = page.inner_text("h2 .queue-depth")
            seen["priorities"] = page.inner_text("h2 .queue-priorities")
            seen["title"] = page.title()
            seen["images"] = page.eval_on_selector_all("img", "images => images.length")
        finally:
            browser.close()
    return seen


@pytest.mark.browser
@on_reactor
async def test_status_page_shows_slots_queue_busy_waits_and_residency(reactor: Any) -> None:
    """Per node: slots in use / slots (unlimited when 0), busy waits, the loaded models (or
    "unknown") and the context each is served with; per facade: the queue depth. A hostile model
    name is shown as text, never markup."""
    require_browser()
    resident = SimulatedEngine(reactor, loaded=("llama3:latest", HOSTILE), kind="ollama")
    loaded = await start_engine(reactor, resident)
    proxy = await start_proxy(
        reactor,
        {
            "ollama": [
                Node("a-busy", "http://127.0.0.1:1", ("llama3:latest",), slots=1),
                Node("b-loaded", loaded.url, None, slots=2),
                Node("c-unknown", "http://127.0.0.1:1", ("llama3:latest",), slots=0),
                Node("d-unlimited", "http://127.0.0.1:1", ("llama3:latest",)),
            ]
        },
    )
    facade = proxy.runtime.facades["ollama"]
    await facade.inventory.poll_now()
    busy = facade.directory.get("a-busy")
    assert busy is not None
    holding = facade.admission.admit([busy])
    queued = facade.admission.admit([busy])
    assert isinstance(holding, Slot) and isinstance(queued, Waiter)
    queued.bound.addErrback(lambda failure: failure.trap(CancelledError))
    batch = facade.admission.admit([busy], priority=Priority.BATCH)
    assert isinstance(batch, Waiter)
    batch.bound.addErrback(lambda failure: failure.trap(CancelledError))
    for _ in range(3):
        facade.progress.busy_waited("a-busy")
    facade.speeds.learn("b-loaded", "llama3:latest", Sample(decode_rate=57.7, prefill_rate=900))
    facade.speeds.learn("b-loaded", HOSTILE, Sample(decode_rate=10.3, prefill_rate=120))
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        seen = await deferToThread(_read_busy_page, f"http://127.0.0.1:{port}")
    finally:
        queued.bound.cancel()
        batch.bound.cancel()
        holding.release()
        await admin.stopService()
        await proxy.stop()
        await loaded.stop()
    assert seen["errors"] == []
    assert seen["a-busy"] == {
        "slots": "1 / 1",
        "busy-waits": "3",
        "loaded": "unknown",
        "contexts": "not stated",
        "rates": "not measured",
    }
    assert seen["queue"] == "2"
    assert seen["priorities"].startswith(" (interactive 1, oldest ")
    assert " · batch 1, oldest " in seen["priorities"]
    assert seen["b-loaded"] == {
        "slots": "0 / 2",
        "busy-waits": "0",
        "loaded": f"{HOSTILE}, llama3:latest",
        "contexts": f"{HOSTILE}: 4096 tokens, llama3:latest: 4096 tokens",
        "rates": f"{HOSTILE}: 10 tok/s decode, 120 tok/s prefill (1 samples);"
        " llama3:latest: 58 tok/s decode, 900 tok/s prefill (1 samples)",
    }
    assert seen["c-unknown"]["slots"] == "0 / ∞ unlimited"
    assert seen["c-unknown"]["loaded"] == "unknown"
    assert seen["d-unlimited"]["slots"] == "0 / ∞ unlimited"
    assert seen["title"] == "nvpair-tw status" and seen["images"] == 0


def _watch_a_cordon(
    admin_url: str, cordon: Callable[[], None], uncordon: Callable[[], None], shot: str
) -> dict[str, Any]:
    """In a worker thread: load the page, cordon a node (on the reactor), read the live state
    cell, take a screenshot, uncordon, and see the node ready again."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"errors": []}
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 500})
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.goto(admin_url + "/")
            row = 'tr[data-node="ollama/gpu2"]'
            page.wait_for_selector(f"{row} td.state.unknown", timeout=10_000)
            page.wait_for_function(
                "document.getElementById('connection').textContent === 'live'", timeout=10_000
            )
            cordon()
            cell = page.wait_for_selector(f"{row} td.state.cordoned", timeout=5_000)
            assert cell is not None
            seen["cordoned_text"] = cell.text_content()
            page.screenshot(path=shot, full_page=True)
            uncordon()
            page.wait_for_selector(f"{row} td.state.unknown", timeout=5_000)
        finally:
            browser.close()
    return seen


@pytest.mark.browser
@on_reactor
async def test_status_page_shows_a_cordon_come_and_go_live(reactor: Any, tmp_path: Any) -> None:
    """A node cordoned on the control side shows as ``cordoned — reason`` within moments (the
    ``node/cordon`` event, well before the 10 s snapshot refresh), and as before on uncordon
    (a static list no request has reached: not heard from yet)."""
    require_browser()
    engine = await start_engine(reactor, SimulatedEngine(reactor))
    proxy = await start_proxy(
        reactor,
        {"ollama": [Node(n, engine.url, ("llama3:latest",)) for n in ("gpu1", "gpu2")]},
        Settings(),
    )
    cordons = proxy.runtime.facades["ollama"].cordons
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()

    def cordon() -> None:
        reactor.callFromThread(cordons.cordon, "gpu2", "driver upgrade")

    def uncordon() -> None:
        reactor.callFromThread(cordons.uncordon, "gpu2")

    shot = str(tmp_path / "cordoned.png")  # looked at by hand when the page changes
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}"
        seen = await deferToThread(_watch_a_cordon, url, cordon, uncordon, shot)
    finally:
        await admin.stopService()
        await proxy.stop()
        await engine.stop()
    assert seen["errors"] == []
    assert seen["cordoned_text"] == "cordoned — driver upgrade"


CHART_POLYLINES = "document.querySelectorAll('#throughput-chart polyline').length"
# Functions, not bare expressions: polling a bare expression evals it, which the page's CSP forbids.


def _infer(proxy_url: str, model: str, stream: bool) -> int:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": CANARY}], "stream": stream}
    ).encode()
    request = urllib.request.Request(
        proxy_url + "/api/chat", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return int(response.status)


def _rows(page: Any, table: str) -> list[list[str]]:
    return cast(
        list[list[str]],
        page.eval_on_selector_all(
            f"#{table} tbody tr",
            "rows => rows.map(r => Array.from(r.cells, c => c.textContent))",
        ),
    )


def _until(page: Any, predicate: str, seen: dict[str, Any]) -> None:
    """Poll ``predicate`` (a JS function) for up to 10 s; on a timeout, fail naming the page's
    errors (a script that throws is why a chart never appears)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(predicate, timeout=10_000)
    except PlaywrightTimeout:
        raise AssertionError(
            f"timed out on {predicate}; page errors {seen['errors']}, console {seen['console']}"
        ) from None


def _watch_throughput(admin_url: str, proxy_url: str, shot: str) -> dict[str, Any]:
    """In a worker thread: open the page (empty chart and tables), send inferences to two nodes,
    wait (polling the DOM, bounded) for a polyline per node and the 24 h rows, screenshot."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"errors": [], "console": [], "statuses": []}
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.on(
                "console",
                lambda m: seen["console"].append(m.text) if m.type == "error" else None,
            )
            page.goto(admin_url + "/")
            page.wait_for_function(
                "() => document.getElementById('connection').textContent === 'live'",
                timeout=10_000,
            )
            page.wait_for_selector("#usage-by-model tbody tr", timeout=10_000)
            seen["empty_chart"] = page.text_content("#throughput-chart")
            seen["empty_polylines"] = page.evaluate(f"() => {CHART_POLYLINES}")
            seen["empty_usage"] = page.inner_text("#usage-by-key tbody")
            page.screenshot(path=shot.replace(".png", "-empty.png"), full_page=True)
            for model, stream in (("llama3", False), ("llama3", True), ("qwen2", False)):
                seen["statuses"].append(_infer(proxy_url, model, stream))
            # the request events refresh the snapshot (250 ms) and the usage (2 s throttle)
            _until(page, f"() => {CHART_POLYLINES} === 2", seen)
            _until(
                page,
                "() => document.querySelectorAll('#usage-by-model tbody tr[data-model]').length"
                " === 2 && document.querySelector('#usage-by-key tbody tr[data-key]') !== null",
                seen,
            )
            seen["legend"] = page.eval_on_selector_all(
                "#throughput-legend li", "items => items.map(i => i.dataset.node)"
            )
            seen["lines"] = page.eval_on_selector_all(
                "#throughput-chart polyline",
                "lines => lines.map(l => [l.dataset.node, l.getAttribute('points').split(' ')"
                ".length])",
            )
            seen["chart_text"] = page.text_content("#throughput-chart")
            seen["by_key"] = _rows(page, "usage-by-key")
            seen["by_model"] = _rows(page, "usage-by-model")
            seen["off_hidden"] = page.eval_on_selector("#usage-off", "e => e.hidden")
            page.screenshot(path=shot, full_page=True)
            seen["html"] = page.content()
            seen["text"] = page.inner_text("body")
        finally:
            browser.close()
    return seen


@pytest.mark.browser
@on_reactor
async def test_status_page_charts_tokens_per_node_and_lists_the_last_24_hours(
    reactor: Any, tmp_path: Any
) -> None:
    """Inferences through the proxy to two simulated nodes (whose answers carry their token
    counts): the chart goes from "no tokens yet" to one polyline per node with a legend, and the
    24 hour tables list the key and each model with their requests and tokens."""
    require_browser()
    # kind="ollama": answers end with Ollama's prompt_eval_count / eval_count (one chunk a token)
    ollama = SimulatedEngine(reactor, chunks=4, kind="ollama")
    a = await start_engine(reactor, ollama)
    qwen = SimulatedEngine(reactor, models=("qwen2:latest",), chunks=6, kind="ollama")
    b = await start_engine(reactor, qwen)
    proxy = await start_proxy(
        reactor,
        {
            "ollama": [
                Node("gpu-a", a.url, ("llama3:latest",)),
                Node("gpu-b", b.url, ("qwen2:latest",)),
            ]
        },
    )
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    # looked at by hand when the page changes (keep them with --basetemp DIR): only ever written
    # in the test's own tmp dir, as tests write nothing beside the repository (outside_reads.py)
    shot = str(tmp_path / "status-page.png")
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}"
        seen = await deferToThread(_watch_throughput, url, proxy.url(), shot)
    finally:
        await admin.stopService()
        await proxy.stop()
        await a.stop()
        await b.stop()
    assert seen["statuses"] == [200, 200, 200]
    assert seen["errors"] == [] and seen["console"] == []
    assert seen["empty_polylines"] == 0 and "no tokens yet" in seen["empty_chart"]
    assert "no requests in the last 24 hours" in seen["empty_usage"]
    assert seen["legend"] == ["ollama/gpu-a", "ollama/gpu-b"]
    assert seen["lines"] == [["ollama/gpu-a", 90], ["ollama/gpu-b", 90]]
    assert "no tokens yet" not in seen["chart_text"]
    assert "now" in seen["chart_text"] and "tokens / s" in seen["chart_text"]
    # key, requests, errors, prompt tokens, completion tokens (one chunk is one token), cached
    # tokens ("—": Ollama says nothing of its cache, which is not 0)
    prompt = str(len(CANARY.split()))
    assert seen["by_key"] == [["local", "3", "0", str(3 * int(prompt)), str(4 + 4 + 6), "—"]]
    assert seen["by_model"] == [
        ["llama3", "2", "0", str(2 * int(prompt)), "8", "—"],
        ["qwen2", "1", "0", prompt, "6", "—"],
    ]
    assert seen["off_hidden"] is True
    assert CANARY not in seen["html"] and CANARY not in seen["text"]


def _usage_off(admin_url: str) -> dict[str, Any]:
    """In a worker thread: the page with ``/api/usage`` answering 404 (a proxy without it)."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {"errors": []}
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.route(
                "**/api/usage*",
                lambda route: route.fulfill(
                    status=404,
                    content_type="application/json",
                    body='{"error": "not found", "code": "not-found"}',
                ),
            )
            page.goto(admin_url + "/")
            off = page.wait_for_selector("#usage-off:not([hidden])", timeout=10_000)
            assert off is not None
            seen["off"] = off.text_content()
            seen["tables_hidden"] = page.eval_on_selector("#usage", "e => e.hidden")
            seen["chart"] = page.text_content("#throughput-chart")
        finally:
            browser.close()
    return seen


@pytest.mark.browser
@on_reactor
async def test_status_page_says_when_usage_history_is_off(reactor: Any) -> None:
    """When the usage route is not there (404) the page says "usage history is off" instead of
    the tables; the chart still shows its empty state."""
    require_browser()
    proxy = await start_proxy(reactor, {"ollama": [Node("a", "http://127.0.0.1:1", ("m:1",))]})
    admin = AdminService(reactor, proxy.runtime, "tcp:0:interface=127.0.0.1")
    admin.startService()
    try:
        port = (await admin.listener.ready).getHost().port  # type: ignore[attr-defined]
        seen = await deferToThread(_usage_off, f"http://127.0.0.1:{port}")
    finally:
        await admin.stopService()
        await proxy.stop()
    assert seen["errors"] == []
    assert seen["off"] == "usage history is off"
    assert seen["tables_hidden"] is True
    assert "no tokens yet" in seen["chart"]
