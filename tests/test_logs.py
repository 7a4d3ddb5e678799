# -*- test-case-name: tests.test_logs -*-
"""Logging: the process-wide level for our loggers, and the compact JSON observer."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
from twisted.logger import ILogObserver, LogLevel
from twisted.python.failure import Failure

from nvpair_tw.logs import (
    LevelledLogger,
    compact_json_observer,
    compactJson,
    current_level,
    parse_level,
    set_level,
    starts_log,
)


@pytest.fixture(autouse=True)
def restore_level() -> Iterator[None]:
    """The level is process-wide: put it back after each test."""
    before = current_level()
    yield
    set_level(before)


def _collecting_logger() -> tuple[LevelledLogger, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    return LevelledLogger(namespace="test.ns", observer=observer), events


def test_events_below_the_level_are_dropped() -> None:
    """At ``warn``, debug and info events never reach the observer; warn and above do."""
    logger, events = _collecting_logger()
    set_level(LogLevel.warn)
    logger.debug("d")
    logger.info("i")
    logger.warn("w")
    logger.error("e")
    logger.critical("c")
    assert [e["log_level"] for e in events] == [LogLevel.warn, LogLevel.error, LogLevel.critical]


def test_debug_level_lets_everything_through() -> None:
    """At ``debug`` nothing is dropped."""
    logger, events = _collecting_logger()
    set_level(LogLevel.debug)
    logger.debug("d")
    logger.info("i")
    assert [e["log_level"] for e in events] == [LogLevel.debug, LogLevel.info]


def test_info_level_keeps_info_and_drops_debug() -> None:
    """At ``info`` (the ``--log-level`` default) debug is dropped and info is kept."""
    set_level(parse_level("info"))
    assert current_level() is LogLevel.info
    logger, events = _collecting_logger()
    logger.debug("d")
    logger.info("i")
    assert [e["log_format"] for e in events] == ["i"]


def test_an_emitted_event_carries_twisted_s_fields_and_its_trace() -> None:
    """An event at a valid level reaches the observer as Twisted's ``Logger.emit`` builds it, a
    ``log_trace`` list included; an invalid level is reported as Twisted reports it."""
    set_level(LogLevel.debug)
    logger, events = _collecting_logger()
    trace: list[object] = []
    logger.emit(LogLevel.info, "hello {who}", who="you", log_trace=trace)
    [event] = events
    assert event["who"] == "you" and event["log_format"] == "hello {who}"
    assert event["log_logger"] is logger and event["log_level"] is LogLevel.info
    assert event["log_namespace"] == "test.ns" and event["log_source"] is None
    assert isinstance(event["log_time"], float)
    assert trace == [(logger, logger.observer)]
    logger.emit(cast(LogLevel, "loud"), "x")
    assert "invalid log level" in events[-1]["log_format"]


def test_set_level_changes_current_level() -> None:
    """``set_level`` is what ``current_level`` reports afterwards."""
    set_level(LogLevel.error)
    assert current_level() is LogLevel.error


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("debug", LogLevel.debug),
        ("info", LogLevel.info),
        ("warn", LogLevel.warn),
        ("warning", LogLevel.warn),
        (" ERROR ", LogLevel.error),
        ("critical", LogLevel.critical),
    ],
)
def test_parse_level_accepts_level_names(name: str, level: LogLevel) -> None:
    """Level names parse case-insensitively; ``warning`` is an alias of ``warn``."""
    assert parse_level(name) is level


@pytest.mark.parametrize("name", ["bogus", "", "verbose", "10"])
def test_parse_level_rejects_unknown_names(name: str) -> None:
    """Unknown names raise ValueError with a message naming the choices."""
    with pytest.raises(ValueError, match="debug, info, warn, error"):
        parse_level(name)


def _lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    text = buffer.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_compact_json_writes_one_object_per_line_with_stable_keys() -> None:
    """Each event is one JSON line: t, level, ns, msg, then the event's own fields."""
    buffer = io.StringIO()
    logger = LevelledLogger(namespace="nvpair_tw.test", observer=compact_json_observer(buffer))
    logger.info("attempt {attempt} to {node} failed", attempt=2, node="gpu-1")
    logger.warn("second")
    first, second = _lines(buffer)
    assert list(first)[:4] == ["t", "level", "ns", "msg"]
    assert first["level"] == "info"
    assert first["ns"] == "nvpair_tw.test"
    assert first["msg"] == "attempt 2 to gpu-1 failed"
    assert first["attempt"] == 2
    assert first["node"] == "gpu-1"
    assert isinstance(first["t"], float)
    assert not [key for key in first if key.startswith("log_")]
    assert second["level"] == "warn"
    assert second["msg"] == "second"


def test_compact_json_reprs_values_json_cannot_hold() -> None:
    """A non-JSON field value is written as its ``repr`` rather than failing the line."""
    buffer = io.StringIO()
    logger = LevelledLogger(namespace="n", observer=compact_json_observer(buffer))
    logger.info("peer {peer}", peer={1, 2}, count=3)
    (line,) = _lines(buffer)
    assert line["peer"] == repr({1, 2})
    assert line["count"] == 3


def test_a_value_that_holds_itself_is_written_as_its_repr_and_the_next_line_whole() -> None:
    """A field whose value holds itself cannot be JSON: the line still comes, that value as
    its ``repr``, the others as they are; the next line is written whole again."""
    buffer = io.StringIO()
    logger = LevelledLogger(namespace="n", observer=compact_json_observer(buffer))
    loop: list[Any] = []
    loop.append(loop)
    logger.info("a loop", loop=loop, count=3)
    logger.info("after", items=[1, 2])
    first, second = _lines(buffer)
    assert first["loop"] == repr(loop) and first["count"] == 3
    assert second["items"] == [1, 2]


def test_event_fields_do_not_override_the_stable_keys() -> None:
    """A field called ``msg`` or ``level`` cannot replace the record's own keys."""
    buffer = io.StringIO()
    logger = LevelledLogger(namespace="n", observer=compact_json_observer(buffer))
    logger.info("hello", msg="spoof", ns="spoof")
    (line,) = _lines(buffer)
    assert line["msg"] == "hello"
    assert line["ns"] == "n"


def _line_of(event: dict[str, Any]) -> str:
    buffer = io.StringIO()
    compact_json_observer(buffer)(event)
    return buffer.getvalue()


def test_a_line_is_the_same_whether_its_fields_are_taken_whole_or_one_by_one() -> None:
    """A logger's event (its fields, then the six ``log_*`` keys ``emit`` adds) has its fields
    taken whole; any other order is read key by key. The line is the same, byte for byte: the
    fields in their order, and never a ``log_*`` key or one a line leaves out."""
    events: list[dict[str, Any]] = []
    logger = LevelledLogger(namespace="n", observer=cast(ILogObserver, events.append))
    logger.info("hello", event="proxy/request", id="r-1", status=200, ms=1.5, attempts=[{"a": 1}])
    logger.info("hello", why="x", t=1, id="r-2")  # a field a line leaves out
    logger.info("hello", log_extra=3, id="r-3")  # a field of the logger's own kind
    for event in events:
        reordered = {"log_time": event["log_time"]}  # the logger's keys not at the end
        reordered.update((k, v) for k, v in event.items() if k != "log_time")
        assert _line_of(event) == _line_of(reordered)
    first, second, third = (json.loads(_line_of(e)) for e in events)
    assert list(first) == ["t", "level", "ns", "msg", "event", "id", "status", "ms", "attempts"]
    assert list(second) == ["t", "level", "ns", "msg", "id"]
    assert list(third) == ["t", "level", "ns", "msg", "id"]


@pytest.mark.parametrize(
    ("keys", "found"),
    [
        (["id", "status"], False),
        (["backlog_size", "catalog"], False),
        (["id", "log_level"], True),
        (["log_"], True),
        ([], False),
    ],
)
def test_starts_log_finds_a_key_that_starts_with_log_(keys: list[str], found: bool) -> None:
    """Only a key that begins with ``log_`` counts, wherever it is in the list."""
    assert starts_log(keys) is found


def test_failures_carry_a_traceback() -> None:
    """``log.failure`` lines include the formatted traceback."""
    buffer = io.StringIO()
    logger = LevelledLogger(namespace="n", observer=compact_json_observer(buffer))
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        logger.failure("poll of {node} failed", Failure(), level=LogLevel.error, node="a")
    (line,) = _lines(buffer)
    assert line["level"] == "error"
    assert line["msg"] == "poll of a failed"
    assert "ZeroDivisionError" in line["traceback"]
    assert "Traceback" in line["traceback"]


def test_compact_json_factory_writes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """``--logger=nvpair_tw.logs.compactJson``: a zero-argument callable whose observer writes stdout."""
    logger = LevelledLogger(namespace="n", observer=compactJson())
    logger.info("ready on {port}", port=11435)
    (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    assert line["msg"] == "ready on 11435"
    assert line["port"] == 11435


def test_a_class_attribute_logger_keeps_its_own_namespace_plus_the_class() -> None:
    """As a descriptor a LevelledLogger names itself ``<its namespace>.<Class>`` and its source is
    the instance, not ``<the class's module>.<Class>``: moving a module keeps its log names."""

    class Thing:
        log = LevelledLogger(namespace="nvpair_tw.somewhere")

    thing = Thing()
    assert thing.log.namespace == "nvpair_tw.somewhere.Thing"
    assert thing.log.source is thing
    assert Thing.log.source is Thing
    assert isinstance(thing.log, LevelledLogger)


def test_a_module_logs_under_its_own_name() -> None:
    """A logger's namespace is its module's (a class's: the module's and the class name), so a log
    line says where it came from: the rate limiter no longer logs as ``nvpair_tw.ingress``."""
    from nvpair_tw.corridor import _attempts
    from nvpair_tw.inbound import _rates
    from nvpair_tw.selection import InventoryBook

    assert _attempts.log.namespace == "nvpair_tw.corridor._attempts"
    assert _rates.log.namespace == "nvpair_tw.inbound._rates"
    assert InventoryBook.log.namespace == "nvpair_tw.selection._inventory.InventoryBook"


def test_every_module_logger_is_named_after_its_module() -> None:
    """No module names its logger by hand (the bus's event lines excepted: they are
    ``nvpair_tw.events``, the module that formats them)."""
    import ast
    from pathlib import Path

    import nvpair_tw

    named = []
    for path in sorted(Path(nvpair_tw.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "namespace":
                value = node.value
                by_hand = isinstance(value, ast.Constant) and value.value != "nvpair_tw.events"
                if by_hand:
                    named.append(f"{path.name}:{node.value.lineno}")
    assert named == []
