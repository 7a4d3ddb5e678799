# -*- test-case-name: tests.corridor.test_boundary -*-
"""The one writer of the corridor's refusals: a :class:`~nvpair_tw.inbound.Rejection` answered as
the proxy's JSON error (docs/behaviour.md §9) and recorded, no node contacted."""

from __future__ import annotations

from twisted.web.server import Request

from nvpair_tw.core import write_error
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import RequestRecord
from nvpair_tw.dialects import MESSAGES_PATH, messages_refusal
from nvpair_tw.inbound import Rejection

__all__ = ["refuse"]


def refuse(
    facade: FacadeState, request: Request, record: RequestRecord, refused: Rejection
) -> None:
    """Answer ``refused`` and publish its record."""
    body = None
    if request.path.startswith(MESSAGES_PATH.encode()):  # Messages' shape (§17.3)
        body = messages_refusal(refused.status, refused.message, refused.code)
    write_error(request, refused.status, refused.message, refused.code, refused.headers, body)
    record.publish(facade.shared.bus, status=refused.status, node_id=None, error=refused.code)
