# -*- test-case-name: tests.corridor.test_roles -*-
"""What a key's role and scope may do (docs/behaviour.md §14.2), as one table read at the end of
the head.

An ``admin`` key and the ``local`` caller may do everything. A ``user`` key may run inference and
the model-routed routes within its scope, read the model lists and any ``GET``/``HEAD`` route, and
name one node with ``X-NVPair-Node``; it may not manage models, fan out to several nodes, send any
other method to a route the proxy does not know, or open the LM Studio channel unless its key has no
model scope and says ``tunnels = true``. A key with a model scope, ``admin`` too, may send only
requests whose models the proxy reads (inference, the model-routed routes, reads, and the routes of
:data:`~nvpair_tw.core.MODEL_NAMES`): never Ollama's blobs, nor another method to a route whose
body the proxy does not read. Every refusal is 403 ``route-not-allowed``, decided before any other
4xx and before the body is read, with no node contacted.
"""

from __future__ import annotations

from enum import Enum

from nvpair_tw.core import MODEL_NAMES, RouteKind
from nvpair_tw.inbound import Caller, KeyRules, Rejection, Role

__all__ = ["MANAGEMENT_PATHS", "MANAGEMENT_PREFIXES", "Channel", "Targeting", "refusal"]


class Channel(Enum):
    """What the request asks the connection to become."""

    HTTP = "http"
    TUNNEL = "tunnel"
    """The LM Studio SDK's WebSocket channel (docs/behaviour.md §2.1)."""


class Targeting(Enum):
    """What ``X-NVPair-Node`` asked for (docs/behaviour.md §2.1, §13.2)."""

    NONE = "none"
    ONE = "one"
    MANY = "many"
    """``*`` or a list of ids: a fan-out of model management."""


MANAGEMENT_PATHS = frozenset(
    {
        "/api/pull",
        "/api/push",
        "/api/create",
        "/api/copy",
        "/api/delete",
        "/api/v1/models/load",
        "/api/v1/models/unload",
        "/api/v1/models/download",
        "/api/v0/models/load",
        "/api/v0/models/unload",
        "/api/v0/models/download",
        "/models/load",
        "/models/unload",
    }
)
"""Model management on Ollama, LM Studio 0.4 (``/api/v1``) and llama.cpp's router: admin only."""

MANAGEMENT_PREFIXES = ("/api/blobs/",)
"""Whole subtrees of model management (Ollama's blob uploads)."""

_READING = frozenset({b"GET", b"HEAD"})


def _denied(why: str) -> Rejection:
    return Rejection(403, "route-not-allowed", f"this key may not {why}")


def _management(path: str) -> bool:
    return path in MANAGEMENT_PATHS or path.startswith(MANAGEMENT_PREFIXES)


def refusal(
    caller: Caller,
    method: bytes,
    path: str,
    kind: RouteKind,
    targeting: Targeting,
    channel: Channel,
) -> Rejection | None:
    """Why ``caller``'s role or scope may not send ``method path`` here (403
    ``route-not-allowed``), or None.

    ``path`` is the normalised path (docs/behaviour.md §14.1)."""
    rules = caller.rules
    if channel is Channel.TUNNEL:
        # The channel carries any model: only a key without a model scope may open it.
        if rules.may_tunnel:
            return None
        return _denied("open the LM Studio channel (needs tunnels = true and no model scope)")
    if rules.role is not Role.ADMIN:
        denied = _user_refusal(method, path, kind, targeting)
        if denied is not None:
            return denied
    return _scope_refusal(rules, method, path, kind)


def _user_refusal(
    method: bytes, path: str, kind: RouteKind, targeting: Targeting
) -> Rejection | None:
    """What a ``user`` key may not do, whatever its scope."""
    if targeting is Targeting.MANY:
        return _denied("run a call on several nodes (X-NVPair-Node: * or a list)")
    if _management(path):
        return _denied(f"manage models ({path})")
    if kind is not RouteKind.PASS_THROUGH or method in _READING:
        return None
    return _denied(f"send {method.decode('latin-1')} to a route the proxy does not know")


def _scope_refusal(rules: KeyRules, method: bytes, path: str, kind: RouteKind) -> Rejection | None:
    """What a key with a model scope may not send, whatever its role: a request whose models the
    proxy cannot read (docs/behaviour.md §14.2)."""
    if rules.models is None:
        return None
    if path.startswith(MANAGEMENT_PREFIXES):
        return _denied("use /api/blobs/* (blobs name no model: a key with a model scope may not)")
    if kind is RouteKind.PASS_THROUGH and method not in _READING and path not in MODEL_NAMES:
        return _denied(
            f"send {method.decode('latin-1')} to this route: a key with a model scope may only"
            " send requests whose models the proxy reads"
        )
    return None
