# -*- test-case-name: tests.corridor.test_probes -*-
"""The routes that ask "is the engine there?", answered by the facade itself (docs/behaviour.md
§17.6), never by one node: a client's heartbeat must not fail because one node is frozen.

- Ollama ``HEAD /`` and ``GET /``: 200 ``Ollama is running`` (the CLI sends ``HEAD /`` before
  every command).
- Ollama ``GET`` / ``HEAD /api/version``: the version the first answering ollama-kind node
  reports, else :data:`OLLAMA_API_VERSION`, within :data:`VERSION_WAIT` seconds.
- The openai facade's ``GET`` / ``HEAD /health``: 200 ``{"status": "ok"}`` while any node is
  usable, else 503 ``no-usable-node``.

These are ``GET``/``HEAD`` routes that read: every role may call them (§14.2), after the source and
key checks of the head.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from twisted.internet.defer import Deferred

from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._writer import Whole
from nvpair_tw.inbound import Rejection
from nvpair_tw.nodes import Node
from nvpair_tw.upstream import ReadError, get_json, join_url

__all__ = [
    "OLLAMA_API_VERSION",
    "VERSION_WAIT",
    "Probe",
    "ollama_version",
    "probe_answer",
    "probe_of",
    "usable_nodes",
]


class Probe(Enum):
    """Which question a probe route asks."""

    RUNNING = "running"
    VERSION = "version"
    HEALTH = "health"


OLLAMA_API_VERSION = "0.9.3"
"""The Ollama API version the facade reports when no ollama-kind node answers: the version the
translation of docs/behaviour.md §11.3 is tested against (never the proxy's own version, which
clients would read as a very old Ollama)."""

VERSION_WAIT = 2.0
"""Seconds ``/api/version`` waits for an ollama-kind node before answering the constant."""

FRESH_POLLS = 3
"""A polled node is usable while its last good inventory poll is at most this many poll
intervals old."""

_PROBES: Mapping[tuple[str, bytes, str], Probe] = {
    ("ollama", b"HEAD", "/"): Probe.RUNNING,
    ("ollama", b"GET", "/"): Probe.RUNNING,
    ("ollama", b"GET", "/api/version"): Probe.VERSION,
    ("ollama", b"HEAD", "/api/version"): Probe.VERSION,
    ("openai", b"GET", "/health"): Probe.HEALTH,
    ("openai", b"HEAD", "/health"): Probe.HEALTH,
}

_RUNNING = b"Ollama is running"
_TEXT = b"text/plain; charset=utf-8"
_JSON = b"application/json; charset=utf-8"


def probe_of(engine: str, method: bytes, path: str) -> Probe | None:
    """The probe ``method path`` (normalised) is on facade ``engine``, or None."""
    return _PROBES.get((engine, method, path))


def usable_nodes(facade: FacadeState) -> list[Node]:
    """The nodes that could take work now: serving (§13.1, §14.3), not cooling after a stall
    (§6.3), and with a static inventory or a good poll at most :data:`FRESH_POLLS` intervals
    old."""
    clock = facade.shared.clock
    fresh = FRESH_POLLS * facade.shared.settings.inventory_interval
    cooling = facade.stalls.cooling()
    usable = []
    for node in facade.serving():
        if node.id in cooling:
            continue
        last = facade.inventory.last_success(node.id)
        if node.models is not None or (last is not None and clock.seconds() - last <= fresh):
            usable.append(node)
    return usable


async def ollama_version(facade: FacadeState) -> str:
    """The version the first ollama-kind node to answer reports, else :data:`OLLAMA_API_VERSION`,
    within :data:`VERSION_WAIT` seconds (each read times out then; the others are cancelled once
    one answered)."""
    nodes = [n for n in facade.serving() if n.kind_of(facade.profile).name == "ollama"]
    if not nodes:
        return OLLAMA_API_VERSION
    first: Deferred[str] = Deferred()
    pending = [len(nodes)]

    def answered(document: Any) -> None:
        version = document.get("version") if isinstance(document, dict) else None
        if isinstance(version, str) and 0 < len(version) <= 64 and not first.called:
            first.callback(version)

    def ended(_: object) -> None:
        pending[0] -= 1
        if pending[0] == 0 and not first.called:
            first.callback(OLLAMA_API_VERSION)

    reads = [Deferred.fromCoroutine(_read_version(facade, node)) for node in nodes]
    for read in reads:
        read.addCallback(answered).addErrback(lambda _: None).addBoth(ended)
    try:
        return await first
    finally:
        for read in reads:
            read.cancel()


async def _read_version(facade: FacadeState, node: Node) -> Any:
    shared = facade.shared
    try:
        return await get_json(
            shared.http,
            shared.clock,
            join_url(node.public_url, "/api/version"),
            timeout=VERSION_WAIT,
            authorization=node.authorization,
        )
    except ReadError:
        return None


async def probe_answer(facade: FacadeState, probe: Probe) -> Whole | Rejection:
    """The answer to ``probe``, from the facade's own state."""
    if probe is Probe.RUNNING:
        return Whole(200, _RUNNING, _TEXT, _NOSNIFF)
    if probe is Probe.VERSION:
        version = await ollama_version(facade)
        return Whole(200, json.dumps({"version": version}).encode(), _JSON, _NOSNIFF)
    if usable_nodes(facade):
        return Whole(200, b'{"status": "ok"}', _JSON, _NOSNIFF)
    return _NO_USABLE_NODE


_NOSNIFF = ((b"x-content-type-options", b"nosniff"),)
_NO_USABLE_NODE = Rejection(503, "no-usable-node", "no node is usable")
