"""The boundary's edges (docs/behaviour.md §14): a scoped admin key, bodies on ``GET``, every place a
key can be carried, the loop marks a client sends, the connections loopback may hold, a foreign
page's ``GET``, stored responses, names echoed back, the request limit and the labels a caller can
add. Each over real loopback sockets against the Go-like node (``tests/golike.py``), asserting what
the node received: a refusal leaves it untouched.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from attrs import evolve
from twisted.internet.defer import maybeDeferred

from nvpair_tw.core import LOOP_HEADER, PROCESS_NONCE, Settings
from nvpair_tw.nodes import Node
from nvpair_tw.ops._metrics import ProxyMetrics
from nvpair_tw.testing import http_client, start_proxy
from tests.corridor.boundary_kit import (
    ADMIN,
    LIMITED,
    OTHER,
    SCOPED,
    SCOPED_ADMIN,
    Answer,
    Boundary,
    open_boundary,
)
from tests.golike import GoLikeNode, listen_golike
from tests.helpers import eventually, refusal_code

pytestmark = pytest.mark.timeout(30)


@pytest_twisted.async_yield_fixture()
async def boundary(reactor: Any, tmp_path: Path) -> AsyncIterator[Boundary]:
    async for opened in open_boundary(reactor, tmp_path):
        yield opened


def body_of(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def chat(model: str, **extra: Any) -> bytes:
    return body_of(model=model, stream=False, messages=[], **extra)


def header(name: str, value: str) -> bytes:
    return f"{name}: {value}".encode()


# -- 1. an admin key with a model scope ----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "body", "headers", "code"),
    [
        (b"POST", b"/completion", body_of(model="secret", prompt="x"), (), "model-not-allowed"),
        (b"POST", b"/infill", body_of(model="secret"), (), "model-not-allowed"),
        (b"POST", b"/tokenize", body_of(model="secret", content="x"), (), "model-not-allowed"),
        (
            b"POST",
            b"/v1/rerank",
            body_of(model="secret-oai", query="q", documents=["d"]),
            (b"X-NVPair-Node: g",),
            "model-not-allowed",
        ),
        (
            b"POST",
            b"/api/copy",
            body_of(source="secret", destination="llama3-copy"),
            (),
            "model-not-allowed",
        ),
        (
            b"POST",
            b"/api/copy",
            body_of(source="llama3", destination="secret"),
            (),
            "model-not-allowed",
        ),
        (
            b"POST",
            b"/api/create",
            body_of(model="llama3-x", **{"from": "secret"}),
            (),
            "model-not-allowed",
        ),
        (
            b"POST",
            b"/api/create",
            body_of(model="llama3-x", files={"m.gguf": "sha256:" + "0" * 64}),
            (),
            "route-not-allowed",
        ),
        (b"POST", b"/api/pull", body_of(model="llama3", name="secret"), (), "model-not-allowed"),
        (b"POST", b"/api/blobs/sha256:" + b"0" * 64, b"weights", (), "route-not-allowed"),
        (b"HEAD", b"/api/blobs/sha256:" + b"0" * 64, b"", (), None),
        (b"POST", b"/v1/images/generations", body_of(model="llama3"), (), "route-not-allowed"),
        (b"PUT", b"/anything", b"", (), "route-not-allowed"),
    ],
    ids=[
        "completion",
        "infill",
        "tokenize",
        "rerank-targeted",
        "copy-source",
        "copy-destination",
        "create-from",
        "create-files",
        "pull-name",
        "blob-upload",
        "blob-head",
        "unreadable-route",
        "unknown-method",
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_scoped_admin_key_names_only_its_models_in_every_field(
    boundary: Boundary,
    method: bytes,
    target: bytes,
    body: bytes,
    headers: tuple[bytes, ...],
    code: str | None,
) -> None:
    """An admin key's models still apply: every model a request names (``model``, ``name``,
    ``source``, ``destination``, ``from``) is in scope, llama.cpp's own routes are read as
    naming their ``model``, and a route whose models the proxy cannot read (blobs, files, an
    unknown route) is refused; the node receives nothing."""
    refused = await boundary.send(method, target, body, key=SCOPED_ADMIN, headers=headers)
    assert refused.status == 403, refused
    if code is not None:
        assert refusal_code(refused.body) == code
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_a_scoped_admin_key_still_manages_and_runs_its_own_models(
    boundary: Boundary,
) -> None:
    """Within its scope a scoped admin key copies, creates and runs llama.cpp's routes; an admin
    key without a scope still copies any model."""
    copied = await boundary.send(
        b"POST", b"/api/copy", body_of(source="llama3", destination="llama3-copy"), SCOPED_ADMIN
    )
    completed = await boundary.send(b"POST", b"/completion", body_of(model="llama3"), SCOPED_ADMIN)
    anything = await boundary.send(
        b"POST", b"/api/copy", body_of(source="secret", destination="x"), ADMIN
    )
    assert (copied.status, completed.status, anything.status) == (200, 200, 200)
    assert [(s.path, s.names) for s in boundary.inference()] == [
        ("/api/copy", (("source", "llama3"), ("destination", "llama3-copy"))),
        ("/completion", (("model", "llama3"),)),
        ("/api/copy", (("source", "secret"), ("destination", "x"))),
    ]


# -- 2. a body on GET or HEAD --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "key"),
    [
        (b"GET", b"/api/chat", SCOPED),
        (b"GET", b"/v1/chat/completions", SCOPED),
        (b"GET", b"/props", SCOPED),
        (b"GET", b"/api/chat", None),
        (b"HEAD", b"/api/tags", SCOPED),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_get_or_head_with_a_body_is_refused_before_any_node(
    boundary: Boundary, method: bytes, target: bytes, key: str | None
) -> None:
    """``GET`` with ``Content-Length`` over 0: 400 ``body-not-allowed``, whoever sends it."""
    refused = await boundary.send(method, target, body_of(model="secret"), key=key)
    assert refused.status == 400
    if method == b"GET":
        assert refusal_code(refused.body) == "body-not-allowed"
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_a_get_with_any_transfer_encoding_is_refused_and_an_empty_length_passes(
    boundary: Boundary,
) -> None:
    chunked = await boundary.send(
        b"GET",
        b"/api/chat",
        b'11\r\n{"model":"secret"}\r\n0\r\n\r\n',
        key=SCOPED,
        headers=(b"Transfer-Encoding: chunked",),
    )
    assert (chunked.status, refusal_code(chunked.body)) == (400, "body-not-allowed")
    assert boundary.inference() == []
    empty = await boundary.send(b"GET", b"/props", key=SCOPED)
    assert empty.status == 200
    assert [s.path for s in boundary.inference()] == ["/props"]


# -- 3. every place a key can be carried ---------------------------------------------------------


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("target", "headers", "code"),
    [
        (b"/api/chat", (header("Api-Key", SCOPED),), "credential-misplaced"),
        (b"/api/chat?key=" + SCOPED.encode(), (), "credential-misplaced"),
        (b"/api/chat?x=1&api_key=" + SCOPED.encode(), (), "credential-misplaced"),
        (
            b"/api/chat",
            (header("Authorization", f"Bearer placeholder, Bearer {SCOPED}"),),
            "credential-misplaced",
        ),
        (b"/api/chat", (header("Authorization", _basic("me", SCOPED)),), "credential-misplaced"),
        (b"/api/chat", (header("Authorization", _basic(SCOPED, "")),), "credential-misplaced"),
        (b"/api/chat", (header("Cookie", f"session={SCOPED}"),), "credential-misplaced"),
        (b"/api/chat", (header("X-Api-Key", f"Bearer {SCOPED}"),), "credential-misplaced"),
        (
            b"/api/chat?token=" + SCOPED.encode(),
            (header("Authorization", f"Bearer {SCOPED}"),),
            "credential-misplaced",
        ),
        (
            b"/api/chat",
            (header("Authorization", "Bearer a"), header("Authorization", "Bearer b")),
            "bad-request",
        ),
        (b"/api/chat", (header("Authorization", "Bearer a, Bearer b"),), "bad-request"),
    ],
    ids=[
        "api-key-header",
        "query-key",
        "query-api-key",
        "two-bearers",
        "basic-password",
        "basic-user",
        "cookie",
        "x-api-key-as-bearer",
        "query-beside-bearer",
        "two-authorization-headers",
        "two-credentials-in-one",
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_key_anywhere_but_bearer_or_x_api_key_goes_nowhere(
    boundary: Boundary, target: bytes, headers: tuple[bytes, ...], code: str
) -> None:
    """A local caller's proxy key in another header, the query or a Basic credential is 400
    ``credential-misplaced``; more than one credential in ``Authorization`` is 400. No node is
    contacted, so the key cannot reach one."""
    refused = await boundary.send(b"POST", target, chat("llama3"), headers=headers)
    assert (refused.status, refusal_code(refused.body)) == (400, code)
    assert SCOPED.encode() not in refused.body
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_a_query_without_a_key_and_a_local_callers_own_credential_reach_the_node(
    boundary: Boundary,
) -> None:
    """The query is forwarded unchanged; a local caller's own Basic credential (not a key of the
    proxy's) is the caller's business and passes."""
    own = _basic("me", "node-secret")
    served = await boundary.send(
        b"POST",
        b"/api/chat?x=1&key=mine",
        chat("llama3"),
        headers=(header("Authorization", own),),
    )
    assert served.status == 200
    [seen] = boundary.inference()
    assert seen.query == b"x=1&key=mine"
    assert (b"authorization", own.encode()) in seen.headers


# -- 4. the loop marks a client sends ------------------------------------------------------------


def _marks(boundary: Boundary) -> list[bytes]:
    [seen] = boundary.inference()
    return [value for name, value in seen.headers if name == LOOP_HEADER]


@pytest_twisted.ensureDeferred
async def test_a_loop_mark_that_is_not_a_proxys_nonce_is_dropped(boundary: Boundary) -> None:
    """``X-NVPair-Via`` is kept only in its own form (a proxy's 32 hex digits): ``deadbeef`` is
    dropped, another proxy's mark passes with this process's own after it."""
    peer = b"0123456789abcdef0123456789abcdef"
    await boundary.send(
        b"POST",
        b"/api/chat",
        chat("llama3"),
        headers=(b"X-NVPair-Via: deadbeef", b"X-NVPair-Via: " + peer + b", <script>"),
    )
    assert _marks(boundary) == [peer, PROCESS_NONCE]


@pytest_twisted.ensureDeferred
async def test_at_most_seven_marks_are_kept_and_the_other_proxy_headers_go(
    boundary: Boundary,
) -> None:
    marks = [b"%032x" % n for n in range(1, 11)]
    headers = (*tuple(b"X-NVPair-Via: " + m for m in marks), b"X-NVPair-Anything: 1")
    await boundary.send(b"POST", b"/api/chat", chat("llama3"), headers=headers)
    assert _marks(boundary) == [*marks[-7:], PROCESS_NONCE]
    [seen] = boundary.inference()
    assert [n for n, _ in seen.headers if n.startswith(b"x-nvpair-")] == [LOOP_HEADER] * 8


# -- 5. connections: the head deadline and loopback's share ---------------------------------------


def _quick_head(boundary: Boundary, seconds: float) -> None:
    """The facade's head deadline, shortened so the test waits on the real reactor briefly."""
    site = boundary.proxy.runtime.site_for("ollama")
    site.limits = evolve(site.limits, header_timeout=seconds)


async def _closed(boundary: Boundary, answer: Answer, within: float) -> tuple[bytes, float]:
    """What ``answer``'s connection received until the proxy closed it, and when it closed."""
    reactor = boundary.reactor
    await eventually(reactor, lambda: answer.done.called, within, "the proxy closing")
    return await answer.done, reactor.seconds()


@pytest_twisted.ensureDeferred
async def test_a_connection_that_sends_nothing_is_closed_silently_at_the_head_deadline(
    boundary: Boundary,
) -> None:
    """The head deadline runs from accept: a connection that never sends a byte is closed when it
    passes, without a 408 (it asked nothing)."""
    _quick_head(boundary, 0.5)
    opened = boundary.reactor.seconds()
    answer = await boundary.connect()
    data, closed = await _closed(boundary, answer, 5.0)
    assert data == b""
    assert 0.4 <= closed - opened < 4.0


@pytest_twisted.ensureDeferred
async def test_an_idle_keep_alive_connection_is_closed_silently_after_its_answer(
    boundary: Boundary,
) -> None:
    """The head deadline runs again from the end of each response: an idle keep-alive connection
    closes then, its answer whole and nothing after it."""
    _quick_head(boundary, 0.5)
    answer = await boundary.connect()
    assert answer.transport is not None
    answer.transport.write(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n")
    reactor = boundary.reactor
    await eventually(reactor, lambda: b"\r\n\r\n" in b"".join(answer.data), 5.0, "the answer")
    answered = reactor.seconds()
    data, closed = await _closed(boundary, answer, 5.0)
    assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1
    assert 0.4 <= closed - answered < 4.0


@pytest_twisted.async_yield_fixture()
async def crowded(reactor: Any, tmp_path: Path) -> AsyncIterator[Boundary]:
    """A boundary whose facade takes 8 connections at most."""
    async for opened in open_boundary(reactor, tmp_path, Settings(max_connections=8)):
        yield opened


@pytest_twisted.ensureDeferred
async def test_loopback_cannot_take_the_share_kept_for_remote_callers(crowded: Boundary) -> None:
    """Idle loopback connections fill at most three quarters of ``--max-connections`` (6 of 8):
    the rest get 503 ``too-many-connections``, and a remote keyed caller is still served."""
    site = crowded.proxy.runtime.site_for("ollama")
    held: list[Answer] = []
    refused: list[bytes] = []
    for _ in range(8):
        before = site.open_connections
        answer = await crowded.connect()
        await eventually(
            crowded.reactor,
            lambda answer=answer, before=before: (
                site.open_connections > before  # type: ignore[misc]
                or answer.done.called
            ),
            5.0,
            "the connection admitted or refused",
        )
        if answer.done.called:
            refused.append(await answer.done)
        else:
            held.append(answer)
    served = await crowded.send(b"POST", b"/api/chat", chat("llama3"), key=SCOPED, remote=True)
    for answer in held:
        assert answer.transport is not None
        answer.transport.loseConnection()
        await answer.done
    assert (len(held), len(refused)) == (6, 2)
    assert all(b" 503 " in r.split(b"\r\n")[0] and b"too-many-connections" in r for r in refused)
    assert served.status == 200
    assert [s.model for s in crowded.inference()] == ["llama3"]


# -- 6. a foreign page's GET ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ((b"Sec-Fetch-Site: cross-site",), 401),
        ((b"Sec-Fetch-Site: same-site",), 401),
        ((b"Sec-Fetch-Site: cross-site", b"Origin: https://evil.example"), 401),
        ((b"Sec-Fetch-Site: cross-site", b"Origin: http://localhost:5173"), 200),
        ((b"Sec-Fetch-Site: none",), 200),
        ((b"Sec-Fetch-Site: same-origin",), 200),
        ((), 200),
    ],
    ids=[
        "cross-site",
        "same-site",
        "cross-site-foreign-origin",
        "cross-site-loopback-origin",
        "none",
        "same-origin",
        "no-header",
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_cross_site_request_from_loopback_is_local_only_with_a_local_origin(
    boundary: Boundary, headers: tuple[bytes, ...], status: int
) -> None:
    """A page's cross-site ``GET`` carries no ``Origin`` but ``Sec-Fetch-Site``: from loopback
    it is not ``local`` (here keys are configured: 401), so a llama.cpp router's
    ``/props?model=X`` never loads a model for it."""
    answer = await boundary.send(b"GET", b"/props?model=secret", headers=headers)
    assert answer.status == status
    reached = [(s.path, s.query) for s in boundary.inference()]
    assert reached == ([] if status != 200 else [("/props", b"model=secret")])


# -- 7. a stored response belongs to the key that made it ---------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_stored_response_is_only_its_owners(boundary: Boundary) -> None:
    """Another key (or a local caller) naming a response it did not make gets 404
    ``response-not-found`` with no node contacted; its owner continues it and reads it back."""
    made = await boundary.send(
        b"POST", b"/v1/responses", body_of(model="llama3", input="hi"), key=SCOPED
    )
    assert made.status == 200 and made.json()["id"] == "resp_1"
    follow = body_of(model="llama3", input="more", previous_response_id="resp_1")
    for key in (OTHER, None):
        continued = await boundary.send(b"POST", b"/v1/responses", follow, key=key)
        read = await boundary.send(b"GET", b"/v1/responses/resp_1", key=key)
        deleted = await boundary.send(b"DELETE", b"/v1/responses/resp_1", key=key)
        for refused in (continued, read):
            assert (refused.status, refusal_code(refused.body)) == (404, "response-not-found")
        assert deleted.status in (403, 404)
    assert [s.path for s in boundary.inference()] == ["/v1/responses"]
    own = await boundary.send(b"POST", b"/v1/responses", follow, key=SCOPED)
    own_read = await boundary.send(b"GET", b"/v1/responses/resp_1", key=SCOPED)
    assert (own.status, own_read.status) == (200, 200)
    assert [(s.method, s.path) for s in boundary.inference()] == [
        ("POST", "/v1/responses"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/resp_1"),
    ]


# -- 9. names a caller sent, repeated back --------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "value"),
    [
        (b"POST", b"/api/chat", b"<img src=x>"),
        (b"DELETE", b"/api/delete", b"g, <img src=x>"),
        (b"POST", b"/api/pull", b"<img src=x>,also-unknown"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_an_unknown_node_name_is_never_repeated_back(
    boundary: Boundary, method: bytes, target: bytes, value: bytes
) -> None:
    refused = await boundary.send(
        method, target, body_of(model="llama3"), headers=(b"X-NVPair-Node: " + value,)
    )
    assert (refused.status, refusal_code(refused.body)) == (404, "unknown-node")
    assert b"img" not in refused.body and b"also-unknown" not in refused.body
    assert boundary.inference() == []


@pytest_twisted.ensureDeferred
async def test_a_model_id_that_fails_the_model_rule_is_refused_not_repeated(
    reactor: Any,
) -> None:
    """A model id in the path is a caller's model name: longer than 256 bytes it is 400
    ``bad-model`` and never repeated (LM Studio's ``/api/v0/models/{id}`` is gated and its 404
    names the model); an id that passes the rule is repeated JSON-escaped."""
    node = GoLikeNode(models=("llama3",))
    port = listen_golike(reactor, node)
    url = f"http://127.0.0.1:{port.getHost().port}"  # type: ignore[attr-defined]
    proxy = await start_proxy(reactor, {"lmstudio": [Node("g", url, models=("llama3",))]})
    try:
        client = http_client(reactor)
        long = "a" * 300
        refused = await client.get(proxy.url() + "/api/v0/models/" + long)
        refused_body = await treq.content(refused)
        quoted = await client.get(proxy.url() + "/api/v0/models/%22%3Cb%3E")
        quoted_body = await treq.content(quoted)
    finally:
        await proxy.stop()
        await maybeDeferred(port.stopListening)
    assert (refused.code, refusal_code(refused_body)) == (400, "bad-model")
    assert long.encode() not in refused_body
    assert (quoted.code, refusal_code(quoted_body)) == (404, "model-not-found")
    assert b'\\"<b>' in quoted_body
    assert [s.path for s in node.seen if s.path.startswith("/api/v0/models/")] == []


# -- 10. every request that reaches a node counts once --------------------------------------------


@pytest_twisted.ensureDeferred
async def test_after_the_limit_no_route_reaches_a_node(boundary: Boundary) -> None:
    """A key at its ``requests_per_minute`` gets 429 on ``/api/show`` and the model list too."""
    served = await boundary.send(b"POST", b"/api/chat", chat("llama3"), key=LIMITED)
    show = await boundary.send(b"POST", b"/api/show", body_of(model="llama3"), key=LIMITED)
    tags = await boundary.send(b"GET", b"/api/tags", key=LIMITED)
    passthrough = await boundary.send(b"GET", b"/api/ps", key=LIMITED)
    assert served.status == 200
    for refused in (show, tags, passthrough):
        assert (refused.status, refusal_code(refused.body)) == (429, "rate-limited")
    assert [s.path for s in boundary.inference()] == ["/api/chat"]


@pytest_twisted.ensureDeferred
async def test_a_model_routed_request_counts_against_the_request_limit(
    boundary: Boundary,
) -> None:
    shown = await boundary.send(b"POST", b"/api/show", body_of(model="llama3"), key=LIMITED)
    refused = await boundary.send(b"POST", b"/api/chat", chat("llama3"), key=LIMITED)
    assert (shown.status, refused.status) == (200, 429)
    assert [s.path for s in boundary.inference()] == ["/api/show"]


# -- 11. labels a caller can add ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_targeted_model_no_node_lists_teaches_no_rate_and_adds_no_label(
    boundary: Boundary,
) -> None:
    """A request sent to a node by ``X-NVPair-Node`` naming a model no node lists is served, but
    its rates are learnt (and labelled) only under names the gate resolved: ``llama3`` appears in
    ``/metrics``, ``zzz-not-in-inventory`` never."""
    targeted = (b"X-NVPair-Node: g",)
    odd = await boundary.send(b"POST", b"/api/chat", chat("zzz-not-in-inventory"), headers=targeted)
    listed = await boundary.send(b"POST", b"/api/chat", chat("llama3"))
    assert (odd.status, listed.status) == (200, 200)
    assert [s.model for s in boundary.inference()] == ["zzz-not-in-inventory", "llama3"]
    facade = boundary.proxy.runtime.facades["ollama"]
    learnt = {model for _node, model, _rates in facade.speeds.known()}
    exposed = ProxyMetrics(boundary.proxy.runtime).exposition().decode()
    assert "llama3" in learnt and 'model="llama3"' in exposed
    assert "zzz-not-in-inventory" not in learnt and "zzz-not-in-inventory" not in exposed


# the loop mark's own value is this process's: sanity for the tests above
def test_the_process_nonce_is_a_proxys_form() -> None:
    assert len(PROCESS_NONCE) == 32 and all(c in b"0123456789abcdef" for c in PROCESS_NONCE)
