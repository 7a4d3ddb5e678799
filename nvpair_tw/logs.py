# -*- test-case-name: tests.test_logs -*-
"""Logging: our loggers honour ``--log-level`` / ``log/set-level``; a compact JSON observer for ``--logger``."""

from __future__ import annotations

import json
import sys
import traceback
from time import time
from typing import IO, Any

from twisted.logger import (
    FileLogObserver,
    ILogObserver,
    Logger,
    LogLevel,
    formatEvent,
)
from twisted.python.failure import Failure

__all__ = [
    "LevelledLogger",
    "compactJson",
    "compact_json_observer",
    "current_level",
    "parse_level",
    "set_level",
]

_ORDER = [LogLevel.debug, LogLevel.info, LogLevel.warn, LogLevel.error, LogLevel.critical]
_RANK = {level: rank for rank, level in enumerate(_ORDER)}
_threshold = [_RANK[LogLevel.info]]


def parse_level(name: str) -> LogLevel:
    """``debug``, ``info``, ``warn``/``warning``, ``error``, ``critical`` → a LogLevel (ValueError otherwise)."""
    key = name.strip().lower()
    if key == "warning":
        key = "warn"
    try:
        level: LogLevel = LogLevel.levelWithName(key)
        return level
    except Exception as exc:  # InvalidLogLevelError
        raise ValueError(f"unknown log level {name!r}; use debug, info, warn, error") from exc


def set_level(level: LogLevel) -> None:
    """Drop our events below ``level`` from now on (process-wide)."""
    _threshold[0] = _RANK[level]


def current_level() -> LogLevel:
    """The level in force."""
    level: LogLevel = _ORDER[_threshold[0]]
    return level


class LevelledLogger(Logger):
    """A Logger whose events below the configured level are dropped before formatting.

    As a class attribute its namespace is its own plus the class name (Twisted's ``Logger``
    would take the class's module instead): modules give their loggers the stable names they
    have always logged under (``nvpair_tw.inventory``), whatever package they live in now, and
    a class's events keep ``nvpair_tw.inventory.InventoryBook``.
    """

    def __get__(self, instance: object, owner: type | None = None) -> LevelledLogger:
        assert owner is not None
        source: Any = owner if instance is None else instance
        return self.__class__(f"{self.namespace}.{owner.__name__}", source, observer=self.observer)

    def bug(
        self, format: str, failure: Failure, level: LogLevel = LogLevel.warn, **kw: Any
    ) -> None:
        """A bug of the proxy's caught where it must not stop the rest: logged at ``level`` with
        its exception type and stack (file, line, function of each frame), never its message,
        which may hold what a request carried (a model name, a node's answer)."""
        kind = failure.type.__name__ if failure.type is not None else "unknown"
        stack = "".join(traceback.format_tb(failure.getTracebackObject())) + kind
        self.emit(level, format + ": {error_type}", error_type=kind, stack=stack, **kw)

    def enabled(self, level: LogLevel) -> bool:
        """Whether an event at ``level`` would be emitted now."""
        return _RANK.get(level, 0) >= _threshold[0]

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: Any) -> None:
        if _RANK.get(level, 0) < _threshold[0]:
            return
        if level not in _RANK:
            super().emit(level, format, **kwargs)  # Twisted reports the invalid level
            return
        # What Twisted's Logger.emit does for a valid level, without its validity check (a sort
        # of every LogLevel constant per event): the request path logs a line per request.
        kwargs.update(
            log_logger=self,
            log_level=level,
            log_namespace=self.namespace,
            log_source=self.source,
            log_format=format,
            log_time=time(),
        )
        if "log_trace" in kwargs:
            kwargs["log_trace"].append((self, self.observer))
        self.observer(kwargs)


_SKIP = {"format", "message", "time", "system", "isError", "printed", "why", "failure"}


def _compact(event: dict[str, Any]) -> str:
    text = event.get("log_format")
    record: dict[str, Any] = {
        "t": event.get("log_time"),
        "level": getattr(event.get("log_level"), "name", None),
        "ns": event.get("log_namespace"),
        # A format without a field is its own text (the event log's lines come rendered).
        "msg": text if isinstance(text, str) and "{" not in text else formatEvent(event),
    }
    for key, value in event.items():
        if key.startswith("log_") or key in _SKIP or key in record:
            continue
        record[key] = value
    failure = event.get("log_failure")
    if failure is not None:
        record["traceback"] = failure.getTraceback()
    try:  # one encoding for the whole line: what JSON cannot hold is written as its repr
        return _ENCODE(record) + "\n"
    except ValueError:  # a value that holds itself
        return _ENCODE({k: _plain(v) for k, v in record.items()}) + "\n"


_ENCODE = json.JSONEncoder(separators=(",", ":"), default=repr).encode


def _plain(value: Any) -> Any:
    """``value`` if JSON holds it as it is, else its repr."""
    try:
        _ENCODE(value)
    except ValueError:
        return repr(value)
    return value


def compact_json_observer(out: IO[str] | None = None) -> ILogObserver:
    """One JSON object per line with stable field names: ``twistd --logger=nvpair_tw.logs.compactJson``."""
    return FileLogObserver(out if out is not None else sys.stdout, _compact)


def compactJson() -> ILogObserver:
    """Zero-argument factory for twistd's ``--logger``."""
    return compact_json_observer()
