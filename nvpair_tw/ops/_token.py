# -*- test-case-name: tests.ops.test_control_auth -*-
"""The control channel's token (docs/behaviour.md §14.3): which endpoints need one, reading it from
its file, and the ``auth`` call that must open every connection of a channel that has one.

The token file is like the keys file: a regular file of mode 0600 (no group or other bits), the
token on its first line (surrounding whitespace trimmed, non-empty, printable). Errors name the
file, never its content. The token is compared in constant time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac
import re

from attrs import field, frozen

from nvpair_tw.inbound import read_private_file
from nvpair_tw.ops._rpc import UNAUTHORIZED, BadRequest, Request, Result, error

__all__ = [
    "AUTH_METHOD",
    "MAX_TOKEN_FILE_BYTES",
    "ControlToken",
    "authenticate",
    "needs_token",
    "read_control_token",
]

AUTH_METHOD = "auth"
MAX_TOKEN_FILE_BYTES = 64 << 10

_UNESCAPED_COLON = re.compile(r"(?<!\\):")


@frozen
class ControlToken:
    """The control channel's shared secret; never shown (its ``repr`` hides it)."""

    secret: bytes = field(repr=False)

    def matches(self, given: object) -> bool:
        """Whether ``given`` (a string from an ``auth`` call) is the token, in constant time."""
        if not isinstance(given, str):
            return False
        return hmac.compare_digest(self.secret, given.encode("utf-8", "surrogatepass"))


def needs_token(description: str) -> bool:
    """Whether a ``--control`` endpoint needs ``--control-token``: all but ``stdio`` and a
    filesystem ``unix:`` socket, whose mode is the lock (§14.3). An abstract unix socket (a
    name starting with NUL or ``@``) and every other endpoint type (``tcp``, ``ssl``,
    ``systemd``, plugins) need one."""
    text = description.strip()
    if text == "stdio":
        return False
    parts = [p.replace("\\:", ":") for p in _UNESCAPED_COLON.split(text)]
    if parts[0] != "unix":
        return True
    named = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    positional = [p for p in parts[1:] if "=" not in p]
    path = named.get("address", positional[0] if positional else "")
    return not path or path.startswith(("\0", "@"))


def read_control_token(path: str) -> ControlToken:
    """The token in ``path``; :class:`ValueError` with one clear line for any flaw."""
    where = f"--control-token {path}"
    try:
        raw = read_private_file(path, where, MAX_TOKEN_FILE_BYTES)
    except OSError as failure:
        raise ValueError(f"{where} cannot be read: {failure.strerror}") from None
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        lines = []
    token = lines[0].strip() if lines else ""
    if len(raw) > MAX_TOKEN_FILE_BYTES or not token or not token.isprintable():
        raise ValueError(f"{where} must hold the token on its first line")
    return ControlToken(token.encode("utf-8"))


def authenticate(request: Request | BadRequest, token: ControlToken) -> Request | Result:
    """A connection's first call when the channel has a token: the request itself when it is
    ``auth`` with the right token (the connection is then open), else the -32001 error to answer
    before the connection closes."""
    if (
        isinstance(request, Request)
        and request.method == AUTH_METHOD
        and isinstance(request.params, dict)
        and token.matches(request.params.get("token"))
    ):
        return request
    request_id = request.id if isinstance(request, Request) else None
    return error(
        request_id,
        UNAUTHORIZED,
        'unauthorized: the first call must be auth {"token": "..."} with the control token',
    )
