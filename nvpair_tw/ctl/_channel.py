# -*- test-case-name: tests.ctl.test_channel -*-
"""One short session on the control channel (docs/control.md): connect, ``auth`` when there is a
token, one call, its answer.

The channel is JSON-RPC 2.0, one object per line. Event notifications (lines without an ``id``)
may come before the answer and are skipped; the answer is the line carrying the call's id. Every
line the proxy sends is read once, strictly: a line that is not a JSON object, an answer without a
result or a well-formed error, or a line longer than :data:`MAX_LINE_BYTES` ends the session with
:class:`ChannelError`. The token is sent in the ``auth`` call only; no message here repeats it.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from nvpair_tw.ctl._endpoint import TcpAddress, UnixAddress

__all__ = [
    "CONNECT_TIMEOUT",
    "MAX_LINE_BYTES",
    "UNAUTHORIZED",
    "CallFailed",
    "ChannelError",
    "Session",
    "read_token",
]

CONNECT_TIMEOUT = 5.0
MAX_LINE_BYTES = 64 << 20
"""The longest answer line read (a usage report of many rows is a few MiB at most)."""
UNAUTHORIZED = -32001
_AUTH_ID = 0
_CALL_ID = 1


class ChannelError(Exception):
    """The session failed before an answer came: no connection, a closed one, a garbled line."""


class CallFailed(Exception):
    """The proxy answered the call with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


def read_token(path: str) -> str:
    """The token on the first line of ``path`` (surrounding whitespace trimmed), as the proxy reads
    its ``--control-token`` file; :class:`ValueError` naming the file, never its content."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(64 << 10)
    except OSError as error:
        raise ValueError(f"--control-token {path}: cannot be read: {error.strerror}") from None
    try:
        token = first.decode("utf-8").strip()
    except UnicodeDecodeError:
        token = ""
    if not token or not token.isprintable():
        raise ValueError(f"--control-token {path}: the token must be on its first line")
    return token


def _connect(address: UnixAddress | TcpAddress) -> socket.socket:
    if isinstance(address, UnixAddress):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(address.address())
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT)


class Session:
    """A connection to the control channel; use as a context manager."""

    def __init__(self, address: UnixAddress | TcpAddress) -> None:
        self._address = address
        self._socket = _connect(address)
        self._stream = self._socket.makefile("rwb")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()
        self._socket.close()

    def authenticate(self, token: str) -> None:
        """Open the session with ``auth``; :class:`CallFailed` when the token is refused."""
        self._send(_AUTH_ID, "auth", {"token": token})
        self._answer(_AUTH_ID, 30.0)

    def call(self, method: str, params: dict[str, Any], wait: float | None) -> Any:
        """The result of ``method``; :class:`CallFailed` with the proxy's refusal, or
        :class:`ChannelError`. ``wait`` bounds the wait for the answer (``None``: as long as the
        proxy keeps the connection, for calls the proxy itself bounds, such as a drain)."""
        self._send(_CALL_ID, method, params)
        return self._answer(_CALL_ID, wait)

    def _send(self, call_id: int, method: str, params: dict[str, Any]) -> None:
        line = {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}
        try:
            self._stream.write(json.dumps(line).encode() + b"\n")
            self._stream.flush()
        except OSError as error:
            raise ChannelError(f"the connection to {self._address} failed: {error}") from None

    def _answer(self, call_id: int, wait: float | None) -> Any:
        self._socket.settimeout(wait)
        while True:
            message = self._read_line()
            if "id" not in message:
                continue  # an event notification
            if message["id"] != call_id:
                raise ChannelError(f"{self._address} answered a call that was not made")
            return _outcome(message)

    def _read_line(self) -> dict[str, Any]:
        try:
            line = self._stream.readline(MAX_LINE_BYTES + 1)
        except TimeoutError:
            raise ChannelError(f"{self._address} did not answer in time") from None
        except OSError as error:
            raise ChannelError(f"the connection to {self._address} failed: {error}") from None
        if not line:
            raise ChannelError(f"{self._address} closed the connection without an answer")
        if len(line) > MAX_LINE_BYTES:
            raise ChannelError(f"{self._address} sent a line over {MAX_LINE_BYTES} bytes")
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            raise ChannelError(f"{self._address} sent a line that is not a JSON object")
        return message


def _outcome(message: dict[str, Any]) -> Any:
    """The answer's result, or :class:`CallFailed` for its error."""
    if "result" in message:
        return message["result"]
    error = message.get("error")
    if (
        isinstance(error, dict)
        and isinstance(error.get("code"), int)
        and isinstance(error.get("message"), str)
    ):
        raise CallFailed(error["code"], error["message"])
    raise ChannelError("the answer has neither a result nor a well-formed error")
