"""Tests for tests.golike: the Go-like node reads paths and models as Go engines do, answers the
routes the proxy's tests use, and records what it read."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.defer import maybeDeferred
from twisted.internet.threads import deferToThread

from tests.golike import (
    GoLikeNode,
    Seen,
    go_clean,
    go_fold,
    go_model,
    go_names,
    go_path,
    listen_golike,
)


@pytest.mark.parametrize(
    ("target", "path"),
    [
        (b"/api/chat", "/api/chat"),
        (b"/api/%63hat?x=1", "/api/chat"),
        (b"//api/./chat/", "/api/chat"),
        (b"/a/../../api/chat", "/api/chat"),
        (b"/v1/models/qwen%2Fqwen3-4b", "/v1/models/qwen/qwen3-4b"),
        (b"/", "/"),
    ],
)
def test_a_path_is_decoded_then_cleaned(target: bytes, path: str) -> None:
    assert go_path(target) == path


def test_clean_is_gos_path_clean() -> None:
    assert [go_clean(p) for p in ("", "a/../..", "//a", "/a/b/../../..", "a//b/")] == [
        ".",
        "..",
        "/a",
        "/",
        "a/b",
    ]


def test_folding_is_simple_folding() -> None:
    assert go_fold("MODEL") == "model"
    assert go_fold("\u212a\u017f") == "ks"  # the Kelvin sign, the long s
    assert go_fold("\u00df") == "\u00df"  # never two characters


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (b'{"model":"llama3"}', "llama3"),
        (b'{"model":"llama3","MODEL":"secret"}', "secret"),
        (b'{"MoDeL":"secret","model":null}', "secret"),
        (b'{"model":"secret"} trailing bytes', "secret"),
        (b'  {"model":"secret"}{"model":"other"}', "secret"),
        (b'{"model":"a\xffb"}', "a\ufffdb"),
        (b'{"model":"a\\ud800"}', "a\ufffd"),
        (b'{"\\u006dodel":"secret"}', "secret"),
        (b'{"model":5}', None),
        (b'["model"]', None),
        (b"{", None),
        (b'{"model":NaN}', None),
        (b"", None),
    ],
)
def test_the_model_is_read_as_encoding_json_reads_it(body: bytes, model: str | None) -> None:
    assert go_model(body) == model


def _exchange(port: int, request: bytes) -> tuple[bytes, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        raw = b""
        while chunk := conn.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)


@pytest_twisted.ensureDeferred  # type: ignore[untyped-decorator]
async def test_the_node_answers_and_records_what_it_read(reactor: Any) -> None:
    node = GoLikeNode(("llama3:latest", "qwen/qwen3-4b"))
    port = listen_golike(reactor, node)
    try:
        address = port.getHost()
        assert isinstance(address, IPv4Address)
        number = address.port
        body = b'{"model":"llama3","MODEL":"secret"} x'
        chat = b"POST /api/%63hat HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
        chat += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        status, answer = await deferToThread(_exchange, number, chat)
        assert status == b"HTTP/1.1 200 OK"
        assert answer["done"] is True and answer["model"] == "secret"
        tags = b"GET /api/tags HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        status, listed = await deferToThread(_exchange, number, tags)
        assert [m["name"] for m in listed["models"]] == ["llama3:latest", "qwen/qwen3-4b"]
        models = b"GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        status, listed = await deferToThread(_exchange, number, models)
        assert [m["id"] for m in listed["data"]] == ["llama3:latest", "qwen/qwen3-4b"]
    finally:
        await maybeDeferred(port.stopListening)
    assert node.seen[0] == Seen(
        "POST",
        "/api/chat",
        "secret",
        ((b"host", b"a"), (b"connection", b"close"), (b"content-length", b"%d" % len(body))),
        (("model", "secret"),),
    )
    assert [(s.method, s.path, s.model) for s in node.seen[1:]] == [
        ("GET", "/api/tags", None),
        ("GET", "/v1/models", None),
    ]


@pytest.mark.parametrize(
    ("method", "target", "keys"),
    [
        (b"POST", b"/api/show", {"modelfile", "parameters", "template", "details", "model_info"}),
        (
            b"POST",
            b"/v1/chat/completions",
            {"id", "object", "created", "model", "choices", "usage"},
        ),
        (
            b"POST",
            b"/api/chat",
            {"model", "message", "done", "done_reason", "prompt_eval_count"}
            | {"prompt_eval_duration", "eval_count", "eval_duration"},
        ),
        (b"DELETE", b"/api/delete", set()),
        (
            b"POST",
            b"/v1/responses",
            {"id", "object", "created_at", "status", "model"} | {"output", "usage"},
        ),
        (b"GET", b"/v1/responses/resp_7", {"id", "object", "status"}),
    ],
)
def test_each_route_answers_in_its_engine_shape(
    method: bytes, target: bytes, keys: set[str]
) -> None:
    node = GoLikeNode()
    answer = node.serve(method, target, b'{"model":"llama3"}', ((b"x-a", b"1"),))
    assert set(answer) == keys
    [seen] = node.seen
    assert (seen.method, seen.path, seen.model, seen.headers) == (
        method.decode(),
        target.decode(),
        "llama3",
        ((b"x-a", b"1"),),
    )


def test_a_stored_response_gets_a_new_id_and_is_read_back_by_its_id() -> None:
    node = GoLikeNode()
    first = node.serve(b"POST", b"/v1/responses", b'{"model":"llama3"}', ())
    second = node.serve(b"POST", b"/v1/responses", b'{"model":"llama3"}', ())
    read = node.serve(b"GET", b"/v1/responses/resp_1?include=x", b"", ())
    assert (first["id"], second["id"], read["id"]) == ("resp_1", "resp_2", "resp_1")
    assert node.seen[-1].query == b"include=x"


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        ("/api/chat", b'{"model":"a","name":"b"}', (("model", "a"),)),
        ("/api/show", b'{"model":"a","NAME":"b"}', (("model", "a"), ("name", "b"))),
        (
            "/api/copy",
            b'{"Source":"a","destination":"b","model":"c"}',
            (("source", "a"), ("destination", "b")),
        ),
        ("/api/create", b'{"model":"a","from":"b","FROM":null}', (("model", "a"), ("from", "b"))),
        ("/completion", b'{"model":"a"} {"model":"b"}', (("model", "a"),)),
        ("/api/pull", b'{"model":5,"name":""}', ()),
        ("/api/pull", b"[1]", ()),
    ],
)
def test_every_model_a_routes_struct_names_is_read_as_go_reads_it(
    path: str, body: bytes, names: tuple[tuple[str, str], ...]
) -> None:
    assert go_names(path, body) == names
