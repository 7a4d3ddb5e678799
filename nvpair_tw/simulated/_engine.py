# -*- test-case-name: tests.simulated.test_engine -*-
"""Simulated engines that misbehave on purpose, for ``--demo``, the benchmarks and the test suite.

A :class:`SimulatedEngine` is a Twisted ``Resource`` answering the Ollama and OpenAI-style routes the
proxy uses. Its :class:`Behaviour`, chosen per inference request by a :data:`Policy` (:func:`always`,
:func:`alternate` or any callable), decides whether it answers, freezes before the headers, sends
headers and then nothing, drops the connection, or fails with a status. Every timer runs on the clock
it is given, so a test can drive it with a ``task.Clock``. Every request it receives is kept as a
:class:`Received` (method, target, headers, body) so tests can compare replayed bodies byte for byte.

``loaded`` says which models are resident, as Ollama's ``GET /api/ps`` and LM Studio's
``GET /api/v0/models`` (``state``) report them; None (the default) answers both with 404, like an
engine without those endpoints, so residency stays unknown.

``kind`` (``ollama``, ``lmstudio``, ``omlx`` or ``openai``, docs/behaviour.md §11.1) makes the engine one real
server: it answers only that server's routes (:mod:`~nvpair_tw.simulated._kinds`), 404s the others
with that server's error body, lists its models in that server's format
(:mod:`~nvpair_tw.simulated._inventory`) and streams as that server does
(:mod:`~nvpair_tw.simulated._dialects`). None (the default) answers every route of every engine.

This module is production-safe (``--demo`` uses it); the test harnesses built on it are in
:mod:`nvpair_tw.testing`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from attrs import define, evolve, field, frozen, validators
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair_tw.core import abort
from nvpair_tw.simulated._asked import Asked
from nvpair_tw.simulated._dialects import kind_frames
from nvpair_tw.simulated._inventory import Shelf, kind_listing, ollama_show
from nvpair_tw.simulated._kinds import KINDS, Raw, not_found, serves
from nvpair_tw.simulated._lmstudio import CHAT_PATH, chat_frames
from nvpair_tw.simulated._machine import Machine
from nvpair_tw.simulated._pace import Pace, Timing, answer_tokens, token_limit
from nvpair_tw.simulated._replies import control_answer, reply_frames, route_answer, stream_kind
from nvpair_tw.simulated._router import Answer, Step, load, router_get, router_post

__all__ = [
    "Behaviour",
    "Policy",
    "Received",
    "SimulatedEngine",
    "alternate",
    "always",
    "once",
    "reply_frames",
    "stream_kind",
]


class Behaviour(Enum):
    """What the engine does with one request."""

    HEALTHY = "healthy"
    FROZEN = "frozen"  # reads the request, never sends headers
    HEADERS_ONLY = "headers-only"  # sends headers, then silence
    DROP_AFTER_HEADERS = "drop-after-headers"  # sends headers, then closes before any body byte
    DROP_MID_STREAM = "drop-mid-stream"  # sends part of the stream, then resets
    STATUS_503 = "status-503"
    STATUS_404 = "status-404"
    STATUS_400 = "status-400"
    EMPTY_200 = "empty-200"  # Content-Length: 0
    SLOW_BODY = "slow-body"  # sends headers, then the body after ``body_delay``
    ERROR_LINE = "error-line"  # an NDJSON stream that ends with an ``{"error": ...}`` line (200)
    STUCK = "stuck"  # the whole engine freezes for ``stuck_for`` seconds (this request: for good)
    NO_ROUTE = "no-route"  # 404 {"detail": "Not Found"}: a FastAPI server's build without the
    # route (vLLM and LocalAI answer /v1/messages so, docs/behaviour.md §17.3)


_SILENT = (Behaviour.FROZEN, Behaviour.STUCK)
"""Behaviours that answer nothing, so no delay comes first."""


@frozen
class Received:
    """One request as the engine saw it."""

    method: bytes
    path: bytes
    headers: dict[bytes, list[bytes]]
    body: bytes

    @classmethod
    def of(cls, request: Request, body: bytes) -> Received:
        """``request`` (whose body was ``body``) as received, header names lowercased."""
        headers = {k.lower(): list(v) for k, v in request.requestHeaders.getAllRawHeaders()}
        return cls(request.method, request.uri, headers, body)


Policy = Callable[[int, bytes], Behaviour]


def always(behaviour: Behaviour) -> Policy:
    """The same behaviour for every request."""
    return lambda _number, _path: behaviour


def alternate(first: Behaviour, second: Behaviour) -> Policy:
    """``first`` on odd-numbered inference requests, ``second`` on even ones (1-based)."""
    return lambda number, _path: first if number % 2 == 1 else second


def once(behaviour: Behaviour) -> Policy:
    """``behaviour`` on the first inference request, :attr:`Behaviour.HEALTHY` on every later one."""
    return lambda number, _path: behaviour if number == 1 else Behaviour.HEALTHY


@define
class SimulatedEngine(Resource):
    """A fake Ollama/OpenAI-style engine: listen it with :meth:`site`, or put it in a
    :class:`nvpair_tw.testing.MemoryCluster`."""

    clock: IReactorTime
    models: Sequence[str] = ("llama3:latest",)
    policy: Policy = field(factory=lambda: always(Behaviour.HEALTHY))
    chunks: int = 3
    chunk_delay: float = 0.0
    header_delay: float = 0.0
    body_delay: float = 0.0
    reply_text: str = "hello"
    api_key: str | None = None
    loaded: Sequence[str] | None = None
    response_prefix: str = "resp"
    script: Callable[[bytes, bool, bytes], list[bytes]] | None = None
    """When set, the frames of a healthy answer: ``script(path, streaming, request_body)``
    (e.g. a stream with tool calls or a usage chunk); else :func:`reply_frames`."""
    split_lines: bool = False
    """Send every frame in two writes, ``chunk_delay`` apart (a line that arrives in pieces)."""
    frozen: bool = False
    """The whole process is frozen (as by SIGSTOP): every request, the model list and the other
    control routes included, is read and never answered. Set it back to ``False`` to thaw: what
    arrives afterwards is answered (requests taken while frozen stay unanswered)."""
    kind: str | None = field(
        default=None, kw_only=True, validator=validators.optional(validators.in_(KINDS))
    )
    """The one engine this is (see the module docstring), or None for all of them at once."""
    context_length: int = field(default=4096, kw_only=True)
    """Each model's context length, as a kind reports it (``max_context_length``, ``n_ctx``, …)."""
    slots: int = field(default=1, kw_only=True)
    """llama.cpp's ``total_slots`` (kind ``openai``)."""
    models_max: int | None = field(default=None, kw_only=True)
    """Kind ``openai`` only: a llama.cpp router keeping this many models loaded (0: no limit;
    :mod:`~nvpair_tw.simulated._router`), or None for a one-model ``llama-server``."""
    loaded_context: int | None = field(default=None, kw_only=True)
    """The context a loaded model is loaded with (LM Studio's loaded instance, a router's
    ``/props?model=``); None: ``context_length``."""
    pace: Pace | Machine | None = field(default=None, kw_only=True)
    """A machine's speed (:mod:`~nvpair_tw.simulated._pace`; a kind's engine only): answers in
    words at that pace, stating its counts and durations; a :class:`Machine`, its pace shared by
    the requests it runs at once; None: ``chunks`` numbered chunks, ``header_delay`` apart."""
    stuck_for: float = field(default=0.0, kw_only=True)
    """How long :attr:`Behaviour.STUCK` freezes the whole engine (:attr:`frozen`), in seconds."""
    received: list[Received] = field(factory=list)
    inference_count: int = 0
    _timers: list[IDelayedCall] = field(factory=list)
    _open: list[Request] = field(factory=list)

    isLeaf = True

    def __attrs_post_init__(self) -> None:
        Resource.__init__(self)

    def site(self) -> Site:
        """A quiet Site serving this engine: no factory lines, no access log (``--demo``)."""
        site = _QuietSite(self)
        site.noisy = False
        return site

    def stop(self) -> None:
        """Cancel pending timers and close any request left open (frozen or silent)."""
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        self._timers.clear()
        for request in self._open:
            abort(request.transport)
        self._open.clear()

    def render(self, request: Request) -> bytes | int:  # type: ignore[override]
        assert request.content is not None
        body = request.content.read()
        path = request.path
        self.received.append(Received.of(request, body))
        if self.frozen:
            self._open.append(request)
            request.notifyFinish().addBoth(_closed, self._open, request)
            return NOT_DONE_YET
        answer = _answered_at_once(self, request, body)
        if answer is not None:
            status, document = answer
            request.setResponseCode(status)
            return _json(request, document)
        self.inference_count += 1
        behaviour = self.policy(self.inference_count, path)
        _use_model(self, path, body)
        self._open.append(request)
        request.notifyFinish().addBoth(_closed, self._open, request)
        head = _head(self, path, body)
        if head > 0 and behaviour not in _SILENT:
            self._later(head, self._act, request, behaviour, body)
        else:
            self._act(request, behaviour, body)
        return NOT_DONE_YET

    @property
    def open_requests(self) -> list[Request]:
        """The requests taken and not yet answered in full."""
        return self._open

    def _later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self._timers = [t for t in self._timers if t.active()]
        self._timers.append(self.clock.callLater(delay, fn, *args))

    def _act(self, request: Request, behaviour: Behaviour, body: bytes) -> None:
        if behaviour is Behaviour.STUCK:
            self.frozen = True
            self._later(self.stuck_for, setattr, self, "frozen", False)
        if behaviour in _SILENT:
            return
        if _refused(request, behaviour, body, self.models):
            return
        if behaviour is Behaviour.EMPTY_200:
            request.setHeader(b"content-length", b"0")
            request.finish()
            return
        streaming, content_type = stream_kind(request.path, body)
        request.setHeader(b"content-type", content_type)
        if behaviour is Behaviour.HEADERS_ONLY:
            request.write(b"")
            return
        if behaviour is Behaviour.DROP_AFTER_HEADERS:
            request.write(b"")
            self._later(0, _hang_up, request)
            return
        if isinstance(self.pace, Machine) and behaviour is Behaviour.HEALTHY:
            return _on_machine(self, self.pace, request, streaming, body)
        frames = _healthy_frames(self, request.path, streaming, body)
        if behaviour is Behaviour.SLOW_BODY:
            request.write(b"")
            self._later(self.body_delay, self._send, request, frames, 0)
            return
        if self.split_lines:  # before a drop, so that it can cut a line in the middle
            frames = [half for frame in frames for half in _halves(frame)]
        if behaviour is Behaviour.DROP_MID_STREAM:
            frames = [*frames[: max(1, len(frames) // 2)], b""]
        if behaviour is Behaviour.ERROR_LINE:
            error = json.dumps({"error": "simulated error"}).encode() + b"\n"
            frames = [*frames[: max(1, len(frames) // 2)], error]
        self._send(request, frames, 0)

    def _send(self, request: Request, frames: list[bytes], index: int) -> None:
        if request.channel is None:
            return
        if index == len(frames):
            request.finish()
            return
        frame = frames[index]
        if frame == b"":
            _hang_up(request)
            return
        request.write(frame)
        pace = _pace_of(self)
        gap = self.chunk_delay if pace is None else 1 / pace.decode
        if gap > 0:
            self._later(gap, self._send, request, frames, index + 1)
        else:
            self._send(request, frames, index + 1)


def _closed(_result: object, still_open: list[Request], request: Request) -> None:
    if request in still_open:
        still_open.remove(request)


def _pace_of(engine: SimulatedEngine) -> Pace | None:
    """The engine's pace (its machine's), or None."""
    return engine.pace.pace if isinstance(engine.pace, Machine) else engine.pace


def _on_machine(
    engine: SimulatedEngine, machine: Machine, request: Request, streaming: bool, body: bytes
) -> None:
    """A healthy answer made on the engine's shared machine: each token is written as the
    machine makes it; the closing frame states the durations it was served at."""
    now, number = engine.clock.seconds(), engine.inference_count
    asked = Asked.of(request.path, body, streaming, engine.chunks, engine.reply_text, now, number)
    asked = _paced(asked, machine.pace)
    planned = _frames_of(engine, asked)

    def tick(index: int, timing: Timing | None) -> None:
        if request.channel is None:
            return
        if timing is None:
            if streaming:
                request.write(planned[index])
            return
        frames = _frames_of(engine, evolve(asked, timing=timing))
        request.write(b"".join(frames[index:] if streaming else frames))
        request.finish()

    job = machine.run(asked.prompt_tokens, len(asked.tokens), tick)
    request.notifyFinish().addErrback(lambda _: machine.drop(job))


def _json(request: Request, document: Any) -> bytes:
    if isinstance(document, Raw):
        request.setHeader(b"content-type", document.content_type)
        return document.body
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(document).encode()


def _path_is(request: Request, path: bytes) -> bool:
    return request.path == path


def _refused(request: Request, behaviour: Behaviour, body: bytes, models: Sequence[str]) -> bool:
    """Answer a failing status, a route this build lacks, or a delete of a model the engine
    lacks; whether it did."""
    document: dict[str, str] = {"detail": "Not Found"}
    if behaviour is Behaviour.NO_ROUTE:
        code = 404
    elif behaviour in (Behaviour.STATUS_503, Behaviour.STATUS_404, Behaviour.STATUS_400):
        code = int(behaviour.value.rsplit("-", 1)[1])
        document = {"error": f"simulated {code}"}
    elif _path_is(request, b"/api/delete") and not _has_model(body, models):
        code, document = 404, {"error": f"model '{_named(body)}' not found"}
    else:
        return False
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.write(json.dumps(document).encode())
    request.finish()
    return True


def _is_router(engine: SimulatedEngine) -> bool:
    return engine.kind == "openai" and engine.models_max is not None


def _loaded_context(engine: SimulatedEngine) -> int:
    return engine.context_length if engine.loaded_context is None else engine.loaded_context


def _use_model(engine: SimulatedEngine, path: bytes, body: bytes) -> None:
    """An inference request loads its model where the engine does so on demand: a router
    (evicting the least recently used model and aborting the requests still running on it,
    llama.cpp #22447) and LM Studio's ``/api/v1/chat`` (just in time)."""
    model = _named(body)
    if model not in engine.models or engine.loaded is None:
        return
    if _is_router(engine):
        assert engine.models_max is not None
        engine.loaded, evicted = load(model, engine.loaded, engine.models_max)
        for request in [r for r in engine.open_requests if _model_of(r) in evicted]:
            abort(request.transport)
    elif engine.kind == "lmstudio" and path == CHAT_PATH and model not in engine.loaded:
        engine.loaded = [*engine.loaded, model]


def _model_of(request: Request) -> str:
    """The model an open request's body names."""
    assert request.content is not None
    request.content.seek(0)
    return _named(request.content.read())


def _router_answer(engine: SimulatedEngine, request: Request, body: bytes) -> Answer | None:
    """A router's own routes (:mod:`~nvpair_tw.simulated._router`), loads and unloads applied."""
    if request.method == b"POST":
        posted = router_post(request.path, body, engine.models)
        if posted is None:
            return None
        answer, change = posted
        if change is not None and change.step is Step.UNLOAD:
            engine.loaded = [m for m in engine.loaded or () if m != change.model]
        elif change is not None:
            _use_model(engine, request.path, json.dumps({"model": change.model}).encode())
        return answer
    args = request.args or {}
    wanted = args.get(b"model", [b""])[0].decode("utf-8", "replace")
    autoload = args.get(b"autoload", [b"true"])[0] != b"false"
    if request.path == b"/props" and wanted and autoload:
        _use_model(engine, request.path, json.dumps({"model": wanted}).encode())
    context = _loaded_context(engine)
    return router_get(request.path, args, _shelf(engine), engine.models_max or 0, context)


def _named(body: bytes) -> str:
    """The ``model`` (else ``name``) of a model-management body, or ``""``."""
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        return ""
    name = parsed.get("model") or parsed.get("name") or ""
    return name if isinstance(name, str) else ""


def _has_model(body: bytes, models: Sequence[str]) -> bool:
    name = _named(body)
    return name in models or f"{name}:latest" in models


def _halves(frame: bytes) -> list[bytes]:
    """A frame as two writes (a hang-up marker, or a one-byte frame, stays whole)."""
    if len(frame) < 2:
        return [frame]
    middle = len(frame) // 2
    return [frame[:middle], frame[middle:]]


def _answered_at_once(
    engine: SimulatedEngine, request: Request, body: bytes
) -> tuple[int, Any] | None:
    """What ``engine`` answers without its policy: 401 for a wrong key, a load or unload (which
    changes what it has loaded), the model lists and the other control routes; None for
    inference. An engine of a kind answers a route its server lacks with that server's 404."""
    if engine.kind is not None and not serves(engine.kind, request.method, request.path):
        return 404, not_found(engine.kind, request.method, request.path)
    if engine.api_key is not None and request.requestHeaders.getRawHeaders(b"authorization") != [
        f"Bearer {engine.api_key}".encode()
    ]:
        return 401, {"error": "unauthorized"}
    path = request.path
    if _is_router(engine):
        routed = _router_answer(engine, request, body)
        if routed is not None:
            return routed
    if engine.kind == "ollama" and request.method == b"POST" and path == b"/api/show":
        return ollama_show(_named(body), _shelf(engine))
    if engine.kind is not None and request.method == b"GET":
        listed = kind_listing(engine.kind, path, _shelf(engine))
        return listed if listed is not None else (404, not_found(engine.kind, b"GET", path))
    if request.method == b"POST":
        control = control_answer(path, body, engine.models, engine.loaded)
        if control is not None:
            status, document, engine.loaded = control
            return status, document
    return route_answer(request.method, path, body, engine.models, engine.loaded)


def _hang_up(request: Request) -> None:
    """Close after flushing what was written (the client sees a truncated response)."""
    if request.transport is not None:
        request.transport.loseConnection()


def _healthy_frames(
    engine: SimulatedEngine, path: bytes, streaming: bool, body: bytes
) -> list[bytes]:
    """The frames of ``engine``'s healthy answer: its ``script``'s, its kind's, or every engine's."""
    if engine.script is not None:
        return engine.script(path, streaming, body)
    response_id = f"{engine.response_prefix}_{engine.inference_count}"
    if engine.kind is None:
        return reply_frames(
            path, streaming, engine.chunks, engine.reply_text, response_id=response_id
        )
    now, number = engine.clock.seconds(), engine.inference_count
    asked = Asked.of(path, body, streaming, engine.chunks, engine.reply_text, now, number)
    pace = _pace_of(engine)
    return _frames_of(engine, asked if pace is None else _paced(asked, pace))


def _frames_of(engine: SimulatedEngine, asked: Asked) -> list[bytes]:
    """The frames of ``engine``'s kind for ``asked``; a paced answer's end goes with its last
    token."""
    assert engine.kind is not None
    if engine.kind == "lmstudio" and asked.path == CHAT_PATH:
        return chat_frames(asked)
    response_id = f"{engine.response_prefix}_{engine.inference_count}"
    frames = kind_frames(engine.kind, asked, engine.context_length, response_id)
    last = asked.completion_tokens - 1
    if asked.timing is None or len(frames) <= last + 1:
        return frames
    return [*frames[:last], b"".join(frames[last:])]


def _paced(asked: Asked, pace: Pace) -> Asked:
    """``asked`` answered at ``pace``: in words, cut at the request's limit, with its timing."""
    tokens, finish = answer_tokens(token_limit(asked.body))
    timing = pace.timing(asked.prompt_tokens, len(tokens))
    return evolve(asked, tokens=tokens, timing=timing, finish=finish)


def _head(engine: SimulatedEngine, path: bytes, body: bytes) -> float:
    """Seconds before an inference answer's headers and first frame: a paced engine's first token
    (a whole answer's last), else ``header_delay``. Later frames go ``1 / decode`` (else
    ``chunk_delay``) apart."""
    if engine.pace is None:
        return engine.header_delay
    if isinstance(engine.pace, Machine):
        return 0.0  # the machine says when each token comes
    streaming, _ = stream_kind(path, body)
    timing = _paced(Asked.of(path, body, streaming, 1, "", 0.0, 0), engine.pace).timing
    assert timing is not None
    return timing.first_token if streaming else timing.total


def _shelf(engine: SimulatedEngine) -> Shelf:
    """What ``engine`` holds now, for its kind's GET routes (its open requests are its busy slots)."""
    busy = len(engine.open_requests)
    return Shelf(
        engine.models,
        engine.loaded,
        engine.context_length,
        _loaded_context(engine),
        engine.slots,
        busy,
        engine.clock.seconds(),
    )


class _QuietSite(Site):
    """A Site that writes no access log."""

    def log(self, request: http.Request) -> None:
        """Nothing: what a simulated engine was asked is in :attr:`SimulatedEngine.received`."""
