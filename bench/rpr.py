"""The plain Twisted baseline: ``python bench/rpr.py PORT UPSTREAM_PORT``.

Serves ``twisted.web.proxy.ReverseProxyResource("127.0.0.1", UPSTREAM_PORT, b"")`` on
127.0.0.1:PORT, with no failover, no timeouts and a new HTTP/1.0 upstream connection per request.
"""

from __future__ import annotations

import sys

from twisted.internet import reactor
from twisted.web.proxy import ReverseProxyResource
from twisted.web.server import Site


def main() -> None:
    port, upstream = int(sys.argv[1]), int(sys.argv[2])
    site = Site(ReverseProxyResource("127.0.0.1", upstream, b""))
    site.noisy = False
    reactor.listenTCP(port, site, backlog=4096, interface="127.0.0.1")  # type: ignore[attr-defined,arg-type]
    reactor.run()  # type: ignore[attr-defined,arg-type]


if __name__ == "__main__":
    main()
