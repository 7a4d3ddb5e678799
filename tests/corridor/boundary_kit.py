"""What the boundary's tests share (docs/behaviour.md §14): a proxy with a keys file in front of one
node that reads requests the way engines written in Go do (``tests/golike.py``), raw requests over
real loopback sockets with their bytes exactly as written, and a second door to the same facade
whose callers the proxy sees as remote ones.

The second door is a real socket too: only the peer address the proxy is told changes (a wrapper
around its protocol factory), so a test can be a caller from the LAN without a listener off
loopback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from attrs import define, field
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IAddress, IListeningPort
from twisted.internet.protocol import Protocol, connectionDone
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure

from nvpair_tw.core import Settings
from nvpair_tw.nodes import Node
from nvpair_tw.testing import ProxyHandle, start_proxy
from tests.golike import GoLikeNode, Seen, listen_golike

__all__ = [
    "ADMIN",
    "EMPTY",
    "KEYS",
    "LAN",
    "LIMITED",
    "OTHER",
    "SCOPED",
    "SCOPED_ADMIN",
    "Answer",
    "Boundary",
    "Reply",
    "open_boundary",
]

SCOPED = "sk-scoped-0123456789"
ADMIN = "sk-admin-0123456789"
EMPTY = "sk-empty-0123456789"
SCOPED_ADMIN = "sk-scoped-admin-0123456789"
LIMITED = "sk-limited-0123456789"
OTHER = "sk-other-0123456789"
KEYS = f"""
[[key]]
name = "scoped"
key = "{SCOPED}"
models = ["llama3*"]

[[key]]
name = "nothing"
key = "{EMPTY}"
models = []

[[key]]
name = "ops"
key = "{ADMIN}"
role = "admin"

[[key]]
name = "scoped-ops"
key = "{SCOPED_ADMIN}"
role = "admin"
models = ["llama3*"]

[[key]]
name = "limited"
key = "{LIMITED}"
requests_per_minute = 1

[[key]]
name = "another"
key = "{OTHER}"
"""

LAN = IPv4Address("TCP", "192.0.2.10", 40000)
"""Where the second door's callers seem to come from."""


@define
class Answer(Protocol):
    """Collects one raw HTTP exchange until the server closes."""

    data: list[bytes] = field(factory=list)
    done: Deferred[bytes] = field(factory=Deferred)

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(b"".join(self.data))


@define
class Reply:
    status: int
    head: bytes
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _Remote(ProtocolWrapper):
    """A connection whose peer the proxy is told is :data:`LAN`."""

    def getPeer(self) -> IAddress:
        return LAN


class _Disguise(WrappingFactory):
    protocol = _Remote


@define
class Boundary:
    """A proxy with :data:`KEYS` in front of one Go-like node that has ``llama3`` and
    ``secret``; ``remote`` is the second door to its ollama facade."""

    reactor: Any
    node: GoLikeNode
    port: IListeningPort
    proxy: ProxyHandle
    remote: IListeningPort

    def facade_port(self, remote: bool = False) -> int:
        port = self.remote if remote else self.proxy.ports["ollama"]
        return int(port.getHost().port)  # type: ignore[attr-defined]

    async def connect(self, remote: bool = False) -> Answer:
        """An open connection to the facade (loopback, or through the remote door)."""
        answer = Answer()
        endpoint = TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.facade_port(remote))
        await connectProtocol(endpoint, answer)
        return answer

    async def send(
        self,
        method: bytes,
        target: bytes,
        body: bytes = b"",
        key: str | None = None,
        headers: tuple[bytes, ...] = (),
        remote: bool = False,
    ) -> Reply:
        """Send one request as raw bytes (the target exactly as given; a ``Content-Length``
        unless the headers frame the body themselves) and read the answer."""
        lines = [method + b" " + target + b" HTTP/1.1", b"Host: localhost", b"Connection: close"]
        if key is not None:
            lines.append(b"Authorization: Bearer " + key.encode())
        lines.extend(headers)
        if not any(h.lower().startswith(b"transfer-encoding:") for h in headers):
            lines.append(b"Content-Length: %d" % len(body))
        raw = b"\r\n".join(lines) + b"\r\n\r\n" + body
        answer = await self.connect(remote)
        assert answer.transport is not None
        answer.transport.write(raw)
        data = await answer.done
        head, _, rest = data.partition(b"\r\n\r\n")
        return Reply(int(head.split(b" ", 2)[1]), head, _unchunked(head, rest))

    def inference(self) -> list[Seen]:
        """What reached the node besides the proxy's own inventory polls."""
        return [s for s in self.node.seen if not (s.method == "GET" and s.path == "/api/tags")]


def _unchunked(head: bytes, rest: bytes) -> bytes:
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    out, data = [], rest
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2 :]
    return b"".join(out)


async def open_boundary(
    reactor: Any, tmp_path: Path, settings: Settings | None = None
) -> AsyncIterator[Boundary]:
    """The body of a fixture: a :class:`Boundary`, stopped when the test ends."""
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    node = GoLikeNode(models=("llama3:latest", "secret:latest"))
    port = listen_golike(reactor, node)
    url = f"http://127.0.0.1:{port.getHost().port}"  # type: ignore[attr-defined]
    nodes = [Node("g", url, models=("llama3:latest", "secret:latest"))]
    proxy = await start_proxy(reactor, {"ollama": nodes}, settings, keys_file=str(keys))
    site = proxy.runtime.site_for("ollama")
    remote = reactor.listenTCP(0, _Disguise(site), interface="127.0.0.1")
    yield Boundary(reactor, node, port, proxy, remote)
    await maybeDeferred(remote.stopListening)
    await proxy.stop()
    await maybeDeferred(port.stopListening)
