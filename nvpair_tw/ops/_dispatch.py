# -*- test-case-name: tests.ops.test_control -*-
"""The control channel's method table (docs/behaviour.md §8): one request in, its answer out.

:class:`ControlMethods` resolves a method name (with its ``ENGINE:`` prefix), checks the params are
an object, refuses a manual node that is this very process (§14.3) and runs the method from
:mod:`nvpair_tw.ops._steering`. An answer is a result, a ``Deferred`` of one (a method that answers
later and lets the connection go on), or :class:`InOrder` (an answer that the connection must
wait for before it reads its next request: a manual node whose host name is being resolved).
"""

from __future__ import annotations

from typing import Any

from attrs import frozen
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from nvpair_tw.corridor import FacadeState
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.ops._rpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    BadRequest,
    NotJsonRpc,
    Params,
    Request,
    Result,
    RpcError,
    invalid,
    read_request,
    short,
)
from nvpair_tw.ops._rpc import error as rpc_error
from nvpair_tw.ops._steering import PROCESS, SCOPED
from nvpair_tw.runtime import Runtime

__all__ = ["ADD_MANUAL", "Answer", "ControlMethods", "InOrder"]

log = LevelledLogger(namespace=__name__)

ADD_MANUAL = "node/add-manual"
_SELF = "url is this proxy's own listener (a node must not be this process)"


@frozen
class InOrder:
    """An answer that comes later and that the connection waits for before its next request."""

    answer: Deferred[Result | None]


Answer = Result | Deferred[Result | None] | InOrder | None
"""What one request gets: a response now, later, later-in-order, or nothing (a notification)."""


def _reply(request: Request, result: Any) -> Result | None:
    return None if request.notification else {"jsonrpc": "2.0", "id": request.id, "result": result}


def _failed(request: Request, failure: Failure) -> Result | None:
    """A method that answers later failed: its own refusal, else -32603 (logged); cancelled (the
    client left), nothing."""
    if failure.check(CancelledError):
        log.info("control {method} stopped: the client left", method=short(request.method))
        return None
    if failure.check(RpcError):
        refusal = failure.value
        assert isinstance(refusal, RpcError)
        log.info(
            "control {method} refused ({code})", method=short(request.method), code=refusal.code
        )
        return (
            None if request.notification else rpc_error(request.id, refusal.code, refusal.message)
        )
    log.failure("control {method} failed", failure, method=short(request.method))
    return None if request.notification else rpc_error(request.id, INTERNAL_ERROR, "internal error")


class ControlMethods:
    """The method table of docs/behaviour.md §8 over one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._scoped = SCOPED
        self._process = PROCESS

    def handle_line(self, line: bytes) -> Answer:
        """Answer one request line; ``None`` for a blank line or a (valid) notification."""
        request = read_request(line)
        if isinstance(request, NotJsonRpc | BadRequest):
            return request.response
        return None if request is None else self.answer(request)

    def answer(self, request: Request) -> Answer:
        """Run one well-formed request and give its answer (see :data:`Answer`)."""
        try:
            result = self.call(request.method, request.params)
        except RpcError as error:
            log.info(
                "control {method} refused ({code})",
                method=short(request.method),
                code=error.code,
                notification=request.notification,
            )
            return (
                None if request.notification else rpc_error(request.id, error.code, error.message)
            )
        except Exception:
            log.failure("control {method} failed", method=short(request.method))
            return (
                None
                if request.notification
                else rpc_error(request.id, INTERNAL_ERROR, "internal error")
            )
        if isinstance(result, InOrder):
            return InOrder(self._later(request, result.answer))
        if isinstance(result, Deferred):
            return self._later(request, result)
        log.debug("control {method} done", method=short(request.method))
        return _reply(request, result)

    def _later(self, request: Request, answer: Deferred[Any]) -> Deferred[Result | None]:
        return answer.addCallbacks(
            lambda later: _reply(request, later), lambda failure: _failed(request, failure)
        )

    def call(self, method: str, params: object) -> Result | Deferred[Result] | InOrder:
        """Run one method (``ENGINE:`` prefix allowed); raise :class:`RpcError` on bad input."""
        name, engine = self._resolve(method)
        if not isinstance(params, dict):
            raise invalid("params must be an object (by-name)")
        process = self._process.get(name)
        if process is not None:
            return process(self._runtime, params)
        facade = self._facade(name, engine)
        if name == ADD_MANUAL:
            return self._add_manual(facade, params)
        return self._scoped[name](facade, params)

    def _add_manual(
        self, facade: FacadeState, params: Params
    ) -> Result | Deferred[Result] | InOrder:
        """``node/add-manual``, refused (-32602) for a URL that is this process (§14.3); a host
        name on one of this process's ports is resolved first, on the reactor's resolver."""
        add = self._scoped[ADD_MANUAL]
        url = params.get("url")
        guard = self._runtime.self_guard
        if not isinstance(url, str):
            return add(facade, params)
        if guard.must_resolve(url):

            def checked(me: bool) -> Result | None:
                if me:
                    raise invalid(_SELF)
                result = add(facade, params)
                assert not isinstance(result, Deferred)  # node/add-manual answers at once
                return result

            later: Deferred[Result | None] = guard.refresh(url).addCallback(checked)
            return InOrder(later)
        if guard.excludes(url):
            raise invalid(_SELF)
        return add(facade, params)

    def _resolve(self, method: str) -> tuple[str, str | None]:
        if method in self._scoped or method in self._process:
            return method, None
        engine, colon, name = method.partition(":")
        if colon and (name in self._scoped or name in self._process):
            if engine not in self._runtime.facades:
                raise RpcError(
                    METHOD_NOT_FOUND,
                    f"method not found: {short(method)!r}: this proxy serves no engine "
                    f"{short(engine)!r} (engines: {', '.join(self._runtime.facades)})",
                )
            return name, engine
        raise RpcError(METHOD_NOT_FOUND, f"method not found: {short(method)!r}")

    def _facade(self, name: str, engine: str | None) -> FacadeState:
        facades = self._runtime.facades
        if engine is not None:
            return facades[engine]
        if len(facades) == 1:
            return next(iter(facades.values()))
        first = next(iter(facades))
        raise RpcError(
            INVALID_PARAMS,
            f"several engines are served ({', '.join(facades)}); "
            f"address one as ENGINE:{name}, e.g. {first}:{name}",
        )
