# -*- test-case-name: tests.test_tap -*-
"""The whole configuration of one process, as a value.

``tap.Options`` parses the command line and the environment into a :class:`Config` and does
nothing else; ``tap.makeService`` applies the log level and hands the value to
``assemble.assemble``, which builds the services on the reactor it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import field, frozen
from twisted.logger import LogLevel

from nvpair_tw.core import Settings
from nvpair_tw.fleet import StateConfig
from nvpair_tw.inbound import IngressConfig
from nvpair_tw.nodes import Node
from nvpair_tw.ops import ControlToken

__all__ = ["Config"]


@frozen
class Config:
    """What ``twistd nvpair`` was asked to run: resolved, validated, free of side effects.

    ``listen`` and ``nodes`` have an entry for every engine; ``nodes`` holds the ``--node`` flag
    nodes (unscoped ones under every engine). ``admin`` and ``control`` are server endpoint
    strings (``control`` may be ``stdio``), ``None`` when off. ``state`` is the fleet store (``--state``),
    ``usage_db`` and ``usage_retention`` the usage history's file and retention. ``warnings`` are the messages about
    ignored values that the start-up log repeats; ``sources`` names where each timer came from.
    """

    engines: tuple[str, ...]
    listen: Mapping[str, str]
    nodes: Mapping[str, tuple[Node, ...]] = field(factory=dict)
    nodes_file: str | None = None
    settings: Settings = field(factory=Settings)
    control: str | None = None
    control_token: ControlToken | None = None
    """``--control-token``: every control connection opens with ``auth`` (docs/behaviour.md §14.3)."""
    admin: str | None = None
    demo: bool = False
    log_level: LogLevel = LogLevel.info
    warnings: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(factory=dict)
    ingress: IngressConfig = field(factory=IngressConfig)
    state: StateConfig | None = None
    usage_db: str | None = None
    """The usage database (``--usage-db``); ``None`` keeps usage in memory only."""
    usage_retention: float = 90 * 86400.0
    """Seconds of usage kept (``--usage-retention``)."""
