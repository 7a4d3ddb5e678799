"""What the tests of nvpair_tw.inbound._limits share: two leaf resources, a channel connected to
an in-memory transport, and an answer split into its status line, headers and body."""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IAddress
from twisted.internet.testing import StringTransportWithDisconnection
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.inbound._limits import LimitedChannel, LimitedSite

__all__ = ["Later", "Ok", "connect", "connect_limited", "split_answer"]


class Ok(Resource):
    """A leaf that answers ``ok`` at once."""

    isLeaf = True

    def render(self, request: Request) -> bytes:
        return b"ok"


class Later(Resource):
    """A leaf that answers later: it keeps each request."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Request] = []

    def render(self, request: Request) -> Any:
        self.pending.append(request)
        return NOT_DONE_YET


def connect(site: Site, peer: IAddress | None = None) -> StringTransportWithDisconnection:
    """A connection to ``site``'s channel over an in-memory transport, from ``peer`` (else from
    the transport's own default peer, a remote address)."""
    transport = (
        StringTransportWithDisconnection()
        if peer is None
        else StringTransportWithDisconnection(peerAddress=peer)
    )
    channel = site.buildProtocol(transport.getPeer())
    transport.protocol = channel
    channel.makeConnection(transport)
    return transport


def connect_limited(site: LimitedSite) -> tuple[LimitedChannel, StringTransportWithDisconnection]:
    """:func:`connect`, with the ``LimitedChannel`` it made."""
    transport = connect(site)
    channel = transport.protocol
    assert isinstance(channel, LimitedChannel)
    return channel, transport


def split_answer(raw: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """The status line, headers (lower-cased names) and body of the first answer in ``raw``."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, {k.lower(): v for k, v in (line.split(b": ", 1) for line in lines)}, body
