"""The floor under both proxies: ``python bench/static.py PORT``.

Serves, with ``twisted.web``'s ``Site`` and a leaf resource, the answer the fast fake engine
(``bench/upstream.py``) gives to ``POST /api/chat``, from memory: no upstream, no routing, no
record. What it costs a request is what Twisted's HTTP server costs a request; both nvpair-tw and
``ReverseProxyResource`` pay it, and the rest of each is its own (docs/performance.md).
"""

from __future__ import annotations

import sys

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Request, Site
from upstream import CHAT, MODELS


class Answer(Resource):
    """The engine's answers, from memory."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return MODELS

    def render_POST(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return CHAT


def main() -> None:
    site = Site(Answer())
    site.noisy = False
    reactor.listenTCP(int(sys.argv[1]), site, backlog=4096, interface="127.0.0.1")  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
