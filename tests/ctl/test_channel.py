"""Tests for nvpair_tw.ctl._channel: one session, its answer found among notifications, and each
way a peer can go wrong ending it with one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvpair_tw.ctl import _channel
from nvpair_tw.ctl._channel import CallFailed, ChannelError, Session, read_token
from nvpair_tw.ctl._endpoint import parse_endpoint
from tests.ctl.peer import Script, answer, scripted_peer


def _call(tmp_path: Path, script: Script, method: str = "nodes/list") -> Any:
    with scripted_peer(tmp_path, script) as (endpoint, _), Session(parse_endpoint(endpoint)) as s:
        return s.call(method, {}, 10.0)


def test_the_answer_is_found_after_the_notifications(tmp_path: Path) -> None:
    with (
        scripted_peer(tmp_path, answer({"nodes": []})) as (endpoint, received),
        Session(parse_endpoint(endpoint)) as session,
    ):
        session.authenticate("t0ken")
        assert session.call("ollama:nodes/list", {"x": 1}, 10.0) == {"nodes": []}
    assert received == [
        {"jsonrpc": "2.0", "id": 0, "method": "auth", "params": {"token": "t0ken"}},
        {"jsonrpc": "2.0", "id": 1, "method": "ollama:nodes/list", "params": {"x": 1}},
    ]


def test_an_error_answer_is_call_failed_with_its_code_and_message(tmp_path: Path) -> None:
    def refuse(request: dict[str, Any]) -> bytes:
        return (
            b'{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"node \\"x\\" not found"}}\n'
        )

    with pytest.raises(CallFailed) as failed:
        _call(tmp_path, refuse)
    assert (failed.value.code, failed.value.message) == (-32602, 'node "x" not found')


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (None, "closed the connection without an answer"),
        (b"POST / HTTP/1.1\r\n", "sent a line that is not a JSON object"),
        (b"[1, 2]\n", "sent a line that is not a JSON object"),
        (b'{"jsonrpc":"2.0","id":9,"result":{}}\n', "answered a call that was not made"),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}\n', "neither a result nor a well-formed"),
        (b'{"jsonrpc":"2.0","id":1}\n', "neither a result nor a well-formed error"),
    ],
)
def test_a_peer_that_goes_wrong_ends_the_session(
    tmp_path: Path, reply: bytes | None, why: str
) -> None:
    with pytest.raises(ChannelError) as failed:
        _call(tmp_path, lambda request: reply)
    assert why in str(failed.value) and "\n" not in str(failed.value)


def test_an_over_long_line_is_not_read_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_channel, "MAX_LINE_BYTES", 1000)
    with pytest.raises(ChannelError) as failed:
        _call(tmp_path, lambda request: b'{"x": "' + b"a" * 5000 + b'"}\n')
    assert "sent a line over 1000 bytes" in str(failed.value)


def test_no_answer_in_time_is_a_channel_error(tmp_path: Path) -> None:
    with (
        scripted_peer(tmp_path, lambda request: b"") as (endpoint, _),
        Session(parse_endpoint(endpoint)) as session,
        pytest.raises(ChannelError) as failed,
    ):
        session.call("nodes/list", {}, 0.2)
    assert str(failed.value) == f"{endpoint} did not answer in time"


def test_the_token_file_gives_its_first_line_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret \nsecond line\n")
    assert read_token(str(path)) == "s3cret"


@pytest.mark.parametrize("content", [b"", b"\n\n", b"   \nx\n", b"\xff\xfe\n", b"a\x1bb\n"])
def test_a_token_file_without_a_token_is_refused_without_its_content(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(ValueError) as refused:
        read_token(str(path))
    assert str(refused.value) == f"--control-token {path}: the token must be on its first line"


def test_a_missing_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        read_token(str(tmp_path / "nope"))
    assert str(refused.value) == (
        f"--control-token {tmp_path / 'nope'}: cannot be read: No such file or directory"
    )
