"""The routes a node was found to lack (docs/behaviour.md §17.3): held per node and URL until the
node's next restart is seen through its inventory poll (its reachability changes)."""

from __future__ import annotations

import pytest
from twisted.logger import capturedLogs, formatEvent

from nvpair_tw.nodes import Node
from nvpair_tw.selection import Reach, RouteGaps
from nvpair_tw.selection._reachability import ReachabilityBook

pytestmark = pytest.mark.timeout(30)

MESSAGES = "/v1/messages"
V = Node("v", "http://v:8000", kind="openai")
STATIC = Node("s", "http://s:8000", ("m",), kind="openai")


def book() -> tuple[RouteGaps, ReachabilityBook]:
    reach = ReachabilityBook("openai")
    return RouteGaps("openai", reach), reach


def test_a_learnt_route_is_lacked_with_the_routes_under_it_and_nothing_else() -> None:
    gaps, reach = book()
    reach.answered(V, 1.0, 1)
    assert not gaps.lacks(V, MESSAGES)
    gaps.learn(V, MESSAGES)
    assert gaps.lacks(V, MESSAGES) and gaps.lacks(V, "/v1/messages/count_tokens")
    assert not gaps.lacks(V, "/v1/chat/completions")
    assert not gaps.lacks(Node("w", "http://w:8000", kind="openai"), MESSAGES)
    assert gaps.of(V) == (MESSAGES,)


def test_a_gap_is_logged_once_without_any_request_text() -> None:
    gaps, reach = book()
    reach.answered(V, 1.0, 1)
    with capturedLogs() as captured:
        gaps.learn(V, MESSAGES)
        gaps.learn(V, MESSAGES)
    lines = [formatEvent(event) for event in captured if "has no" in formatEvent(event)]
    assert lines == [
        "node v has no /v1/messages: it is sent the translation until it restarts (openai facade)"
    ]


def test_a_gap_holds_while_the_node_answers_its_polls() -> None:
    gaps, reach = book()
    reach.answered(V, 1.0, 1)
    gaps.learn(V, MESSAGES)
    for at in (11.0, 21.0, 31.0):
        reach.answered(V, at, 1)
    assert gaps.lacks(V, MESSAGES)


def test_a_failed_poll_is_a_restart_seen_and_the_gap_is_forgotten() -> None:
    """The node went down (or stopped answering): whatever runs there when it is back is asked
    for the route again."""
    gaps, reach = book()
    reach.answered(V, 1.0, 1)
    gaps.learn(V, MESSAGES)
    reach.failed(V, "connection refused", 11.0, 1)
    assert reach.of(V).state is Reach.UNREACHABLE
    assert not gaps.lacks(V, MESSAGES)
    reach.answered(V, 21.0, 1)
    assert gaps.of(V) == ()


def test_a_gap_learnt_while_unreachable_is_forgotten_when_the_node_answers_again() -> None:
    gaps, reach = book()
    reach.failed(V, "no answer within 10s", 1.0, 1)
    gaps.learn(V, MESSAGES)
    reach.failed(V, "no answer within 10s", 11.0, 1)
    assert gaps.lacks(V, MESSAGES)
    reach.answered(V, 21.0, 1)
    assert not gaps.lacks(V, MESSAGES)


def test_a_node_at_another_url_is_another_server() -> None:
    gaps, _ = book()
    gaps.learn(V, MESSAGES)
    moved = Node("v", "http://elsewhere:8000", kind="openai")
    assert not gaps.lacks(moved, MESSAGES) and not gaps.lacks(V, MESSAGES)


def test_a_polled_node_that_left_and_came_back_is_asked_again() -> None:
    gaps, reach = book()
    reach.answered(V, 1.0, 1)
    gaps.learn(V, MESSAGES)
    reach.prune({})  # the node left the directory
    reach.answered(V, 21.0, 1)  # back, and polled
    assert not gaps.lacks(V, MESSAGES)


def test_a_static_node_is_never_polled_so_its_gap_holds() -> None:
    gaps, reach = book()
    gaps.learn(STATIC, MESSAGES)
    reach.prune({})
    assert gaps.lacks(STATIC, MESSAGES)
