"""A node's reachability (docs/behaviour.md §3) as the inventory poll finds it, over real sockets:
unreachable with the last error in plain words, its URL without userinfo and since when; logged
once when it becomes unreachable and once when it is back; each list's last good answer kept."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.core import abort
from nvpair_tw.core._engines import OLLAMA
from nvpair_tw.nodes._directory import Node, NodeDirectory
from nvpair_tw.selection import Reach, Reachability
from nvpair_tw.selection._inventory import InventoryBook

START = 1_000.0


class Engine(Resource):
    """A real Ollama-like engine: ``/api/tags`` and ``/api/ps`` answer ``status`` with one model,
    or, while ``frozen``, are held (``arrived`` fires at the first held model-list read)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.status = 200
        self.frozen = False
        self.held: list[Request] = []
        self.arrived: Deferred[None] = Deferred()

    def render_GET(self, request: Request) -> bytes | int:
        if self.frozen:
            self.held.append(request)
            if request.path == b"/api/tags" and not self.arrived.called:
                self.arrived.callback(None)
            return NOT_DONE_YET
        request.setResponseCode(self.status)
        return json.dumps({"models": [{"name": "llama3:latest", "size": 7}]}).encode()

    def thaw(self) -> None:
        for request in self.held:
            abort(request.transport)
        self.held.clear()


@pytest.fixture
def engine() -> Iterator[Engine]:
    made = Engine()
    yield made
    made.thaw()


def _site(resource: Resource) -> Site:
    site = Site(resource)
    site.noisy = False
    return site


def _book(url: str, http: HTTPClient, clock: Clock, **options: Any) -> InventoryBook:
    directory = NodeDirectory(OLLAMA, clock, flag_nodes=[Node("gpu2", url)])
    return InventoryBook(OLLAMA, directory, http, clock, **options)


def _ours(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("node gpu2")]


@pytest_twisted.ensureDeferred
async def test_a_node_never_reached_is_unreachable_in_plain_words_once_and_back_once(
    reactor: Any, http: HTTPClient, log_lines: list[str]
) -> None:
    """A refused node is ``unreachable: connection refused`` at its URL without userinfo, since
    the first failed poll; the second failed poll logs nothing more; once it answers it is
    reachable again, logged once with how long it was away. Never "keeping the last good
    inventory": it never had one."""
    port = reactor.listenTCP(0, _site(Engine()), interface="127.0.0.1")
    number = port.getHost().port
    await port.stopListening()  # nothing listens there now: connections are refused
    clock = Clock()
    clock.advance(START)
    book = _book(f"http://ops:s3cret@127.0.0.1:{number}", http, clock)
    url = f"http://127.0.0.1:{number}"
    assert book.reachability("gpu2") == Reachability(Reach.UNKNOWN, url)
    await book.poll_now()
    down = Reachability(Reach.UNREACHABLE, url, START, "connection refused")
    assert book.reachability("gpu2") == down
    clock.advance(10)
    await book.poll_now()
    assert book.reachability("gpu2") == down  # since the first failure
    assert _ours(log_lines) == [
        f"node gpu2 unreachable: connection refused at {url} (ollama facade)"
    ]
    again = reactor.listenTCP(number, _site(Engine()), interface="127.0.0.1")
    try:
        clock.advance(10)
        await book.poll_now()
    finally:
        await again.stopListening()
    assert book.reachability("gpu2") == Reachability(Reach.REACHABLE, url, START + 20)
    assert _ours(log_lines)[1:] == [f"node gpu2 reachable again at {url} after 20s (ollama facade)"]
    assert not any("s3cret" in line or "ops:" in line for line in log_lines)
    assert book.reachability("gpu2").to_json() == {  # type: ignore[union-attr]
        "state": "reachable",
        "url": url,
        "since": START + 20,
        "error": None,
    }


@pytest_twisted.ensureDeferred
async def test_a_frozen_node_is_unreachable_after_its_poll_timeout_in_one_line(
    http: HTTPClient, listen: Callable[[Any], int], engine: Engine, log_lines: list[str]
) -> None:
    """A node that accepts the poll and never answers is unreachable when the poll's timeout
    runs out (``no answer within 2s``); its residency read, which ran out too, adds no line."""
    url = f"http://127.0.0.1:{listen(_site(engine))}"
    clock = Clock()
    clock.advance(START)
    book = _book(url, http, clock, timeout=2.0)
    engine.frozen = True
    polled = book.poll_now()
    await engine.arrived
    clock.advance(1.999)
    assert book.reachability("gpu2") == Reachability(Reach.UNKNOWN, url)
    clock.advance(0.001)
    await polled
    assert book.reachability("gpu2") == Reachability(
        Reach.UNREACHABLE, url, START + 2, "no answer within 2s"
    )
    assert [line for line in log_lines if "gpu2" in line] == [
        f"node gpu2 unreachable: no answer within 2s at {url} (ollama facade)"
    ]


@pytest_twisted.ensureDeferred
async def test_a_node_that_answered_before_keeps_its_inventory_and_its_lists(
    http: HTTPClient, listen: Callable[[Any], int], engine: Engine, log_lines: list[str]
) -> None:
    """The first good poll logs the node reachable with its model count; a failure after it says
    the last inventory is kept (and nothing about its residency read, which failed with it), and
    the last good list answers stay for lists that do not wait."""
    url = f"http://127.0.0.1:{listen(_site(engine))}"
    clock = Clock()
    book = _book(url, http, clock)
    await book.poll_now()
    node = Node("gpu2", url)
    listed = {"models": [{"name": "llama3:latest", "size": 7}]}
    assert (book.lists.last(node, "/api/tags"), book.lists.last(node, "/api/ps")) == (
        listed,
        listed,
    )
    assert book.lists.last(Node("gpu2", url + "/other"), "/api/tags") is None  # another URL
    engine.status = 500
    clock.advance(3)
    await book.poll_now()
    assert book.reachability("gpu2") == Reachability(Reach.UNREACHABLE, url, 3.0, "status 500")
    assert book.models("gpu2") == frozenset({"llama3:latest"})
    assert book.lists.last(node, "/api/tags") == listed
    assert book.loaded("gpu2") is None  # residency is unknown after a failed read
    assert [line for line in log_lines if "gpu2" in line] == [
        f"node gpu2 reachable at {url}: 1 models (ollama facade)",
        f"node gpu2 unreachable: status 500 at {url} (ollama facade); its last inventory "
        "(1 models) is kept",
    ]


def test_a_static_node_is_not_polled_and_an_unknown_id_has_no_reachability() -> None:
    """A node with a static inventory is never polled (``not-polled``); an id the directory does
    not hold has none."""
    clock = Clock()
    directory = NodeDirectory(
        OLLAMA, clock, flag_nodes=[Node("s", "http://u:p@10.0.0.7:11434", ("m",))]
    )
    book = InventoryBook(OLLAMA, directory, HTTPClient(None), clock)  # type: ignore[arg-type]
    assert book.reachability("s") == Reachability(Reach.NOT_POLLED, "http://10.0.0.7:11434")
    assert book.reachability("nope") is None
