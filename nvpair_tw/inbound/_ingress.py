# -*- test-case-name: tests.inbound.test_ingress -*-
"""Who may talk to a facade: the loopback / API-key / CIDR gate and the identity probe (docs/behaviour.md §9).

By default only loopback (and UNIX-socket) callers are served, decided from the TCP peer, never
from forwarding headers. API keys open the gate to other hosts, optionally narrowed to CIDRs.
Keys are kept only as SHA-256 digests and compared in constant time; a key file is re-read when
it changes, so keys rotate without a restart. Key text is never logged or echoed.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Mapping

from attrs import define, field, frozen
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair_tw.logs import LevelledLogger

__all__ = [
    "IngressConfig",
    "IngressConfigError",
    "IngressPolicy",
    "Rejection",
    "is_loopback",
    "parse_ingress",
]

KEYS_VAR = "NVPAIR_PROXY_API_KEYS"
KEYS_FILE_VAR = "NVPAIR_PROXY_API_KEYS_FILE"
CIDRS_VAR = "NVPAIR_PROXY_ALLOWED_CIDRS"
PROBE_HEADER = b"X-NVPAIR-Engine-Identity-Probe"
RELOAD_INTERVAL = 2.0

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_CHALLENGE = b'Bearer realm="nvpair"'


class IngressConfigError(Exception):
    """The ingress configuration is unusable; the proxy must not start with it."""


@frozen
class Rejection:
    """Why a request is refused: the status, error code, message and extra response headers."""

    status: int
    code: str
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


_LOOPBACK_ONLY = Rejection(403, "loopback-only", "only loopback clients are allowed")
_NOT_ALLOWED = Rejection(403, "source-not-allowed", "source address not allowed")
_KEY_MISSING = Rejection(
    401, "auth-required", "API key required", ((b"WWW-Authenticate", _CHALLENGE),)
)
_KEY_INVALID = Rejection(
    401,
    "invalid-api-key",
    "invalid API key",
    ((b"WWW-Authenticate", _CHALLENGE + b', error="invalid_token"'),),
)
_PROBE = Rejection(409, "proxy-facade", "this is an nvpair proxy facade, not an engine")


def _ip_of(peer: IAddress) -> _IPAddress | None:
    """The peer's IP (IPv4-mapped IPv6 unwrapped), or ``None`` if it has none that parses."""
    if not isinstance(peer, IPv4Address | IPv6Address):
        return None
    return _parse_ip(peer.host)


@functools.lru_cache(maxsize=1024)
def _parse_ip(host: str) -> _IPAddress | None:
    """Parse once per distinct peer host: this runs on every request."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback(peer: IAddress) -> bool:
    """Whether ``peer`` is local: a loopback IP or a UNIX socket; anything unparseable is not."""
    if isinstance(peer, UNIXAddress):
        return True
    ip = _ip_of(peer)
    return ip is not None and ip.is_loopback


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _check_key(key: str, where: str) -> bytes:
    """Return the key as bytes, or raise naming ``where`` (never the key itself)."""
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise IngressConfigError(
            f"{where}: API keys must be printable ASCII without spaces or control characters"
        )
    return key.encode("ascii")


def _parse_keys_var(value: str) -> frozenset[bytes]:
    digests = set()
    for index, entry in enumerate(value.split(","), start=1):
        key = entry.strip()
        if not key:
            raise IngressConfigError(f"{KEYS_VAR}: entry {index} is empty")
        digests.add(_digest(_check_key(key, f"{KEYS_VAR} entry {index}")))
    return frozenset(digests)


def _parse_cidrs(value: str) -> tuple[_IPNetwork, ...]:
    networks = []
    for index, entry in enumerate(value.split(","), start=1):
        text = entry.strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as e:
            raise IngressConfigError(
                f"{CIDRS_VAR}: entry {index} {text!r} is not a CIDR: {e}"
            ) from None
    return tuple(networks)


def _file_signature(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)


def _read_key_file(path: str) -> frozenset[bytes]:
    """Read a key file (one key per line, ``#`` comment lines) into digests; raise on any flaw."""
    try:
        # O_NONBLOCK: a FIFO put in the file's place must not block the reactor.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IngressConfigError(f"{KEYS_FILE_VAR} {path} is not a regular file")
            if st.st_mode & 0o077:
                raise IngressConfigError(
                    f"{KEYS_FILE_VAR} {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must not "
                    "be accessible by group or other (chmod 600)"
                )
            with open(fd, "rb", closefd=False) as f:
                raw = f.read()
        finally:
            os.close(fd)
    except OSError as e:
        raise IngressConfigError(f"{KEYS_FILE_VAR} {path} cannot be read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise IngressConfigError(f"{KEYS_FILE_VAR} {path} is not UTF-8 text") from None
    digests = set()
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if key and not key.startswith("#"):
            digests.add(_digest(_check_key(key, f"{KEYS_FILE_VAR} {path} line {number}")))
    if not digests:
        raise IngressConfigError(f"{KEYS_FILE_VAR} {path} contains no keys")
    return frozenset(digests)


def _bearer_token(value: bytes) -> bytes | None:
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def _presented_keys(headers: Headers) -> list[bytes]:
    """Credentials the caller presented: ``Authorization: Bearer <key>`` and ``X-Api-Key``."""
    tokens = (_bearer_token(v) for v in headers.getRawHeaders(b"authorization", []))
    keys = [token for token in tokens if token is not None]
    keys.extend(v.strip() for v in headers.getRawHeaders(b"x-api-key", []) if v.strip())
    return keys


@frozen
class IngressConfig:
    """The ingress settings read from the environment, as a value (no clock, no timer).

    Key material is held only as SHA-256 digests and left out of the repr.
    """

    static_digests: frozenset[bytes] = field(default=frozenset(), repr=False)
    key_file: str | None = None
    file_digests: frozenset[bytes] = field(default=frozenset(), repr=False)
    file_signature: tuple[int, int, int, int] | None = field(default=None, repr=False)
    networks: tuple[_IPNetwork, ...] = ()

    @property
    def keys_configured(self) -> bool:
        """Whether API keys open the gate to non-loopback callers."""
        return bool(self.static_digests or self.file_digests)


def parse_ingress(environ: Mapping[str, str]) -> IngressConfig:
    """Read the ingress variables (and the key file); raise ``IngressConfigError`` if unusable."""
    keys_value = environ.get(KEYS_VAR, "").strip()
    static = _parse_keys_var(keys_value) if keys_value else frozenset()
    key_file = environ.get(KEYS_FILE_VAR, "").strip() or None
    file_digests: frozenset[bytes] = frozenset()
    signature = None
    if key_file is not None:
        try:
            signature = _file_signature(key_file)
        except OSError as e:
            raise IngressConfigError(
                f"{KEYS_FILE_VAR} {key_file} cannot be read: {e.strerror}"
            ) from None
        file_digests = _read_key_file(key_file)
    cidrs_value = environ.get(CIDRS_VAR, "").strip()
    networks = _parse_cidrs(cidrs_value) if cidrs_value else ()
    if networks and not (static or file_digests):
        raise IngressConfigError(
            f"{CIDRS_VAR} only applies with API keys; set {KEYS_VAR} or {KEYS_FILE_VAR}"
        )
    return IngressConfig(
        static_digests=static,
        key_file=key_file,
        file_digests=file_digests,
        file_signature=signature,
        networks=networks,
    )


@define
class IngressPolicy:
    """The live gate in front of every facade; build it with ``from_config``."""

    clock: IReactorTime
    static_digests: frozenset[bytes] = frozenset()
    key_file: str | None = None
    networks: tuple[_IPNetwork, ...] = ()
    reload_interval: float = RELOAD_INTERVAL
    _file_digests: frozenset[bytes] = frozenset()
    _file_signature: tuple[int, int, int, int] | None = None
    _last_problem: str | None = None
    _loop: LoopingCall | None = field(default=None, init=False)

    log = LevelledLogger(namespace="nvpair_tw.ingress")

    @classmethod
    def from_config(cls, config: IngressConfig, clock: IReactorTime) -> IngressPolicy:
        """The gate for ``config``; a key file is re-read on ``clock`` once :meth:`start` runs."""
        return cls(
            clock=clock,
            static_digests=config.static_digests,
            key_file=config.key_file,
            networks=config.networks,
            file_digests=config.file_digests,
            file_signature=config.file_signature,
        )

    @property
    def keys_configured(self) -> bool:
        """Whether API keys open the gate to non-loopback callers."""
        return bool(self.static_digests or self._file_digests)

    def check(self, peer: IAddress, headers: Headers) -> Rejection | None:
        """Return why the request must be refused, or ``None`` to let it through."""
        if not is_loopback(peer):
            if not self.keys_configured:
                return _LOOPBACK_ONLY
            if self.networks:
                ip = _ip_of(peer)
                if ip is None or not any(ip in net for net in self.networks):
                    return _NOT_ALLOWED
            presented = _presented_keys(headers)
            if not presented:
                return _KEY_MISSING
            if not any(self._matches(key) for key in presented):
                return _KEY_INVALID
        probe = headers.getRawHeaders(PROBE_HEADER, [])
        if any(v.strip() == b"1" for v in probe):
            return _PROBE
        return None

    def _matches(self, key: bytes) -> bool:
        digest = _digest(key)
        found = False
        for stored in self.static_digests | self._file_digests:
            found |= hmac.compare_digest(digest, stored)
        return found

    def strip_credentials(self, peer: IAddress, headers: Headers) -> None:
        """Remove the proxy's own credentials before forwarding (non-loopback callers only).

        ``X-Api-Key`` goes; an ``Authorization`` value goes when it carries one of our keys, so a
        caller that authenticated with ``X-Api-Key`` can still pass its own token upstream.
        """
        if is_loopback(peer) or not self.keys_configured:
            return
        headers.removeHeader(b"x-api-key")
        kept = []
        for value in headers.getRawHeaders(b"authorization", []):
            token = _bearer_token(value)
            if token is None or not self._matches(token):
                kept.append(value)
        if kept:
            headers.setRawHeaders(b"authorization", kept)
        else:
            headers.removeHeader(b"authorization")

    def start(self) -> None:
        """Begin watching the key file for changes (no-op without one)."""
        if self.key_file is None or self._loop is not None:
            return
        self._loop = LoopingCall(self._poll)
        self._loop.clock = self.clock
        self._loop.start(self.reload_interval, now=False).addErrback(self._loop_failed)

    def stop(self) -> None:
        """Stop watching the key file."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()

    def _loop_failed(self, failure: Failure) -> None:
        self.log.failure("API key file watcher stopped", failure)

    def _poll(self) -> None:
        assert self.key_file is not None
        try:
            signature = _file_signature(self.key_file)
        except OSError as e:
            self._problem(f"cannot be read: {e.strerror}")
            return
        if signature == self._file_signature:
            return
        self._file_signature = signature
        try:
            digests = _read_key_file(self.key_file)
        except IngressConfigError as e:
            self._problem(str(e))
            return
        self._file_digests = digests
        self._last_problem = None
        self.log.info(
            "reloaded {count} API keys from {path}", count=len(digests), path=self.key_file
        )

    def _problem(self, why: str) -> None:
        if why != self._last_problem:
            self._last_problem = why
            self._file_signature = None
            self.log.warn(
                "API key file {path} not reloaded, keeping the previous keys: {why}",
                path=self.key_file,
                why=why,
            )
