"""A control channel that misbehaves on purpose: a real unix socket, served from a thread, whose
answers are scripted per request (what the real proxy never sends: garbled lines, stray ids,
an early close)."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Script = Callable[[dict[str, Any]], bytes | None]
"""Given a request, the bytes to send back (``None``: close the connection)."""


def answer(result: object) -> Script:
    """Every request answered with ``result`` under its own id, after an event notification."""

    def script(request: dict[str, Any]) -> bytes:
        event = {"jsonrpc": "2.0", "method": "workload:queued", "params": {"id": 7}}
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
        return (json.dumps(event) + "\n" + json.dumps(reply) + "\n").encode()

    return script


@contextmanager
def scripted_peer(directory: Path, script: Script) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A socket at ``directory/peer.sock`` serving one connection with ``script``; yields its
    ``unix:`` endpoint and the requests it received."""
    path = str(directory / "peer.sock")
    received: list[dict[str, Any]] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(30)

    def serve() -> None:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection, connection.makefile("rwb") as stream:
            for line in stream:
                request = json.loads(line)
                received.append(request)
                reply = script(request)
                if reply is None:
                    return
                stream.write(reply)
                stream.flush()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"unix:{path}", received
    finally:
        server.close()
        thread.join(30)
        os.unlink(path)
