"""A fleet of proxies sharing what they learn through a real redis-server (docs/behaviour.md §6.6).

Every test starts its own ``redis-server`` (the Debian package; a missing binary fails the test)
on a free loopback port with persistence off, and two proxies in this process, each with its own
runtime, listening on loopback. "Within 100 ms"-type checks poll with a bounded deadline.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock
from twisted.web.server import Site

from nvpair_tw.core._resolved import Settings
from nvpair_tw.events import NODE_COOLDOWN
from nvpair_tw.fleet._store import (
    BACKOFF_CAP,
    FleetStore,
    SharedAffinityTable,
    StateConfig,
    next_backoff,
    parse_state_url,
    read_secret,
)
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._admin import StatusBoard, admin_resource
from nvpair_tw.ops._control import ControlMethods
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.runtime._process import build_runtime
from nvpair_tw.selection._affinity import AffinityTable, affinity_key
from nvpair_tw.selection._reservations import make_rank
from nvpair_tw.selection._stalls import StallTracker
from nvpair_tw.testing import (
    Behaviour,
    EngineHandle,
    ProxyHandle,
    SimulatedEngine,
    always,
    http_client,
    start_engine,
    start_proxy,
)
from tests.helpers import chat, eventually

MODEL = ("llama3:latest",)
CANARY = "canary-7f3a9-do-not-store"
PEER_BOUND = 0.1
"""Seconds: a peer applies a change within this (docs/behaviour.md §6.6)."""
BACK_BOUND = 5.0
"""Seconds: after the store returns, a new cooldown reaches the peer within this."""


# --- a real redis-server ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """One redis-server on loopback, which a test may kill and restart on the same port."""

    def __init__(self, password: str | None = None) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            pytest.fail("redis-server is required (apt-get install redis-server)")
        self.binary = binary
        self.port = _free_port()
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def cli(self, *args: str) -> str:
        command = ["redis-cli", "-p", str(self.port), "--raw"]
        if self.password is not None:
            command += ["--no-auth-warning", "-a", self.password]
        done = subprocess.run(command + list(args), capture_output=True, timeout=10, check=True)
        return done.stdout.decode("utf-8", "replace")

    def listening(self) -> bool:
        try:
            return self.cli("PING").strip() == "PONG"
        except subprocess.SubprocessError:
            return False

    def everything(self) -> str:
        """Every key and every value in the database, as text."""
        parts = []
        for key in self.cli("--scan").split():
            kind = self.cli("TYPE", key).strip()
            value = self.cli("GET", key) if kind == "string" else self.cli("DUMP", key)
            parts.append(f"{key}\t{kind}\t{value}")
        return "\n".join(parts)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def config(self) -> StateConfig:
        return parse_state_url(self.url(), password=self.password)


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    _wait_sync(server)
    yield server
    server.kill()


def _wait_sync(server: RedisServer) -> None:
    for _ in range(500):  # bounded: 500 tries, each a redis-cli round trip
        if server.listening():
            return
    pytest.fail("redis-server did not start")


async def restart(reactor: Any, server: RedisServer) -> None:
    server.start()
    await eventually(reactor, server.listening, 10.0, "redis-server listening")


# --- proxies ------------------------------------------------------------------------------------


class Fleet:
    """Engines behind two (or more) proxies that share one store."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.engines: list[EngineHandle] = []
        self.proxies: list[ProxyHandle] = []
        self.events: list[list[Any]] = []

    async def engine(self, engine: SimulatedEngine) -> EngineHandle:
        handle = await start_engine(self.reactor, engine)
        self.engines.append(handle)
        return handle

    async def proxy(
        self, nodes: Sequence[Node], settings: Settings, state: StateConfig | None
    ) -> ProxyHandle:
        proxy = await start_proxy(self.reactor, {"ollama": list(nodes)}, settings, state=state)
        self.proxies.append(proxy)
        seen: list[Any] = []
        proxy.runtime.shared.bus.subscribe(seen.append, name="test")
        self.events.append(seen)
        return proxy

    async def up(self, within: float = 5.0) -> None:
        for proxy in self.proxies:
            fleet = proxy.runtime.fleet
            assert fleet is not None
            await eventually(self.reactor, store_up(fleet), within, "store connected")

    async def post(
        self, proxy: ProxyHandle, payload: dict[str, Any], path: str = "/api/chat"
    ) -> tuple[int, bytes, str | None]:
        response = await http_client(self.reactor).post(
            proxy.url() + path, data=json.dumps(payload).encode()
        )
        content = await treq.content(response)
        node = response.headers.getRawHeaders(b"x-nvpair-node")
        return response.code, content, node[0].decode() if node else None

    async def stop(self) -> None:
        for proxy in self.proxies:
            await proxy.stop()
        for engine in self.engines:
            await engine.stop()


@pytest_twisted.async_yield_fixture()
async def fleet(reactor: Any) -> AsyncIterator[Fleet]:
    made = Fleet(reactor)
    yield made
    await made.stop()


def store_up(store: FleetStore) -> Callable[[], bool]:
    return lambda: store.up


def healthy(reactor: Any, **kw: Any) -> SimulatedEngine:
    return SimulatedEngine(reactor, MODEL, always(Behaviour.HEALTHY), **kw)


def facade_of(proxy: ProxyHandle) -> Any:
    return proxy.runtime.facades["ollama"]


def unreachable(log_lines: list[str]) -> int:
    """How many "store unreachable" warnings were logged."""
    return sum("unreachable" in line for line in log_lines)


# --- configuration ------------------------------------------------------------------------------


def test_state_url_parses_host_port_db_and_password_but_never_shows_the_password() -> None:
    config = parse_state_url("redis://:s3cret-pw@10.0.0.5:6380/2")
    assert (config.host, config.port, config.db, config.password) == (
        "10.0.0.5",
        6380,
        2,
        "s3cret-pw",
    )
    assert "s3cret-pw" not in str(config) and "s3cret-pw" not in repr(config)
    assert str(config) == "redis://:***@10.0.0.5:6380/2"
    assert parse_state_url("redis://store").port == 6379
    assert parse_state_url("redis://store").db == 0


def test_password_file_wins_over_the_url_password() -> None:
    assert parse_state_url("redis://:inurl@h:1/0", password="fromfile").password == "fromfile"


@pytest.mark.parametrize(
    "url", ["http://h:1/0", "redis://:pw-canary@/0", "redis://h:1/x", "redis://h:notaport/0"]
)
def test_bad_state_url_is_a_clear_error_without_the_password(url: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_state_url(url)
    assert "pw-canary" not in str(raised.value) and "--state" in str(raised.value)


def test_secret_file_is_read_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"fleet-secret\n")
    assert read_secret(str(path)) == b"fleet-secret"
    (tmp_path / "empty").write_bytes(b"\n")
    with pytest.raises(ValueError):
        read_secret(str(tmp_path / "empty"))


def test_reconnect_backoff_doubles_and_is_capped_at_two_seconds() -> None:
    delays = [0.1]
    for _ in range(10):
        delays.append(next_backoff(delays[-1]))
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert max(delays) == BACKOFF_CAP == 2.0


def test_without_state_nothing_is_shared(reactor: Any) -> None:
    runtime = build_runtime(reactor, Settings(), ["ollama"], nodes={"ollama": []})
    facade = runtime.facades["ollama"]
    assert runtime.fleet is None
    assert type(facade.stalls) is StallTracker and type(facade.affinity) is AffinityTable
    assert runtime.shared.ledger.on_change is None


def test_sealed_affinity_digests_are_hmac_sha256_under_the_secret(reactor: Any) -> None:
    store = FleetStore(reactor, StateConfig("127.0.0.1", secret=b"k"))
    table = store.affinity_table("ollama", 10, 60.0)
    assert isinstance(table, SharedAffinityTable)
    key = affinity_key("/api/chat", "llama3:latest", chat("llama3", "hello", stream=True))
    assert key is not None
    shared: list[tuple[str, bytes, str]] = []
    table._share = lambda m, d, n: shared.append((m, d, n))  # type: ignore[misc]
    table.record(key, "n1")
    import hashlib
    import hmac

    assert shared == [("llama3:latest", hmac.new(b"k", key.key, hashlib.sha256).digest(), "n1")]
    assert table.lookup(key) == "n1"


# --- a fleet over a real store ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_stall_is_paid_once_per_fleet(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """P1's first request pays one deadline on the frozen node; P2 already knows: its first request
    goes straight to the healthy node, and the frozen node saw exactly one request in all."""
    frozen = await fleet.engine(SimulatedEngine(reactor, MODEL, always(Behaviour.FROZEN)))
    good = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", frozen.url, MODEL), Node("n1", good.url, MODEL)]
    settings = Settings(response_header_timeout=1.5)
    p1 = await fleet.proxy(nodes, settings, redis.config())
    p2 = await fleet.proxy(nodes, settings, redis.config())
    await fleet.up()

    status, _, node = await fleet.post(p1, chat("llama3", f"{CANARY} one", stream=True))
    assert (status, node) == (200, "n1")
    assert frozen.engine.inference_count == 1
    await eventually(
        reactor, lambda: "n0" in facade_of(p2).stalls.cooling(), PEER_BOUND, "peer cooldown"
    )

    status, _, node = await fleet.post(p2, chat("llama3", f"{CANARY} two", stream=True))
    assert (status, node) == (200, "n1")
    assert frozen.engine.inference_count == 1
    assert good.engine.inference_count == 2
    # Shown like a local cooldown, marked as a peer's.
    peer_events = [e.payload for e in fleet.events[1] if e.name == NODE_COOLDOWN]
    assert [e.get("origin") for e in peer_events] == ["peer"]
    listed = ControlMethods(p2.runtime).call("nodes/list", {})
    cooling = {n["id"]: n["coolingUntil"] for n in listed["nodes"]}  # type: ignore[index]
    assert cooling["n0"] is not None and cooling["n1"] is None
    # And the store's copy lives no longer than the cooldown.
    ttl = int(redis.cli("PTTL", "nvpair:cool:ollama:n0"))
    assert 0 < ttl <= 1500


@pytest_twisted.ensureDeferred
async def test_a_success_on_any_proxy_ends_the_cooldown_everywhere(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    n0 = await fleet.engine(healthy(reactor))
    n1 = await fleet.engine(healthy(reactor))
    both = [Node("n0", n0.url, MODEL), Node("n1", n1.url, MODEL)]
    settings = Settings(response_header_timeout=60.0)
    p1 = await fleet.proxy(both, settings, redis.config())
    p2 = await fleet.proxy(both[:1], settings, redis.config())  # n0 is P2's only node
    await fleet.up()

    facade_of(p1).stalls.cool("n0", "stall")
    await eventually(reactor, lambda: "n0" in facade_of(p2).stalls.cooling(), PEER_BOUND)
    status, _, node = await fleet.post(
        p2, chat("llama3", "hello", stream=True)
    )  # a sole candidate is used, cooling
    assert (status, node) == (200, "n0")
    assert "n0" not in facade_of(p2).stalls.cooling()
    await eventually(
        reactor, lambda: "n0" not in facade_of(p1).stalls.cooling(), PEER_BOUND, "peer clear"
    )
    assert redis.cli("EXISTS", "nvpair:cool:ollama:n0").strip() == "0"


@pytest_twisted.ensureDeferred
async def test_turn_two_through_the_other_proxy_lands_on_turn_ones_node(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    n0 = await fleet.engine(healthy(reactor))
    n1 = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", n0.url, MODEL), Node("n1", n1.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    # P1's scheduler says n0 is busy, so turn 1 goes to n1; P2 on its own would pick n0.
    p1.runtime.shared.ledger.apply(1, ["n0", "n1"], [make_rank("n0", 5, 0), make_rank("n1", 0, 0)])

    status, _, first = await fleet.post(p1, chat("llama3", "turn one", stream=True))
    assert (status, first) == (200, "n1")
    await eventually(reactor, lambda: len(facade_of(p2).affinity) == 1, PEER_BOUND, "peer entry")
    # Turn one's reservation released everywhere: a node a peer still has work on is predicted
    # slower (the fleet's reservations count, docs/behaviour.md §15.2), whatever its prefix.
    ledger = p2.runtime.shared.ledger
    await eventually(reactor, lambda: ledger.reservations("n1") == 0, PEER_BOUND, "release seen")

    status, _, second = await fleet.post(
        p2, chat("llama3", "turn one", "answer", "turn two", stream=True)
    )
    assert (status, second) == (200, "n1")


@pytest_twisted.ensureDeferred
async def test_a_conversation_a_peers_pushed_out_of_a_nodes_cache_is_not_expected_warm(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """Each node keeps one conversation (docs/behaviour.md §5.3.1). P1 serves a conversation on
    n1, then P2 another one there: P1 counts it (the fleet shares which conversations each node
    was sent), so P1's next turn of the first is not expected warm on n1 and goes to n0, where
    it pushes no active conversation out."""
    engines = [await fleet.engine(healthy(reactor)) for _ in range(2)]
    nodes = [Node(f"n{i}", e.url, MODEL, cache_conversations=1) for i, e in enumerate(engines)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    facade_of(p1).pin = facade_of(p2).pin = "n1"
    status, _, first = await fleet.post(p1, chat("llama3", "turn one", stream=True))
    assert (status, first) == (200, "n1")
    status, _, other = await fleet.post(p2, chat("llama3", "another one", stream=True))
    assert (status, other) == (200, "n1")
    books = facade_of(p1).caches._books
    await eventually(
        reactor, lambda: len(books.get(("n1", "llama3:latest"), ())) == 2, PEER_BOUND, "note"
    )
    ledger = p1.runtime.shared.ledger
    await eventually(reactor, lambda: ledger.reservations("n1") == 0, PEER_BOUND, "release seen")
    facade_of(p1).pin = None
    status, _, second = await fleet.post(
        p1, chat("llama3", "turn one", "answer", "turn two", stream=True)
    )
    assert (status, second) == (200, "n0")


@pytest_twisted.ensureDeferred
async def test_reservations_are_fleet_wide(reactor: Any, fleet: Fleet, redis: RedisServer) -> None:
    """20 requests held open, 7 through P1 and 13 through P2: equal nodes get 10 each (±1).
    Each proxy alone would split its own share: 4/3 and 7/6, 11/9 in all."""
    # Held open until the test lets them go: on the reactor's clock a 2 s delay ran out, and the
    # first reservations ended, whenever the 20 round trips below took longer than that.
    held = Clock()
    engines = [await fleet.engine(healthy(held, header_delay=1.0)) for _ in range(2)]
    nodes = [Node(f"n{i}", e.url, MODEL) for i, e in enumerate(engines)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    for proxy in (p1, p2):
        proxy.runtime.shared.ledger.apply(1, ["n0", "n1"], [])

    def fleet_total(proxy: ProxyHandle) -> int:
        return sum(proxy.runtime.shared.ledger.reservations(n) for n in ("n0", "n1"))

    pending = []
    for i in range(20):
        proxy = p1 if i < 7 else p2
        pending.append(
            ensureDeferred(fleet.post(proxy, chat("llama3", f"request {i}", stream=True)))
        )
        await eventually(
            reactor,
            lambda: fleet_total(p1) == len(pending) and fleet_total(p2) == len(pending),
            1.0,
            f"both proxies seeing {i + 1} reservations",
        )
    served = [e.engine.inference_count for e in engines]
    assert sum(served) == 20 and abs(served[0] - served[1]) <= 1, served
    held.advance(1.0)
    results = [await p for p in pending]
    assert all(status == 200 for status, _, _ in results)
    await eventually(reactor, lambda: fleet_total(p1) == 0 and fleet_total(p2) == 0, PEER_BOUND)


@pytest_twisted.ensureDeferred
async def test_losing_the_store_loses_only_the_sharing(
    reactor: Any, fleet: Fleet, redis: RedisServer, log_lines: list[str]
) -> None:
    n0 = await fleet.engine(healthy(reactor, header_delay=0.3))
    n1 = await fleet.engine(healthy(reactor, header_delay=0.3))
    nodes = [Node("n0", n0.url, MODEL), Node("n1", n1.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    admin = Site(
        admin_resource(
            p1.runtime,
            ProxyMetrics(p1.runtime),
            StatusBoard(p1.runtime),
            lambda _engine: True,
            lambda _request: None,
        )
    )
    admin_port = reactor.listenTCP(0, admin, interface="127.0.0.1")
    admin_url = f"http://127.0.0.1:{admin_port.getHost().port}"
    await eventually(reactor, lambda: facade_of(p1).inventory.known("n0"), 5.0, "inventory")
    try:
        in_flight = [
            ensureDeferred(fleet.post(p, chat("llama3", f"before {i}", stream=True)))
            for i, p in enumerate((p1, p2, p1, p2))
        ]
        redis.kill()
        await eventually(
            reactor,
            lambda: not any(p.runtime.fleet.up for p in (p1, p2)),  # type: ignore[union-attr]
            5.0,
            "store seen lost",
        )
        during = [
            await fleet.post(p, chat("llama3", f"during {i}", stream=True))
            for i, p in enumerate((p1, p2) * 3)
        ]
        before = [await d for d in in_flight]
        assert [s for s, _, _ in before + during] == [200] * 10

        ready = await http_client(reactor).get(admin_url + "/readyz")
        detail = json.loads(await treq.content(ready))
        assert ready.code == 200 and detail["status"] == "ready"
        assert detail["state"]["state"] == "down"
        metrics = await treq.text_content(await http_client(reactor).get(admin_url + "/metrics"))
        assert "nvpair_state_store_up 0.0" in metrics
        state = await treq.json_content(await http_client(reactor).get(admin_url + "/api/state"))
        assert state["store"]["state"] == "down"

        await restart(reactor, redis)
        await fleet.up(within=BACK_BOUND)
        facade_of(p1).stalls.cool("n1", "stall")
        await eventually(
            reactor, lambda: "n1" in facade_of(p2).stalls.cooling(), BACK_BOUND, "cooldown after"
        )
        metrics = await treq.text_content(await http_client(reactor).get(admin_url + "/metrics"))
        assert "nvpair_state_store_up 1.0" in metrics
    finally:
        await admin_port.stopListening()
    # One warning when lost and one line when back, per proxy.
    assert sum("lost; working on local state" in line for line in log_lines) == 2
    assert sum("is back; state resynchronised" in line for line in log_lines) == 2


@pytest_twisted.ensureDeferred
async def test_a_cooldown_learnt_while_the_store_was_away_is_shared_on_return(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    n0 = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", n0.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(response_header_timeout=60.0), redis.config())
    p2 = await fleet.proxy(nodes, Settings(response_header_timeout=60.0), redis.config())
    await fleet.up()
    redis.kill()
    await eventually(reactor, lambda: not p1.runtime.fleet.up, 5.0)  # type: ignore[union-attr]
    facade_of(p1).stalls.cool("n0", "stall")
    assert "n0" not in facade_of(p2).stalls.cooling()
    await restart(reactor, redis)
    await eventually(
        reactor, lambda: "n0" in facade_of(p2).stalls.cooling(), BACK_BOUND, "resynchronised"
    )


@pytest_twisted.ensureDeferred
async def test_flushed_and_corrupted_keys_never_become_a_client_error(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    n0 = await fleet.engine(healthy(reactor))
    n1 = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", n0.url, MODEL), Node("n1", n1.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    statuses = [(await fleet.post(p1, chat("llama3", "a", stream=True)))[0]]
    facade_of(p1).stalls.cool("n0", "stall")
    redis.cli("FLUSHALL")
    statuses += [
        (await fleet.post(p, chat("llama3", "b", "x", "c", stream=True)))[0] for p in (p1, p2)
    ]
    # Wrong types under every kind of key, and garbage on the channel.
    redis.cli("LPUSH", "nvpair:cool:ollama:n1", "x")
    redis.cli("HSET", "nvpair:res:someone", "n0", "x")
    redis.cli("SET", "nvpair:aff:ollama:0:00", "not json")
    redis.cli("SET", "nvpair:res:other", '{"n0": "many"}')
    redis.cli("SADD", "nvpair:aff:ollama:1:11", "x")
    redis.cli("SET", "nvpair:cool:ollama:n1", '{"e": "ollama", "n": 5}', "PX", "60000")
    lost = [p.runtime.fleet.lost_count for p in (p1, p2)]  # type: ignore[union-attr]
    for message in (
        "garbage",
        "[1, 2]",
        '{"t": "cool", "e": "ollama", "n": "n0", "ttl": "soon"}',
        '{"t": "aff", "e": "ollama", "m": "llama3:latest", "d": "zz", "n": "n1"}',
        '{"t": "res", "o": "x", "c": {"n0": "lots"}}',
        '{"t": "clear", "e": 3}',
    ):
        redis.cli("PUBLISH", "nvpair:events", message)
    # Ignored without dropping the connection: a good message after them still arrives.
    facade_of(p2).stalls.cool("n0", "stall")
    await eventually(reactor, lambda: "n0" in facade_of(p1).stalls.cooling(), PEER_BOUND)
    assert [p.runtime.fleet.lost_count for p in (p1, p2)] == lost  # type: ignore[union-attr]
    # Make both proxies resynchronise over the corrupted keys.
    redis.cli("CLIENT", "KILL", "TYPE", "normal")
    redis.cli("CLIENT", "KILL", "TYPE", "pubsub")
    await eventually(
        reactor,
        lambda: all(p.runtime.fleet.lost_count >= 1 for p in (p1, p2)),  # type: ignore[union-attr]
        5.0,
    )
    await fleet.up()
    statuses += [
        (await fleet.post(p, chat("llama3", "d", "y", "e", stream=True)))[0]
        for p in (p1, p2, p1, p2)
    ]
    facade_of(p2).stalls.cool("n1", "stall")  # overwrites the wrong type
    await eventually(reactor, lambda: "n1" in facade_of(p1).stalls.cooling(), PEER_BOUND)
    statuses += [(await fleet.post(p, chat("llama3", "f", stream=True)))[0] for p in (p1, p2)]
    assert statuses == [200] * len(statuses)


@pytest_twisted.ensureDeferred
async def test_no_prompt_text_reaches_the_store(
    reactor: Any, fleet: Fleet, redis: RedisServer, tmp_path: Path
) -> None:
    engines = [await fleet.engine(healthy(reactor)) for _ in range(2)]
    nodes = [Node(f"n{i}", e.url, MODEL) for i, e in enumerate(engines)]
    secret = tmp_path / "secret"
    secret.write_bytes(b"fleet secret\n")
    config = parse_state_url(redis.url(), secret=read_secret(str(secret)))
    p1 = await fleet.proxy(nodes, Settings(), config)
    p2 = await fleet.proxy(nodes, Settings(), config)
    await fleet.up()
    long_prompt = (CANARY + " ") * 100  # ≥ 1,024 bytes: completions get affinity too
    for proxy in (p1, p2):
        await fleet.post(proxy, chat("llama3", CANARY, "ok", CANARY, stream=True))
        await fleet.post(proxy, {"model": "llama3", "prompt": long_prompt}, "/api/generate")
    facade_of(p1).stalls.cool("n0", "stall")
    await eventually(reactor, lambda: "n0" in facade_of(p2).stalls.cooling(), PEER_BOUND)
    for proxy in (p1, p2):  # the usage minutes (§12.4) go to the store too
        assert proxy.runtime.usage is not None
        await proxy.runtime.usage.flush()
    await eventually(reactor, lambda: "nvpair:usage:" in redis.everything(), 5.0, "usage stored")
    stored = redis.everything()
    assert "nvpair:aff:" in stored and "nvpair:cool:" in stored
    assert CANARY not in stored
    # Sealed: the plain docs/behaviour.md §5.3 digest is not what is stored.
    key = affinity_key(
        "/api/chat", "llama3:latest", chat("llama3", CANARY, "ok", CANARY, stream=True)
    )
    assert key is not None and key.key.hex() not in stored


@pytest_twisted.ensureDeferred
async def test_a_password_store_works_and_the_password_is_never_logged(
    reactor: Any, fleet: Fleet, log_lines: list[str]
) -> None:
    password = "pw-canary-91c2"
    server = RedisServer(password=password)
    server.start()
    try:
        await eventually(reactor, server.listening, 10.0, "redis-server listening")
        n0 = await fleet.engine(healthy(reactor))
        nodes = [Node("n0", n0.url, MODEL)]
        url = f"redis://:{password}@127.0.0.1:{server.port}/1"
        p1 = await fleet.proxy(nodes, Settings(response_header_timeout=60.0), parse_state_url(url))
        p2 = await fleet.proxy(nodes, Settings(response_header_timeout=60.0), parse_state_url(url))
        wrong = parse_state_url(url, password="wrong-" + password)
        p3 = await fleet.proxy(nodes, Settings(), wrong)
        for proxy in (p1, p2):
            assert proxy.runtime.fleet is not None
            await eventually(reactor, store_up(proxy.runtime.fleet), 5.0)
        facade_of(p1).stalls.cool("n0", "stall")
        await eventually(reactor, lambda: "n0" in facade_of(p2).stalls.cooling(), PEER_BOUND)
        # Database 1, as the URL said.
        assert server.cli("-n", "1", "EXISTS", "nvpair:cool:ollama:n0").strip() == "1"
        # P3's refused dial is told before P3 is stopped (a stop mid-dial says nothing).
        await eventually(reactor, lambda: unreachable(log_lines) > 0, 5.0, "password refused")
        assert not p3.runtime.fleet.up  # type: ignore[union-attr]
        assert (await fleet.post(p3, chat("llama3", "still served", stream=True)))[0] == 200
        fleet.proxies.remove(p3)
        await p3.stop()
    finally:
        server.kill()
    assert log_lines and not any(password in line for line in log_lines)
    # The wrong password: one warning, however many retries.
    assert unreachable(log_lines) == 1


@pytest_twisted.ensureDeferred
async def test_a_store_that_is_not_there_yet_is_joined_when_it_comes(
    reactor: Any, fleet: Fleet, log_lines: list[str]
) -> None:
    server = RedisServer()
    n0 = await fleet.engine(healthy(reactor))
    p1 = await fleet.proxy([Node("n0", n0.url, MODEL)], Settings(), server.config())
    try:
        assert (await fleet.post(p1, chat("llama3", "served alone", stream=True)))[0] == 200
        # The store comes only once the proxy has found it missing: its first dial (a resolution
        # in the reactor's thread pool, then a refused connection) can still be under way when
        # the request is served, and a store started meanwhile would be joined at once.
        await eventually(reactor, lambda: unreachable(log_lines) > 0, 5.0, "store seen missing")
        assert p1.runtime.fleet is not None and not p1.runtime.fleet.up
        await restart(reactor, server)
        await fleet.up(within=BACK_BOUND)  # the backoff is capped at 2 s
    finally:
        server.kill()
    assert unreachable(log_lines) == 1


@pytest_twisted.ensureDeferred
async def test_body_progress_reaches_peers_at_most_once_per_node_per_second(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    n0 = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", n0.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    s1, s2 = p1.runtime.fleet, p2.runtime.fleet
    assert s1 is not None and s2 is not None
    assert s2.peer_progress("ollama", "n0") is None
    applied = s2.applied
    s1.note_progress("ollama", "n0")
    s1.note_progress("ollama", "n0")  # within the same second: not sent
    s1.note_progress("ollama", "n1")
    await eventually(reactor, lambda: s2.peer_progress("ollama", "n1") is not None, PEER_BOUND)
    assert s2.peer_progress("ollama", "n0") is not None
    assert s2.applied - applied == 2
    assert s1.peer_progress("ollama", "n0") is None  # its own is not a peer's


@pytest_twisted.ensureDeferred
async def test_a_store_that_refuses_scripts_is_reported_once_and_never_hurts_a_client(
    reactor: Any, fleet: Fleet, redis: RedisServer, log_lines: list[str]
) -> None:
    redis.cli("CONFIG", "SET", "maxmemory", "1")  # every write is refused with OOM from now on
    redis.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
    n0 = await fleet.engine(healthy(reactor))
    p1 = await fleet.proxy([Node("n0", n0.url, MODEL)], Settings(), redis.config())
    await fleet.up()
    statuses = [
        (await fleet.post(p1, chat("llama3", f"turn {i}", stream=True)))[0] for i in range(3)
    ]
    assert p1.runtime.fleet is not None
    await eventually(reactor, lambda: p1.runtime.fleet.write_refused, 1.0, "refusal seen")  # type: ignore[union-attr]
    statuses += [
        (await fleet.post(p1, chat("llama3", f"again {i}", stream=True)))[0] for i in range(3)
    ]
    assert statuses == [200] * 6
    assert sum("refused a write" in line for line in log_lines) == 1


@pytest_twisted.ensureDeferred
async def test_a_nodes_body_bytes_on_one_proxy_are_progress_on_the_other(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """Busy is not stalled across a fleet: a chunk P1 receives from n0 reaches P2's progress
    record, so P2's header deadline on n0 would wait instead of cooling it."""
    n0 = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", n0.url, MODEL)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    there = p2.runtime.facades["ollama"].progress
    assert not there.delivered_within("n0", 60.0)
    p1.runtime.facades["ollama"].progress.toucher("n0")()
    await eventually(reactor, lambda: there.delivered_within("n0", 60.0), PEER_BOUND)


@pytest_twisted.ensureDeferred
async def test_a_cordon_is_fleet_wide_and_lifted_from_any_proxy(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """``node/cordon`` on one proxy cordons the node on every proxy (origin ``peer``), kept in the
    store without a TTL; an uncordon on another proxy lifts it everywhere (docs/behaviour.md §13.1)."""
    n0 = await fleet.engine(healthy(reactor))
    n1 = await fleet.engine(healthy(reactor))
    both = [Node("n0", n0.url, MODEL), Node("n1", n1.url, MODEL)]
    settings = Settings(response_header_timeout=60.0)
    p1 = await fleet.proxy(both, settings, redis.config())
    p2 = await fleet.proxy(both, settings, redis.config())
    await fleet.up()

    facade_of(p1).cordons.cordon("n0", "disk swap")
    await eventually(reactor, lambda: "n0" in facade_of(p2).cordons.ids(), PEER_BOUND, "cordon")
    seen = facade_of(p2).cordons.of_id("n0")
    assert seen is not None and (seen.reason, seen.origin) == ("disk swap", "peer")
    assert redis.cli("PTTL", "nvpair:cordon:ollama:n0").strip() == "-1"  # no TTL
    for proxy in (p1, p2):
        status, _, node = await fleet.post(proxy, chat("llama3", "hello", stream=True))
        assert (status, node) == (200, "n1")

    assert facade_of(p2).cordons.uncordon("n0")
    await eventually(
        reactor, lambda: "n0" not in facade_of(p1).cordons.ids(), PEER_BOUND, "uncordon"
    )
    assert redis.cli("EXISTS", "nvpair:cordon:ollama:n0").strip() == "0"


@pytest_twisted.ensureDeferred
async def test_a_proxy_that_joins_later_reads_the_fleets_cordons(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """A proxy started after the cordon was set learns it from the store when it connects."""
    n0 = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", n0.url, MODEL)]
    settings = Settings(response_header_timeout=60.0)
    p1 = await fleet.proxy(nodes, settings, redis.config())
    await fleet.up()
    facade_of(p1).cordons.cordon("n0", "upgrade")
    await eventually(
        reactor,
        lambda: redis.cli("EXISTS", "nvpair:cordon:ollama:n0").strip() == "1",
        5.0,
        "the cordon stored",
    )
    p2 = await fleet.proxy(nodes, settings, redis.config())
    await fleet.up()
    await eventually(reactor, lambda: "n0" in facade_of(p2).cordons.ids(), 5.0, "resynced")
    status, body, _ = await fleet.post(p2, chat("llama3", "hello", stream=True))
    assert status == 503 and json.loads(body)["code"] == "model-unavailable"


@pytest_twisted.ensureDeferred
async def test_the_proxy_that_saw_the_stall_probes_and_its_renewal_holds_on_the_peers(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """A node frozen whole (its model list too): P1 stalls on it and, at each cooldown's end, asks
    it its model list; no answer renews the cooldown and the renewal is shared, so P2 keeps it
    cooling without asking the node itself; thawed, P1's next question is answered and the end is
    shared (docs/behaviour.md §6.3, §6.6). Both use static nodes: every model-list GET the node
    sees is a probe."""
    period = 0.3
    frozen_engine = SimulatedEngine(reactor, MODEL, frozen=True)
    frozen = await fleet.engine(frozen_engine)
    good = await fleet.engine(healthy(reactor))
    nodes = [Node("n0", frozen.url, MODEL), Node("n1", good.url, MODEL)]
    settings = Settings(response_header_timeout=period)
    p1 = await fleet.proxy(nodes, settings, redis.config())
    p2 = await fleet.proxy(nodes, settings, redis.config())
    await fleet.up()
    facade_of(p1).pin = "n0"

    assert (await fleet.post(p1, chat("llama3", "hello", stream=True)))[
        0
    ] == 200  # paid once, served by n1
    await eventually(reactor, lambda: "n0" in facade_of(p2).stalls.cooling(), PEER_BOUND)

    def probes() -> int:
        return sum(1 for r in frozen_engine.received if r.path == b"/api/tags")

    def renewals(proxy_index: int) -> int:
        cooled = [e for e in fleet.events[proxy_index] if e.name == "node/cooldown"]
        return sum(1 for e in cooled if e.payload.get("renewed"))

    await eventually(reactor, lambda: renewals(0) >= 3, 10 * period, "three renewals on P1")
    assert "n0" in facade_of(p2).stalls.cooling()  # held by the shared renewals
    assert probes() <= renewals(0) + 1  # one question per period: P1's alone
    assert sum(1 for r in frozen_engine.received if r.path == b"/api/chat") == 1  # paid once

    frozen_engine.frozen = False
    await eventually(
        reactor, lambda: "n0" not in facade_of(p1).stalls.cooling(), 10 * period, "P1 ends it"
    )
    await eventually(
        reactor, lambda: "n0" not in facade_of(p2).stalls.cooling(), 10 * period, "P2 follows"
    )


async def post_as(
    reactor: Any, proxy: ProxyHandle, payload: dict[str, Any], headers: dict[str, str]
) -> str | None:
    """POST ``payload`` to ``/api/chat`` with ``headers``: the node that answered."""
    sent: dict[bytes | str, bytes | str] = {k: v for k, v in headers.items()}
    response = await http_client(reactor).post(
        proxy.url() + "/api/chat", data=json.dumps(payload).encode(), headers=sent
    )
    await treq.content(response)
    assert response.code == 200
    node = response.headers.getRawHeaders(b"x-nvpair-node")
    return node[0].decode() if node else None


SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 80}


def conversation(*said: str) -> dict[str, Any]:
    messages = [SYSTEM, *({"role": "user", "content": text} for text in said)]
    return {"model": "llama3", "stream": False, "messages": messages}


async def session_fleet(
    reactor: Any, fleet: Fleet, config: StateConfig
) -> tuple[ProxyHandle, ProxyHandle]:
    """Two proxies over n0 and n1; a session named on P1 is served by n1 (P1's pin)."""
    engines = [await fleet.engine(healthy(reactor)) for _ in range(2)]
    nodes = [Node(f"n{i}", e.url, MODEL) for i, e in enumerate(engines)]
    p1 = await fleet.proxy(nodes, Settings(), config)
    p2 = await fleet.proxy(nodes, Settings(), config)
    await fleet.up()
    facade_of(p1).pin = "n1"
    session = {"X-Session-Id": CANARY}
    assert await post_as(reactor, p1, conversation("turn one"), session) == "n1"
    await eventually(reactor, lambda: len(facade_of(p2).affinity) == 1, PEER_BOUND, "peer entry")
    await _release_heard(reactor, p1, p2)
    return p1, p2


async def _release_heard(reactor: Any, p1: ProxyHandle, p2: ProxyHandle) -> None:
    """P1 says its counts now (none), so P2 has heard the release, not only seen no reservation
    yet."""
    assert p1.runtime.fleet is not None and p2.runtime.fleet is not None
    p1.runtime.fleet._sharing.reservations.refresh()
    heard = p2.runtime.fleet._sharing.reservations._peers
    origin = p1.runtime.fleet.proxy_id
    await eventually(
        reactor, lambda: heard.get(origin, ({"?": 1},))[0] == {}, PEER_BOUND, "release"
    )


@pytest_twisted.ensureDeferred
async def test_a_session_named_on_one_proxy_goes_home_through_another(
    reactor: Any, fleet: Fleet, redis: RedisServer, tmp_path: Path
) -> None:
    """With a secret, a session's home is the fleet's: its compacted next turn (no prefix in
    common) reaches n1 through P2; the same turn without the session goes where P2's order puts
    it; the store holds the session sealed, never its name."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"fleet secret\n")
    config = parse_state_url(redis.url(), secret=read_secret(str(secret)))
    _p1, p2 = await session_fleet(reactor, fleet, config)
    await eventually(reactor, lambda: len(facade_of(p2).sessions) == 1, PEER_BOUND, "peer home")
    session = {"X-Session-Id": CANARY}
    assert await post_as(reactor, p2, conversation("compacted"), session) == "n1"
    assert await post_as(reactor, p2, conversation("another"), {}) == "n0"
    stored = redis.everything()
    assert "nvpair:sess:ollama:" in stored and CANARY not in stored


@pytest_twisted.ensureDeferred
async def test_without_a_secret_a_session_stays_on_its_proxy(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """No secret: conversations' prefixes are shared, sessions are not (a name would leave the
    proxy unkeyed)."""
    _p1, p2 = await session_fleet(reactor, fleet, redis.config())
    assert len(facade_of(p2).sessions) == 0
    session = {"X-Session-Id": CANARY}
    assert await post_as(reactor, p2, conversation("compacted"), session) == "n0"
    assert "nvpair:sess:" not in redis.everything()


@pytest_twisted.ensureDeferred
async def test_a_stored_response_made_through_one_proxy_is_continued_through_another(
    reactor: Any, fleet: Fleet, redis: RedisServer
) -> None:
    """A ``/v1/responses`` answer made on n1 through P1: P2 learns its placement and owner (as
    digests, kept for the session time, docs/behaviour.md §2.1) and sends its continuation to n1."""
    engines = [await fleet.engine(healthy(reactor)) for _ in range(2)]
    nodes = [Node(f"n{i}", e.url, MODEL) for i, e in enumerate(engines)]
    p1 = await fleet.proxy(nodes, Settings(), redis.config())
    p2 = await fleet.proxy(nodes, Settings(), redis.config())
    await fleet.up()
    facade_of(p1).pin = "n1"
    client = http_client(reactor)
    made = await client.post(
        p1.url() + "/v1/responses", data=json.dumps({"model": "llama3", "input": "hi"}).encode()
    )
    stored = json.loads(await treq.content(made))["id"]
    assert made.code == 200
    await eventually(reactor, lambda: len(facade_of(p2).responses) == 2, PEER_BOUND, "peer")
    follow = {"model": "llama3", "input": "more", "previous_response_id": stored}
    await _release_heard(reactor, p1, p2)
    continued = await client.post(p2.url() + "/v1/responses", data=json.dumps(follow).encode())
    await treq.content(continued)
    assert continued.code == 200
    assert continued.headers.getRawHeaders(b"x-nvpair-node") == [b"n1"]
    keys = [k for k in redis.cli("--scan").split() if ":ollama/responses:" in k]
    assert len(keys) == 2 and stored not in redis.everything()
    ttl = int(redis.cli("PTTL", keys[0]).strip())
    assert Settings().affinity_ttl * 1000 < ttl <= Settings().session_ttl * 1000
