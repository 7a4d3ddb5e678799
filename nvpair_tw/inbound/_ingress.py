# -*- test-case-name: tests.inbound.test_ingress -*-
"""Who may talk to a facade: the loopback / API-key / CIDR gate and the identity probe (docs/behaviour.md §9).

By default only loopback (and UNIX-socket) callers are served, decided from the TCP peer, never
from forwarding headers. API keys open the gate to other hosts, optionally narrowed to CIDRs.
Keys are kept only as SHA-256 digests and compared in constant time; a key file is re-read when
it changes, so keys rotate without a restart. Key text is never logged or echoed.

Named keys (``--keys``, docs/behaviour.md §12.1, :mod:`~nvpair_tw.inbound._keys`) open the gate
like any other key; :meth:`IngressPolicy.identify` says which key a caller presented (its name and
rules), by the same judgement :meth:`IngressPolicy.check` makes.
"""

from __future__ import annotations

import functools
import hashlib
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

from nvpair_tw.inbound._keys import (
    LOCAL,
    Caller,
    KeyBook,
    KeysFileError,
    NamedKey,
    file_signature,
    read_keys_file,
)
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "IngressConfig",
    "IngressConfigError",
    "IngressPolicy",
    "Rejection",
    "is_loopback",
    "model_not_allowed",
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


def model_not_allowed(model: str) -> Rejection:
    """403 ``model-not-allowed``: the caller's key may not use ``model`` (§12.1)."""
    return Rejection(403, "model-not-allowed", f"this key may not use model '{model}'")


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


_file_signature = file_signature


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
    keys_file: str | None = None
    """The ``--keys`` file of named keys (§12.1)."""
    named: KeyBook = field(factory=KeyBook, repr=False)
    named_signature: tuple[int, int, int, int] | None = field(default=None, repr=False)

    @property
    def keys_configured(self) -> bool:
        """Whether API keys open the gate to non-loopback callers."""
        return bool(self.static_digests or self.file_digests or self.named)


def parse_ingress(environ: Mapping[str, str], keys_file: str | None = None) -> IngressConfig:
    """Read the ingress variables, the key file and the ``--keys`` file of named keys; raise
    ``IngressConfigError`` (or :class:`~nvpair_tw.inbound._keys.KeysFileError`) if unusable."""
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
    named = KeyBook()
    named_signature = None
    if keys_file is not None:
        try:
            named_signature = _file_signature(keys_file)
        except OSError as e:
            raise KeysFileError(f"keys file {keys_file} cannot be read: {e.strerror}") from None
        named = read_keys_file(keys_file)
    if networks and not (static or file_digests or named):
        raise IngressConfigError(
            f"{CIDRS_VAR} only applies with API keys; set {KEYS_VAR}, {KEYS_FILE_VAR} or --keys"
        )
    return IngressConfig(
        static_digests=static,
        key_file=key_file,
        file_digests=file_digests,
        file_signature=signature,
        networks=networks,
        keys_file=keys_file,
        named=named,
        named_signature=named_signature,
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
    keys_file: str | None = None
    _named: KeyBook = field(factory=KeyBook)
    _named_signature: tuple[int, int, int, int] | None = None
    _named_problem: str | None = None
    _book: KeyBook = field(init=False, factory=KeyBook)
    _loop: LoopingCall | None = field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._rebuild()

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
            keys_file=config.keys_file,
            named=config.named,
            named_signature=config.named_signature,
        )

    @property
    def keys_configured(self) -> bool:
        """Whether API keys open the gate to non-loopback callers."""
        return bool(self._book)

    @property
    def book(self) -> KeyBook:
        """Every key the gate knows now, named: the ``--keys`` file's, then the environment's."""
        return self._book

    def _rebuild(self) -> None:
        self._book = self._named.with_defaults(self.static_digests | self._file_digests)

    def check(self, peer: IAddress, headers: Headers) -> Rejection | None:
        """Return why the request must be refused, or ``None`` to let it through."""
        verdict = self._judge(peer, headers)
        if isinstance(verdict, Rejection):
            return verdict
        probe = headers.getRawHeaders(PROBE_HEADER, [])
        if any(v.strip() == b"1" for v in probe):
            return _PROBE
        return None

    def identify(self, peer: IAddress, headers: Headers) -> Caller | None:
        """Who is calling (§12.1): the presented key's name and rules, :data:`LOCAL` for a
        loopback caller without a known key, ``None`` when :meth:`check` refuses the caller's
        source or key. Call it before :meth:`strip_credentials`."""
        verdict = self._judge(peer, headers)
        if isinstance(verdict, Rejection):
            return None
        return LOCAL if verdict is None else verdict.caller

    def _judge(self, peer: IAddress, headers: Headers) -> Rejection | NamedKey | None:
        """The gate: a refusal, the key presented, or None (loopback without a known key)."""
        loopback = is_loopback(peer)
        if not loopback:
            if not self.keys_configured:
                return _LOOPBACK_ONLY
            if self.networks:
                ip = _ip_of(peer)
                if ip is None or not any(ip in net for net in self.networks):
                    return _NOT_ALLOWED
        presented = _presented_keys(headers) if self.keys_configured else []
        if not presented:
            return None if loopback else _KEY_MISSING
        entry = self._book.first_of(presented)
        if entry is None and not loopback:
            return _KEY_INVALID
        return entry

    def _matches(self, key: bytes) -> bool:
        return self._book.lookup(key) is not None

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
        """Begin watching the key files for changes (no-op without one)."""
        if (self.key_file is None and self.keys_file is None) or self._loop is not None:
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
        if self.key_file is not None:
            self._poll_key_file()
        if self.keys_file is not None:
            self._poll_keys_file()

    def _poll_keys_file(self) -> None:
        """Re-read the ``--keys`` file when it changed; a bad one keeps the previous keys."""
        path = self.keys_file
        assert path is not None
        try:
            signature = _file_signature(path)
            if signature == self._named_signature:
                return
            self._named_signature = signature
            named = read_keys_file(path)
        except (OSError, KeysFileError) as e:
            why = f"cannot be read: {e.strerror}" if isinstance(e, OSError) else str(e)
            if why != self._named_problem:
                self._named_problem = why
                self._named_signature = None
                self.log.warn(
                    "keys file {path} not reloaded, keeping the previous keys: {why}",
                    path=path,
                    why=why,
                )
            return
        self._named = named
        self._named_problem = None
        self._rebuild()
        self.log.info(
            "reloaded {count} named keys from {path}: {names}",
            count=len(named),
            path=path,
            names=", ".join(named.names()),
        )

    def _poll_key_file(self) -> None:
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
        self._rebuild()
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
