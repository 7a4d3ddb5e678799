# -*- test-case-name: tests.test_tap,tests.test_tap_command -*-
"""``twistd nvpair``: command-line options and ``makeService``, the only user of the global reactor.

``Options`` turns the command line and the environment into a :class:`~nvpair_tw.app._config.Config`
and has no other effect; ``makeService`` applies it (the log level) and assembles the services.
A mistake in an option or in a file an option names is one line that names it, with the closest
valid name where there is one; under twistd that line is all that is printed (exit status 2).
``twistd nvpair --help`` shows the options in groups, two examples first.
"""

from __future__ import annotations

import getopt
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NoReturn, cast
from urllib.parse import urlsplit

from attrs import evolve
from twisted.application import service
from twisted.internet.endpoints import serverFromString
from twisted.logger import LogLevel
from twisted.python import usage

from nvpair_tw import __version__
from nvpair_tw.app import Config, assemble
from nvpair_tw.core import (
    BILLING_BLOCKS,
    ENGINES,
    UPSTREAM_CLIENTS,
    IProxyReactor,
    Least,
    Resolved,
    Settings,
    did_you_mean,
    read_duration,
    resolve_first_body_timeout,
    resolve_response_header_timeout,
)
from nvpair_tw.fleet import StateConfig, parse_state_url, read_secret
from nvpair_tw.inbound import IngressConfigError, KeysFileError, parse_ingress, parse_origin
from nvpair_tw.logs import LevelledLogger, parse_level, set_level
from nvpair_tw.nodes import Node, NodesFileError, load_nodes_file, public_url, validate_url
from nvpair_tw.ops import ControlToken, needs_token, read_control_token
from nvpair_tw.runtime import owner_only, steady_collector, tcp_listener

__all__ = ["Options", "makeService", "parse_size"]

log = LevelledLogger()

DEMO_RESPONSE_HEADER_TIMEOUT = 5.0

_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(text: str) -> int:
    """Bytes from ``33554432``, ``32MiB``, ``32m``, ``1g`` (binary for bare letters)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"invalid size {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]


def _one_of(what: str, given: str, choices: Iterable[str]) -> str:
    """``unknown engine 'olama'; did you mean 'ollama'?``, or the whole list when none is close."""
    names = sorted(choices)
    hint = did_you_mean(given, names) or f"; choose from {', '.join(names)}"
    return f"unknown {what} {given!r}{hint}"


def parse_node(text: str) -> tuple[str | None, Node]:
    """``ID=URL`` (every engine) or ``ENGINE:ID=URL`` (one engine)."""
    left, sep, url = text.partition("=")
    if not sep or not left.strip() or not url.strip():
        raise usage.UsageError(f"--node wants ID=URL or ENGINE:ID=URL, not {text!r}")
    engine: str | None = None
    prefix, colon, rest = left.partition(":")
    if colon and prefix in ENGINES:
        engine, left = prefix, rest
    if not left.strip():
        raise usage.UsageError(f"--node wants ID=URL or ENGINE:ID=URL, not {text!r}")
    url = url.strip()
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    try:
        validate_url(url)
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port in (-1, 0):
        raise usage.UsageError(
            f"--node {left}: URL must be http(s)://HOST[:PORT] with a port 1-65535,"
            f" not {public_url(url)!r}"
        )
    return engine, Node(id=left.strip(), url=url.rstrip("/"), source="flag")


MAX_KEY_FILE_BYTES = 64 << 10


def read_key_file(text: str) -> tuple[str, str]:
    """``ID=PATH`` of ``--node-key-file``: the node id and the key read from PATH (first line,
    surrounding whitespace trimmed). Errors name the file, never its content."""
    node_id, sep, path = text.partition("=")
    if not sep or not node_id.strip() or not path.strip():
        raise usage.UsageError(f"--node-key-file wants ID=PATH, not {text!r}")
    node_id, path = node_id.strip(), path.strip()
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise usage.UsageError(
            f"--node-key-file {node_id}: cannot read {path}: {error.strerror}"
        ) from None
    try:
        lines = raw.decode("utf-8").strip().splitlines()
    except UnicodeDecodeError:
        lines = []
    key = lines[0].strip() if lines else ""
    if len(raw) > MAX_KEY_FILE_BYTES or not key or not key.isprintable():
        raise usage.UsageError(
            f"--node-key-file {node_id}: {path} must hold the key on its first line"
        )
    return node_id, key


def parse_node_slots(text: str) -> tuple[str | None, str, int]:
    """``ID=N`` (that ``--node`` under every engine) or ``ENGINE:ID=N`` (one engine)."""
    left, sep, count = text.rpartition("=")
    engine: str | None = None
    prefix, colon, rest = left.partition(":")
    if colon and prefix in ENGINES:
        engine, left = prefix, rest
    try:
        slots = int(count.strip())
    except ValueError:
        slots = -1
    if not sep or not left.strip() or slots < 0:
        raise usage.UsageError(
            f"--node-slots wants ID=N or ENGINE:ID=N with N >= 0 (0 = unlimited), not {text!r}"
        )
    return engine, left.strip(), slots


def _with_slots(
    engine: str, nodes: list[Node], given: list[tuple[str | None, str, int]]
) -> tuple[Node, ...]:
    """The flag nodes of ``engine`` with their ``--node-slots`` (the engine-scoped one wins)."""
    chosen: dict[str, int] = {}
    for scope in (None, engine):
        chosen.update({node_id: n for s, node_id, n in given if s == scope})
    return tuple(evolve(n, slots=chosen[n.id]) if n.id in chosen else n for n in nodes)


_PARAMETERS: list[list[str | None]] = [
    ["nodes", None, None, "TOML file of nodes (reloaded when it changes)."],
    [
        "keys",
        None,
        None,
        "TOML file of named API keys with model scopes and rate limits (mode 0600, reloaded "
        "when it changes).",
    ],
    ["connect-timeout", None, "10s", "Dial timeout per attempt."],
    [
        "response-header-timeout",
        None,
        None,
        "Deadline for response headers after the request is written; a stall cools the node "
        "for this long. [env NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT, default 120s]",
    ],
    [
        "first-body-timeout",
        None,
        None,
        "Opt-in deadline for the first body byte after headers (inference); 0 disables. "
        "[env NVPAIR_PROXY_FIRST_BODY_TIMEOUT, default 0]",
    ],
    ["max-body-size", None, "32MiB", "Largest request body accepted (413 beyond)."],
    ["inventory-interval", None, "10s", "How often each node's model list is polled."],
    [
        "affinity-max-entries",
        None,
        "10000",
        "Prefix-affinity table size per facade, and sessions kept per key.",
    ],
    ["affinity-ttl", None, "5m", "Idle time after which an affinity entry is forgotten."],
    ["session-ttl", None, "1h", "Idle time after which a client's session is forgotten."],
    [
        "session-header",
        None,
        None,
        "A header of your own that names a session, read before X-Session-Id and the agents' "
        "own (docs/affinity.md).",
    ],
    [
        "billing-block",
        None,
        "remove",
        "Claude Code's x-anthropic-billing-header system block: remove it from what nodes "
        "receive (it defeats their prefix cache), or keep it.",
    ],
    ["write-stall-timeout", None, "30s", "Drop a client that accepts no bytes this long."],
    ["max-connections", None, "256", "Open client connections per facade (503 beyond)."],
    [
        "max-connections-per-source",
        None,
        "64",
        "Open connections per remote address (IPv6: per /64) on each facade (503 beyond); "
        "loopback shares --max-connections only.",
    ],
    ["max-tunnels", None, "64", "Open WebSocket tunnels, process-wide (503 beyond)."],
    [
        "control",
        None,
        None,
        "JSON-RPC control channel endpoint (e.g. unix:/run/nvpair/ctl.sock, stdio); a unix"
        " socket is created mode 0600 unless it gives :mode=660 or another; every other"
        " endpoint (tcp:...) needs --control-token.",
    ],
    [
        "control-token",
        None,
        None,
        "File (mode 0600) whose first line is the control channel's token; each control"
        " connection then opens with auth {token}.",
    ],
    [
        "admin",
        None,
        "tcp:9180:interface=127.0.0.1",
        "Admin listener (metrics, status); none disables.",
    ],
    ["shutdown-grace", None, "10s", "On SIGTERM, how long in-flight streams may finish."],
    [
        "default-slots",
        None,
        "0",
        "Requests a node runs at once unless it sets slots; 0 = unlimited.",
    ],
    ["queue-size", None, "256", "Inference requests that may wait for a free slot per facade."],
    ["queue-timeout", None, "10m", "How long a request may wait for a free slot."],
    [
        "batch-max-wait",
        None,
        "2m",
        "How long a batch request waits behind interactive ones; then it is served as one.",
    ],
    [
        "busy-max-wait",
        None,
        "30m",
        "Longest header wait extended while the node shows progress.",
    ],
    [
        "load-timeout",
        None,
        None,
        "Added to the first deadline on a node known not to have the model loaded "
        "[default: the response-header timeout].",
    ],
    [
        "state",
        None,
        None,
        "Share cooldowns, affinity and reservations with other proxies through Redis or "
        "Valkey: redis://[:PASSWORD@]HOST:PORT/DB.",
    ],
    ["state-password-file", None, None, "File holding the --state store's password."],
    [
        "state-secret-file",
        None,
        None,
        "File holding a secret: affinity digests go to the store as HMAC-SHA-256 under it.",
    ],
    [
        "upstream-client",
        None,
        "native",
        "HTTP client for requests to nodes: native (coalescing keep-alive client) or twisted "
        "(Twisted's Agent and connection pool).",
    ],
    [
        "otlp-endpoint",
        None,
        None,
        "Export one span per request over OTLP/HTTP to this collector URL (http://HOST:4318, or "
        "the full /v1/traces URL); off by default. Needs the traces extra.",
    ],
    [
        "usage-db",
        None,
        "nvpair-usage.sqlite3",
        "SQLite file of the usage history (requests and tokens per minute by key, model and "
        "node); none keeps usage in memory only.",
    ],
    [
        "usage-retention",
        None,
        "90d",
        "How long usage minutes are kept (a duration such as 2160h, or days such as 90d).",
    ],
    ["log-level", None, "info", "debug, info, warn or error."],
]


class Options(usage.Options):
    """Options of ``twistd nvpair``."""

    synopsis = "--engine NAME [--engine NAME]... [options]"
    longdesc = (
        "A reverse proxy that makes several machines running a local LLM engine look like one, "
        "and fails over past nodes that stall."
    )
    optFlags = [
        [
            "demo",
            None,
            "Start two simulated Ollama nodes in-process: demo-fast (50 tokens/s, stuck 12 s from"
            " its first request) and demo-slow (12 tokens/s).",
        ]
    ]
    optParameters = _PARAMETERS

    config: Config
    """What ``postOptions`` resolved; the only thing parsing produces."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._environ = environ
        self["engines"] = []
        self["listen"] = {}
        self["node"] = []
        self["node-key"] = {}
        self["node-slots"] = []
        self["node-kind"] = {}
        self["assemble"] = {}
        self["cors-origin"] = []
        self["allow-host"] = []

    def opt_engine(self, name: str) -> None:
        """Engine facade to serve: ollama, lmstudio, omlx or openai (repeatable)."""
        if name not in ENGINES:
            raise usage.UsageError(f"--engine: {_one_of('engine', name, ENGINES)}")
        if name not in self["engines"]:
            self["engines"].append(name)

    opt_e = opt_engine

    def opt_listen(self, description: str) -> None:
        """Listener endpoint (Twisted endpoint string); ENGINE=ENDPOINT with several engines."""
        engine, sep, rest = description.partition("=")
        if sep and engine in ENGINES:
            self["listen"][engine] = rest
        else:
            self["listen"][None] = description

    def opt_node(self, text: str) -> None:
        """A node: ID=URL for every engine, or ENGINE:ID=URL (repeatable)."""
        self["node"].append(parse_node(text))

    def opt_node_kind(self, text: str) -> None:
        """ID=KIND: the engine --node ID runs (ollama, lmstudio, omlx, openai); it then stands
        behind every facade (repeatable)."""
        node_id, sep, kind = text.partition("=")
        if not sep or not node_id.strip():
            raise usage.UsageError(
                f"--node-kind wants ID=KIND with KIND one of {', '.join(sorted(ENGINES))},"
                f" not {text!r}"
            )
        if kind.strip() not in ENGINES:
            raise usage.UsageError(
                f"--node-kind {node_id.strip()}: {_one_of('kind', kind.strip(), ENGINES)}"
            )
        self["node-kind"][node_id.strip()] = kind.strip()

    def opt_node_key_file(self, text: str) -> None:
        """ID=PATH: send the key in PATH as Authorization: Bearer to --node ID only (repeatable)."""
        node_id, key = read_key_file(text)
        self["node-key"][node_id] = key

    def opt_cors_origin(self, text: str) -> None:
        """A browser origin allowed to call the facades (scheme://host[:port]; repeatable; off by default)."""
        try:
            self["cors-origin"].append(parse_origin(text))
        except ValueError as error:
            raise usage.UsageError(f"--cors-origin: {error}") from None

    def opt_allow_host(self, name: str) -> None:
        """A host name local callers may use in Host besides localhost, IP literals and this
        machine's name (docs/behaviour.md §14.2; repeatable)."""
        self["allow-host"].append(name)

    def opt_node_slots(self, text: str) -> None:
        """Slots of a --node: ID=N or ENGINE:ID=N, 0 = unlimited (repeatable)."""
        self["node-slots"].append(parse_node_slots(text))

    def opt_assemble(self, text: str) -> None:
        """on|off, or ENGINE=on|off: assemble non-streaming answers from a streamed upstream."""
        engine, sep, value = text.rpartition("=")
        if value not in ("on", "off") or (sep and engine not in ENGINES):
            raise usage.UsageError(f"--assemble wants on, off or ENGINE=on|off, not {text!r}")
        self["assemble"][engine if sep else None] = value == "on"

    def opt_version(self) -> None:
        """Print the nvpair-tw version and exit."""
        print(f"nvpair-tw {__version__.public()}")
        raise SystemExit(0)

    def parseOptions(self, options: Sequence[str] | None = None) -> None:
        """Parse ``options`` (``sys.argv[1:]`` when None) into ``self.config``.

        A mistake is a :class:`~twisted.python.usage.UsageError` of one line naming the option or
        the file. As a sub-command of ``twistd`` or ``twist`` (which set ``parent`` before they
        parse it) that line goes to stderr alone, and the process exits with status 2: those
        runners would print the whole help first and the line last.
        """
        given = list(sys.argv[1:] if options is None else options)
        try:
            super().parseOptions(given)
        except usage.UsageError as error:
            line = _getopt_mistake(self, given) or str(error)
            if getattr(self, "parent", None) is None:
                raise usage.UsageError(line) from None
            refuse(line)

    def parseArgs(self, *args: str) -> None:
        """Words that are not options are refused by name (twistd's options go before ``nvpair``)."""
        if args:
            raise usage.UsageError(
                f"unexpected argument {args[0]!r}: every option starts with -- "
                "(twistd nvpair --help lists them)"
            )

    def getUsage(self, width: int | None = None) -> str:
        """The description, two examples, then every option in its group (``_GROUPS``)."""
        return usage_text(self, width or int(os.environ.get("COLUMNS", "80")))

    def postOptions(self) -> None:
        """Resolve and validate everything into ``self.config``; nothing else happens."""
        self.config = _resolve(self, os.environ if self._environ is None else self._environ)


def _resolve(options: Options, environ: Mapping[str, str]) -> Config:
    """Everything ``options`` and ``environ`` say, checked, as one value (a ``UsageError`` of one
    line naming the option, variable or file otherwise)."""
    engines: list[str] = options["engines"]
    if not engines:
        raise usage.UsageError(
            "at least one --engine is required: ollama, lmstudio, omlx or openai"
            " (e.g. --engine ollama)"
        )
    listen, admin, control = _endpoints(options, engines)
    try:
        header = resolve_response_header_timeout(options["response-header-timeout"], environ)
        if options["demo"] and header.source == "default":
            # The demo's fast node is stuck at first: show the failover, and the stall paid once.
            header = Resolved(DEMO_RESPONSE_HEADER_TIMEOUT, "demo default")
        first = resolve_first_body_timeout(options["first-body-timeout"], environ)
        log_level = _log_level(options["log-level"])
        nodes_file = options["nodes"]
        if nodes_file is not None:
            for engine in engines:
                load_nodes_file(nodes_file, engine)
        ingress = parse_ingress(
            environ, keys_file=options["keys"], allow_hosts=options["allow-host"]
        )
        settings = _settings(options, engines, header.seconds, first.seconds)
        state = _state(options)
        usage_db, usage_retention = _usage(options)
        control_token = _control_token(options["control-token"], control)
    except (ValueError, OSError, NodesFileError, IngressConfigError, KeysFileError) as error:
        raise usage.UsageError(str(error)) from None
    return Config(
        engines=tuple(engines),
        listen=listen,
        nodes=_flag_nodes(options, engines),
        nodes_file=nodes_file,
        settings=settings,
        control=control,
        control_token=control_token,
        admin=admin,
        demo=bool(options["demo"]),
        log_level=log_level,
        sources={
            "response-header-timeout": header.source,
            "first-body-timeout": first.source,
        },
        ingress=ingress,
        state=state,
        usage_db=usage_db,
        usage_retention=usage_retention,
    )


def _with_kinds(
    flag_nodes: list[tuple[str | None, Node]], kinds: Mapping[str, str]
) -> list[tuple[str | None, Node]]:
    """The ``--node`` nodes with their ``--node-kind`` kinds (§11.1): a node with a kind is one
    machine of one engine, so it must be given as ``ID=URL`` (for every facade)."""
    for node_id in kinds:
        scopes = [scope for scope, node in flag_nodes if node.id == node_id]
        if not scopes:
            raise usage.UsageError(f"--node-kind {node_id}: no --node has this id")
        if any(scope is not None for scope in scopes):
            raise usage.UsageError(
                f"--node-kind {node_id}: give that --node as ID=URL (a node with a kind"
                " stands behind every facade)"
            )
    return [
        (scope, evolve(node, kind=kinds[node.id]) if node.id in kinds else node)
        for scope, node in flag_nodes
    ]


def _with_keys(
    flag_nodes: list[tuple[str | None, Node]], keys: Mapping[str, str]
) -> list[tuple[str | None, Node]]:
    """The ``--node`` nodes with their ``--node-key-file`` keys; a key for no ``--node`` is an error."""
    named = {node.id for _, node in flag_nodes}
    for node_id in keys:
        if node_id not in named:
            raise usage.UsageError(f"--node-key-file {node_id}: no --node has this id")
    return [
        (scope, evolve(node, api_key=keys[node.id]) if node.id in keys else node)
        for scope, node in flag_nodes
    ]


def _endpoints(
    options: Options, engines: list[str]
) -> tuple[dict[str, str], str | None, str | None]:
    """Each facade's listener, the admin listener and the control channel, each checked."""
    given: dict[str | None, str] = dict(options["listen"])
    if None in given:
        if len(engines) > 1:
            raise usage.UsageError("with several engines, give --listen as ENGINE=ENDPOINT")
        given[engines[0]] = given.pop(None)
    for engine in given:
        if engine not in engines:
            raise usage.UsageError(f"--listen for {engine}, which is not an --engine")
    listen = {e: given.get(e, ENGINES[e].default_listen) for e in engines}
    admin = options["admin"] if options["admin"] != "none" else None
    control: str | None = options["control"] and owner_only(options["control"])
    for flag, description in [
        *((f"--listen {e}", d) for e, d in listen.items()),
        ("--admin", admin),
        ("--control", control if control != "stdio" else None),
    ]:
        if description is not None:
            _check_endpoint(flag, description)
    return listen, admin, control or None


def _control_token(path: str | None, control: str | None) -> ControlToken | None:
    """The ``--control-token``, read now; a control endpoint that needs one (all but stdio and a
    unix socket, docs/behaviour.md §14.3) without one is a ``ValueError``."""
    if path is None:
        if control is not None and needs_token(control):
            raise ValueError(
                f"--control {control}: a control channel on this endpoint needs"
                " --control-token FILE (only stdio and a unix socket may go without)"
            )
        return None
    if control is None:
        raise ValueError("--control-token is given without --control")
    return read_control_token(path)


def _settings(options: Options, engines: list[str], header: float, first: float) -> Settings:
    """The timers and limits (``ValueError`` naming the option for a bad value)."""
    load_timeout = options["load-timeout"]
    return Settings(
        connect_timeout=_duration(options, "connect-timeout"),
        response_header_timeout=header,
        first_body_timeout=first,
        max_body_size=_count(options, "max-body-size", parse_size),
        write_stall_timeout=_duration(options, "write-stall-timeout"),
        inventory_interval=_duration(options, "inventory-interval"),
        affinity_max_entries=_count(options, "affinity-max-entries", int),
        affinity_ttl=_duration(options, "affinity-ttl"),
        session_ttl=_duration(options, "session-ttl"),
        session_header=_session_header(options["session-header"]),
        billing_block=_billing_block(options["billing-block"]),
        max_connections=_count(options, "max-connections", int),
        max_connections_per_source=_count(options, "max-connections-per-source", int),
        max_tunnels=_count(options, "max-tunnels", int),
        cors_origins=tuple(options["cors-origin"]),
        shutdown_grace=_duration(options, "shutdown-grace", Least.ZERO),
        default_slots=_count(options, "default-slots", int, Least.ZERO),
        queue_size=_count(options, "queue-size", int),
        queue_timeout=_duration(options, "queue-timeout"),
        batch_max_wait=_duration(options, "batch-max-wait", Least.ZERO),
        busy_max_wait=_duration(options, "busy-max-wait", Least.ZERO),
        load_timeout=(
            None if load_timeout is None else _duration(options, "load-timeout", Least.ZERO)
        ),
        assemble=_assemble_by_engine(options["assemble"], engines),
        upstream_client=_upstream_client(options["upstream-client"]),
        otlp_endpoint=_otlp_endpoint(options["otlp-endpoint"]),
    )


def _otlp_endpoint(text: str | None) -> str | None:
    """``--otlp-endpoint``, checked: an http(s) URL, and the OpenTelemetry SDK installed."""
    if text is None:
        return None
    try:
        from nvpair_tw.traces import traces_url
    except ImportError:
        raise ValueError(
            "--otlp-endpoint needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'nvpair-tw[traces]'"
        ) from None
    try:
        traces_url(text)
    except ValueError as error:
        raise ValueError(f"--otlp-endpoint: {error}") from None
    return text.strip()


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header name (RFC 9110 §5.1)."""


def _session_header(name: str | None) -> bytes | None:
    """``--session-header``: a header name, kept in lower case."""
    if name is None:
        return None
    if not _TOKEN.fullmatch(name.strip()):
        raise ValueError(f"--session-header: {name!r} is not a header name (e.g. X-My-Session)")
    return name.strip().lower().encode("ascii")


def _billing_block(value: str) -> str:
    if value not in BILLING_BLOCKS:
        raise ValueError(
            f"--billing-block must be one of {', '.join(BILLING_BLOCKS)}, not {value!r}"
        )
    return value


def _upstream_client(name: str) -> str:
    if name not in UPSTREAM_CLIENTS:
        raise ValueError(
            f"--upstream-client must be one of {', '.join(UPSTREAM_CLIENTS)}, not {name!r}"
        )
    return name


def _flag_nodes(options: Options, engines: list[str]) -> dict[str, tuple[Node, ...]]:
    """Each engine's ``--node`` nodes (unscoped ones under every engine) with their slots and
    ``--node-key-file`` keys."""
    flag_nodes = _with_kinds(_with_keys(options["node"], options["node-key"]), options["node-kind"])
    slots: list[tuple[str | None, str, int]] = options["node-slots"]
    for scope, node_id, _ in slots:
        if scope is not None and scope not in engines:
            raise usage.UsageError(f"--node-slots for {scope}, which is not an --engine")
        if not any(n.id == node_id and s in (None, scope or s) for s, n in flag_nodes):
            where = f"{scope}:{node_id}" if scope else node_id
            raise usage.UsageError(f"--node-slots {where}: no --node {node_id} to apply it to")
    return {
        engine: _with_slots(
            engine, [node for scope, node in flag_nodes if scope in (None, engine)], slots
        )
        for engine in engines
    }


class _ParseOnly:
    """Stands in for the reactor while an endpoint string is parsed: the parsers only store it."""


def _check_endpoint(flag: str, description: str) -> None:
    """Parse a server endpoint string now, so a typo is a usage error and not a traceback later."""
    try:
        serverFromString(_ParseOnly(), description)
        tcp_listener(description)
    except Exception as error:  # parsers raise ValueError, KeyError, OSError (ssl files), ...
        raise usage.UsageError(f"{flag}: not a server endpoint {description!r}: {error}") from None


def _state(options: Options) -> StateConfig | None:
    """``--state`` with its password and secret files; errors never quote the password."""
    url: str | None = options["state"]
    password_file: str | None = options["state-password-file"]
    secret_file: str | None = options["state-secret-file"]
    if url is None:
        if password_file is not None or secret_file is not None:
            raise ValueError("--state-password-file and --state-secret-file need --state")
        return None
    password = _secret("--state-password-file", password_file)
    secret = _secret("--state-secret-file", secret_file)
    return parse_state_url(
        url, password=None if password is None else password.decode(), secret=secret
    )


def _secret(option: str, path: str | None) -> bytes | None:
    """A ``--state-*-file``'s content; a flaw names the option and the file, never the content."""
    if path is None:
        return None
    where = f"{option} {path}"
    try:
        content = read_secret(path)
        if option == "--state-password-file":
            content.decode()
    except OSError as error:
        raise ValueError(f"{where}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where}: the password must be UTF-8 text") from None
    except ValueError:
        raise ValueError(f"{where}: the file is empty") from None
    return content


def _usage(options: Options) -> tuple[str | None, float]:
    """``--usage-db`` (``none``: no file) and ``--usage-retention`` (a positive span)."""
    path: str = options["usage-db"]
    if not path.strip():
        raise ValueError("--usage-db must be a file path or none")
    retention = read_duration("--usage-retention", options["usage-retention"], Least.MINUTE)
    return (None if path.strip() == "none" else path), retention


def _duration(options: Options, name: str, least: Least = Least.ABOVE_ZERO) -> float:
    """A duration option, read by the one rule (``core.read_duration``)."""
    return read_duration(f"--{name}", options[name], least)


def _count(
    options: Options, name: str, parse: Callable[[str], int], least: Least = Least.ABOVE_ZERO
) -> int:
    try:
        value = parse(options[name])
    except ValueError:
        value = -1
    if not least.admits(value):
        raise ValueError(f"--{name}: {options[name]!r} must be a whole number, {least.value}")
    return value


def _log_level(name: str) -> LogLevel:
    try:
        return parse_level(name)
    except ValueError as error:
        raise ValueError(f"--log-level: {error}") from None


def _assemble_by_engine(given: Mapping[str | None, bool], engines: list[str]) -> dict[str, bool]:
    """``--assemble on|off`` applies to every engine; ``ENGINE=on|off`` to one (and wins)."""
    chosen = {engine: given[None] for engine in engines} if None in given else {}
    chosen.update({e: v for e, v in given.items() if e is not None})
    return chosen


def refuse(message: str) -> NoReturn:
    """End ``twistd nvpair`` over a mistake: ``nvpair: MESSAGE`` as one line on stderr, status 2."""
    sys.stderr.write(f"nvpair: {' '.join(message.split())}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def _getopt_mistake(options: usage.Options, given: list[str]) -> str | None:
    """What getopt refused in ``given``, said as one line naming the option (with the closest of
    the plugin's options, or where twistd's own option goes); None when getopt accepts it."""
    try:
        getopt.getopt(given, options.shortOpt, options.longOpt)
    except getopt.GetoptError as error:
        dash = "-" if len(error.opt) == 1 and f"--{error.opt}" not in error.msg else "--"
        flag = f"{dash}{error.opt}"
        if error.msg.endswith("requires argument"):
            return f"{flag} needs a value"
        if error.msg.endswith("must not have an argument"):
            return f"{flag} takes no value"
        if error.msg.endswith("not a unique prefix"):
            starts = sorted(n.rstrip("=") for n in options.longOpt if n.startswith(error.opt))
            return f"{flag} is the start of {', '.join('--' + n for n in starts)}; write one out"
        return f"unknown option {flag}{_unknown_hint(options, error.opt)}"
    return None


def _unknown_hint(options: usage.Options, name: str) -> str:
    """Where twistd's own option goes, else the closest option of the plugin, else --help."""
    parent = getattr(options, "parent", None)
    if parent is not None and {f"{name}=", name} & set(parent.longOpt):
        return ": it is twistd's own option; give it before nvpair"
    names = [n.rstrip("=") for n in options.longOpt]
    return did_you_mean(name, names, "--{}") or " (twistd nvpair --help lists the options)"


_EXAMPLES = (
    (
        "Try it: two simulated nodes behind http://127.0.0.1:11435",
        ("twistd -n --pidfile= nvpair --engine ollama --demo",),
    ),
    (
        "Two Ollama machines behind one address (a stall on one is paid once)",
        (
            "twistd -n --pidfile= nvpair --engine ollama \\",
            "    --node gpu1=http://10.0.0.5:11434 --node gpu2=http://10.0.0.6:11434",
        ),
    ),
)
_GROUPS = (
    (
        "Facades",
        (
            "engine",
            "listen",
            "assemble",
            "billing-block",
            "max-body-size",
            "max-connections",
            "max-connections-per-source",
            "max-tunnels",
            "write-stall-timeout",
        ),
    ),
    (
        "Nodes",
        (
            "nodes",
            "node",
            "node-kind",
            "node-key-file",
            "node-slots",
            "default-slots",
            "inventory-interval",
            "upstream-client",
            "demo",
        ),
    ),
    (
        "Routing and timeouts",
        (
            "connect-timeout",
            "response-header-timeout",
            "first-body-timeout",
            "load-timeout",
            "busy-max-wait",
            "queue-size",
            "queue-timeout",
            "batch-max-wait",
            "affinity-max-entries",
            "affinity-ttl",
            "session-ttl",
            "session-header",
        ),
    ),
    ("Keys", ("keys", "allow-host", "cors-origin")),
    (
        "State and usage",
        ("state", "state-password-file", "state-secret-file", "usage-db", "usage-retention"),
    ),
    (
        "Operations",
        (
            "admin",
            "control",
            "control-token",
            "log-level",
            "otlp-endpoint",
            "shutdown-grace",
            "version",
            "help",
        ),
    ),
)
"""The groups of ``--help``, in order; every option is in exactly one (tests/test_tap.py)."""
_NOTES = (
    "Durations: 300ms, 5s, 2m, 1m30s, 2h, 90d. Environment: NVPAIR_PROXY_API_KEYS,"
    " NVPAIR_PROXY_API_KEYS_FILE, NVPAIR_PROXY_ALLOWED_CIDRS (docs/security.md) and the two"
    " timeouts above. Every option: docs/configuration.md."
)


def usage_text(options: usage.Options, width: int) -> str:
    """``--help`` after the synopsis: the description, ``_EXAMPLES``, ``_GROUPS``, ``_NOTES``."""
    rows = _option_rows(options)
    indent = max(len(column) for column, _ in rows.values()) + 2
    text = max(20, width - indent)
    out = ["", *textwrap.wrap(str(getattr(options, "longdesc", "")), width), "", "Examples:"]
    for why, command in _EXAMPLES:
        out += [f"  # {why}", *(f"  {line}" for line in command)]
    for title, names in _GROUPS:
        out += ["", f"{title}:"]
        for name in names:
            column, doc = rows[name]
            lines = textwrap.wrap(doc, text) or [""]
            out += [column.ljust(indent) + lines[0], *(" " * indent + line for line in lines[1:])]
    return "\n".join([*out, "", *textwrap.wrap(_NOTES, width), ""])


def _option_rows(options: usage.Options) -> dict[str, tuple[str, str]]:
    """Each option's first column (``  -e, --engine=``) and its help with its default."""
    shorts = {long: short for short, long in options.synonyms.items() if len(short) == 1}
    rows: dict[str, tuple[str, str]] = {}
    for opt in options.longOpt:
        name = opt.rstrip("=")
        short = f"-{shorts[name]}," if name in shorts else "   "
        doc = " ".join(options.docs.get(name, "").split())
        default = options.defaults.get(name)
        if opt.endswith("=") and default is not None:
            doc = f"{doc} [default: {default}]"
        rows[name] = (f"  {short} --{opt}", doc)
    return rows


def makeService(options: Options) -> service.IService:
    """Apply the configuration's process-wide settings, build the process on the global reactor,
    then settle its garbage collector (``runtime.steady_collector``)."""
    from twisted.internet import reactor

    set_level(options.config.log_level)
    built = assemble(cast(IProxyReactor, reactor), options.config)
    steady_collector()
    return built
