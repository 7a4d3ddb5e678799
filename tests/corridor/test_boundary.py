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
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.threads import deferToThread

from nvpair_tw.core import LOOP_HEADER, PROCESS_NONCE
from tests.corridor.boundary_kit import (
    ADMIN,
    EMPTY,
    SCOPED,
    SCOPED_ADMIN,
    Boundary,
    open_boundary,
)

pytestmark = pytest.mark.timeout(30)


@pytest_twisted.async_yield_fixture()
async def boundary(reactor: Any, tmp_path: Path) -> AsyncIterator[Boundary]:
    async for opened in open_boundary(reactor, tmp_path):
        yield opened


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
        *(b"/api/show", b"/api/copy", b"/api/c%6Fpy", b"/api/create", b"/api/pull"),
        *(b"/completion", b"/v1/rerank", b"/tokenize", b"/api/blobs/sha256:00"),
    ]
)
_NAMES = st.sampled_from(
    ["model", "MODEL", "Model", "mode\u212a", "modeL", "name", "source", "Destination", "from"]
)
_MODELS = st.sampled_from(["llama3", "secret", "llama3:latest", "secret:latest", "", "LLAMA3"])
_TAILS = st.sampled_from([b""] * 8 + [b" ", b"\n", b" x", b"{}", b"\xff", b'"', b"\x00"])
_CALLERS = st.sampled_from([SCOPED, SCOPED_ADMIN])
_METHODS = st.sampled_from([b"POST", b"POST", b"POST", b"GET", b"HEAD"])


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """A JSON object of one to three model-ish members (some repeated under case variants),
    maybe followed by trailing bytes or carrying an invalid UTF-8 byte."""
    members = draw(st.lists(st.tuples(_NAMES, _MODELS), min_size=1, max_size=3))
    inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in members)
    body = ("{" + inner + ', "messages": []}').encode()
    if draw(st.integers(0, 7)) == 0:
        body = body.replace(b'"messages"', b'"m\xffessages"')
    return body + draw(_TAILS)


def _blocking_send(port: int, method: bytes, target: bytes, body: bytes, key: str) -> bytes:
    """One request over a blocking socket (a worker thread): the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _allowed(name: str) -> bool:
    return name.lower().startswith("llama3")


@pytest.mark.timeout(180)
@pytest_twisted.ensureDeferred
async def test_what_a_node_runs_is_what_the_proxy_checked(boundary: Boundary) -> None:
    """Property (Hypothesis, over the socket): for any scoped key (role user or admin), method,
    path and body, either the proxy refuses and the node sees nothing, or every model the Go-like
    node reads — ``model``, and ``name``, ``source``, ``destination`` and ``from`` where the
    route's struct has them — is one the key allows. A ``GET`` or ``HEAD`` with a body is 400
    ``body-not-allowed`` whatever it names."""
    port = boundary.facade_port()

    @settings(max_examples=400, deadline=None, derandomize=True, database=None)
    @given(_CALLERS, _METHODS, _PATHS, _bodies())
    def example(key: str, method: bytes, target: bytes, body: bytes) -> None:
        before = len(boundary.inference())
        answer = _blocking_send(port, method, target, body, key)
        status = int(answer.split(b" ", 2)[1])
        reached = boundary.inference()[before:]
        context = (key, method, target, body, status)
        if method != b"POST":
            assert status == 400 and b"body-not-allowed" in answer, context
        if status >= 400 and status != 502:
            assert reached == [], context
        for seen in reached:
            assert all(_allowed(name) for _, name in seen.names), (context, seen.names)
            assert not seen.model or _allowed(seen.model), context  # "" names none

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
