"""What a key's role may do (docs/behaviour.md §14.2): the one table, read at the end of the head."""

from __future__ import annotations

import pytest

from nvpair_tw.core import RouteKind
from nvpair_tw.corridor._roles import MANAGEMENT_PATHS, Channel, Targeting, refusal
from nvpair_tw.inbound import LOCAL, Caller, KeyRules, Role

pytestmark = pytest.mark.timeout(10)

USER = Caller("u", KeyRules(models=("llama3*",)))
UNSCOPED_USER = Caller("v", KeyRules())
TUNNELLER = Caller("t", KeyRules(tunnels=True))
SCOPED_TUNNELLER = Caller("s", KeyRules(models=("a",), tunnels=True))
ADMIN = Caller("a", KeyRules(role=Role.ADMIN))
SCOPED_ADMIN = Caller("b", KeyRules(role=Role.ADMIN, models=("a",)))
HTTP, TUNNEL = Channel.HTTP, Channel.TUNNEL
NONE, ONE, MANY = Targeting.NONE, Targeting.ONE, Targeting.MANY


def code(caller: Caller, method: bytes, path: str, kind: RouteKind, *rest: object) -> str | None:
    targeting = rest[0] if rest else NONE
    channel = rest[1] if len(rest) > 1 else HTTP
    assert isinstance(targeting, Targeting) and isinstance(channel, Channel)
    refused = refusal(caller, method, path, kind, targeting, channel)
    return None if refused is None else f"{refused.status} {refused.code}"


@pytest.mark.parametrize("path", [*sorted(MANAGEMENT_PATHS), "/api/blobs/sha256:0"])
def test_a_user_may_not_manage_models_and_an_admin_may(path: str) -> None:
    for caller in (USER, UNSCOPED_USER):
        assert code(caller, b"POST", path, RouteKind.PASS_THROUGH) == "403 route-not-allowed"
    for caller in (ADMIN, LOCAL):
        assert code(caller, b"POST", path, RouteKind.PASS_THROUGH) is None


def test_a_user_may_not_fan_out_but_may_name_one_node() -> None:
    assert code(USER, b"POST", "/api/chat", RouteKind.INFERENCE, MANY) == "403 route-not-allowed"
    assert code(USER, b"POST", "/api/chat", RouteKind.INFERENCE, ONE) is None
    assert code(ADMIN, b"POST", "/api/pull", RouteKind.PASS_THROUGH, MANY) is None


@pytest.mark.parametrize(
    ("method", "kind", "allowed"),
    [
        (b"POST", RouteKind.INFERENCE, True),
        (b"POST", RouteKind.MODEL_ROUTED, True),
        (b"GET", RouteKind.MODEL_LIST, True),
        (b"GET", RouteKind.PASS_THROUGH, True),
        (b"HEAD", RouteKind.PASS_THROUGH, True),
        (b"POST", RouteKind.PASS_THROUGH, False),
        (b"PUT", RouteKind.PASS_THROUGH, False),
        (b"DELETE", RouteKind.PASS_THROUGH, False),
        (b"OPTIONS", RouteKind.PASS_THROUGH, False),
    ],
)
def test_a_user_reads_any_route_but_writes_only_known_ones(
    method: bytes, kind: RouteKind, allowed: bool
) -> None:
    got = code(USER, method, "/some/route", kind)
    assert got is None if allowed else got == "403 route-not-allowed"


def test_the_tunnel_needs_tunnels_and_no_model_scope_whatever_the_role() -> None:
    """The LM Studio channel carries any model, so a key with a scope may never open it."""
    args = (b"GET", "/llm", RouteKind.PASS_THROUGH, NONE, TUNNEL)
    assert code(TUNNELLER, *args) is None
    assert code(LOCAL, *args) is None
    assert code(ADMIN, *args) is None
    for caller in (USER, UNSCOPED_USER, SCOPED_TUNNELLER, SCOPED_ADMIN):
        assert code(caller, *args) == "403 route-not-allowed", caller.name


def test_reading_a_management_route_is_management_too() -> None:
    """``HEAD /api/blobs/…`` is how ``ollama create`` checks a blob: a user may not, though it reads."""
    for method in (b"GET", b"HEAD"):
        got = code(USER, method, "/api/blobs/sha256:0", RouteKind.PASS_THROUGH)
        assert got == "403 route-not-allowed", method
        assert code(USER, method, "/api/blobsx", RouteKind.PASS_THROUGH) is None


@pytest.mark.parametrize(
    ("caller", "method", "path", "targeting", "channel", "says"),
    [
        (USER, b"POST", "/api/pull", NONE, HTTP, "may not manage models (/api/pull)"),
        (USER, b"POST", "/api/chat", MANY, HTTP, "may not run a call on several nodes"),
        (USER, b"PUT", "/x", NONE, HTTP, "may not send PUT to a route the proxy does not know"),
        (USER, b"GET", "/llm", NONE, TUNNEL, "may not open the LM Studio channel"),
    ],
)
def test_a_refusal_says_what_was_refused(
    caller: Caller,
    method: bytes,
    path: str,
    targeting: Targeting,
    channel: Channel,
    says: str,
) -> None:
    refused = refusal(caller, method, path, RouteKind.PASS_THROUGH, targeting, channel)
    assert refused is not None and says in refused.message


@pytest.mark.parametrize(
    ("method", "path", "kind", "allowed"),
    [
        (b"POST", "/api/chat", RouteKind.INFERENCE, True),
        (b"POST", "/api/show", RouteKind.MODEL_ROUTED, True),
        (b"GET", "/api/tags", RouteKind.MODEL_LIST, True),
        (b"GET", "/props", RouteKind.PASS_THROUGH, True),
        (b"POST", "/api/copy", RouteKind.PASS_THROUGH, True),
        (b"POST", "/completion", RouteKind.PASS_THROUGH, True),
        (b"POST", "/v1/rerank", RouteKind.PASS_THROUGH, True),
        (b"POST", "/models/load", RouteKind.PASS_THROUGH, True),
        (b"POST", "/api/blobs/sha256:0", RouteKind.PASS_THROUGH, False),
        (b"HEAD", "/api/blobs/sha256:0", RouteKind.PASS_THROUGH, False),
        (b"GET", "/api/blobs/sha256:0", RouteKind.PASS_THROUGH, False),
        (b"POST", "/v1/images/generations", RouteKind.PASS_THROUGH, False),
        (b"PUT", "/completion", RouteKind.PASS_THROUGH, True),
        (b"DELETE", "/anything", RouteKind.PASS_THROUGH, False),
    ],
)
def test_a_scoped_admin_sends_only_what_the_proxy_reads_the_models_of(
    method: bytes, path: str, kind: RouteKind, allowed: bool
) -> None:
    """A model scope binds an admin key too (docs/behaviour.md §14.2): blobs, and any other method
    to a route whose body the proxy does not read, are refused; an unscoped admin sends them."""
    expected = None if allowed else "403 route-not-allowed"
    assert code(SCOPED_ADMIN, method, path, kind) == expected
    assert code(ADMIN, method, path, kind) is None
    assert code(LOCAL, method, path, kind) is None


def test_a_scoped_refusal_names_neither_the_path_nor_the_model() -> None:
    blob = refusal(SCOPED_ADMIN, b"POST", "/api/blobs/<x>", RouteKind.PASS_THROUGH, NONE, HTTP)
    other = refusal(SCOPED_ADMIN, b"POST", "/<x>", RouteKind.PASS_THROUGH, NONE, HTTP)
    assert blob is not None and other is not None
    assert "<x>" not in blob.message + other.message
    assert blob.message == (
        "this key may not use /api/blobs/* (blobs name no model: a key with a model scope may not)"
    )
    assert other.message == (
        "this key may not send POST to this route: a key with a model scope may only send"
        " requests whose models the proxy reads"
    )
