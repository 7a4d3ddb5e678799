# -*- test-case-name: tests.corridor.test_fanout -*-
"""Models across nodes (docs/behaviour.md §13.2): one model-management call run on several nodes at once.

``X-NVPair-Node: *`` (every node of the facade) or ``X-NVPair-Node: a,b`` runs ``/api/pull``,
``/api/create``, ``/api/copy`` or ``/api/delete`` on each listed node at once; ``DELETE /api/delete``
without the header goes to every owner of the model. Each node gets the same body, the plan's
end-to-end headers and its own credential (:func:`~nvpair_tw.corridor._attempts.node_headers`).

- Pull and create (:func:`_stream`): one NDJSON stream, committed at once, whose lines are each
  node's own progress lines with ``"nvpair_node"`` added, in the order they arrive. Every node's
  body is split into lines here (a line is never split or merged); a node's failure is its own
  error line, or an ``{"error", "nvpair_node"}`` line made here for an HTTP failure. The last line
  is ``{"status": "success" | "partial", "nodes": {ID: "success" | "<error text>"}}``. The client's
  flow control pauses every node body (:class:`_Merge` under a
  :class:`~nvpair_tw.corridor._relay.StallGuard`).
- Copy and delete (:func:`_summary`): one JSON object ``{"status": "success" | "partial",
  "nodes": {ID: {"status": N} | {"status": N, "error": "..."}}}``: 200 when every node
  succeeded, 207 when some did, 502 (with the proxy's ``error`` and ``code``) when none did.

A client that leaves cancels every node's part. Nothing here logs or records a body: error texts
are the engine's own ``error`` message (capped) or a transport reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field, frozen
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse
from twisted.web.server import Request
from zope.interface import implementer

from nvpair_tw.core import FanOutRoute, Lines, abort
from nvpair_tw.corridor._attempts import classify_failure, node_headers
from nvpair_tw.corridor._relay import CLIENT_STOPPED_READING, DROPPED_MID_STREAM, StallGuard
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._workloads import AttemptOutcome, RequestRecord, status_outcome
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.upstream import Discard, describe_failure, node_url

__all__ = [
    "EVERY_NODE",
    "LINE_LIMIT",
    "FanOutRequest",
    "fan_out",
    "is_fan_out",
    "parse_targets",
]

log = LevelledLogger(namespace=__name__)

EVERY_NODE = "*"
"""``X-NVPair-Node: *``: every node of the facade."""

LINE_LIMIT = 1 << 20
"""The longest progress line a node may send (a node that sends more without a newline fails)."""

_ERROR_BODY_LIMIT = 64 << 10
_ERROR_TEXT_LIMIT = 300
_SUCCESS = "success"
_CANCELLED = "cancelled"


def is_fan_out(value: str) -> bool:
    """Whether an ``X-NVPair-Node`` value names several nodes (``*`` or a list) rather than one."""
    return value.strip() == EVERY_NODE or "," in value


def parse_targets(value: str, nodes: Sequence[Node]) -> tuple[list[Node], list[str]]:
    """The nodes an ``X-NVPair-Node`` value names, in order and without repeats, and the ids
    this facade does not know (``*`` is every node)."""
    if value.strip() == EVERY_NODE:
        return list(nodes), []
    by_id = {n.id: n for n in nodes}
    wanted = list(dict.fromkeys(token.strip() for token in value.split(",") if token.strip()))
    return [by_id[i] for i in wanted if i in by_id], [i for i in wanted if i not in by_id]


@frozen
class FanOutRequest:
    """One fan-out as the facade hands it on: the route, the nodes (at least one), the method,
    the target as a node receives it (normalised path and query), the forwardable headers and the
    checked body (docs/behaviour.md §14.1)."""

    route: FanOutRoute
    nodes: list[Node]
    method: bytes
    target: bytes
    headers: Headers
    body: bytes


def _error_text(text: str) -> str:
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[: _ERROR_TEXT_LIMIT - 1] + "…"


def _engine_error(body: bytes) -> str | None:
    """The ``error`` message of a JSON error body, capped; None when it carries none."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return _error_text(parsed["error"])
    return None


def _status_error(code: int, body: bytes) -> str:
    """A node's non-2xx answer as short text: the status and the engine's own message."""
    message = _engine_error(body)
    return f"upstream answered {code}" + (f": {message}" if message else "")


class _Body(Protocol):
    """A node's response body: ``done`` fires (never fails) once it ended, ``reason`` says how."""

    def __init__(self) -> None:
        self.done: Deferred[None] = Deferred()
        self.reason: Failure | None = None

    def producer(self) -> IPushProducer | None:
        return IPushProducer(self.transport) if self.transport is not None else None

    def stop(self) -> None:
        """Close the node's body now (legal at any time)."""
        producer = self.producer()
        if producer is not None and not self.done.called:
            producer.stopProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not self.done.called:
            self.reason = reason
            self.done.callback(None)


class _Capped(_Body):
    """Keeps the first :data:`_ERROR_BODY_LIMIT` bytes of a (failure) body, drops the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def dataReceived(self, data: bytes) -> None:
        room = _ERROR_BODY_LIMIT - len(self.data)
        if room > 0:
            self.data += data[:room]


class _Lines(_Body):
    """Splits a node's NDJSON body into whole lines for ``emit``; remembers its error and success.

    A partial line is held by the core framer until its line end (or a clean end); a held line
    longer than :data:`LINE_LIMIT` stops the body and fails the node.
    """

    def __init__(self, node_id: str, emit: Callable[[bytes], None], paused: bool) -> None:
        super().__init__()
        self._node_id = node_id
        self._emit = emit
        self._lines = Lines(LINE_LIMIT)
        self._paused = paused
        self.error: str | None = None
        self.succeeded = False
        self.too_long = False

    def connectionMade(self) -> None:
        if self._paused:
            self.pause()

    def pause(self) -> None:
        self._paused = True
        producer = self.producer()
        if producer is not None and not self.done.called:
            producer.pauseProducing()

    def resume(self) -> None:
        self._paused = False
        producer = self.producer()
        if producer is not None and not self.done.called:
            producer.resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        if self.too_long:
            return
        for line in self._lines.feed(data):
            self._line(line)
        if self._lines.over:
            self.too_long = True
            self._lines.clear()
            self.stop()

    def finish(self) -> None:
        """The body ended cleanly: a last line without its line end is still a whole line."""
        for line in self._lines.end():
            self._line(line)

    def _line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError, UnicodeDecodeError):
            return  # not a progress object: nothing to tag (Ollama sends none)
        if not isinstance(parsed, dict):
            return
        error = parsed.get("error")
        if error is not None and self.error is None:
            self.error = _error_text(error if isinstance(error, str) else json.dumps(error))
        if parsed.get("status") == _SUCCESS:
            self.succeeded = True
        parsed["nvpair_node"] = self._node_id
        self._emit(json.dumps(parsed, separators=(",", ":")).encode() + b"\n")


@implementer(IPushProducer)
class _Merge:
    """The client's flow control over every node body of a stream (pause one, pause all)."""

    def __init__(self, stop_all: Callable[[], None]) -> None:
        self.bodies: list[_Lines] = []
        self.paused = False
        self._stop_all = stop_all

    def pauseProducing(self) -> None:
        self.paused = True
        for body in self.bodies:
            body.pause()

    def resumeProducing(self) -> None:
        self.paused = False
        for body in self.bodies:
            body.resume()

    def stopProducing(self) -> None:
        self._stop_all()


@define(eq=False)
class _Part:
    """One node's share of a fan-out: what is in flight, and how it ended."""

    node: Node
    since: float
    cancel: Callable[[], object] | None = None
    result: str | None = None
    """``"success"`` or the error text, once the part has ended."""
    status: int = 502
    """The node's HTTP status (502 when it gave none)."""
    outcome: str = AttemptOutcome.COMMITTED.value
    done: bool = field(default=False)

    def stop(self) -> None:
        if not self.done and self.cancel is not None:
            self.cancel()


@define(eq=False)
class _Run:
    """One fan-out in progress: the request, its parts and whether the client is still there."""

    facade: FacadeState
    request: Request
    record: RequestRecord
    fan: FanOutRequest
    parts: list[_Part]
    gone: str | None = None

    def leave(self, reason: str) -> None:
        """The client left (or stopped reading): cancel every node's part."""
        if self.gone is not None:
            return
        self.gone = reason
        for part in self.parts:
            part.stop()

    async def send(self, part: _Part) -> IResponse | None:
        """The node's response, or None after recording why it gave none."""
        shared = self.facade.shared
        attempt = shared.client.request(
            self.fan.method,
            node_url(part.node.url, self.fan.target),
            node_headers(self.fan.headers, part.node),
            self.fan.body,
            shared.settings.response_header_timeout,
        )
        part.cancel = attempt.cancel
        try:
            response = await attempt
        except Exception:
            failure = Failure()
            outcome = classify_failure(failure, self.gone)
            why = _CANCELLED if outcome is AttemptOutcome.CANCELLED else describe_failure(failure)
            if outcome is AttemptOutcome.STALL:
                self.facade.stalls.cool(part.node.id, why)
            self.end(part, outcome.value, why)
            return None
        if self.gone is not None:  # the headers came as the client left: nothing to read
            response.deliverBody(Discard())
            self.end(part, AttemptOutcome.CANCELLED.value, _CANCELLED)
            return None
        return response

    async def read_error(self, part: _Part, response: IResponse) -> None:
        """A non-2xx answer: its status and the engine's own message, body otherwise dropped."""
        body = _Capped()
        part.cancel = body.stop
        response.deliverBody(body)
        await body.done
        part.status = response.code
        self.end(
            part, status_outcome(response.code), _status_error(response.code, bytes(body.data))
        )

    def end(self, part: _Part, outcome: str, result: str) -> None:
        part.done = True
        part.cancel = None
        if self.gone is not None and result != _SUCCESS:
            outcome = AttemptOutcome.CANCELLED.value
        part.outcome = outcome
        part.result = _CANCELLED if self.gone is not None and result != _SUCCESS else result
        self.record.part_ended(part.node.id, outcome, part.since)
        if 200 <= part.status < 300 and outcome == AttemptOutcome.COMMITTED.value:
            self.facade.stalls.clear(part.node.id)
        if result != _SUCCESS and self.gone is None:
            log.info(
                "fan-out {path} to {node} failed: {why}",
                path=self.record.path,
                node=part.node.id,
                why=result,
            )

    @property
    def succeeded(self) -> list[_Part]:
        return [p for p in self.parts if p.result == _SUCCESS]


async def fan_out(
    facade: FacadeState, request: Request, fan: FanOutRequest, record: RequestRecord
) -> None:
    """Run ``fan`` on each of its nodes at once, answer the client and publish the record."""
    clock = facade.shared.clock
    parts = [_Part(node, clock.seconds()) for node in fan.nodes]
    run = _Run(facade, request, record, fan, parts)
    record.fanned_out([n.id for n in fan.nodes])

    def client_left(_: Failure) -> None:
        run.leave("client disconnected")

    request.notifyFinish().addErrback(client_left)
    if fan.route.streams:
        await _stream(run)
    else:
        await _summary(run)


def _head(request: Request, status: int, content_type: bytes, nodes: Sequence[Node]) -> None:
    request.setResponseCode(status)
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"x-nvpair-node", ",".join(n.id for n in nodes).encode())


def _node_results(run: _Run) -> dict[str, str]:
    return {p.node.id: p.result or _CANCELLED for p in run.parts}


async def _stream(run: _Run) -> None:
    """Pull and create: one NDJSON stream of every node's progress lines, then the last line."""
    request, record, shared = run.request, run.record, run.facade.shared
    _head(request, 200, b"application/x-ndjson", run.fan.nodes)
    request.write(b"")  # the head goes out now: the client sees the fan-out has begun
    record.first_byte()

    def emit(line: bytes) -> None:
        if run.gone is None and request.channel is not None and not request.finished:
            request.write(line)

    def stop_all() -> None:  # the client's connection is gone (Twisted stops its producer)
        run.leave("client disconnected")

    merge = _Merge(stop_all)

    def write_stalled() -> None:
        run.leave(CLIENT_STOPPED_READING)
        abort(request.transport)

    guard = StallGuard(shared.clock, merge, shared.settings.write_stall_timeout, write_stalled)
    registered = request.channel is not None
    if registered:
        request.registerProducer(guard, True)

    try:
        await gatherResults(
            [Deferred.fromCoroutine(_stream_part(run, p, merge, emit)) for p in run.parts],
            consumeErrors=True,
        )
    finally:
        guard.cancel()
    if run.gone is not None or request.channel is None:
        record.publish(shared.bus, status=499, node_id=None, error=run.gone or "cancelled")
        return
    if registered:
        request.unregisterProducer()
    results = _node_results(run)
    complete = len(run.succeeded) == len(run.parts)
    final = {"status": _SUCCESS if complete else "partial", "nodes": results}
    request.write(json.dumps(final, separators=(",", ":")).encode() + b"\n")
    request.finish()
    record.publish(shared.bus, status=200, node_id=None, error=None if complete else "partial")


async def _stream_part(
    run: _Run, part: _Part, merge: _Merge, emit: Callable[[bytes], None]
) -> None:
    """One node's part of a streamed fan-out: its progress lines to ``emit``, then its result."""
    response = await run.send(part)
    if response is None:
        if run.gone is None:
            emit(_error_line(part))
        return
    if not 200 <= response.code < 300:
        await run.read_error(part, response)
        if run.gone is None:
            emit(_error_line(part))
        return
    part.status = response.code
    lines = _Lines(part.node.id, emit, merge.paused)
    merge.bodies.append(lines)
    part.cancel = lines.stop
    response.deliverBody(lines)
    await lines.done
    merge.bodies.remove(lines)
    reason = lines.reason
    assert reason is not None
    if reason.check(ResponseDone, PotentialDataLoss) and not lines.too_long:
        lines.finish()
        if lines.error is not None:
            result = lines.error
        elif lines.succeeded:
            result = _SUCCESS
        else:
            result = "the node's progress ended without success"
        run.end(part, AttemptOutcome.COMMITTED.value, result)
        return
    why = "a progress line was too long" if lines.too_long else DROPPED_MID_STREAM
    run.end(part, AttemptOutcome.DROPPED.value, why)
    emit(_error_line(part))


def _error_line(part: _Part) -> bytes:
    """The line that tells the client a node failed without an error line of its own."""
    line = {"error": part.result, "nvpair_node": part.node.id}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


async def _summary(run: _Run) -> None:
    """Copy and delete: every node's status in one JSON object (200, 207 or 502)."""
    request, record, shared = run.request, run.record, run.facade.shared

    async def part(part: _Part) -> None:
        response = await run.send(part)
        if response is None:
            return
        if 200 <= response.code < 300:
            body = _Capped()
            part.cancel = body.stop
            response.deliverBody(body)
            await body.done
            part.status = response.code
            run.end(part, AttemptOutcome.COMMITTED.value, _SUCCESS)
        else:
            await run.read_error(part, response)

    await gatherResults([Deferred.fromCoroutine(part(p)) for p in run.parts], consumeErrors=True)
    if run.gone is not None or request.channel is None or request.finished:
        record.publish(shared.bus, status=499, node_id=None, error=run.gone or "cancelled")
        return
    nodes: dict[str, Any] = {}
    for p in run.parts:
        nodes[p.node.id] = (
            {"status": p.status}
            if p.result == _SUCCESS
            else {"status": p.status, "error": p.result}
        )
    succeeded = len(run.succeeded)
    document: dict[str, Any] = {
        "status": _SUCCESS if succeeded == len(run.parts) else "partial",
        "nodes": nodes,
    }
    if succeeded == len(run.parts):
        status, error = 200, None
    elif succeeded:
        status, error = 207, "partial"
    else:
        status, error = 502, "fan-out-failed"
        document = {"error": "no node succeeded", "code": "fan-out-failed", **document}
    body = json.dumps(document, separators=(",", ":")).encode()
    _head(request, status, b"application/json", run.fan.nodes)
    request.setHeader(b"content-length", b"%d" % len(body))
    record.first_byte()
    request.write(body)
    request.finish()
    record.publish(shared.bus, status=status, node_id=None, error=error)
