# -*- test-case-name: tests.inbound.test_ingress -*-
"""A refusal as a value: what every check of the inbound side answers with (docs/behaviour.md §9,
§14), written by whoever holds the connection in the route's error shape."""

from __future__ import annotations

from attrs import frozen

__all__ = ["Rejection"]


@frozen
class Rejection:
    """Why a request is refused: the status, error code, message and extra response headers."""

    status: int
    code: str
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
