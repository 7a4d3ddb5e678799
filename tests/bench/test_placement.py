"""The black-box scheduling bench (``bench/placement.py``, issue 39): its oracle finishes each
arrival where it would end first under processor sharing, and a run through the proxy answers
every request, split as the oracle splits a burst."""

from __future__ import annotations

import pytest

from bench.placement import (
    ANSWER_TOKENS,
    FAST,
    PACES,
    PROMPT_TOKENS,
    SLOW,
    Scenario,
    _shared_finish,
    figures,
    measure,
    run,
    through_proxy,
)


def test_a_job_shared_with_others_ends_when_the_machine_has_done_the_work_before_it() -> None:
    assert _shared_finish([], 2.0) == 2.0
    assert _shared_finish([5.0], 2.0) == 4.0  # both at half speed until it ends
    assert _shared_finish([1.0], 2.0) == pytest.approx(2 * 1.0 + 1.0)
    assert _shared_finish([1.0, 1.0], 3.0) == pytest.approx(3 * 1.0 + 2.0)


def test_the_oracle_sends_one_request_of_a_burst_of_six_to_the_slow_machine() -> None:
    """Five on the fast machine end before one alone on the slow one would; the sixth would not."""
    fast, slow = (
        p.load + PROMPT_TOKENS / p.prefill + ANSWER_TOKENS / p.decode
        for p in (PACES[FAST], PACES[SLOW])
    )
    assert 5 * fast < slow < 6 * fast
    burst = Scenario("one burst", (1.0,) * 6)
    oracle = measure(burst)["oracle"]
    assert oracle.slow_share == pytest.approx(1 / 6)


def test_a_run_through_the_proxy_answers_every_request() -> None:
    answers = run(Scenario("two", (1.0, 1.0)), through_proxy)
    assert sorted(a.node for a in answers) == [SLOW, FAST]  # one to each: neither was measured
    assert figures(answers).slow_share == 0.5
