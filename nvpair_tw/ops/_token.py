# -*- test-case-name: tests.ops.test_control_auth -*-
"""The control channel's token (docs/behaviour.md §14.3): which endpoints need one, reading it from
its file, and the ``auth`` call that must open every connection of a channel that has one.

The token file is like the keys file: a regular file of mode 0600 (no group or other bits), the
token on its first line (surrounding whitespace trimmed, non-empty, printable). Errors name the
file, never its content. The token is compared in constant time (:func:`hmac.compare_digest`).

Guessing is slowed per source (:class:`AuthThrottle`): each source (an IP address, an IPv6 /64,
or every local peer of a unix socket or stdio together) may fail :data:`FAILURE_BURST` times in a
row, then one more time every :data:`FAILURE_INTERVAL` seconds; an ``auth`` beyond that is refused
without being compared (the right token too), so no source tests more than a few tokens a second.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import re

from attrs import define, field, frozen
from twisted.internet.interfaces import IAddress, IReactorTime

from nvpair_tw.inbound import read_private_file
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.ops._rpc import UNAUTHORIZED, BadRequest, Request, Result, error

__all__ = [
    "AUTH_METHOD",
    "FAILURE_BURST",
    "FAILURE_INTERVAL",
    "MAX_TOKEN_FILE_BYTES",
    "AuthThrottle",
    "ControlToken",
    "admit_auth",
    "auth_source",
    "authenticate",
    "needs_token",
    "read_control_token",
    "throttled",
]

AUTH_METHOD = "auth"
MAX_TOKEN_FILE_BYTES = 64 << 10

log = LevelledLogger(namespace=__name__)

_UNESCAPED_COLON = re.compile(r"(?<!\\):")

FAILURE_BURST = 5
"""Failed ``auth`` calls a source may make in a row before it is slowed down."""
FAILURE_INTERVAL = 0.5
"""Seconds: then one more failed ``auth`` per source is compared every this long (2 a second)."""
_MAX_SOURCES = 4096
"""Sources whose failures are remembered at once (the oldest rested one is forgotten first)."""


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


def auth_source(address: IAddress | None) -> str:
    """Whose failures an ``auth`` from ``address`` counts with: its IP (IPv4-mapped unwrapped),
    an IPv6 address's /64, or ``local`` for a unix socket or stdio peer."""
    host = getattr(address, "host", None)
    if not isinstance(host, str):
        return "local"
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@define
class _Failures:
    """One source's allowance: failures it may still make now, as of ``at``, and the ``auth``
    calls refused unchecked since its last compared one."""

    left: float
    at: float
    unchecked: int = 0


@define
class AuthThrottle:
    """Failed ``auth`` calls per source, as a bucket of :data:`FAILURE_BURST` refilled one every
    :data:`FAILURE_INTERVAL` seconds of ``clock`` (docs/behaviour.md §14.3)."""

    clock: IReactorTime
    _sources: dict[str, _Failures] = field(factory=dict, init=False)

    def _now(self, source: str) -> _Failures:
        now = self.clock.seconds()
        failures = self._sources.get(source)
        if failures is None:
            return _Failures(float(FAILURE_BURST), now)
        refilled = failures.left + (now - failures.at) / FAILURE_INTERVAL
        failures.left, failures.at = min(float(FAILURE_BURST), refilled), now
        return failures

    def wait(self, source: str) -> float:
        """Seconds until an ``auth`` from ``source`` may be compared again; 0 when it may now
        (an ``auth`` refused for waiting is counted, see :meth:`checked`)."""
        failures = self._now(source)
        if failures.left >= 1:
            return 0.0
        failures.unchecked += 1
        return (1 - failures.left) * FAILURE_INTERVAL

    def checked(self, source: str) -> int:
        """An ``auth`` from ``source`` is being compared: how many were refused unchecked since
        the last compared one (told once)."""
        failures = self._sources.get(source)
        if failures is None:
            return 0
        unchecked, failures.unchecked = failures.unchecked, 0
        return unchecked

    def failed(self, source: str) -> bool:
        """A compared ``auth`` from ``source`` failed; whether the source is now slowed down."""
        failures = self._now(source)
        failures.left -= 1
        self._sources.pop(source, None)
        self._sources[source] = failures  # the most recent last
        self._forget()
        return failures.left < 1

    def _forget(self) -> None:
        """Keep at most :data:`_MAX_SOURCES`: the oldest first (its allowance has had the
        longest to refill)."""
        while len(self._sources) > _MAX_SOURCES:
            del self._sources[next(iter(self._sources))]


def throttled(request: Request | BadRequest, wait: float) -> Result:
    """The -32001 answer to an ``auth`` refused unchecked: its source failed too often."""
    request_id = request.id if isinstance(request, Request) else None
    seconds = max(1, math.ceil(wait))
    return error(
        request_id,
        UNAUTHORIZED,
        f"unauthorized: too many failed auth attempts from this source; retry in {seconds} s",
    )


def admit_auth(
    request: Request | BadRequest,
    token: ControlToken,
    throttle: AuthThrottle,
    source: str,
    peer: str,
) -> Request | Result:
    """A connection's first call on a channel with a token, from ``source`` (``peer`` names the
    connection in logs): the request itself when it is ``auth`` with the right token, else the
    -32001 answer to send before the connection closes — without comparing the token while the
    source is slowed down. Each compared failure is logged, never the token."""
    wait = throttle.wait(source)
    if wait:
        log.debug("control client {peer} closed: auth throttled", peer=peer)
        return throttled(request, wait)
    unchecked = throttle.checked(source)
    if unchecked:
        log.warn(
            "control: {count} auth calls from {source} were refused unchecked (throttled)",
            count=unchecked,
            source=source,
        )
    admitted = authenticate(request, token)
    if not isinstance(admitted, Request):
        slowed = throttle.failed(source)
        log.warn(
            "control client {peer} closed: failed auth from {source}{slowed}",
            peer=peer,
            source=source,
            slowed="; slowed down: at most 2 a second are compared" if slowed else "",
        )
    return admitted
