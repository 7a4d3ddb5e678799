"""nvpair-tw's node client alone behind Twisted's server: ``python bench/bare.py PORT UPSTREAM_PORT``.

A leaf resource reads the body and forwards it through :class:`nvpair_tw.upstream.NodeAgent`
(nvpair-tw's own keep-alive HTTP/1.1 client) to the engine on UPSTREAM_PORT, then writes the
answer back: no head gate, no route, no attempts' rules, no relay's meter, no record. What it
costs a request beyond ``bench/static.py`` is what the hop itself costs; what nvpair-tw costs
beyond it is its corridor (docs/performance.md).
"""

from __future__ import annotations

import sys
from io import BytesIO

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.web.client import FileBodyProducer, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.upstream import NodeAgent, NodeEndpointFactory


class Forward(Resource):
    """Each request forwarded once, its answer written back whole."""

    isLeaf = True

    def __init__(self, agent: NodeAgent, url: bytes) -> None:
        super().__init__()
        self._agent = agent
        self._url = url

    def render_POST(self, request: Request) -> int:
        body = request.content.read() if request.content is not None else b""
        headers = Headers({b"content-type": [b"application/json"]})
        asked = self._agent.request(
            b"POST", self._url + request.uri, headers, FileBodyProducer(BytesIO(body))
        )

        def answered(response: IResponse) -> Deferred[bytes]:
            request.setResponseCode(response.code)
            for name, values in response.headers.getAllRawHeaders():
                if name.lower() not in (b"transfer-encoding", b"connection"):
                    request.responseHeaders.setRawHeaders(name, values)
            return readBody(response)

        def written(data: bytes) -> None:
            request.write(data)
            request.finish()

        asked.addCallback(answered).addCallback(written)
        return NOT_DONE_YET

    render_GET = render_POST


def main() -> None:
    port, upstream = int(sys.argv[1]), int(sys.argv[2])
    agent = NodeAgent(reactor, NodeEndpointFactory(reactor, 5.0))  # type: ignore[arg-type]
    site = Site(Forward(agent, b"http://127.0.0.1:%d" % upstream))
    site.noisy = False
    reactor.listenTCP(port, site, backlog=4096, interface="127.0.0.1")  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
