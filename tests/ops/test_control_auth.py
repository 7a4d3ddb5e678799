"""Tests for nvpair_tw.ops._token and the control channel's boundary (docs/behaviour.md §14.3): the
token file, ``auth`` first with nothing sent before it, a line that is not JSON-RPC closing the
connection (a web page's HTTP POST to a TCP control port: the "evil node" case), and
``node/add-manual`` refusing this process's own listeners.

Protocol details run on ``StringTransport``; the boundary itself over real loopback TCP and unix
sockets, reading what the socket really carries.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, cast

import pytest
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, UNIXClientEndpoint, connectProtocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from nvpair_tw.events import NodeCooldown
from nvpair_tw.nodes._guard import SelfGuard
from nvpair_tw.ops._control import (
    INVALID_PARAMS,
    PARSE_ERROR,
    UNAUTHORIZED,
    ControlFactory,
    ControlProtocol,
    control_service,
)
from nvpair_tw.ops._dispatch import InOrder
from nvpair_tw.ops._rpc import Request
from nvpair_tw.ops._token import (
    FAILURE_BURST,
    FAILURE_INTERVAL,
    AuthThrottle,
    ControlToken,
    auth_source,
    needs_token,
    read_control_token,
    throttled,
)
from nvpair_tw.runtime._process import Runtime
from nvpair_tw.runtime._service import ListenerService
from tests.nodes.test_self import ResolvingReactor
from tests.ops.test_control import Client, _lines, _runtime, ensure_deferred

TOKEN = ControlToken(b"s3cret-token")
AUTH = {"jsonrpc": "2.0", "id": 0, "method": "auth", "params": {"token": "s3cret-token"}}
EVIL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "node/add-manual",
    "params": {"id": "evil", "url": "http://evil.example:11434"},
}


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _web_page_post(port: int, *lines: dict[str, Any]) -> bytes:
    """What ``fetch(url, {method: "POST", mode: "no-cors", body})`` sends: one HTTP request whose
    text/plain body holds JSON-RPC lines."""
    body = b"".join(_line(m) for m in lines)
    head = (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://evil.example\r\n"
        f"Content-Type: text/plain;charset=UTF-8\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- the token file and which endpoints need it -------------------------------------------------


@pytest.mark.parametrize(
    ("description", "needed"),
    [
        ("stdio", False),
        (" stdio ", False),
        ("unix:/run/nvpair/ctl.sock", False),
        ("unix:address=/run/nvpair/ctl.sock:mode=600", False),
        ("unix:@abstract", True),
        ("tcp:7070:interface=127.0.0.1", True),
        ("tcp6:port=7070:interface=\\:\\:1", True),
        ("ssl:7443:privateKey=k.pem", True),
        ("systemd:domain=INET:index=0", True),
        ("unix:", True),
    ],
)
def test_every_endpoint_but_stdio_and_a_filesystem_unix_socket_needs_a_token(
    description: str, needed: bool
) -> None:
    """Only stdio and a filesystem unix socket (whose mode is the lock) go without a token."""
    assert needs_token(description) is needed


def _token_file(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "control.token"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_token_is_the_first_line_of_a_0600_file(tmp_path: Path) -> None:
    """Surrounding whitespace is trimmed; later lines are ignored; the repr hides the token."""
    token = read_control_token(_token_file(tmp_path, "  s3cret-token \nsecond line\n"))
    assert token == TOKEN and token.matches("s3cret-token")
    assert not token.matches("s3cret-toke") and not token.matches(None)
    assert "s3cret" not in repr(token)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_a_token_file_readable_by_group_or_other_is_refused(tmp_path: Path, mode: int) -> None:
    """Like the keys file: any group or other bit refuses the file, naming its mode."""
    with pytest.raises(ValueError, match=f"mode {mode:04o}.*chmod 600"):
        read_control_token(_token_file(tmp_path, "s3cret-token\n", mode))


@pytest.mark.parametrize("text", ["", "\n\n", "   \nlater\n", "tab\there\n"])
def test_a_token_file_without_a_token_on_its_first_line_is_refused(
    tmp_path: Path, text: str
) -> None:
    """Empty, blank or non-printable first line: one line naming the file, never the content."""
    with pytest.raises(ValueError, match="must hold the token on its first line") as caught:
        read_control_token(_token_file(tmp_path, text))
    assert "here" not in str(caught.value)


def test_a_missing_token_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    """A path that cannot be read, or is not a regular file, is a clear error."""
    with pytest.raises(ValueError, match="cannot be read"):
        read_control_token(str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="not a regular file"):
        read_control_token(str(tmp_path))


def test_the_control_service_refuses_tcp_without_a_token() -> None:
    """The process cannot build a TCP control channel without a token; unix and stdio can."""
    runtime = _runtime()
    with pytest.raises(ValueError, match="needs --control-token"):
        control_service(runtime.reactor, runtime, "tcp:7070:interface=127.0.0.1")
    assert isinstance(
        control_service(runtime.reactor, runtime, "tcp:0", token=TOKEN), ListenerService
    )
    assert isinstance(
        control_service(runtime.reactor, runtime, "unix:/tmp/x.sock"), ListenerService
    )


# --- auth first, over StringTransport -----------------------------------------------------------


def _connected(runtime: Runtime | None = None) -> tuple[ControlFactory, ControlProtocol, Any]:
    factory = ControlFactory(runtime if runtime is not None else _runtime(), token=TOKEN)
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 4000))
    transport = StringTransport()
    protocol.makeConnection(transport)
    return factory, protocol, transport


def test_nothing_is_sent_before_auth_and_events_flow_after_it() -> None:
    """Before ``auth`` the connection has no event subscription and receives nothing at all."""
    factory, protocol, transport = _connected()
    bus = factory.runtime.shared.bus
    subscribers = len(bus.subscriptions)
    bus.publish(NodeCooldown("ollama", "a", "stall", 5))
    assert transport.value() == b"" and len(bus.subscriptions) == subscribers
    protocol.dataReceived(_line(AUTH))
    after = NodeCooldown("ollama", "b", "stall", 5)
    bus.publish(after)
    assert _lines(transport) == [
        {"jsonrpc": "2.0", "id": 0, "result": {"authenticated": True}},
        {"jsonrpc": "2.0", "method": "node/cooldown", "params": after.to_json()},
    ]
    assert not transport.disconnecting


@pytest.mark.parametrize(
    "first",
    [
        EVIL,
        {**AUTH, "params": {"token": "guess"}},
        {**AUTH, "params": {"token": 5}},
        {**AUTH, "params": ["s3cret-token"]},
        {"jsonrpc": "1.0", "id": 3, "method": "auth", "params": {"token": "s3cret-token"}},
    ],
)
def test_any_other_first_call_or_a_wrong_token_is_32001_and_closes(first: dict[str, Any]) -> None:
    """-32001, the connection closes, and nothing after it in the same read runs."""
    factory, protocol, transport = _connected()
    protocol.dataReceived(_line(first) + _line(AUTH) + _line(EVIL))
    [refusal] = _lines(transport)
    assert refusal["error"]["code"] == UNAUTHORIZED and "s3cret" not in json.dumps(refusal)
    assert transport.disconnecting
    assert factory.runtime.facades["ollama"].directory.get("evil") is None


def test_auth_and_requests_may_arrive_in_one_read() -> None:
    """``auth`` then a request in the same segment: both are served, in order."""
    factory, protocol, transport = _connected()
    protocol.dataReceived(
        _line(AUTH) + _line({**EVIL, "params": {"id": "m", "url": "http://10.1.1.1:1"}})
    )
    assert [m.get("result") for m in _lines(transport)] == [
        {"authenticated": True},
        {"added": True},
    ]
    assert factory.runtime.facades["ollama"].directory.get("m") is not None


# --- the boundary over real sockets ------------------------------------------------------------


async def _tcp_client(reactor: Any, port: int) -> Client:
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    return cast(Client, await connectProtocol(endpoint, Client(reactor)))


@pytest.mark.parametrize("token", [TOKEN, None], ids=["with-token", "without-token"])
@ensure_deferred
async def test_a_web_pages_post_to_a_tcp_control_port_adds_no_node(
    reactor: Any, listen: Any, token: ControlToken | None
) -> None:
    """The "evil node" case: a whole HTTP POST with JSON-RPC lines in its body, in one TCP
    segment, is answered -32700 for its request line and the connection closes; no node is
    added (with a token, and by the framing rule alone without one)."""
    runtime = _runtime()
    port = listen(ControlFactory(runtime, token=token))
    client = await _tcp_client(reactor, port)
    assert client.transport is not None
    client.transport.write(_web_page_post(port, AUTH, EVIL))
    await client.lost
    [answer] = client.messages
    assert answer["error"]["code"] == PARSE_ERROR and answer["id"] is None
    assert runtime.facades["ollama"].directory.get("evil") is None


def _made(factory: ControlFactory) -> Deferred[ControlProtocol]:
    """Fires once the server side of the next connection is made."""
    made: Deferred[ControlProtocol] = Deferred()
    build = factory.buildProtocol

    def building(addr: Any) -> ControlProtocol:
        protocol = build(addr)
        connected = protocol.connectionMade

        def connection_made() -> None:
            connected()
            made.callback(protocol)

        protocol.connectionMade = connection_made  # type: ignore[method-assign]
        return protocol

    factory.buildProtocol = building  # type: ignore[method-assign]
    return made


@ensure_deferred
async def test_over_tcp_the_first_bytes_on_the_socket_are_the_auth_answer(
    reactor: Any, listen: Any
) -> None:
    """Events published while a TCP connection is not yet authenticated never reach its socket:
    the first line it reads is the answer to ``auth``; events follow from then on."""
    runtime = _runtime()
    factory = ControlFactory(runtime, token=TOKEN)
    made = _made(factory)
    client = await _tcp_client(reactor, listen(factory))
    await made
    for n in range(3):
        runtime.shared.bus.publish(NodeCooldown("ollama", str(n), "stall", 5))
    client.send(AUTH)
    await client.wait_for(lambda m: m.get("id") == 0)
    after = NodeCooldown("ollama", "3", "stall", 5)
    runtime.shared.bus.publish(after)
    await client.wait_for(lambda m: m.get("method") == "node/cooldown")
    assert client.messages == [
        {"jsonrpc": "2.0", "id": 0, "result": {"authenticated": True}},
        {"jsonrpc": "2.0", "method": "node/cooldown", "params": after.to_json()},
    ]
    assert [n["id"] for n in (await client.result("nodes/list"))["nodes"]] == ["a"]
    assert client.transport is not None
    client.transport.loseConnection()
    await client.lost


@ensure_deferred
async def test_over_tcp_a_wrong_token_is_refused_and_the_socket_closed(
    reactor: Any, listen: Any
) -> None:
    """A wrong token over TCP: one -32001 line, then the server closes the connection."""
    client = await _tcp_client(reactor, listen(ControlFactory(_runtime(), token=TOKEN)))
    client.send({**AUTH, "params": {"token": "s3cret-tokeN"}})
    await client.lost
    assert [m["error"]["code"] for m in client.messages] == [UNAUTHORIZED]


@ensure_deferred
async def test_a_unix_socket_given_a_token_also_requires_auth(reactor: Any) -> None:
    """With ``--control-token`` every endpoint requires ``auth``, a unix socket included."""
    directory = tempfile.mkdtemp(prefix="nvctl")
    path = os.path.join(directory, "ctl.sock")
    port = reactor.listenUNIX(path, ControlFactory(_runtime(), token=TOKEN))
    try:
        client = cast(
            Client, await connectProtocol(UNIXClientEndpoint(reactor, path), Client(reactor))
        )
        client.send({"jsonrpc": "2.0", "id": 1, "method": "nodes/list"})
        await client.lost
        assert [m["error"]["code"] for m in client.messages] == [UNAUTHORIZED]
    finally:
        await maybeDeferred(port.stopListening)
        os.rmdir(directory)


@ensure_deferred
async def test_add_manual_of_the_control_ports_own_address_is_refused(
    reactor: Any, listen: Any
) -> None:
    """A manual node at this process's own listener (here the control port itself) is -32602;
    a node on another port of the same host is added."""
    runtime = _runtime()
    factory = ControlFactory(runtime, token=TOKEN)
    port = listen(factory)
    runtime.self_guard.listened(cast(Any, _Bound(port)))
    client = await _tcp_client(reactor, port)
    await client.result("auth", {"token": "s3cret-token"})
    for url in (f"http://127.0.0.1:{port}", f"http://localhost:{port}/", f"http://[::1]:{port}"):
        answer = await client.call("node/add-manual", {"id": "me", "url": url})
        assert (
            answer["error"]["code"] == INVALID_PARAMS
            and "own listener" in answer["error"]["message"]
        )
    added = await client.result(
        "node/add-manual", {"id": "n", "url": f"http://127.0.0.1:{port + 1}"}
    )
    assert added == {"added": True}
    assert runtime.facades["ollama"].directory.get("me") is None
    assert client.transport is not None
    client.transport.loseConnection()
    await client.lost


class _Bound:
    """A listening port as :meth:`SelfGuard.listened` sees it."""

    def __init__(self, port: int) -> None:
        self._port = port

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", self._port)


# --- a named URL on one of our ports: resolved first, the connection waits -------------------------


def test_a_named_url_on_an_own_port_is_resolved_before_the_next_request_runs() -> None:
    """The name is resolved on the reactor's resolver; the answer and every later request on the
    connection wait for it, in order; a name that is this process is -32602."""
    runtime = _runtime()
    resolving = ResolvingReactor()
    runtime.self_guard = SelfGuard(resolving)  # type: ignore[arg-type]
    runtime.self_guard.listened(cast(Any, _Bound(11435)))
    _, protocol, transport = _connected(runtime)
    named = {**EVIL, "params": {"id": "me", "url": "http://me.example:11435"}}
    protocol.dataReceived(
        _line(AUTH) + _line(named) + _line({"jsonrpc": "2.0", "id": 2, "method": "nodes/list"})
    )
    assert [m["id"] for m in _lines(transport)] == [0]
    resolving.nameResolver.answer("127.0.1.1")
    refused, listed = _lines(transport)
    assert refused["id"] == 1 and refused["error"]["code"] == INVALID_PARAMS
    assert [n["id"] for n in listed["result"]["nodes"]] == ["a"]


def test_a_named_url_resolving_elsewhere_is_added() -> None:
    """The same name resolving to another machine: the node is added once resolved."""
    runtime = _runtime()
    resolving = ResolvingReactor()
    runtime.self_guard = SelfGuard(resolving)  # type: ignore[arg-type]
    runtime.self_guard.listened(cast(Any, _Bound(11435)))
    factory = ControlFactory(runtime)
    answer = factory.methods.handle_line(
        _line({**EVIL, "params": {"id": "gpu", "url": "http://gpu.example:11435"}})
    )
    assert isinstance(answer, InOrder)
    results: list[Any] = []
    answer.answer.addCallback(results.append)
    resolving.nameResolver.answer("192.0.2.5")
    assert results == [{"jsonrpc": "2.0", "id": 1, "result": {"added": True}}]
    assert runtime.facades["ollama"].directory.get("gpu") is not None


# --- guessing the token (docs/behaviour.md §14.3) ----------------------------------------------


async def _auth_once(reactor: Any, port: int, token: str) -> dict[str, Any]:
    """One connection, one ``auth``: its one answer (the connection then closes, or stays open
    when the token was right and is closed here)."""
    client = await _tcp_client(reactor, port)
    client.send({**AUTH, "params": {"token": token}})
    answer = await client.wait_for(lambda m: m.get("id") == 0)
    if client.transport is not None:
        client.transport.loseConnection()
    await client.lost
    return answer


@ensure_deferred
async def test_failed_auth_slows_down_per_source_and_is_logged(
    reactor: Any, listen: Any, log_lines: list[str]
) -> None:
    """Guessing from one source: after a few wrong tokens every further ``auth`` from it is
    refused without being compared — the right token too — until the pace allows another (a
    few a second at most); each failure is logged, with the source, never the token."""
    runtime = _runtime()
    clock = cast(Clock, runtime.shared.clock)
    port = listen(ControlFactory(runtime, token=TOKEN))
    answers = [await _auth_once(reactor, port, f"guess-{n}") for n in range(20)]
    assert all(a["error"]["code"] == UNAUTHORIZED for a in answers)
    checked = [a for a in answers if "too many failed" not in a["error"]["message"]]
    assert 1 <= len(checked) <= 5
    throttled = await _auth_once(reactor, port, "s3cret-token")
    assert "too many failed" in throttled["error"]["message"]
    clock.advance(1.0)
    second = [await _auth_once(reactor, port, f"again-{n}") for n in range(10)]
    assert len([a for a in second if "too many failed" not in a["error"]["message"]]) <= 3
    clock.advance(10.0)
    assert (await _auth_once(reactor, port, "s3cret-token"))["result"] == {"authenticated": True}
    failures = [line for line in log_lines if "failed auth" in line]
    assert failures and all("127.0.0.1" in line for line in failures)
    assert not any("guess-" in line or "s3cret" in line for line in log_lines)


def test_a_source_fails_five_times_then_once_every_half_second() -> None:
    clock = Clock()
    throttle = AuthThrottle(clock)
    slowed = [throttle.failed("a") for _ in range(FAILURE_BURST)]
    assert slowed == [False] * (FAILURE_BURST - 1) + [True]
    assert throttle.wait("a") == pytest.approx(FAILURE_INTERVAL)
    assert throttle.wait("b") == 0  # sources count apart
    clock.advance(0.2)
    assert throttle.wait("a") == pytest.approx(0.3)
    clock.advance(0.3)
    assert throttle.wait("a") == 0
    assert throttle.checked("a") == 2 and throttle.checked("a") == 0  # told once
    assert throttle.failed("a")  # one compared, slowed again
    clock.advance(100)
    assert [throttle.failed("a") for _ in range(FAILURE_BURST)][-1]  # rested: a burst, no more


def test_a_throttled_answer_is_32001_with_the_wait_and_no_token() -> None:
    answer = throttled(Request(4, "auth", {"token": "guess"}, False), 0.2)
    assert answer["id"] == 4 and answer["error"]["code"] == UNAUTHORIZED
    assert "retry in 1 s" in answer["error"]["message"] and "guess" not in json.dumps(answer)


@pytest.mark.parametrize(
    ("address", "source"),
    [
        (IPv4Address("TCP", "192.0.2.7", 5000), "192.0.2.7"),
        (IPv6Address("TCP", "2001:db8:1:2:3:4:5:6", 5000), "2001:db8:1:2::/64"),
        (IPv6Address("TCP", "2001:db8:1:2:ffff::1", 5000), "2001:db8:1:2::/64"),
        (IPv6Address("TCP", "::ffff:192.0.2.7", 5000), "192.0.2.7"),
        (UNIXAddress(b"/run/ctl.sock"), "local"),
        (None, "local"),
    ],
)
def test_failures_count_per_address_per_ipv6_64_and_local_peers_together(
    address: Any, source: str
) -> None:
    assert auth_source(address) == source


def test_the_sources_remembered_are_bounded() -> None:
    throttle = AuthThrottle(Clock())
    for n in range(5000):
        throttle.failed(f"s{n}")
    assert len(throttle._sources) == 4096
    assert throttle.wait("s0") == 0 and "s4999" in throttle._sources
