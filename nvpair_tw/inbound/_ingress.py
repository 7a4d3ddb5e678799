# -*- test-case-name: tests.inbound.test_ingress -*-
"""Who may talk to a facade: source, ``local``, keys and the identity probe, decided once at the end
of the head (docs/behaviour.md §9, §14.2).

A caller that passes the ``local`` test (:mod:`~nvpair_tw.inbound._local`: loopback peer, a local
``Host``, no foreign ``Origin``) is :data:`~nvpair_tw.inbound._keys.LOCAL`, unless it presents one
of the proxy's keys, which makes it that key's caller. Any other caller is remote: without keys it
is refused (403 ``loopback-only``, or ``host-not-allowed`` for a loopback peer that failed the
test), outside ``NVPAIR_PROXY_ALLOWED_CIDRS`` 403, and without a right key 401. The credential
read is ``X-Api-Key`` when present, else ``Authorization: Bearer``; one of the proxy's keys
anywhere else (another header, the query, a ``Basic`` credential) is 400 ``credential-misplaced``
and more than one credential 400, from any caller, after the source check
(:mod:`~nvpair_tw.inbound._credentials`). The proxy's keys never reach a node:
:meth:`IngressPolicy.strip` removes every header value carrying one, from every caller.

Keys are kept only as SHA-256 digests and compared in constant time; the key files are re-read
when they change (:mod:`~nvpair_tw.inbound._reload`: the file is the truth), and
:meth:`IngressPolicy.watch_changes` tells which names a reload removed or changed. Key text is
never logged or echoed.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable, Iterable, Mapping

from attrs import define, field, frozen
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair_tw.inbound._credentials import bearer_token, credential, misplaced
from nvpair_tw.inbound._keys import (
    LOCAL,
    Caller,
    KeyBook,
    KeysFileEmpty,
    KeysFileError,
    NamedKey,
    PrivateFileError,
    file_signature,
    read_keys_file,
    read_private_file,
)
from nvpair_tw.inbound._local import (
    Locality,
    LocalNames,
    check_host_name,
    ip_of,
    is_loopback,
    locality,
)
from nvpair_tw.inbound._rejection import Rejection
from nvpair_tw.inbound._reload import KeyFileWatch, LiveKeys
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "IngressConfig",
    "IngressConfigError",
    "IngressPolicy",
    "Rejection",
    "credential",
    "ingress_warnings",
    "is_loopback",
    "model_not_allowed",
    "parse_ingress",
]

KEYS_VAR = "NVPAIR_PROXY_API_KEYS"
KEYS_FILE_VAR = "NVPAIR_PROXY_API_KEYS_FILE"
CIDRS_VAR = "NVPAIR_PROXY_ALLOWED_CIDRS"
PROBE_HEADER = b"X-NVPAIR-Engine-Identity-Probe"
RELOAD_INTERVAL = 2.0

_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_CHALLENGE = b'Bearer realm="nvpair"'
Signature = tuple[int, int, int, int]


class IngressConfigError(Exception):
    """The ingress configuration is unusable; the proxy must not start with it."""


class KeyFileEmpty(IngressConfigError):
    """``NVPAIR_PROXY_API_KEYS_FILE`` holds no key (two such reads in a row revoke its keys)."""


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
_TWO_HOSTS = Rejection(400, "bad-request", "more than one Host header")
_HOST_NOT_ALLOWED = Rejection(
    403,
    "host-not-allowed",
    "this Host or Origin is not a local one (see --allow-host and --cors-origin)",
)


def model_not_allowed(model: str) -> Rejection:
    """403 ``model-not-allowed``: the caller's key may not use ``model`` (§12.1)."""
    return Rejection(403, "model-not-allowed", f"this key may not use model '{model}'")


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


def _read_key_file(path: str) -> frozenset[bytes]:
    """Read a key file (one key per line, ``#`` comment lines) into digests; raise on any flaw."""
    try:
        raw = read_private_file(path, f"{KEYS_FILE_VAR} {path}")
    except PrivateFileError as e:
        raise IngressConfigError(str(e)) from None
    except FileNotFoundError as e:
        raise KeyFileEmpty(f"{KEYS_FILE_VAR} {path} cannot be read: {e.strerror}") from None
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
        raise KeyFileEmpty(f"{KEYS_FILE_VAR} {path} contains no keys")
    return frozenset(digests)


def _parse_allow_hosts(hosts: Iterable[str]) -> tuple[str, ...]:
    try:
        return tuple(sorted({check_host_name(h) for h in hosts}))
    except ValueError as error:
        raise IngressConfigError(f"--allow-host: {error}") from None


@frozen
class IngressConfig:
    """The ingress settings read from the environment, as a value (no clock, no timer).

    Key material is held only as SHA-256 digests and left out of the repr.
    """

    static_digests: frozenset[bytes] = field(default=frozenset(), repr=False)
    key_file: str | None = None
    file_digests: frozenset[bytes] = field(default=frozenset(), repr=False)
    file_signature: Signature | None = field(default=None, repr=False)
    networks: tuple[_IPNetwork, ...] = ()
    keys_file: str | None = None
    """The ``--keys`` file of named keys (§12.1)."""
    named: KeyBook = field(factory=KeyBook, repr=False)
    named_signature: Signature | None = field(default=None, repr=False)
    allow_hosts: tuple[str, ...] = ()
    """The ``--allow-host`` names a ``local`` caller's ``Host`` may carry (§14.2), lower case."""

    @property
    def keys_configured(self) -> bool:
        """Whether API keys open the gate to non-loopback callers."""
        return bool(self.static_digests or self.file_digests or self.named)


def _signature_of(path: str, error: type[Exception], what: str) -> Signature:
    try:
        return file_signature(path)
    except OSError as e:
        raise error(f"{what} {path} cannot be read: {e.strerror}") from None


def parse_ingress(
    environ: Mapping[str, str], keys_file: str | None = None, allow_hosts: Iterable[str] = ()
) -> IngressConfig:
    """Read the ingress variables, the key file, the ``--keys`` file of named keys and the
    ``--allow-host`` names; raise ``IngressConfigError`` (or
    :class:`~nvpair_tw.inbound._keys.KeysFileError`) if unusable."""
    keys_value = environ.get(KEYS_VAR, "").strip()
    static = _parse_keys_var(keys_value) if keys_value else frozenset()
    key_file = environ.get(KEYS_FILE_VAR, "").strip() or None
    file_digests: frozenset[bytes] = frozenset()
    signature = None
    if key_file is not None:
        signature = _signature_of(key_file, IngressConfigError, KEYS_FILE_VAR)
        file_digests = _read_key_file(key_file)
    cidrs_value = environ.get(CIDRS_VAR, "").strip()
    networks = _parse_cidrs(cidrs_value) if cidrs_value else ()
    named = KeyBook()
    named_signature = None
    if keys_file is not None:
        named_signature = _signature_of(keys_file, KeysFileError, "keys file")
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
        allow_hosts=_parse_allow_hosts(allow_hosts),
    )


def ingress_warnings(config: IngressConfig) -> tuple[str, ...]:
    """The start-up warnings of §14.7 about the keys (logged once by the wiring): how many named
    keys have role user, and what the keys file's reader flagged (names starting ``key-``)."""
    warnings = list(config.named.warnings)
    users = config.named.user_keys()
    if users:
        keys = "named key has" if users == 1 else "named keys have"
        warnings.append(
            f"{users} {keys} role user: model management and X-NVPair-Node: * need"
            ' role = "admin" (docs/upgrading.md)'
        )
    return tuple(warnings)


def _key_file_watch(path: str, signature: Signature | None) -> KeyFileWatch[frozenset[bytes]]:
    return KeyFileWatch(
        path,
        KEYS_FILE_VAR,
        _read_key_file,
        frozenset(),
        (KeyFileEmpty,),
        (IngressConfigError,),
        signature,
    )


def _keys_file_watch(path: str, signature: Signature | None) -> KeyFileWatch[KeyBook]:
    return KeyFileWatch(
        path, "keys file", read_keys_file, KeyBook(), (KeysFileEmpty,), (KeysFileError,), signature
    )


def _outside(networks: tuple[_IPNetwork, ...], peer: IAddress, where: Locality) -> Rejection | None:
    """403 for a remote peer outside ``NVPAIR_PROXY_ALLOWED_CIDRS`` (when set)."""
    if where is not Locality.REMOTE or not networks:
        return None
    ip = ip_of(peer)
    if ip is None or not any(ip in net for net in networks):
        return _NOT_ALLOWED
    return None


def _carries_key(book: KeyBook, name: bytes, value: bytes) -> bool:
    """Whether header ``name``'s ``value`` is one of ``book``'s keys where the proxy reads it."""
    if name == b"x-api-key":
        return book.holds(value.strip())
    token = bearer_token(value)
    return token is not None and book.holds(token)


@define
class IngressPolicy:
    """The live gate in front of every facade and the admin listener; build it with
    ``from_config``."""

    clock: IReactorTime
    keys: LiveKeys = field(factory=LiveKeys)
    networks: tuple[_IPNetwork, ...] = ()
    names: LocalNames = field(factory=LocalNames.of)
    """What the ``local`` test accepts (§14.2)."""
    reload_interval: float = RELOAD_INTERVAL
    _loop: LoopingCall | None = field(default=None, init=False, repr=False)

    log = LevelledLogger(namespace=__name__)

    @classmethod
    def from_config(
        cls,
        config: IngressConfig,
        clock: IReactorTime,
        *,
        cors_origins: Iterable[str] = (),
        hostname: str | None = None,
    ) -> IngressPolicy:
        """The gate for ``config`` and the ``--cors-origin`` origins (a ``local`` caller's
        ``Origin`` may be one); ``hostname`` defaults to this machine's. The key files are
        re-read on ``clock`` once :meth:`start` runs."""
        keys = LiveKeys(
            static_digests=config.static_digests,
            file_digests=config.file_digests,
            named=config.named,
            key_watch=(
                _key_file_watch(config.key_file, config.file_signature)
                if config.key_file is not None
                else None
            ),
            keys_watch=(
                _keys_file_watch(config.keys_file, config.named_signature)
                if config.keys_file is not None
                else None
            ),
        )
        names = LocalNames.of(config.allow_hosts, cors_origins, hostname)
        return cls(clock=clock, keys=keys, networks=config.networks, names=names)

    @property
    def keys_configured(self) -> bool:
        """Whether API keys open the gate to non-loopback callers."""
        return bool(self.keys.book)

    @property
    def book(self) -> KeyBook:
        """Every key the gate knows now, named: the ``--keys`` file's, then the environment's."""
        return self.keys.book

    @property
    def static_digests(self) -> frozenset[bytes]:
        return self.keys.static_digests

    @property
    def key_file(self) -> str | None:
        return self.keys.key_watch.path if self.keys.key_watch is not None else None

    @property
    def keys_file(self) -> str | None:
        return self.keys.keys_watch.path if self.keys.keys_watch is not None else None

    def admit(self, peer: IAddress, headers: Headers, query: bytes = b"") -> Caller | Rejection:
        """Who is calling, or why the request is refused (docs/behaviour.md §9, §14.2): decided
        once, from the peer, the head and the target's ``query``, before any body byte is
        read."""
        where = locality(peer, headers, self.names)
        if where is Locality.AMBIGUOUS:
            return _TWO_HOSTS
        book = self.keys.book
        if book:
            # the source first: outsiders learn nothing about keys, not even where they go
            refused = _outside(self.networks, peer, where) or misplaced(headers, query, book)
            if refused is not None:
                return refused
        presented = credential(headers) if book else None
        entry = book.lookup(presented) if presented is not None else None
        if where is Locality.LOCAL:
            caller: Caller | Rejection = LOCAL if entry is None else entry.caller
        else:
            caller = self._remote(where, presented is not None, entry)
        if isinstance(caller, Caller) and any(
            v.strip() == b"1" for v in headers.getRawHeaders(PROBE_HEADER, [])
        ):
            return _PROBE
        return caller

    def _remote(
        self, where: Locality, presented: bool, entry: NamedKey | None
    ) -> Caller | Rejection:
        """A caller that is not ``local``, inside the allowed sources: its key."""
        if not self.keys.book:
            return _HOST_NOT_ALLOWED if where is Locality.LOOPBACK_FOREIGN else _LOOPBACK_ONLY
        if not presented:
            return _KEY_MISSING
        if entry is None:
            return _KEY_INVALID
        return entry.caller

    def strip(self, headers: Headers) -> None:
        """Remove every ``X-Api-Key`` and ``Authorization`` value that carries one of the proxy's
        keys, whoever sent it: the proxy's keys never reach a node (§14.2). Others stay."""
        if not self.keys.book:
            return
        for name in (b"x-api-key", b"authorization"):
            values = headers.getRawHeaders(name)
            if values is None:
                continue
            kept = [v for v in values if not _carries_key(self.keys.book, name, v)]
            if not kept:
                headers.removeHeader(name)
            elif len(kept) != len(values):
                headers.setRawHeaders(name, kept)

    def check(self, peer: IAddress, headers: Headers) -> Rejection | None:
        """:meth:`admit`'s refusal, or ``None`` (for callers not yet moved to :meth:`admit`)."""
        verdict = self.admit(peer, headers)
        return verdict if isinstance(verdict, Rejection) else None

    def identify(self, peer: IAddress, headers: Headers) -> Caller | None:
        """:meth:`admit`'s caller, or ``None`` when it refuses (as :meth:`check`)."""
        verdict = self.admit(peer, headers)
        return verdict if isinstance(verdict, Caller) else None

    def strip_credentials(self, peer: IAddress, headers: Headers) -> None:
        """:meth:`strip` (the peer no longer matters: every caller's proxy keys go)."""
        self.strip(headers)

    def watch_changes(self, callback: Callable[[frozenset[str]], None]) -> None:
        """Call ``callback`` after each reload that removed a key or changed one's key or
        rules, with those names, so their open tunnels and queued requests can be cut (§14.2)."""
        self.keys.watch_changes(callback)

    def start(self) -> None:
        """Begin watching the key files for changes (no-op without one)."""
        if not self.keys.watched or self._loop is not None:
            return
        self._loop = LoopingCall(self.keys.poll)
        self._loop.clock = self.clock
        self._loop.start(self.reload_interval, now=False).addErrback(self._loop_failed)

    def stop(self) -> None:
        """Stop watching the key files."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()

    def _loop_failed(self, failure: Failure) -> None:
        self.log.failure("API key file watcher stopped", failure)
