"""Tests for nvpair_tw.fleet._writer: bounded, batched, fire-and-forget writes, on a ``task.Clock``
and a recording stand-in for the command connection."""

from __future__ import annotations

import functools
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from nvpair_tw.fleet._config import StateConfig
from nvpair_tw.fleet._wire import Codec, Op
from nvpair_tw.fleet._writer import MAX_PENDING_WRITES, WRITE_BATCH, BatchedWriter


class ResponseError(Exception):
    """What txredisapi raises when the store refuses a command (matched by name)."""


class Connection:
    """Records each script call; answers with ``reply``."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[Any]]] = []
        self.reply: Exception | None = None

    def eval(self, _script: str, keys: list[str], args: list[Any]) -> Deferred[Any]:
        self.calls.append((keys, args))
        return fail(self.reply) if self.reply is not None else succeed(1)


def writer(up: bool = True) -> tuple[BatchedWriter, Clock, Connection, list[bool]]:
    clock, conn, state = Clock(), Connection(), [up]
    made = BatchedWriter(
        clock,  # type: ignore[arg-type]
        StateConfig("127.0.0.1", password="pw-canary"),
        Codec("p1", "ns"),
        lambda: conn if state[0] else None,
    )
    return made, clock, conn, state


def set_op(key: str) -> list[Op]:
    return [("set", key, "v", 1000)]


def test_writes_within_the_batch_window_are_one_script_call() -> None:
    out, clock, conn, _up = writer()
    out.write(lambda: set_op("ns:a"))
    out.write(lambda: set_op("ns:b"))
    assert conn.calls == []
    clock.advance(WRITE_BATCH)
    assert [keys for keys, _args in conn.calls] == [["ns:a", "ns:b"]]


def test_while_the_store_is_away_the_oldest_writes_beyond_the_bound_are_dropped() -> None:
    out, clock, conn, up = writer(up=False)
    for i in range(MAX_PENDING_WRITES + 3):
        out.write(functools.partial(set_op, f"ns:{i}"))
    clock.advance(1.0)
    assert conn.calls == [] and out.dropped == 3
    up[0] = True
    out.connected()
    keys = conn.calls[0][0]
    assert len(keys) == MAX_PENDING_WRITES and keys[0] == "ns:3"


def test_a_failing_write_is_skipped_and_the_others_still_go() -> None:
    out, clock, conn, _up = writer()

    def broken() -> list[Op]:
        raise KeyError("bug")

    out.write(broken)
    out.write(lambda: set_op("ns:ok"))
    clock.advance(WRITE_BATCH)
    assert conn.calls[0][0] == ["ns:ok"]


def test_a_refused_batch_is_said_once_without_the_password_until_the_store_reconnects(
    log_lines: list[str],
) -> None:
    out, clock, conn, _up = writer()
    conn.reply = ResponseError("OOM command not allowed; pw-canary")
    for key in ("ns:a", "ns:b"):
        out.write(functools.partial(set_op, key))
        clock.advance(WRITE_BATCH)
    assert out.write_refused and len(conn.calls) == 2
    refused = [line for line in log_lines if "refused a write" in line]
    assert len(refused) == 1 and "pw-canary" not in refused[0] and "OOM" in refused[0]
    conn.reply = None
    out.connected()
    assert not out.write_refused


def test_a_direct_flush_cancels_the_pending_batch_timer() -> None:
    """Shutdown flushes then stops: the 5 ms batch the last write started must not outlive it
    (it did, and ran after the store had stopped)."""
    out, clock, conn, _up = writer()
    out.write(lambda: set_op("ns:a"))
    out.flush()
    out.stop()
    assert clock.getDelayedCalls() == []
    assert [keys for keys, _args in conn.calls] == [["ns:a"]]
