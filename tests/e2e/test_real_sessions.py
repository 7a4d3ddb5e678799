# -*- test-case-name: tests.e2e.test_real_sessions -*-
"""Coding agents keep their cache through the proxy, counted by real engines (issue 39,
docs/behaviour.md §5.3): four Claude Code sessions of six turns on two real ``llama-server``\\ s
with two slots each and prompt caching on (its default), through a ``twist nvpair`` subprocess
and then straight to pinned nodes (session ``i`` on node ``i % 2``), each run on freshly started
servers so that neither finds the other's prompts.

This build of ``llama-server`` serves ``/v1/messages`` and says what it found cached in the
stream's ``message_start`` usage: ``cache_read_input_tokens`` (found) and ``input_tokens`` (read,
the rest). The sessions (``tests/e2e/realsessions.py``) are sent through the proxy as Claude Code
2.1.37 sends them (a billing block with a new ``cch`` every request, ``cache_control`` markers
that move, the session in ``metadata.user_id`` and ``X-Claude-Code-Session-Id``) and to the pinned
nodes without the billing block, as the proxy forwards them by default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.realnodes import ProxyProcess, RealLlamaServer
from tests.e2e.realsessions import (
    CLAUDE_CODE,
    Pacing,
    Run,
    pinned,
    run_sessions,
    sessions,
    through,
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine]

SESSIONS = 4
PACING = Pacing(turns=6, turn_words=12)
SYSTEM_WORDS = 30
"""The sessions' shared system prompt, in pseudo-words (about four tokens each; the Claude Code
identity and tool schema come on top): short, so that each session's own turns are most of what
a node reads and a session sent to the wrong node shows in the count."""
WITHIN = 0.10
"""How far the proxy's cached share may fall from the pinned run's, relative to it."""


@contextmanager
def _servers() -> Iterator[list[RealLlamaServer]]:
    started: list[RealLlamaServer] = []
    try:
        for _ in range(2):
            started.append(RealLlamaServer.start(slots=2))
        yield started
    finally:
        for server in started:
            server.stop()


def _pinned(servers: list[RealLlamaServer]) -> Run:
    """The sessions straight to the servers, session ``i`` on server ``i % 2``, without the
    billing block."""
    urls = [server.url for server in servers]
    names = {url: f"n{number}" for number, url in enumerate(urls)}
    made = sessions(SESSIONS, SYSTEM_WORDS, PACING.turn_words)
    return run_sessions(CLAUDE_CODE.clean, CLAUDE_CODE.read, made, pinned(urls), PACING, names)


def _through_proxy(servers: list[RealLlamaServer], workdir: Path) -> Run:
    """The sessions as Claude Code sends them, through a proxy over the two servers."""
    nodes = workdir / "nodes.toml"
    nodes.write_text(
        "".join(
            f'[[node]]\nid = "n{number}"\nurl = "{server.url}"\nkind = "openai"\n\n'
            for number, server in enumerate(servers)
        )
    )
    made = sessions(SESSIONS, SYSTEM_WORDS, PACING.turn_words)
    proxy = ProxyProcess(["--engine", "openai", "--nodes", str(nodes)], workdir)
    try:
        proxy.wait_ready(2)
        return run_sessions(
            CLAUDE_CODE.build, CLAUDE_CODE.read, made, through(proxy.url), PACING, {}
        )
    finally:
        log = proxy.stop()
        assert "Traceback" not in log, log
        assert made[0].task not in log, "a prompt reached the proxy's log"


def _each(run: Callable[[list[RealLlamaServer]], Run]) -> Run:
    with _servers() as servers:
        return run(servers)


def _shown(run: Run) -> str:
    return (
        f"{run.cached} of {run.cached + run.read} prompt tokens cached "
        f"({run.cached_share:.1%}), {run.moved} turns moved, {run.seconds:.1f} s"
    )


@pytest.mark.timeout(240, func_only=True)
def test_claude_code_sessions_through_the_proxy_find_as_much_cached_as_pinned(
    tmp_path: Path,
) -> None:
    """The share of prompt tokens the engines report cached through the proxy is within 10 %
    (relative) of the pinned run's: the proxy keeps each conversation on the node that holds it,
    although the request changes every turn (the billing block's ``cch``, the moving
    ``cache_control``)."""
    through = _each(lambda servers: _through_proxy(servers, tmp_path))
    pinned = _each(_pinned)
    shown = f"through the proxy: {_shown(through)}; pinned: {_shown(pinned)}"
    print(shown)
    assert len(through.served) == len(pinned.served) == SESSIONS * PACING.turns, shown
    assert pinned.moved == 0, shown
    kept, oracle = through.cached_share, pinned.cached_share
    assert oracle > 0.5, shown  # the engines do cache: the comparison means something
    assert abs(kept - oracle) <= oracle * WITHIN, shown
