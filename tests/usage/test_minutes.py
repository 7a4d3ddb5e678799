"""Tests for nvpair_tw.usage._minutes: which records count, into which minute, and the report's
window, grouping and sums."""

from __future__ import annotations

from datetime import UTC, datetime

import attrs
import pytest

from nvpair_tw.usage._minutes import (
    ANONYMOUS,
    Report,
    UsageKey,
    counts_of,
    grouped,
    minute_iso,
    parse_report,
    parse_span,
    rollup,
)
from tests.helpers import proxy_request

NOW = datetime(2026, 12, 1, 13, 17, 30, tzinfo=UTC).timestamp()


def test_an_inference_counts_in_its_utc_minute_with_known_tokens() -> None:
    """The bucket is the record's minute, key, public model and node; tokens add up."""
    payload = {
        "model": "llama3",
        "key": "team-a",
        "node_id": "n1",
        "status": 200,
        "prompt_tokens": 7,
        "completion_tokens": 11,
    }
    bucket, counts = counts_of(NOW, proxy_request(**payload))  # type: ignore[misc]
    assert bucket == UsageKey(int(NOW // 60), "team-a", "llama3", "n1")
    assert minute_iso(bucket.minute) == "2026-12-01T13:17:00Z"
    assert counts == [1, 0, 7, 11, 0, 0, 1]


@pytest.mark.parametrize(("cached", "counted"), [(40, [40, 0]), (0, [0, 0]), (None, [0, 1])])
def test_the_cached_prompt_tokens_add_up_and_an_unknown_cached_count_is_counted_not_zero(
    cached: int | None, counted: list[int]
) -> None:
    """docs/behaviour.md §12.4: ``cached_tokens`` sums the cached counts the engines stated (a
    stated 0 among them); ``unknown_cached`` counts the requests whose engine stated none."""
    record = proxy_request(model="m", status=200, prompt_tokens=48, completion_tokens=4)
    _, counts = counts_of(NOW, attrs.evolve(record, cached_tokens=cached))  # type: ignore[misc]
    assert counts == [1, 0, 48, 4, 0, *counted]


def test_unknown_counts_are_not_zero_and_errors_are_4xx_5xx_499() -> None:
    """None tokens count as unknown (and add nothing); a missing key is anonymous, a missing node empty."""
    for status, errored in [(200, 0), (404, 1), (499, 1), (502, 1), (None, 1)]:
        payload = {"model": "m", "status": status, "prompt_tokens": 3, "completion_tokens": None}
        bucket, counts = counts_of(NOW, proxy_request(**payload))  # type: ignore[misc]
        assert bucket.key == ANONYMOUS and bucket.node == ""
        assert counts == [1, errored, 3, 0, 1, 0, 1]


def test_a_record_without_a_model_is_not_usage() -> None:
    """Model lists, health checks and refusals before routing name no model."""
    assert counts_of(NOW, proxy_request(status=200, path="/api/tags")) is None


def test_spans_take_go_durations_and_days() -> None:
    assert parse_span("24h") == 86400 and parse_span("90d") == 90 * 86400
    for bad in ("", "1y", "-1h", "d"):
        with pytest.raises(ValueError):
            parse_span(bad)


def test_a_report_window_is_relative_or_iso_and_by_is_checked() -> None:
    """since/until as durations back from now or ISO-8601 (naive = UTC); by from the six names."""
    report = parse_report("1h", None, ["key", "hour"], NOW)
    assert report == Report(int(NOW // 60) - 60, int(NOW // 60), ("key", "hour"))
    iso = parse_report("2026-12-01T12:00:00", "2026-12-01T13:00:00Z", "model,node", NOW)
    assert iso.until - iso.since == 60 and iso.by == ("model", "node")
    assert parse_report(None, None, None, NOW).since == int(NOW // 60) - 1440
    for since, until, by in [
        ("yesterday", None, []),
        ("1h", "2h", []),
        ("1h", None, ["week"]),
        ("1h", None, 3),
        (5, None, []),
    ]:
        with pytest.raises(ValueError):
            parse_report(since, until, by, NOW)


def test_rollup_sums_groups_from_every_source_in_order() -> None:
    """The same group from the database, memory and the fleet is one row; hour and day are UTC."""
    minute = int(NOW // 60)
    rows = [
        (minute, "a", "m1", "n1", 1, 0, 5, 5, 0, 4, 0),
        (minute - 1, "a", "m2", "n2", 2, 1, 1, 1, 1, 0, 2),
        (minute, "b", "m1", "", 1, 0, 0, 0, 1, 0, 1),
        (minute - 5000, "a", "m1", "n1", 9, 9, 9, 9, 9, 9, 9),  # outside the window
    ]
    report = parse_report("1h", None, ["key", "hour"], NOW)
    extra = (("a", minute - 17), (1, 0, 0, 0, 0, 0, 1))
    result = rollup(report, [*grouped(report, rows), extra])
    assert result == [
        {
            "key": "a",
            "hour": "2026-12-01T13:00:00Z",
            "requests": 4,
            "errors": 1,
            "prompt_tokens": 6,
            "completion_tokens": 6,
            "unknown_tokens": 1,
            "cached_tokens": 4,
            "unknown_cached": 3,
        },
        {
            "key": "b",
            "hour": "2026-12-01T13:00:00Z",
            "requests": 1,
            "errors": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "unknown_tokens": 1,
            "cached_tokens": 0,
            "unknown_cached": 1,
        },
    ]
    by_node = parse_report("1h", None, ["node"], NOW)
    assert [r["node"] for r in rollup(by_node, grouped(by_node, rows))] == [None, "n1", "n2"]
    totals = parse_report("1h", None, [], NOW)
    assert rollup(totals, grouped(totals, rows))[0]["requests"] == 4
