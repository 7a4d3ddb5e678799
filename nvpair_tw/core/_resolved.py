# -*- test-case-name: tests.core.test_resolved -*-
"""Resolved configuration: flag beats environment beats default, each value read by the one
duration rule (docs/behaviour.md §6.3); a value that is not one is refused, never replaced."""

from __future__ import annotations

from collections.abc import Mapping

from attrs import field, frozen

from nvpair_tw.core._durations import Least, read_duration

__all__ = [
    "ASSEMBLE_BY_DEFAULT",
    "BILLING_BLOCKS",
    "FIRST_BODY_ENV",
    "RESPONSE_HEADER_ENV",
    "UPSTREAM_CLIENTS",
    "Resolved",
    "Settings",
    "resolve_first_body_timeout",
    "resolve_response_header_timeout",
]

DEFAULT_RESPONSE_HEADER_TIMEOUT = 120.0
DEFAULT_FIRST_BODY_TIMEOUT = 0.0
ASSEMBLE_BY_DEFAULT = frozenset({"ollama"})
UPSTREAM_CLIENTS = ("native", "twisted")
"""What ``--upstream-client`` accepts; the first is the default."""
BILLING_BLOCKS = ("remove", "keep")
"""What ``--billing-block`` accepts; the first is the default (docs/behaviour.md §5.3)."""
RESPONSE_HEADER_ENV = "NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT"
FIRST_BODY_ENV = "NVPAIR_PROXY_FIRST_BODY_TIMEOUT"


@frozen
class Resolved:
    """A resolved duration and where it came from (``flag``, ``$VARIABLE`` or ``default``)."""

    seconds: float
    source: str


def resolve_response_header_timeout(flag: str | None, environ: Mapping[str, str]) -> Resolved:
    """Flag > environment > 120 s; a value that is not a positive duration is a ``ValueError``
    naming the flag or the variable."""
    return _resolve(
        "--response-header-timeout",
        flag,
        environ,
        RESPONSE_HEADER_ENV,
        DEFAULT_RESPONSE_HEADER_TIMEOUT,
        Least.ABOVE_ZERO,
    )


def resolve_first_body_timeout(flag: str | None, environ: Mapping[str, str]) -> Resolved:
    """Flag > environment > 0 (off); an explicit 0 turns it off; a value that is not a duration
    of zero or more is a ``ValueError`` naming the flag or the variable."""
    return _resolve(
        "--first-body-timeout",
        flag,
        environ,
        FIRST_BODY_ENV,
        DEFAULT_FIRST_BODY_TIMEOUT,
        Least.ZERO,
    )


def _resolve(
    option: str,
    flag: str | None,
    environ: Mapping[str, str],
    variable: str,
    default: float,
    least: Least,
) -> Resolved:
    if flag is not None:
        return Resolved(read_duration(option, flag, least), "flag")
    if variable in environ:
        return Resolved(read_duration(variable, environ[variable], least), f"${variable}")
    return Resolved(default, "default")


@frozen
class Settings:
    """Everything a facade needs to know about timing and limits, resolved once at start."""

    connect_timeout: float = 10.0
    response_header_timeout: float = DEFAULT_RESPONSE_HEADER_TIMEOUT
    first_body_timeout: float = DEFAULT_FIRST_BODY_TIMEOUT
    max_body_size: int = 32 * 1024 * 1024
    write_stall_timeout: float = 30.0
    inventory_interval: float = 10.0
    inventory_timeout: float = 10.0
    affinity_max_entries: int = 10_000
    """Prefix-affinity entries per facade, and sessions per key per facade (§5.3)."""
    affinity_ttl: float = 300.0
    session_ttl: float = 3600.0
    """Idle time after which a session's home is forgotten (§5.3)."""
    session_header: bytes | None = None
    """The operator's own header naming a session (``--session-header``, lower case), read
    before the ones clients send (§5.3); None: only those."""
    billing_block: str = "remove"
    """Claude Code's ``x-anthropic-billing-header`` system block: ``remove`` it from what nodes
    receive, or ``keep`` it (``--billing-block``, §5.3)."""
    max_connections: int = 256
    max_connections_per_source: int = 64
    """Open connections per remote source on each facade (docs/behaviour.md §14.4)."""
    max_tunnels: int = 64
    """WebSocket tunnels open at once, process-wide (503 ``too-many-tunnels`` beyond, §2.1)."""
    shutdown_grace: float = 10.0
    model_list_timeout: float = 10.0
    default_slots: int = 0
    """Slots per node without its own ``slots``; 0 = unlimited (docs/behaviour.md §6.4)."""
    queue_size: int = 256
    """Inference requests that may wait for a slot per facade (503 ``queue-full`` beyond)."""
    queue_timeout: float = 600.0
    """How long a request may wait for a slot (503 ``queue-timeout`` after)."""
    batch_max_wait: float = 120.0
    """How long a batch request waits behind interactive ones before it is served as one
    (docs/behaviour.md §16.3)."""
    busy_max_wait: float = 1800.0
    """How long a header wait may be extended while the node shows progress elsewhere."""
    load_timeout: float | None = None
    """Added to the first deadline on a node known not to have the model loaded; None = the
    response-header timeout."""
    assemble: Mapping[str, bool] = field(factory=dict)
    """Per engine: send non-streaming inference upstream as a stream and assemble the answer
    (docs/behaviour.md §6.5); an engine not named uses its default (on for ollama only)."""
    extra: Mapping[str, str] = field(factory=dict)
    cors_origins: tuple[str, ...] = ()
    """Origins whose browser pages may call the facades (``--cors-origin``, §13.4); none = off."""
    otlp_endpoint: str | None = None
    """Where spans go over OTLP/HTTP (``--otlp-endpoint``, §12.5); None = no traces."""
    upstream_client: str = "native"
    """The HTTP client of the upstream hop: ``native`` (:class:`nvpair_tw.upstream._agent.NodeAgent`)
    or ``twisted`` (Twisted's ``Agent`` over ``upstream.make_pool``); ``--upstream-client``."""

    @property
    def cooldown(self) -> float:
        """A stalled node cools for one response-header timeout."""
        return self.response_header_timeout

    @property
    def cold_load_allowance(self) -> float:
        """What a node known not to have the model loaded gets added to its first deadline."""
        return self.response_header_timeout if self.load_timeout is None else self.load_timeout

    def assembles(self, engine: str) -> bool:
        """Whether ``engine``'s facade assembles whole answers from streamed work."""
        return self.assemble.get(engine, engine in ASSEMBLE_BY_DEFAULT)
