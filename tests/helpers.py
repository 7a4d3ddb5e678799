"""Helpers the test modules share, each written once: a bounded wait for a condition on the running
reactor, the Ollama chat request most tests send, a request record to publish, and raw bytes sent to a loopback port and its
whole answer read back (from the reactor, or from a blocking socket in a thread).

``eventually`` is the only poll of the suite's reactor tests: every wait for something that has no
event of its own to await ends, failing the test with what it waited for, after ``within`` seconds
of the reactor's time.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any
from typing import Protocol as Shape

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair_tw.events import ProxyRequest

POLL_INTERVAL = 0.005
"""Seconds between two looks at the condition."""


class NotReached(AssertionError):
    """``eventually``'s condition did not hold within its bound."""


async def eventually(
    reactor: IReactorTime,
    check: Callable[[], object],
    within: float = 10.0,
    what: str = "condition",
) -> None:
    """Look at ``check()`` every ``POLL_INTERVAL`` seconds until it is true; raise ``NotReached``
    naming ``what`` once ``within`` seconds of ``reactor`` time have passed without it."""
    deadline = reactor.seconds() + within
    while not check():
        if reactor.seconds() >= deadline:
            raise NotReached(f"{what} not reached within {within:g} s")
        await deferLater(reactor, POLL_INTERVAL, lambda: None)


_EMPTY_REQUEST = ProxyRequest("", "", None, "", "", None, None, None, None, (), False, 0)


def proxy_request(**fields: Any) -> ProxyRequest:
    """A ``proxy/request`` record of the ``fields`` given (attribute names), every other one empty:
    no node, no status, no timings, no attempts and no model (so none of an inference's fields)."""
    return attrs.evolve(_EMPTY_REQUEST, **fields)


def refusal_code(body: bytes | dict[str, Any]) -> str:
    """The proxy's code in one of its refusals, whatever the route's error shape (docs/behaviour.md
    §9): ``{"error", "code"}``, OpenAI's ``{"error": {"code"}}`` or Anthropic's, with ``code``
    beside its ``error``."""
    document = json.loads(body) if isinstance(body, bytes) else body
    inner = document.get("error")
    if "code" in document:
        return str(document["code"])
    assert isinstance(inner, dict), document
    code = str(inner["code"])
    return {"model_not_found": "model-not-found"}.get(code, code)


def refusal_message(body: bytes | dict[str, Any]) -> str:
    """The message of one of the proxy's refusals, whatever the route's error shape."""
    document = json.loads(body) if isinstance(body, bytes) else body
    inner = document["error"]
    return str(inner["message"] if isinstance(inner, dict) else inner)


def chat(model: str, *texts: str, **fields: Any) -> dict[str, Any]:
    """An Ollama ``/api/chat`` request document: ``model``, the ``texts`` as messages taking turns
    (user, assistant, user, …; one user ``"hi"`` when none is given), then ``fields``."""
    said = texts or ("hi",)
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(said)]
    return {"model": model, "messages": messages, **fields}


def chat_body(model: str, *texts: str, **fields: Any) -> bytes:
    """:func:`chat` as the bytes of a request body."""
    return json.dumps(chat(model, *texts, **fields)).encode()


class _Raw(Protocol):
    """Writes ``sent`` once connected; fires ``done`` with every byte read when the connection
    closes."""

    def __init__(self, sent: bytes, done: Deferred[bytes]) -> None:
        self.sent, self.done, self.data = sent, done, b""

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.sent)

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(self.data)


async def send_raw(reactor: Any, port: int, raw: bytes) -> bytes:
    """Send ``raw`` to 127.0.0.1:``port`` over the reactor; every byte read until it closes."""
    done: Deferred[bytes] = Deferred()
    reactor.connectTCP("127.0.0.1", port, ClientFactory.forProtocol(lambda: _Raw(raw, done)))
    return await done


def exchange(port: int, raw: bytes) -> bytes:
    """Blocking (run it in a thread): send ``raw`` to 127.0.0.1:``port`` and read until the
    server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


class Pumped(Shape):
    """A test engine that writes for as long as its client takes bytes."""

    paused: bool
    pauses: int
    stopped: bool

    def pump(self) -> None:
        """Write until paused, stopped or done."""


@implementer(IPushProducer)
class PumpProducer:
    """The push producer of a :class:`Pumped` engine's request: counts pauses, pumps on resume."""

    def __init__(self, engine: Pumped) -> None:
        self._engine = engine

    def pauseProducing(self) -> None:
        self._engine.paused = True
        self._engine.pauses += 1

    def resumeProducing(self) -> None:
        self._engine.paused = False
        self._engine.pump()

    def stopProducing(self) -> None:
        self._engine.stopped = True


@implementer(IPushProducer)
class RecordingProducer:
    """A producer stand-in that records the flow-control calls it receives."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")
