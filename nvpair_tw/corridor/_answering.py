# -*- test-case-name: tests.corridor.test_facade, tests.corridor.test_probes -*-
"""The stages that answer a request by themselves (docs/behaviour.md §2.1, §4.3, §13.2, §17.6):
a probe, a model list, a tunnel, a fan-out and a preload, each run with the driver's writer and
giving back what its record says (:class:`~nvpair_tw.corridor._exchange.Ended`), or the refusal
the writer still has to write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from attrs import frozen

from nvpair_tw.corridor._caller import CallerState
from nvpair_tw.corridor._exchange import Answer, Ended, Stage
from nvpair_tw.corridor._fanout import FanOutRequest, fan_out
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._preload import Preload, preload_answer
from nvpair_tw.corridor._probes import probe_answer, probe_of
from nvpair_tw.corridor._stages import list_answer, tunnel_nodes
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.corridor._tunnel import Upgrade, open_tunnel
from nvpair_tw.corridor._writer import Writer
from nvpair_tw.inbound import LOCAL, Rejection

__all__ = ["Asked", "answer"]


@frozen
class Asked:
    """What a stage that answers by itself works with."""

    facade: FacadeState
    writer: Writer
    head: Head
    caller: CallerState


async def answer(asked: Asked, step: Answer) -> Ended | Rejection:
    """Run the stage ``step`` names; what its record says, or the refusal to write."""
    return await _STAGES[step.stage](asked, step)


def _now(asked: Asked) -> float:
    return asked.facade.shared.clock.seconds()


async def _probe(asked: Asked, _: Answer) -> Ended | Rejection:
    head = asked.head
    probe = probe_of(asked.facade.engine, head.method, head.path)
    assert probe is not None
    whole = await probe_answer(asked.facade, probe)
    if isinstance(whole, Rejection):
        return whole
    asked.writer.whole(whole)
    return Ended(whole.status, first_byte_at=_now(asked))


async def _model_list(asked: Asked, _: Answer) -> Ended | Rejection:
    whole, error = await list_answer(asked.facade, asked.head)
    asked.writer.whole(whole)
    return Ended(whole.status, error=error, first_byte_at=_now(asked))


async def _tunnel(asked: Asked, _: Answer) -> Ended | Rejection:
    facade, head = asked.facade, asked.head
    shared = facade.shared
    nodes = tunnel_nodes(facade, head)
    if isinstance(nodes, Rejection):
        return nodes
    caller = head.caller
    assert shared.endpoints is not None
    end = await open_tunnel(
        asked.writer,
        nodes,
        Upgrade(head.target.wire, head.headers, list(head.upgrade)),
        asked.caller,
        key=None if caller is LOCAL else (caller.name, caller.rules.max_tunnels),
        engine=facade.engine,
        book=shared.tunnels,
        endpoints=shared.endpoints,
        clock=shared.clock,
        timeout=shared.settings.response_header_timeout,
    )
    if end.refused is not None:
        asked.writer.refuse(end.refused)
    return Ended(end.status, end.node_id, end.error, end.attempts, None, end.first_byte_at)


async def _fan_out(asked: Asked, step: Answer) -> Ended | Rejection:
    assert isinstance(step.work, FanOutRequest)
    end = await fan_out(asked.facade, asked.writer, step.work, asked.caller)
    return Ended(end.status, None, end.error, end.parts, end.nodes, end.first_byte_at)


async def _preload(asked: Asked, step: Answer) -> Ended | Rejection:
    assert isinstance(step.work, Preload)
    answered = await preload_answer(asked.facade, step.work)
    if isinstance(answered, Rejection):
        return answered
    whole, node_id = answered
    asked.writer.whole(whole)
    return Ended(200, node_id, first_byte_at=_now(asked))


_STAGES: dict[Stage, Callable[[Asked, Answer], Awaitable[Ended | Rejection]]] = {
    Stage.PROBE: _probe,
    Stage.MODEL_LIST: _model_list,
    Stage.TUNNEL: _tunnel,
    Stage.FAN_OUT: _fan_out,
    Stage.PRELOAD: _preload,
}
