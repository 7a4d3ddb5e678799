"""A 404 about a missing route told from a 404 about an unknown model (docs/behaviour.md §17.3),
on the bodies real servers answer (and the simulated engines copy)."""

from __future__ import annotations

import json

import pytest

from nvpair_tw.dialects import route_missing
from nvpair_tw.simulated._kinds import KINDS, not_found

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_servers_missing_route_404_is_a_missing_route(kind: str) -> None:
    assert route_missing(not_found(kind, b"POST", b"/v1/messages").body)


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"error": 'model "smollm2" not found, try pulling it first'}).encode(),
        json.dumps(
            {
                "object": "error",
                "message": "The model `x` does not exist.",
                "type": "NotFoundError",
                "code": 404,
            }
        ).encode(),
        json.dumps(
            {"error": {"code": 404, "message": "model not found", "type": "not_found_error"}}
        ).encode(),
        json.dumps({"detail": "Model x not found"}).encode(),
        b"",
        b"not json",
        b"[1]",
    ],
)
def test_a_404_about_the_model_or_unknown_is_not_a_missing_route(body: bytes) -> None:
    assert not route_missing(body)
