"""The coding-agent scenario of ``bench/agents.py`` (issue 39): every agent's requests are read
by the engine double as one growing conversation, so a session pinned to a node finds its whole
previous turn cached on every route (the oracle's figure is the scenario's, not an artefact of a
request shape); Claude Code 2.1.37's billing block defeats that; a run through the proxy
completes every turn."""

from __future__ import annotations

from itertools import pairwise

import pytest

from bench.agentclients import CLIENTS, Client
from bench.agents import ORACLE, RANDOM, Outcome, Scenario, _nvpair, run
from bench.kvengine import Served

REPLY = 25
"""The tokens of every answer (22 words, then the tool call's three)."""


def _one_session(client: Client, turns: int = 3) -> list[Served]:
    outcome = run(Scenario(client, ORACLE, "-", sessions=1, turns=turns, seed=1))
    assert not outcome.failures
    return outcome.served


@pytest.mark.parametrize(
    "client", CLIENTS, ids=[c.path + ("+billing" if c.clean else "") for c in CLIENTS]
)
def test_a_pinned_session_finds_its_whole_previous_turn_cached(client: Client) -> None:
    """Turn k finds turn k-1's prompt and answer cached, and reads only what is new: the tool
    result of about 1,000 tokens and the markers around it."""
    served = _one_session(client)
    assert [s.path for s in served] == [client.path] * 3
    assert served[0].prompt > 3000  # the 2,000-token system prompt and the 1,000-token task
    for before, after in pairwise(served):
        assert after.cached == before.prompt + REPLY
        assert 1000 <= after.prompt - after.cached <= 1010


def test_the_billing_block_claude_code_2_1_37_sends_defeats_the_cache() -> None:
    """Its first system block changes on every request, so only the tokens before its ``cch``
    are found cached, whatever the node; without it (what the oracle sends) the whole previous
    turn is."""
    [claude_code] = [c for c in CLIENTS if c.clean is not None]
    outcome = run(Scenario(claude_code, RANDOM, "-", sessions=1, turns=3, seed=1))
    assert not outcome.failures
    assert all(s.cached < 10 for s in outcome.served)


def _through_proxy(client: Client, sessions: int = 2, turns: int = 3) -> Outcome:
    return run(Scenario(client, _nvpair("ollama"), "ollama", sessions, turns, seed=1))


@pytest.mark.parametrize(
    "client", CLIENTS, ids=[c.path + ("+billing" if c.clean else "") for c in CLIENTS]
)
def test_every_turn_through_the_proxy_is_answered_on_its_own_route(client: Client) -> None:
    """The proxy forwards each route natively to the engine doubles (llama-server speaks all
    three OpenAI and Anthropic routes; Ollama ``/api/chat``), and every turn is answered."""
    outcome = _through_proxy(client)
    assert not outcome.failures
    assert len(outcome.turn_seconds) == 2 * 3
    assert {s.path for s in outcome.served} == {client.path}
