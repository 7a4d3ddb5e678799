# -*- test-case-name: tests.inbound.test_reload -*-
"""A key file is the truth (docs/behaviour.md §14.2): what one poll of it means.

Each poll looks at the file's signature (modification time, size, inode, mode) and reads it when
that changed. A read gives new keys, or finds the file missing or holding no key (*empty*), or
finds it unusable otherwise (*bad*: bad TOML, a loose mode, a bad entry). New keys replace the old
ones. A bad file keeps the old keys (one warning per distinct problem). An empty file keeps them
once, since an editor may have caught it half-written, and is read again at the next poll; empty
on two reads in a row, it revokes every key of that file (one warning). :class:`LiveKeys` merges
the files' keys with the environment's and tells its listeners which names a reload removed or
changed (their tunnels and queued requests are then cut, §14.2).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Generic, TypeVar

from attrs import define, field

from nvpair_tw.inbound._keys import KeyBook, file_signature
from nvpair_tw.logs import LevelledLogger

__all__ = [
    "EMPTY_READS_TO_REVOKE",
    "KeyFileWatch",
    "LiveKeys",
    "Read",
    "changed_names",
    "key_changes",
]

T = TypeVar("T")
Signature = tuple[int, int, int, int]
EMPTY_READS_TO_REVOKE = 2

_log = LevelledLogger(namespace=__name__)


class Read(Enum):
    """What one look at the file found."""

    UNCHANGED = "unchanged"
    NEW = "new"
    EMPTY = "empty"
    BAD = "bad"


@define
class KeyFileWatch(Generic[T]):
    """One watched key file: ``read(path)`` returns its keys or raises; an exception of
    ``empty_errors`` (or a missing file) means *empty*, one of ``bad_errors`` means *bad*."""

    path: str
    what: str
    """How log lines name the file (``keys file``, ``NVPAIR_PROXY_API_KEYS_FILE``)."""
    read: Callable[[str], T]
    revoked: T
    """The keys left after a revocation (none)."""
    empty_errors: tuple[type[Exception], ...]
    bad_errors: tuple[type[Exception], ...]
    signature: Signature | None = None
    _empty_reads: int = field(default=0, init=False)
    _recheck: bool = field(default=False, init=False)
    _problem: str | None = field(default=None, init=False)

    def poll(self) -> tuple[Read, T | None]:
        """Look at the file once: what was found, and the keys to use now (``None``: keep)."""
        try:
            signature: Signature | None = file_signature(self.path)
        except FileNotFoundError:
            signature = None
        except OSError as e:
            return self._bad(None, f"cannot be read: {e.strerror}")
        if signature == self.signature and not self._recheck:
            return Read.UNCHANGED, None
        if signature is None:
            return self._empty(None)
        try:
            keys = self.read(self.path)
        except self.empty_errors:
            return self._empty(signature)
        except self.bad_errors as e:
            why = f"cannot be read: {e.strerror}" if isinstance(e, OSError) else str(e)
            return self._bad(signature, why)
        self.signature, self._empty_reads, self._recheck, self._problem = signature, 0, False, None
        return Read.NEW, keys

    def _bad(self, signature: Signature | None, why: str) -> tuple[Read, T | None]:
        self.signature, self._empty_reads, self._recheck = signature, 0, False
        if why != self._problem:
            self._problem = why
            _log.warn(
                "{what} {path} not reloaded, keeping the previous keys: {why}",
                what=self.what,
                path=self.path,
                why=why,
            )
        return Read.BAD, None

    def _empty(self, signature: Signature | None) -> tuple[Read, T | None]:
        self._empty_reads += 1
        self._problem = None
        self.signature = signature
        self._recheck = self._empty_reads < EMPTY_READS_TO_REVOKE
        if self._empty_reads != EMPTY_READS_TO_REVOKE:
            return Read.EMPTY, None
        _log.warn(
            "{what} {path} is missing or holds no key on {reads} reads in a row: "
            "every key it gave is revoked",
            what=self.what,
            path=self.path,
            reads=EMPTY_READS_TO_REVOKE,
        )
        return Read.EMPTY, self.revoked


def key_changes(before: KeyBook, after: KeyBook) -> str:
    """The key names a reload added, removed and changed, in a few words; ``no change``."""
    old, new = before.rules_by_name(), after.rules_by_name()
    groups = (
        ("added", sorted(new.keys() - old.keys())),
        ("removed", sorted(old.keys() - new.keys())),
        ("changed", sorted(n for n in old.keys() & new.keys() if old[n] != new[n])),
    )
    return "; ".join(f"{what} {', '.join(names)}" for what, names in groups if names) or "no change"


def changed_names(before: KeyBook, after: KeyBook) -> frozenset[str]:
    """The names whose key was removed, replaced or re-scoped between two books."""
    old, new = before.rules_by_name(), after.rules_by_name()
    return frozenset(name for name, held in old.items() if new.get(name) != held)


@define
class LiveKeys:
    """Every key the gate knows now: ``NVPAIR_PROXY_API_KEYS``, ``NVPAIR_PROXY_API_KEYS_FILE``
    (``key_watch``) and the ``--keys`` file (``keys_watch``), merged into one :class:`KeyBook`."""

    static_digests: frozenset[bytes] = field(default=frozenset(), repr=False)
    file_digests: frozenset[bytes] = field(default=frozenset(), repr=False)
    named: KeyBook = field(factory=KeyBook, repr=False)
    key_watch: KeyFileWatch[frozenset[bytes]] | None = field(default=None, repr=False)
    keys_watch: KeyFileWatch[KeyBook] | None = field(default=None, repr=False)
    book: KeyBook = field(init=False, factory=KeyBook, repr=False)
    _listeners: list[Callable[[frozenset[str]], None]] = field(factory=list, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._rebuild()

    @property
    def watched(self) -> bool:
        return self.key_watch is not None or self.keys_watch is not None

    def _rebuild(self) -> None:
        self.book = self.named.with_defaults(self.static_digests | self.file_digests)

    def watch_changes(self, callback: Callable[[frozenset[str]], None]) -> None:
        self._listeners.append(callback)

    def poll(self) -> None:
        """Look at each key file once; tell the listeners which names a reload changed."""
        before = self.book
        unchanged: tuple[Read, None] = (Read.UNCHANGED, None)
        digests = self.key_watch.poll() if self.key_watch is not None else unchanged
        named = self.keys_watch.poll() if self.keys_watch is not None else unchanged
        if digests[1] is None and named[1] is None:
            return
        if digests[1] is not None:
            if digests[0] is Read.NEW and self.key_watch is not None:
                was, now = KeyBook().with_defaults(self.file_digests), digests[1]
                self._reloaded(self.key_watch, was, KeyBook().with_defaults(now), "API keys")
            self.file_digests = digests[1]
        if named[1] is not None:
            if named[0] is Read.NEW and self.keys_watch is not None:
                self._reloaded(self.keys_watch, self.named, named[1], "named keys")
                for warning in named[1].warnings:
                    _log.warn("{warning}", warning=warning)
            self.named = named[1]
        self._rebuild()
        changed = changed_names(before, self.book)
        if changed:
            self._tell(changed)

    def _reloaded(self, watch: KeyFileWatch[T], before: KeyBook, after: KeyBook, what: str) -> None:
        """One line: how many keys the file holds now and which names it added, removed or
        changed (a key, scope or limits; never a key)."""
        _log.info(
            "reloaded {count} {what} from {path}: {changes}",
            count=len(after),
            what=what,
            path=watch.path,
            changes=key_changes(before, after),
        )

    def _tell(self, changed: frozenset[str]) -> None:
        for listener in list(self._listeners):
            try:
                listener(changed)
            except Exception:
                _log.failure("a key change listener failed")
