# -*- test-case-name: tests.nodes.test_directory -*-
"""Nodes: the machines behind a facade, merged from every source into one view.

Sources are command-line flags, a TOML nodes file (watched and reloaded on change), the control
channel (manual nodes) and discovery snapshots; when none of them names a node, the engine's
default node stands in. A node pointing at this proxy's own listener is dropped (no loops).

The nodes file is TOML, one ``[[node]]`` table per machine::

    [[node]]
    id = "gpu1"                        # required, unique, stable (not a host name)
    models = ["llama3:8b"]             # optional static inventory for every engine (never polled)
    url = "http://10.0.0.5:11434"      # one URL for every engine, or per engine:
    slots = 2                          # optional: requests run on it at once; 0 = no limit
    slots_reserved = 1                 # optional: of its slots, kept for interactive work (§16.3)
    speed = 5.0                        # optional: relative speed, seeds its learnt rates (§15.1)
    cache_conversations = 6            # optional: conversations its prompt cache keeps per model (§5.3.1)
    models_max = 2                     # optional, llama.cpp router: models loaded at once (§17.2)
    cordon = true                      # optional: takes no new work (maintenance; docs/behaviour.md §13.1)
    kind = "lmstudio"                  # optional: ollama | lmstudio | omlx | openai (§11.1); with a
                                       # kind the node stands behind every facade (url: one string)
    facades = ["ollama"]               # optional, with a kind: only behind these facades
    # [node.url]
    # ollama = "http://10.0.0.5:11434"
    # lmstudio = "http://10.0.0.5:1234"
    # for https URLs, at most one of (see nvpair_tw.nodes._tls):
    # ca_file = "gpu1-ca.pem"          # trust this CA / self-signed certificate (relative to the file)
    # fingerprint = "sha256:AB:CD:…"   # pin the leaf certificate's SHA-256 (no name check)
    # insecure = true                  # no verification at all (logged as a warning)
    # api_key = "sk-…"                 # sent as Authorization: Bearer to this node only

A URL's userinfo (``http://user:pass@host``) becomes Basic authorization toward that node; a node's
``api_key`` wins over it. Neither is ever shown: :attr:`Node.public_url` is the URL without
userinfo, and ``api_key`` is left out of the node's ``repr``.

A node without a URL for an engine is not part of that engine's facade. A node without a ``kind``
takes the kind of each facade it joins.

The file may also declare models under several names (docs/behaviour.md §11.4)::

    [[model]]
    name = "llama3.1:8b"                                   # the public name
    aliases = ["meta-llama-3.1-8b-instruct", "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit"]
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import os
import tomllib
from collections.abc import Callable, Collection, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from attrs import asdict, define, evolve, field, fields, frozen
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from nvpair_tw.core import ENGINES, EngineProfile, did_you_mean
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes._catalogue import Catalogue, CatalogueError, parse_catalogue
from nvpair_tw.nodes._tls import TLS_KEYS, NodeTLS, https_address, parse_node_tls

__all__ = [
    "MAX_NODES_FILE_BYTES",
    "Node",
    "NodeDirectory",
    "NodesFileError",
    "NodesFileWatcher",
    "load_nodes_file",
    "public_url",
    "url_key",
    "validate_url",
]

MAX_NODES_FILE_BYTES = 1 << 20
"""A nodes file larger than this is rejected rather than parsed on the reactor thread."""


@frozen
class Node:
    """One machine as one engine sees it.

    ``models`` is a static inventory (never polled) or ``None`` (polled). ``source`` says where the
    node came from: ``flag``, ``file``, ``manual``, ``discovery`` or ``default``. ``slots`` is how
    many requests one facade of this process runs on it at once (0 = unlimited, ``None`` = the
    ``--default-slots``; docs/behaviour.md §6.4). ``tls`` is how an https node's certificate is
    checked (nodes file only; ``None``: the system trust store). ``cordon`` is ``cordon = true`` in
    the nodes file: the node takes no new work until the file says otherwise (§13.1).
    """

    id: str
    url: str = field(repr=lambda url: repr(public_url(url)))
    models: tuple[str, ...] | None = None
    source: str = "flag"
    slots: int | None = None
    tls: NodeTLS | None = field(default=None, kw_only=True)
    api_key: str | None = field(default=None, kw_only=True, repr=False)
    cordon: bool = field(default=False, kw_only=True)
    kind: str | None = field(default=None, kw_only=True)
    """The engine the machine runs (§11.1), or ``None``: the kind of each facade it joins."""
    speed: float | None = field(default=None, kw_only=True)
    """``speed = X`` in the nodes file: its speed relative to 1.0, the seed of its learnt rates
    until it has measurements (docs/behaviour.md §15.1); ``None``: unset."""
    models_max: int | None = field(default=None, kw_only=True)
    """How many models a llama.cpp router keeps loaded at once (its ``--models-max``; 0 = no
    limit), or ``None``: what the router says (docs/behaviour.md §17.2)."""
    slots_reserved: int = field(default=0, kw_only=True)
    """``slots_reserved = N``: N of its ``slots`` a batch request does not take (§16.3)."""
    cache_conversations: int | None = field(default=None, kw_only=True)
    """``cache_conversations = N``: how many conversations the engine keeps a prompt cache of for
    a model at once, its slots and any host-memory cache together (docs/behaviour.md §5.3.1);
    ``None``: what the engine states, else learnt."""

    def kind_of(self, facade: EngineProfile) -> EngineProfile:
        """The profile this node is spoken to with behind ``facade``."""
        return facade if self.kind is None else ENGINES[self.kind]

    def speaks(self, facade: EngineProfile, path: str) -> bool:
        """Whether a request for ``path`` behind ``facade`` is sent to this node as it is (§11.3):
        always for a node of the facade's own kind (every route it passes through), else when the
        node's kind serves the route itself."""
        if self.kind is None or self.kind == facade.name:
            return not facade.lacks(path)  # §17.3: a route its engine may lack is translated
        return ENGINES[self.kind].speaks(path)

    @property
    def public_url(self) -> str:
        """The URL without userinfo: what requests are sent to, and what may be shown."""
        return public_url(self.url)

    @property
    def authorization(self) -> bytes | None:
        """The ``Authorization`` value every request to this node carries, or None (docs/behaviour.md §3):
        ``Bearer <api_key>``, else ``Basic`` from the URL's userinfo."""
        if self.api_key:
            return b"Bearer " + self.api_key.encode("utf-8")
        return _basic(self.url)


@functools.lru_cache(maxsize=256)
def _basic(url: str) -> bytes | None:
    """``Basic`` from ``url``'s userinfo, or None: worked out once per URL (every request to
    the node asks)."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return b"Basic " + base64.b64encode(pair)


def public_url(url: str) -> str:
    """``url`` without its userinfo (``user:pass@``), for sending and showing."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{tail}"


class NodesFileError(Exception):
    """The nodes file cannot be read or is invalid; the message is one clear line."""


def validate_url(url: str) -> None:
    """Raise :class:`ValueError` unless ``url`` is an http(s) base URL with a host, whatever the
    source (flag, file, control channel, discovery; docs/behaviour.md §14.3). Spaces and control
    characters are refused (``urlsplit`` would silently drop a tab or newline)."""
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError:
        raise ValueError("must be an http or https URL with a host") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http or https URL with a host")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")


_NODE_KEYS = (
    frozenset(
        {
            "id",
            "url",
            "models",
            "slots",
            "api_key",
            "cordon",
            "kind",
            "facades",
            "speed",
            "slots_reserved",
            "models_max",
            "cache_conversations",
        }
    )
    | TLS_KEYS
)


@frozen
class NodesDocument:
    """What a nodes file says to one facade: its nodes and the model catalogue (§11.4)."""

    nodes: list[Node]
    catalogue: Catalogue


def load_nodes_file(path: str, engine: str) -> list[Node]:
    """Read a TOML nodes file and return the nodes that have a URL for ``engine``.

    Every node is validated, including those of other engines (format: see the module docstring).
    """
    return load_nodes_document(path, engine).nodes


def load_nodes_document(path: str, engine: str) -> NodesDocument:
    """Read a TOML nodes file: the nodes with a URL for ``engine``, and its catalogue."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_NODES_FILE_BYTES + 1)
    except OSError as error:
        raise NodesFileError(f"nodes file {path}: cannot read: {error.strerror}") from None
    if len(raw) > MAX_NODES_FILE_BYTES:
        raise NodesFileError(f"nodes file {path}: larger than {MAX_NODES_FILE_BYTES} bytes")
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise NodesFileError(f"nodes file {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise NodesFileError(f"nodes file {path}: invalid TOML: {error}") from None
    nodes = _parse_document(path, document, engine)
    try:
        catalogue = parse_catalogue(f"nodes file {path}", document.get("model"))
    except CatalogueError as error:
        raise NodesFileError(str(error)) from None
    return NodesDocument(nodes, catalogue)


def _parse_document(path: str, document: dict[str, Any], engine: str) -> list[Node]:
    base_dir = os.path.dirname(os.path.abspath(path))
    unknown = sorted(set(document) - {"node", "model"})
    if unknown:
        hint = did_you_mean(unknown[0], ("node", "model"))
        raise NodesFileError(f"nodes file {path}: unknown top-level key {unknown[0]!r}{hint}")
    entries = document.get("node", [])
    if not isinstance(entries, list):
        raise NodesFileError(f"nodes file {path}: 'node' must be an array of tables ([[node]])")
    nodes: list[Node] = []
    seen: set[str] = set()
    tls_at: dict[tuple[str, int], tuple[str, NodeTLS | None]] = {}
    for index, entry in enumerate(entries, start=1):
        where = f"nodes file {path}: node {index}"
        if not isinstance(entry, dict):
            raise NodesFileError(f"{where}: must be a table")
        node_id = entry.get("id")
        if not isinstance(node_id, str) or not node_id.strip():
            raise NodesFileError(f"{where}: id: required, a non-empty string")
        where = f"{where} (id {node_id!r})"
        if node_id in seen:
            raise NodesFileError(f"{where}: id: duplicate")
        seen.add(node_id)
        unknown = sorted(set(entry) - _NODE_KEYS)
        if unknown:
            hint = did_you_mean(unknown[0], _NODE_KEYS)
            raise NodesFileError(f"{where}: unknown field {unknown[0]!r}{hint}")
        urls = _parse_urls(where, entry.get("url"))
        models = _parse_models(where, entry.get("models"))
        tls = _parse_tls(where, entry, base_dir, urls.values())
        api_key = _parse_api_key(where, entry.get("api_key"))
        _check_shared_tls(where, node_id, tls, urls.values(), tls_at)
        slots = _parse_slots(where, entry.get("slots"))
        speed = _parse_speed(where, entry.get("speed"))
        models_max = _parse_models_max(where, entry.get("models_max"))
        reserved = _parse_reserved(where, entry.get("slots_reserved"), slots)
        cache = _parse_cache(where, entry.get("cache_conversations"))
        cordon = _parse_cordon(where, entry.get("cordon", False))
        kind, facades = _parse_kind(where, entry, urls)
        url = urls.get(engine, urls.get("*"))
        if url is not None and (facades is None or engine in facades):
            nodes.append(
                Node(
                    id=node_id,
                    url=url,
                    models=models,
                    source="file",
                    slots=slots,
                    tls=tls,
                    api_key=api_key,
                    cordon=cordon,
                    kind=kind,
                    speed=speed,
                    models_max=models_max,
                    slots_reserved=reserved,
                    cache_conversations=cache,
                )
            )
    return nodes


def _parse_kind(
    where: str, entry: dict[str, Any], urls: dict[str, str]
) -> tuple[str | None, frozenset[str] | None]:
    """A node's ``kind`` and ``facades`` (§11.1): a kind is one engine at one URL."""
    kind = entry.get("kind")
    facades = entry.get("facades")
    if kind is None:
        if facades is not None:
            raise NodesFileError(f"{where}: facades: needs a kind")
        return None, None
    if not isinstance(kind, str) or kind not in ENGINES:
        hint = did_you_mean(kind, ENGINES) if isinstance(kind, str) else ""
        raise NodesFileError(
            f"{where}: kind: one of {', '.join(sorted(ENGINES))}, not {kind!r}{hint}"
        )
    if set(urls) != {"*"}:
        raise NodesFileError(f"{where}: url: a node with a kind has one URL (a string)")
    if facades is None:
        return kind, None
    if (
        not isinstance(facades, list)
        or not facades
        or not all(isinstance(f, str) and f in ENGINES for f in facades)
    ):
        wrong = (
            [f for f in facades if isinstance(f, str) and f not in ENGINES]
            if isinstance(facades, list)
            else []
        )
        hint = did_you_mean(wrong[0], ENGINES) if wrong else ""
        raise NodesFileError(
            f"{where}: facades: a non-empty list of {', '.join(sorted(ENGINES))}{hint}"
        )
    return kind, frozenset(facades)


def _parse_api_key(where: str, api_key: Any) -> str | None:
    """A node's ``api_key``: absent, or a non-empty single-line string (stripped)."""
    if api_key is not None and (
        not isinstance(api_key, str) or not api_key.strip() or not api_key.isprintable()
    ):
        raise NodesFileError(f"{where}: api_key: must be a non-empty single-line string")
    return api_key.strip() if api_key is not None else None


def _check_shared_tls(
    where: str,
    node_id: str,
    tls: NodeTLS | None,
    urls: Collection[str],
    tls_at: dict[tuple[str, int], tuple[str, NodeTLS | None]],
) -> None:
    """Record the node's https addresses in ``tls_at``; two nodes at one address need equal TLS."""
    for address in filter(None, map(https_address, urls)):
        other = tls_at.setdefault(address, (node_id, tls))
        if other != (node_id, tls) and other[1] != tls:
            raise NodesFileError(
                f"{where}: https://{_netloc(address)} is also node {other[0]!r}'s address,"
                " with different TLS settings (ca_file, fingerprint, insecure); make them equal"
            )


def _parse_tls(
    where: str, entry: dict[str, Any], base_dir: str, urls: Collection[str]
) -> NodeTLS | None:
    try:
        tls = parse_node_tls(entry, base_dir)
    except ValueError as error:
        raise NodesFileError(f"{where}: {error}") from None
    if tls is not None and not any(https_address(url) for url in urls):
        field_name = sorted(TLS_KEYS & set(entry))[0]
        raise NodesFileError(
            f"{where}: {field_name}: applies to https URLs, and this node has none"
        )
    return tls


def _netloc(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_urls(where: str, value: object) -> dict[str, str]:
    if isinstance(value, str):
        urls = {"*": value}
    elif isinstance(value, dict):
        urls = {}
        for name, url in value.items():
            if name not in ENGINES:
                known = ", ".join(sorted(ENGINES))
                hint = did_you_mean(name, ENGINES) or f" (known: {known})"
                raise NodesFileError(f"{where}: url.{name}: unknown engine{hint}")
            if not isinstance(url, str):
                raise NodesFileError(f"{where}: url.{name}: must be a string")
            urls[name] = url
        if not urls:
            raise NodesFileError(f"{where}: url: names no engine")
    elif value is None:
        raise NodesFileError(f"{where}: url: required (a string or a table of engine = URL)")
    else:
        raise NodesFileError(f"{where}: url: must be a string or a table of engine = URL")
    for name, url in urls.items():
        label = "url" if name == "*" else f"url.{name}"
        try:
            validate_url(url)
        except ValueError as error:
            raise NodesFileError(f"{where}: {label}: {error}") from None
    return urls


def _parse_models(where: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) and m.strip() for m in value):
        raise NodesFileError(f"{where}: models: must be a list of non-empty strings")
    return tuple(value)


def _parse_slots(where: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NodesFileError(f"{where}: slots: must be a whole number >= 0 (0 = unlimited)")
    return value


def _parse_reserved(where: str, value: object, slots: int | None) -> int:
    """``slots_reserved``: a whole number below the node's own ``slots`` (§16.3)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NodesFileError(f"{where}: slots_reserved: must be a whole number >= 0")
    if value and (slots is None or not value < slots):
        raise NodesFileError(
            f"{where}: slots_reserved: must be below the node's slots (set slots = N > {value}"
            " on this node; unlimited slots queue nothing, so nothing is kept)"
        )
    return value


def _parse_speed(where: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise NodesFileError(f"{where}: speed: must be a number > 0 (relative to 1.0)")
    return float(value)


def _parse_cordon(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise NodesFileError(f"{where}: cordon: must be true or false")
    return value


def _parse_cache(where: str, value: object) -> int | None:
    """``cache_conversations``: a whole number >= 0 (§5.3.1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NodesFileError(
            f"{where}: cache_conversations: must be a whole number >= 0"
            " (0 = the engine keeps no prompt cache)"
        )
    return value


def _parse_models_max(where: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NodesFileError(f"{where}: models_max: must be a whole number >= 0 (0 = no limit)")
    return value


_LOOPBACK = "<loopback>"


def url_key(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` for comparing URLs; every loopback or wildcard host is one host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not host:
        return None
    if host == "localhost":
        host = _LOOPBACK
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            if address.is_loopback or address.is_unspecified:
                host = _LOOPBACK
    if port is None:
        port = 443 if scheme == "https" else 80
    return (scheme, host, port)


_FileSignature = tuple[int, int] | None


def _defaults(engine: EngineProfile) -> tuple[Node, ...]:
    """The nodes a facade uses when no source names one (§11.2 for the ``openai`` facade)."""
    if not engine.default_kinds:
        return (Node(id="default", url=engine.default_node_url, source="default"),)
    return tuple(
        Node(id=kind, url=ENGINES[kind].default_node_url, source="default", kind=kind)
        for kind in engine.default_kinds
    )


def _as_nodes(nodes: Sequence[Node]) -> tuple[Node, ...]:
    return tuple(nodes)


def what_changed(before: NodesDocument, after: NodesDocument) -> str:
    """What a reload of the nodes file changed, in a few words (docs/operations.md): the nodes
    added, removed and changed, by id, a changed one with the names of its changed fields (never
    a value: no key, no userinfo), and the model catalogue's public names; ``no change``."""
    old = {n.id: n for n in before.nodes}
    new = {n.id: n for n in after.nodes}
    parts = _listed(
        ("added", sorted(new.keys() - old.keys())), ("removed", sorted(old.keys() - new.keys()))
    )
    changed = [
        f"{i} ({', '.join(names)})"
        for i in sorted(old.keys() & new.keys())
        if (names := _changed_fields(old[i], new[i]))
    ]
    parts += _listed(("changed", changed))
    models = _catalogue_change(before.catalogue, after.catalogue)
    if models:
        parts.append("models " + ", ".join(models))
    return "; ".join(parts) or "no change"


def _listed(*groups: tuple[str, list[str]]) -> list[str]:
    return [f"{what} {', '.join(items)}" for what, items in groups if items]


def _changed_fields(old: Node, new: Node) -> list[str]:
    """The names of the fields that differ (``url credentials`` when only the userinfo did)."""
    names = [a.name for a in fields(Node) if getattr(old, a.name) != getattr(new, a.name)]
    if "url" in names and public_url(old.url) == public_url(new.url):
        names[names.index("url")] = "url credentials"
    return names


def _catalogue_change(before: Catalogue, after: Catalogue) -> list[str]:
    """The ``[[model]]`` public names added, removed and changed (names or policy)."""

    def tables(catalogue: Catalogue) -> dict[str, object]:
        publics = {m.public: m for m in catalogue.by_name.values()}
        policies = {p: asdict(policy) for p, policy in catalogue.policies.items()}  # eq=False
        return {p: (publics.get(p), policies.get(p)) for p in {*publics, *policies}}

    old, new = tables(before), tables(after)
    changed = sorted(p for p in old.keys() & new.keys() if old[p] != new[p])
    return _listed(
        ("added", sorted(new.keys() - old.keys())),
        ("removed", sorted(old.keys() - new.keys())),
        ("changed", changed),
    )


@define
class NodesFileWatcher:
    """Watches a nodes file: checks it every ``interval`` seconds by modification time and size,
    and hands every good read to ``apply``, logging what it changed; a bad one is logged and the
    previous nodes kept."""

    _path: str
    _engine: str
    _clock: IReactorTime
    _apply: Callable[[NodesDocument], None]
    _log: Logger
    _interval: float = field(default=2.0, kw_only=True)
    _signature: _FileSignature = field(default=None, init=False)
    _watcher: LoopingCall | None = field(default=None, init=False)
    _last: NodesDocument | None = field(default=None, init=False)

    def reload(self) -> bool:
        """Re-read the file now; True when it was read, False (old set kept) when not."""
        self._signature = self._stat()
        try:
            document = load_nodes_document(self._path, self._engine)
        except NodesFileError as error:
            self._log.warn("keeping the previous nodes: {why}", why=str(error))
            return False
        if self._last is not None:
            self._log.info(
                "nodes file {path} reloaded for the {engine} facade: {changes}",
                path=self._path,
                engine=self._engine,
                changes=what_changed(self._last, document),
            )
        self._last = document
        self._apply(document)
        return True

    def start(self) -> None:
        """Load the file (a bad file raises :class:`NodesFileError`) and watch it."""
        if self._watcher is not None:
            return
        self._signature = self._stat()
        self._last = load_nodes_document(self._path, self._engine)
        self._apply(self._last)
        watcher = LoopingCall(self._check)
        watcher.clock = self._clock
        watcher.start(self._interval, now=False).addErrback(
            lambda failure: self._log.failure("nodes file watcher failed", failure)
        )
        self._watcher = watcher

    def stop(self) -> None:
        """Stop watching."""
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.stop()

    def _stat(self) -> _FileSignature:
        try:
            status = os.stat(self._path)
        except OSError:
            return None
        return (status.st_mtime_ns, status.st_size)

    def _check(self) -> None:
        if self._stat() != self._signature:
            self.reload()


@define
class NodeDirectory:
    """The nodes one facade may use: flags, the TOML file (watched by a :class:`NodesFileWatcher`),
    manual (control channel), discovery, default.

    When one id comes from several sources, manual beats discovery beats file beats flag.
    Subscribers are called after every change of the merged view.
    """

    log = LevelledLogger(namespace=__name__)

    _engine: EngineProfile
    _clock: IReactorTime
    _flag_nodes: tuple[Node, ...] = field(default=(), converter=_as_nodes, kw_only=True)
    _nodes_file: str | None = field(default=None, kw_only=True)
    _watch_interval: float = field(default=2.0, kw_only=True)
    _file_nodes: tuple[Node, ...] = field(default=(), init=False)
    catalogue: Catalogue = field(factory=Catalogue.empty, init=False)
    """The nodes file's ``[[model]]`` names (§11.4); empty without a file or tables. Read on
    every request (an attribute, not a property); only the nodes file changes it."""
    _manual: dict[str, Node] = field(factory=dict, init=False)
    _discovered: tuple[Node, ...] = field(default=(), init=False)
    _excluded: frozenset[tuple[str, str, int]] = field(default=frozenset(), init=False)
    _view: tuple[Node, ...] = field(default=(), init=False)
    _by_id: dict[str, Node] = field(factory=dict, init=False)
    _warned: set[tuple[str, str]] = field(factory=set, init=False)
    _warned_insecure: set[tuple[str, str]] = field(factory=set, init=False)
    _subscribers: list[Callable[[], None]] = field(factory=list, init=False)
    _file: NodesFileWatcher | None = field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        if self._nodes_file is not None:
            self._file = NodesFileWatcher(
                self._nodes_file,
                self._engine.name,
                self._clock,
                self._set_file_nodes,
                self.log,
                interval=self._watch_interval,
            )
        self._recompute()  # nobody has subscribed yet

    def nodes(self) -> tuple[Node, ...]:
        """The merged nodes, sorted by id (the default node only when no source has any)."""
        return self._view

    def get(self, node_id: str) -> Node | None:
        """The merged node with this id, if any."""
        return self._by_id.get(node_id)

    def add_manual(self, node: Node) -> bool:
        """Add or replace a manual node; True when added or changed."""
        node = evolve(node, source="manual")
        if self._manual.get(node.id) == node:
            return False
        self._manual[node.id] = node
        self._recompute()
        return True

    def remove_manual(self, node_id: str) -> bool:
        """Remove a manual node; True when it existed."""
        if self._manual.pop(node_id, None) is None:
            return False
        self._recompute()
        return True

    def set_discovered(self, nodes: Sequence[Node]) -> None:
        """Replace the discovered set with a new snapshot."""
        self._discovered = tuple(evolve(n, source="discovery") for n in nodes)
        self._recompute()

    def exclude_urls(self, urls: Collection[str]) -> None:
        """Never use a node at one of these URLs (this proxy's own listeners)."""
        self._excluded = frozenset(k for k in map(url_key, urls) if k is not None)
        self._recompute()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after every change of the merged view; returns the unsubscriber."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def reload_file(self) -> bool:
        """Re-read the nodes file now; True when it was read, False (old set kept) when not."""
        return self._file is not None and self._file.reload()

    def start(self) -> None:
        """Load the nodes file (a bad file raises :class:`NodesFileError`) and watch it."""
        if self._file is not None:
            self._file.start()

    def stop(self) -> None:
        """Stop watching the nodes file."""
        if self._file is not None:
            self._file.stop()

    def _set_file_nodes(self, document: NodesDocument) -> None:
        self.catalogue = document.catalogue
        nodes = document.nodes
        for node in nodes:
            insecure = node.tls is not None and node.tls.insecure
            if insecure and (node.id, node.url) not in self._warned_insecure:
                self._warned_insecure.add((node.id, node.url))
                self.log.warn(
                    "node {node} ({url}): TLS certificate verification is disabled"
                    " (insecure = true in the nodes file)",
                    node=node.id,
                    url=node.public_url,
                    engine=self._engine.name,
                )
        self._file_nodes = tuple(nodes)
        self._recompute()

    def _recompute(self) -> None:
        merged: dict[str, Node] = {}
        for source in (self._flag_nodes, self._file_nodes, self._discovered, self._manual.values()):
            for node in source:
                merged[node.id] = node
        if not merged:
            for default in _defaults(self._engine):
                merged[default.id] = default
        kept: list[Node] = []
        for node in merged.values():
            if url_key(node.url) in self._excluded:
                if (node.id, node.url) not in self._warned:
                    self._warned.add((node.id, node.url))
                    self.log.warn(
                        "ignoring node {node} ({source}): its URL is this proxy's own listener",
                        node=node.id,
                        source=node.source,
                        engine=self._engine.name,
                    )
                continue
            kept.append(node)
        view = tuple(sorted(kept, key=lambda n: n.id))
        if view == self._view:
            return
        self._view = view
        self._by_id = {n.id: n for n in view}
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception:
                self.log.failure("a node-set subscriber failed", engine=self._engine.name)
