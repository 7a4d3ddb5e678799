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
are the engine's own ``error`` message (capped) or a transport reason. A streamed fan-out's
progress on each node (its lines' ``completed`` and ``total``, each part's end) is published as
``fan-out/progress`` events (:mod:`~nvpair_tw.corridor._progress`), for the status page.
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
from zope.interface import implementer

from nvpair_tw.core import FanOutRoute, Lines
from nvpair_tw.corridor._attempts import CallerState, classify_failure, node_headers
from nvpair_tw.corridor._progress import FanOutWatch
from nvpair_tw.corridor._record import elapsed_ms
from nvpair_tw.corridor._relay import CLIENT_STOPPED_READING, DROPPED_MID_STREAM, StallGuard
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._writer import Whole, Writer
from nvpair_tw.events import Attempt, AttemptOutcome, Outcome, PartState, StatusOutcome
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.upstream import Discard, describe_failure, node_url

__all__ = [
    "EVERY_NODE",
    "LINE_LIMIT",
    "FanOutEnd",
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
    the target as a node receives it (normalised path and query), the forwardable headers, the
    checked body (docs/behaviour.md §14.1) and the model it names (for its progress events)."""

    route: FanOutRoute
    nodes: list[Node]
    method: bytes
    target: bytes
    headers: Headers
    body: bytes
    model: str | None = None


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

    def __init__(
        self,
        node_id: str,
        emit: Callable[[bytes], None],
        paused: bool,
        seen: Callable[[dict[str, Any]], None],
    ) -> None:
        super().__init__()
        self._node_id = node_id
        self._emit = emit
        self._seen = seen
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
        self._seen(parsed)
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
    outcome: Outcome = AttemptOutcome.COMMITTED
    done: bool = field(default=False)

    def stop(self) -> None:
        if not self.done and self.cancel is not None:
            self.cancel()


@frozen
class FanOutEnd:
    """How a fan-out ended, for its record: the status, the error (None when every node
    succeeded), each node's part, and when its answer began (clock seconds)."""

    status: int
    error: str | None
    parts: tuple[Attempt, ...]
    nodes: tuple[str, ...]
    first_byte_at: float | None


@define(eq=False)
class _Run:
    """One fan-out in progress: the client's answer, its parts and whether the client is there."""

    facade: FacadeState
    writer: Writer
    fan: FanOutRequest
    parts: list[_Part]
    ended: list[Attempt] = field(factory=list)
    gone: str | None = None
    first_byte_at: float | None = None
    watch: FanOutWatch | None = None
    """A streamed fan-out's progress events."""

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
            self.end(part, outcome, why)
            return None
        if self.gone is not None:  # the headers came as the client left: nothing to read
            response.deliverBody(Discard())
            self.end(part, AttemptOutcome.CANCELLED, _CANCELLED)
            return None
        return response

    async def read_error(self, part: _Part, response: IResponse) -> None:
        """A non-2xx answer: its status and the engine's own message, body otherwise dropped."""
        body = _Capped()
        part.cancel = body.stop
        response.deliverBody(body)
        await body.done
        part.status = response.code
        self.end(part, StatusOutcome(response.code), _status_error(response.code, bytes(body.data)))

    def end(self, part: _Part, outcome: Outcome, result: str) -> None:
        part.done = True
        part.cancel = None
        if self.gone is not None and result != _SUCCESS:
            outcome = AttemptOutcome.CANCELLED
        part.outcome = outcome
        part.result = _CANCELLED if self.gone is not None and result != _SUCCESS else result
        now = self.facade.shared.clock.seconds()
        self.ended.append(Attempt(part.node.id, outcome, elapsed_ms(part.since, now)))
        if self.watch is not None:
            state = _PART_STATES.get(part.result, PartState.FAILED)
            self.watch.ended(part.node.id, state, part.result)
        if 200 <= part.status < 300 and outcome is AttemptOutcome.COMMITTED:
            self.facade.stalls.clear(part.node.id)
        if result != _SUCCESS and self.gone is None:
            log.info(
                "fan-out {path} to {node} failed: {why}",
                path=self.fan.route.path,
                node=part.node.id,
                why=result,
            )

    @property
    def succeeded(self) -> list[_Part]:
        return [p for p in self.parts if p.result == _SUCCESS]

    def began(self) -> None:
        self.first_byte_at = self.facade.shared.clock.seconds()

    def over(self, status: int, error: str | None) -> FanOutEnd:
        nodes = tuple(n.id for n in self.fan.nodes)
        return FanOutEnd(status, error, tuple(self.ended), nodes, self.first_byte_at)


async def fan_out(
    facade: FacadeState, writer: Writer, fan: FanOutRequest, caller: CallerState
) -> FanOutEnd:
    """Run ``fan`` on each of its nodes at once and answer the client through ``writer``; a
    client that leaves (``caller`` abandoned) cancels every node's part."""
    clock = facade.shared.clock
    parts = [_Part(node, clock.seconds()) for node in fan.nodes]
    run = _Run(facade, writer, fan, parts)
    caller.track(lambda: run.leave(caller.gone or "client disconnected"))
    try:
        if fan.route.streams:
            return await _stream(run)
        return await _summary(run)
    finally:
        caller.track(None)


def _head(status: int, content_type: bytes, nodes: Sequence[Node]) -> Headers:
    return Headers(
        {
            b"content-type": [content_type],
            b"x-content-type-options": [b"nosniff"],
            b"x-nvpair-node": [",".join(n.id for n in nodes).encode()],
        }
    )


_PART_STATES = {_SUCCESS: PartState.SUCCEEDED, _CANCELLED: PartState.CANCELLED}
"""A part's state in its progress events, by its result (any other is an error text)."""


def _node_results(run: _Run) -> dict[str, str]:
    return {p.node.id: p.result or _CANCELLED for p in run.parts}


async def _stream(run: _Run) -> FanOutEnd:
    """Pull and create: one NDJSON stream of every node's progress lines, then the last line."""
    writer, shared = run.writer, run.facade.shared
    writer.head(200, None, _head(200, b"application/x-ndjson", run.fan.nodes), None)
    writer.first(b"")  # the head goes out now: the client sees the fan-out has begun
    run.began()
    fan = run.fan
    nodes = [n.id for n in fan.nodes]
    run.watch = FanOutWatch.start(
        shared.bus, shared.clock, run.facade.engine, fan.route.path, fan.model, nodes
    )

    def emit(line: bytes) -> None:
        if run.gone is None:
            writer.write(line)

    def stop_all() -> None:  # the client's connection is gone (Twisted stops its producer)
        run.leave("client disconnected")

    merge = _Merge(stop_all)

    def write_stalled() -> None:
        run.leave(CLIENT_STOPPED_READING)
        writer.reset()

    guard = StallGuard(shared.clock, merge, shared.settings.write_stall_timeout, write_stalled)
    registered = writer.register(guard)
    try:
        await gatherResults(
            [Deferred.fromCoroutine(_stream_part(run, p, merge, emit)) for p in run.parts],
            consumeErrors=True,
        )
    finally:
        guard.cancel()
    if run.gone is not None or not writer.connected:
        return run.over(499, run.gone or "cancelled")
    if registered:
        writer.unregister()
    results = _node_results(run)
    complete = len(run.succeeded) == len(run.parts)
    final = {"status": _SUCCESS if complete else "partial", "nodes": results}
    writer.write(json.dumps(final, separators=(",", ":")).encode() + b"\n")
    writer.finish()
    return run.over(200, None if complete else "partial")


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
    watch = run.watch
    assert watch is not None
    lines = _Lines(part.node.id, emit, merge.paused, lambda line: watch.line(part.node.id, line))
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
        run.end(part, AttemptOutcome.COMMITTED, result)
        return
    why = "a progress line was too long" if lines.too_long else DROPPED_MID_STREAM
    run.end(part, AttemptOutcome.DROPPED, why)
    emit(_error_line(part))


def _error_line(part: _Part) -> bytes:
    """The line that tells the client a node failed without an error line of its own."""
    line = {"error": part.result, "nvpair_node": part.node.id}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


async def _summary(run: _Run) -> FanOutEnd:
    """Copy and delete: every node's status in one JSON object (200, 207 or 502)."""

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
            run.end(part, AttemptOutcome.COMMITTED, _SUCCESS)
        else:
            await run.read_error(part, response)

    await gatherResults([Deferred.fromCoroutine(part(p)) for p in run.parts], consumeErrors=True)
    writer = run.writer
    if run.gone is not None or not writer.connected or writer.answered:
        return run.over(499, run.gone or "cancelled")
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
    headers = _head(status, b"application/json", run.fan.nodes)
    run.began()
    writer.whole(Whole(status, body, headers=tuple(_pairs(headers))))
    return run.over(status, error)


def _pairs(headers: Headers) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, values in headers.getAllRawHeaders() for value in values]
