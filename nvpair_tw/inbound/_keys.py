# -*- test-case-name: tests.inbound.test_keys -*-
"""Named keys with scopes and limits: the ``--keys`` file (docs/behaviour.md §12.1).

A keys file is TOML, mode 0600 or stricter, with one ``[[key]]`` table per key: ``name`` (shown
in usage, logs and metrics, never the key), exactly one of ``key`` or ``key_sha256``, and
optionally ``models`` (case-sensitive ``fnmatch`` patterns over public model names),
``requests_per_minute``, ``tokens_per_minute``, ``max_concurrent``, ``role`` (``"user"``, the
default, or ``"admin"``), ``tunnels`` (``true`` lets a user key without a model scope open the LM
Studio channel) and ``max_tunnels`` (default 4) (docs/behaviour.md §14.2), and ``priority`` (``"interactive"``, the
default, or ``"batch"``: docs/behaviour.md §16.3). The names ``local``,
``anonymous`` and ``other`` are refused; a name starting ``key-`` is warned about (it can collide
with an environment key's). Keys are kept only as SHA-256 digests, looked up in constant time, and
never logged or put into an error message. The keys of ``NVPAIR_PROXY_API_KEYS[_FILE]`` are named
``key-`` + the first 8 hex digits of their digest and have role admin; a ``local`` caller
(docs/behaviour.md §14.2) without a key is :data:`LOCAL`, with every right.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import os
import re
import stat
import tomllib
from collections.abc import Iterable
from enum import Enum
from typing import Any

from attrs import Factory, field, frozen

from nvpair_tw.core import Priority, did_you_mean

__all__ = [
    "ENVIRONMENT_RULES",
    "LOCAL",
    "Caller",
    "KeyBook",
    "KeyRules",
    "KeysFileEmpty",
    "KeysFileError",
    "NamedKey",
    "Role",
    "env_key_name",
    "read_keys_file",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_HEX64 = re.compile(r"[0-9A-Fa-f]{64}")
_LIMITS = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "max_tunnels")
_FIELDS = frozenset(
    {"name", "key", "key_sha256", "models", "role", "tunnels", "priority", *_LIMITS}
)
RESERVED_NAMES = frozenset({"local", "anonymous", "other"})
"""Names the records use for callers without a key or models without a name (§14.2, §14.6)."""
DEFAULT_MAX_TUNNELS = 4
CLEAN_VALUES = 4096
"""Header values a :class:`KeyBook` remembers as holding none of its keys."""


class KeysFileError(Exception):
    """The keys file cannot be used as written (the message never holds a key)."""


class KeysFileEmpty(KeysFileError):
    """The keys file holds no key (two such reads in a row revoke every key, §14.2)."""


class Role(Enum):
    """What a key may do beyond inference within its scope (docs/behaviour.md §14.2)."""

    ADMIN = "admin"
    """Every route, ``X-NVPair-Node: *``, model management."""
    USER = "user"
    """Inference, model-routed routes and reads within the key's scope."""


@frozen(kw_only=True)
class KeyRules:
    """What one key may do: its role, its model patterns (``None``: every model), its limits
    and its tunnels (``max_tunnels`` ``None``: no cap of its own, :data:`LOCAL` and the
    environment's keys)."""

    models: tuple[str, ...] | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    role: Role = Role.USER
    tunnels: bool = False
    max_tunnels: int | None = DEFAULT_MAX_TUNNELS
    priority: Priority = Priority.INTERACTIVE
    """The highest priority its requests get; ``X-NVPair-Priority`` may lower it (§16.3)."""

    @property
    def may_tunnel(self) -> bool:
        """Whether the LM Studio WebSocket channel is open to this key: it has no model scope
        (a tunnel is unscoped) and is admin or says ``tunnels = true`` (§14.2)."""
        return self.models is None and (self.role is Role.ADMIN or self.tunnels)

    @property
    def limited(self) -> bool:
        """Whether any rate or concurrency limit applies."""
        return (
            self.requests_per_minute is not None
            or self.tokens_per_minute is not None
            or self.max_concurrent is not None
        )

    def allows(self, model: str) -> bool:
        """Whether ``model`` (a public name) matches one of the patterns, case-sensitively."""
        if self.models is None:
            return True
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def allowed(self, models: Iterable[str]) -> list[str]:
        """The models of ``models`` this key may use, in their order."""
        return [m for m in models if self.allows(m)]


UNRESTRICTED = KeyRules()
ENVIRONMENT_RULES = KeyRules(role=Role.ADMIN, tunnels=True, max_tunnels=None)
"""The rules of a key from ``NVPAIR_PROXY_API_KEYS[_FILE]``: every right, as before named keys."""


@frozen
class Caller:
    """Who is calling: the key's name (``local`` for a local caller without a key) and its rules."""

    name: str
    rules: KeyRules = UNRESTRICTED

    @property
    def role(self) -> Role:
        return self.rules.role


LOCAL = Caller("local", ENVIRONMENT_RULES)
"""A ``local`` caller (§14.2) without one of the proxy's keys: every right."""


@frozen
class NamedKey:
    """One key as held: its SHA-256 digest (never shown), its name and its rules."""

    digest: bytes = field(repr=False)
    name: str
    rules: KeyRules = UNRESTRICTED

    @property
    def caller(self) -> Caller:
        return Caller(self.name, self.rules)


def env_key_name(digest: bytes) -> str:
    """The name of a key from ``NVPAIR_PROXY_API_KEYS[_FILE]``: ``key-`` + 8 hex digits."""
    return "key-" + digest.hex()[:8]


@frozen
class KeyBook:
    """Every named key the gate knows, looked up by digest in constant time."""

    entries: tuple[NamedKey, ...] = ()
    warnings: tuple[str, ...] = ()
    """What the file's reader should hear about (a name starting ``key-``); never a key."""
    _digests: frozenset[bytes] = field(
        init=False,
        eq=False,
        repr=False,
        default=Factory(lambda self: frozenset(e.digest for e in self.entries), takes_self=True),
    )
    clean: set[int] = field(init=False, eq=False, repr=False, factory=set)
    """Hashes (Python's, seeded per process) of header values found to hold none of these keys,
    so a value seen before is not searched again; at most :data:`CLEAN_VALUES`, then forgotten.
    The values themselves are not kept."""

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def lookup(self, key: bytes) -> NamedKey | None:
        """The entry whose digest is ``key``'s; every entry is compared, whatever matches."""
        digest = hashlib.sha256(key).digest()
        found: NamedKey | None = None
        for entry in self.entries:
            if hmac.compare_digest(digest, entry.digest) and found is None:
                found = entry
        return found

    def holds(self, text: bytes) -> bool:
        """Whether ``text`` is one of the keys: a lookup of its digest in a set, for searching a
        request for keys where they do not belong (docs/behaviour.md §14.2). A digest's timing
        tells nothing about a key (finding one from it is SHA-256's preimage problem)."""
        return hashlib.sha256(text).digest() in self._digests

    def first_of(self, keys: Iterable[bytes]) -> NamedKey | None:
        """The entry of the first of ``keys`` that is known (every key is looked up)."""
        found: NamedKey | None = None
        for key in keys:
            entry = self.lookup(key)
            if found is None:
                found = entry
        return found

    def with_defaults(self, digests: Iterable[bytes]) -> KeyBook:
        """This book plus unrestricted entries for ``digests`` it does not hold (the
        environment's keys, named by :func:`env_key_name`); an entry of this book wins."""
        held = {e.digest for e in self.entries}
        extra = [
            NamedKey(d, env_key_name(d), ENVIRONMENT_RULES)
            for d in sorted(digests)
            if d not in held
        ]
        return KeyBook(self.entries + tuple(extra), self.warnings)

    def rules_by_name(self) -> dict[str, tuple[bytes, KeyRules]]:
        """Each name's digest and rules (to tell which keys a reload removed or changed)."""
        return {e.name: (e.digest, e.rules) for e in self.entries}

    def user_keys(self) -> int:
        """How many keys have role user."""
        return sum(1 for e in self.entries if e.rules.role is Role.USER)


def _check_name(value: Any, where: str, seen: set[str]) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise KeysFileError(
            f"{where}: name must be 1-64 characters of letters, digits, '.', '_', '@' or '-' "
            "(starting with a letter or digit)"
        )
    if value.lower() in RESERVED_NAMES:
        raise KeysFileError(
            f"{where}: the names local, anonymous and other are kept for the proxy's records"
        )
    if value in seen:
        raise KeysFileError(f"{where}: the name {value!r} is used twice")
    seen.add(value)
    return value


def _digest_of(entry: dict[str, Any], where: str) -> bytes:
    has_key, has_digest = "key" in entry, "key_sha256" in entry
    if has_key == has_digest:
        raise KeysFileError(f"{where}: give exactly one of key or key_sha256")
    if has_digest:
        value = entry["key_sha256"]
        if not isinstance(value, str) or not _HEX64.fullmatch(value):
            raise KeysFileError(f"{where}: key_sha256 must be 64 hex digits")
        return bytes.fromhex(value)
    key = entry["key"]
    if (
        not isinstance(key, str)
        or not key
        or not key.isascii()
        or not key.isprintable()
        or any(c.isspace() for c in key)
    ):
        raise KeysFileError(
            f"{where}: key must be printable ASCII without spaces or control characters"
        )
    return hashlib.sha256(key.encode("ascii")).digest()


def _models_of(entry: dict[str, Any], where: str) -> tuple[str, ...] | None:
    if "models" not in entry:
        return None
    models = entry["models"]
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise KeysFileError(f"{where}: models must be a list of non-empty glob patterns")
    return tuple(models)


def _limit_of(entry: dict[str, Any], name: str, where: str) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KeysFileError(f"{where}: {name} must be a positive integer")
    return value


def _role_of(entry: dict[str, Any], where: str) -> Role:
    value = entry.get("role", Role.USER.value)
    if not isinstance(value, str) or value not in {r.value for r in Role}:
        raise KeysFileError(f'{where}: role must be "admin" or "user"')
    return Role(value)


def _tunnels_of(entry: dict[str, Any], where: str) -> bool:
    value = entry.get("tunnels", False)
    if not isinstance(value, bool):
        raise KeysFileError(f"{where}: tunnels must be true or false")
    return value


def _priority_of(entry: dict[str, Any], where: str) -> Priority:
    value = entry.get("priority", Priority.INTERACTIVE.value)
    if not isinstance(value, str) or value not in {p.value for p in Priority}:
        raise KeysFileError(f'{where}: priority must be "interactive" or "batch"')
    return Priority(value)


def _rules_of(entry: dict[str, Any], where: str) -> KeyRules:
    limits = {limit: _limit_of(entry, limit, where) for limit in _LIMITS}
    max_tunnels = limits["max_tunnels"]
    return KeyRules(
        models=_models_of(entry, where),
        requests_per_minute=limits["requests_per_minute"],
        tokens_per_minute=limits["tokens_per_minute"],
        max_concurrent=limits["max_concurrent"],
        role=_role_of(entry, where),
        tunnels=_tunnels_of(entry, where),
        priority=_priority_of(entry, where),
        max_tunnels=DEFAULT_MAX_TUNNELS if max_tunnels is None else max_tunnels,
    )


def _warnings_of(entry: NamedKey, where: str) -> list[str]:
    warnings = []
    if entry.name.startswith("key-"):
        warnings.append(
            f"{where}: a name starting 'key-' can collide with an NVPAIR_PROXY_API_KEYS key's name"
        )
    rules = entry.rules
    if rules.tunnels and rules.models is not None:
        warnings.append(f"{where}: tunnels = true has no effect on a key with a model scope")
    return warnings


def parse_keys(document: dict[str, Any], path: str) -> KeyBook:
    """The key book of a parsed keys file; raise :class:`KeysFileError` on any flaw
    (:class:`KeysFileEmpty` when it holds no key)."""
    extra = set(document) - {"key"}
    if extra:
        first = sorted(extra)[0]
        hint = did_you_mean(first, ("key",))
        raise KeysFileError(f"keys file {path}: unknown table {first!r}{hint}")
    tables = document.get("key", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise KeysFileError(f"keys file {path}: keys are [[key]] tables")
    if not tables:
        raise KeysFileEmpty(f"keys file {path} contains no keys")
    seen: set[str] = set()
    digests: set[bytes] = set()
    entries = []
    warnings: list[str] = []
    for number, entry in enumerate(tables, start=1):
        where = f"keys file {path}: [[key]] #{number}"
        unknown = set(entry) - _FIELDS
        if unknown:
            first = sorted(unknown)[0]
            hint = did_you_mean(first, _FIELDS)
            raise KeysFileError(f"{where}: unknown field {first!r}{hint}")
        name = _check_name(entry.get("name"), where, seen)
        where = f"{where} ({name})"
        digest = _digest_of(entry, where)
        if digest in digests:
            raise KeysFileError(f"{where}: the same key is given twice")
        digests.add(digest)
        entries.append(NamedKey(digest, name, _rules_of(entry, where)))
        warnings.extend(_warnings_of(entries[-1], where))
    return KeyBook(tuple(entries), tuple(warnings))


class PrivateFileError(ValueError):
    """A secrets file that is not a regular file of mode 0600 or stricter (the message says which)."""


def read_private_file(path: str, what: str, limit: int | None = None) -> bytes:
    """The bytes of a secrets file (keys, tokens), at most ``limit`` + 1 of them: it must be a
    regular file no group or other may access. Raises :class:`PrivateFileError` (``what`` names
    the file in its message) or the ``OSError`` of a file that cannot be opened."""
    # O_NONBLOCK: a FIFO put in the file's place must not block the reactor.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PrivateFileError(f"{what} is not a regular file")
        if st.st_mode & 0o077:
            raise PrivateFileError(
                f"{what} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be "
                "accessible by group or other (chmod 600)"
            )
        with open(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit + 1)
    finally:
        os.close(fd)


def file_signature(path: str) -> tuple[int, int, int, int]:
    """What changes when a file is rewritten, replaced or re-moded."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)


def read_keys_file(path: str) -> KeyBook:
    """Read and check a keys file (a regular file, mode 0600 or stricter, TOML)."""
    try:
        raw = read_private_file(path, f"keys file {path}")
    except PrivateFileError as e:
        raise KeysFileError(str(e)) from None
    except FileNotFoundError as e:
        raise KeysFileEmpty(f"keys file {path} cannot be read: {e.strerror}") from None
    except OSError as e:
        raise KeysFileError(f"keys file {path} cannot be read: {e.strerror}") from None
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise KeysFileError(f"keys file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        # tomllib's message names a line and column, never the text around it.
        raise KeysFileError(f"keys file {path} is not valid TOML: {error}") from None
    return parse_keys(document, path)
