"""A key is a boundary (docs/behaviour.md §14): each probe that bypassed a scoped key, over real
loopback sockets, against a node that reads requests the way engines written in Go do
(``tests/golike.py``: decoded paths, the first JSON value, keys matched case-insensitively with the
last winning). Every refusal must leave the node untouched; what the node runs is what was checked.
"""

from __future__ import annotations

import gc
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from attrs import define, field
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure

from nvpair_tw.core import LOOP_HEADER, PROCESS_NONCE
from nvpair_tw.nodes import Node
from nvpair_tw.testing import ProxyHandle, start_proxy
from tests.golike import GoLikeNode, Seen, listen_golike

pytestmark = pytest.mark.timeout(30)

SCOPED = "sk-scoped-0123456789"
ADMIN = "sk-admin-0123456789"
EMPTY = "sk-empty-0123456789"
KEYS = f"""
[[key]]
name = "scoped"
key = "{SCOPED}"
models = ["llama3*"]

[[key]]
name = "nothing"
key = "{EMPTY}"
models = []

[[key]]
name = "ops"
key = "{ADMIN}"
role = "admin"
"""


@define
class _Answer(Protocol):
    """Collects one raw HTTP exchange until the server closes."""

    data: list[bytes] = field(factory=list)
    done: Deferred[bytes] = field(factory=Deferred)

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(b"".join(self.data))


@define
class Reply:
    status: int
    head: bytes
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@define
class Boundary:
    """A proxy with a keys file in front of one Go-like node that has ``llama3`` and ``secret``."""

    reactor: Any
    node: GoLikeNode
    port: IListeningPort
    proxy: ProxyHandle

    async def send(
        self,
        method: bytes,
        target: bytes,
        body: bytes = b"",
        key: str | None = None,
        headers: tuple[bytes, ...] = (),
    ) -> Reply:
        """Send one request as raw bytes (the target exactly as given) and read the answer."""
        lines = [method + b" " + target + b" HTTP/1.1", b"Host: localhost", b"Connection: close"]
        if key is not None:
            lines.append(b"Authorization: Bearer " + key.encode())
        lines.extend(headers)
        lines.append(b"Content-Length: %d" % len(body))
        raw = b"\r\n".join(lines) + b"\r\n\r\n" + body
        port = self.proxy.ports["ollama"].getHost().port  # type: ignore[attr-defined]
        answer = _Answer()
        await connectProtocol(TCP4ClientEndpoint(self.reactor, "127.0.0.1", port), answer)
        assert answer.transport is not None
        answer.transport.write(raw)
        data = await answer.done
        head, _, rest = data.partition(b"\r\n\r\n")
        return Reply(int(head.split(b" ", 2)[1]), head, _unchunked(head, rest))

    def inference(self) -> list[Seen]:
        """What reached the node besides the proxy's own inventory polls."""
        return [s for s in self.node.seen if not (s.method == "GET" and s.path == "/api/tags")]


def _unchunked(head: bytes, rest: bytes) -> bytes:
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    out, data = [], rest
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2 :]
    return b"".join(out)


@pytest_twisted.async_yield_fixture()
async def boundary(reactor: Any, tmp_path: Path) -> AsyncIterator[Boundary]:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    node = GoLikeNode(models=("llama3:latest", "secret:latest"))
    port = listen_golike(reactor, node)
    url = f"http://127.0.0.1:{port.getHost().port}"  # type: ignore[attr-defined]
    nodes = [Node("g", url, models=("llama3:latest", "secret:latest"))]
    proxy = await start_proxy(reactor, {"ollama": nodes}, keys_file=str(keys))
    yield Boundary(reactor, node, port, proxy)
    await proxy.stop()
    await maybeDeferred(port.stopListening)


def chat(model: str, **extra: Any) -> bytes:
    return json.dumps({"model": model, "stream": False, "messages": [], **extra}).encode()


@pytest_twisted.ensureDeferred
async def test_an_encoded_path_is_the_route_it_decodes_to_and_its_scope_applies(
    boundary: Boundary,
) -> None:
    """``POST /api/%63hat`` is ``/api/chat`` to a Go engine: the proxy classifies it as that
    route, so the key's scope refuses ``secret`` and the node gets nothing."""
    refused = await boundary.send(b"POST", b"/api/%63hat", chat("secret"), key=SCOPED)
    assert (refused.status, refused.json()["code"]) == (403, "model-not-allowed")
    assert boundary.inference() == []
    served = await boundary.send(b"POST", b"/api/%63hat", chat("llama3"), key=SCOPED)
    assert served.status == 200
    [seen] = boundary.inference()
    assert (seen.path, seen.model) == ("/api/chat", "llama3")


@pytest.mark.parametrize(
    "body",
    [
        chat("secret") + b" x",
        b'{"model": "secret", "messages": [], "x": "\xff"}',
        b'{"model": "secret", "deep": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"model": "llama3", "MODEL": "secret"}',
        b'{"model": "llama3", "model": "secret"}',
        b"",
    ],
    ids=["trailing", "invalid-utf8", "deep", "folded-duplicate", "duplicate", "empty"],
)
@pytest_twisted.ensureDeferred
async def test_a_body_the_proxy_cannot_read_strictly_is_refused_and_never_forwarded(
    boundary: Boundary, body: bytes
) -> None:
    """What the proxy cannot parse by the one strict rule, a Go engine might run: 400
    ``bad-body`` for every caller, the node untouched."""
    for key in (SCOPED, ADMIN, None):
        refused = await boundary.send(b"POST", b"/api/chat", body, key=key)
        assert (refused.status, refused.json()["code"]) == (400, "bad-body"), key
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_a_model_key_in_another_case_is_the_model_the_engine_runs(
    boundary: Boundary,
) -> None:
    """``{"MODEL": "secret"}`` alone is ``secret`` to a Go engine, and so to the proxy."""
    refused = await boundary.send(b"POST", b"/api/chat", b'{"MODEL": "secret"}', key=SCOPED)
    assert (refused.status, refused.json()["code"]) == (403, "model-not-allowed")
    served = await boundary.send(b"POST", b"/api/chat", b'{"Model": "secret"}', key=ADMIN)
    assert served.status == 200
    [seen] = boundary.inference()
    assert seen.model == "secret"


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        (b"DELETE", b"/api/delete", (b"X-NVPair-Node: *",)),
        (b"POST", b"/api/pull", (b"X-NVPair-Node: *",)),
        (b"POST", b"/api/create", (b"X-NVPair-Node: g",)),
        (b"POST", b"/api/copy", ()),
        (b"POST", b"/api/push", ()),
        (b"DELETE", b"/api/delete", ()),
        (b"POST", b"/api/blobs/sha256:00", ()),
        (b"POST", b"/api/unknown", ()),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_user_key_may_not_manage_models_or_fan_out(
    boundary: Boundary, method: bytes, target: bytes, headers: tuple[bytes, ...]
) -> None:
    """Model management, ``*`` fan-outs and unknown non-``GET`` routes are an admin's: 403
    ``route-not-allowed`` for a user key, scoped or with no models at all, no node contacted."""
    body = json.dumps({"model": "llama3", "source": "llama3", "destination": "x"}).encode()
    for key in (SCOPED, EMPTY):
        refused = await boundary.send(method, target, body, key=key, headers=headers)
        assert (refused.status, refused.json()["code"]) == (403, "route-not-allowed"), key
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_an_admin_key_still_manages_models(boundary: Boundary) -> None:
    """The same call with a key of role ``admin`` reaches the node."""
    body = json.dumps({"model": "llama3"}).encode()
    answered = await boundary.send(b"DELETE", b"/api/delete", body, key=ADMIN)
    assert answered.status == 200
    assert [(s.method, s.path) for s in boundary.inference()] == [("DELETE", "/api/delete")]


@pytest_twisted.ensureDeferred
async def test_the_proxys_keys_never_reach_a_node(boundary: Boundary) -> None:
    """A named key presented from loopback (an SDK's own key) is the proxy's: removed from
    ``Authorization`` and ``X-Api-Key``; the caller's own token still passes."""
    await boundary.send(b"POST", b"/api/chat", chat("llama3"), key=SCOPED)
    own = (b"X-Api-Key: " + SCOPED.encode(), b"Authorization: Bearer node-token")
    await boundary.send(b"POST", b"/api/chat", chat("llama3"), headers=own)
    first, second = boundary.inference()
    for seen in (first, second):
        values = b" ".join(v for _, v in seen.headers)
        assert SCOPED.encode() not in values
        assert not any(n.startswith(b"x-nvpair-") and n != LOOP_HEADER for n, _ in seen.headers)
    assert (b"authorization", b"Bearer node-token") in second.headers


@pytest_twisted.ensureDeferred
async def test_a_rebinding_host_from_loopback_is_not_local(boundary: Boundary) -> None:
    """``Host: evil.example`` from loopback (DNS rebinding) is a remote caller: it needs a key."""
    refused = await boundary.send(
        b"POST", b"/api/chat", chat("secret"), headers=(b"Host: evil.example",)
    )
    assert refused.status in (400, 401)
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_a_request_that_comes_back_to_its_proxy_is_a_loop(boundary: Boundary) -> None:
    """A request carrying this process's loop mark came from this process: 508, no node."""
    refused = await boundary.send(
        b"POST", b"/api/chat", chat("llama3"), headers=(LOOP_HEADER + b": " + PROCESS_NONCE,)
    )
    assert (refused.status, refused.json()["code"]) == (508, "loop-detected")
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_every_request_to_a_node_carries_the_loop_mark(boundary: Boundary) -> None:
    await boundary.send(b"POST", b"/api/chat", chat("llama3"))
    [seen] = boundary.inference()
    assert (LOOP_HEADER, PROCESS_NONCE) in seen.headers


@pytest_twisted.ensureDeferred
async def test_a_refusal_before_the_body_closes_and_carries_no_request_id(
    boundary: Boundary,
) -> None:
    """A head refused (here a role refusal) is answered with ``Connection: close`` and without
    the request id or the version (docs/behaviour.md §14.4)."""
    refused = await boundary.send(b"POST", b"/api/pull", b"{}", key=SCOPED)
    head = refused.head.lower()
    assert refused.status == 403
    assert b"connection: close" in head
    assert b"x-nvpair-request-id" not in head
    assert b"twistedweb" not in head


_PATHS = st.sampled_from(
    [
        *(b"/api/chat", b"/api/%63hat", b"/api/./chat", b"//api/chat", b"/api/x/../chat"),
        *(b"/API/chat", b"/api/ch%61t", b"/api/chat%2F", b"/api/chat/", b"/v1/chat/completions"),
        b"/api/show",
    ]
)
_KEYS = st.sampled_from(["model", "MODEL", "Model", "mode\u212a", "modeL", "name"])
_MODELS = st.sampled_from(["llama3", "secret", "llama3:latest", "secret:latest", "", "LLAMA3"])
_TAILS = st.sampled_from([b""] * 8 + [b" ", b"\n", b" x", b"{}", b"\xff", b'"', b"\x00"])


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """A JSON object of one to three model-ish members (some repeated under case variants),
    maybe followed by trailing bytes or carrying an invalid UTF-8 byte."""
    members = draw(st.lists(st.tuples(_KEYS, _MODELS), min_size=1, max_size=2))
    inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in members)
    body = ("{" + inner + ', "messages": []}').encode()
    if draw(st.integers(0, 7)) == 0:
        body = body.replace(b'"messages"', b'"m\xffessages"')
    return body + draw(_TAILS)


def _blocking_send(port: int, target: bytes, body: bytes) -> int:
    """One request over a blocking socket (a worker thread): the status."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            b"Authorization: Bearer " + SCOPED.encode() + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.mark.timeout(120)
@pytest_twisted.ensureDeferred
async def test_what_a_node_runs_is_what_the_proxy_checked(boundary: Boundary) -> None:
    """Property (Hypothesis, over the socket): for any path and body, either the proxy refuses
    and the node sees nothing, or the model the Go-like node runs is one the scoped key allows."""
    port = boundary.proxy.ports["ollama"].getHost().port  # type: ignore[attr-defined]

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(_PATHS, _bodies())
    def example(target: bytes, body: bytes) -> None:
        before = len(boundary.inference())
        status = _blocking_send(port, target, body)
        reached = boundary.inference()[before:]
        if status >= 400 and status != 502:
            assert reached == [], (status, target, body)
        for seen in reached:
            assert seen.model is None or seen.model.lower().startswith("llama3"), (target, body)

    await deferToThread(example)


@pytest_twisted.ensureDeferred
async def test_a_large_body_is_parsed_in_slices_and_then_let_go(boundary: Boundary) -> None:
    """A body over the large-body threshold is parsed cooperatively, forwarded as sent, and the
    collector's state is back to normal once its request ended, served or refused (§14.1)."""
    big = chat("llama3", pad="x" * (600 << 10))
    served = await boundary.send(b"POST", b"/api/chat", big)
    refused = await boundary.send(b"POST", b"/api/chat", big + b" x")
    assert (served.status, refused.status, refused.json()["code"]) == (200, 400, "bad-body")
    [seen] = boundary.inference()
    assert seen.model == "llama3"
    collector = boundary.proxy.runtime.shared.collector
    assert (collector.parsing, collector.holding) == (0, 0)
    assert gc.get_freeze_count() == 0 and gc.isenabled()
