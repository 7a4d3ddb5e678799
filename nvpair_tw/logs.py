# -*- test-case-name: tests.test_logs -*-
"""Logging: our loggers honour ``--log-level`` / ``log/set-level``; a compact JSON observer for ``--logger``."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
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
    "starts_log",
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
        self.emit_fields(level, format, kwargs)

    def emit_fields(self, level: LogLevel, format: str | None, fields: dict[str, Any]) -> None:
        """:meth:`emit` with the event's fields given as a dict, which becomes the log event
        itself (the caller gives it up): the event log's line per request is made without
        copying its fields once more. ``level`` is a valid level."""
        if _RANK[level] < _threshold[0]:
            return
        # What Twisted's Logger.emit does for a valid level, without its validity check (a sort
        # of every LogLevel constant per event): the request path logs a line per request.
        fields.update(
            log_logger=self,
            log_level=level,
            log_namespace=self.namespace,
            log_source=self.source,
            log_format=format,
            log_time=time(),
        )
        if "log_trace" in fields:
            fields["log_trace"].append((self, self.observer))
        self.observer(fields)


_SKIP = {"format", "message", "time", "system", "isError", "printed", "why", "failure"}


_HEAD = frozenset({"t", "level", "ns", "msg"})
_LEFT_OUT = _SKIP | _HEAD
"""The fields a line leaves out (besides ``log_*``): Twisted's legacy ones, and its own four."""


def _compact(event: dict[str, Any]) -> str:
    text = event.get("log_format")
    record: dict[str, Any] = {
        "t": event.get("log_time"),
        "level": getattr(event.get("log_level"), "name", None),
        "ns": event.get("log_namespace"),
        # A format without a field is its own text (the event log's lines come rendered).
        "msg": text if isinstance(text, str) and "{" not in text else formatEvent(event),
    }
    if _fields_then_logger(event):
        record.update(event)  # the fields in their order, then the logger's keys, dropped
        for key in _LOGGER_ORDER:
            del record[key]
    else:
        for key, value in event.items():
            if key.startswith("log_") or key in _LEFT_OUT:
                continue
            record[key] = value
    failure = event.get("log_failure")
    if failure is not None:
        record["traceback"] = failure.getTraceback()
    try:  # one encoding for the whole line: what JSON cannot hold is written as its repr
        return _encode_line(record) + "\n"
    except (ValueError, RecursionError):  # a value that holds itself
        return _ENCODE({k: _plain(v) for k, v in record.items()}) + "\n"


def _fields_then_logger(event: dict[str, Any]) -> bool:
    """Whether ``event`` is a logger's fields followed by the six ``log_*`` keys ``emit`` adds,
    in its order, with no field a ``log_*`` key or one a line leaves out: then a line's fields
    are the event's but for those six, and are taken whole, not one by one."""
    keys = list(event)
    if keys[-_LOGGER_KEYS:] != _LOGGER_ORDER or not _LEFT_OUT.isdisjoint(keys):
        return False
    return not starts_log(keys[:-_LOGGER_KEYS])


def starts_log(keys: list[str]) -> bool:
    """Whether a key of ``keys`` starts with ``log_`` (searched in them joined, in one pass: a
    key holding ``\0log_`` inside is counted too, which only sends it the longer way)."""
    return "\0log_" in "\0" + "\0".join(keys)


_LOGGER_ORDER = ["log_logger", "log_level", "log_namespace", "log_source", "log_format", "log_time"]
"""The keys Twisted's ``Logger.emit`` (and :meth:`LevelledLogger.emit_fields`) end an event with."""
_LOGGER_KEYS = len(_LOGGER_ORDER)

_ENCODE = json.JSONEncoder(separators=(",", ":"), default=repr).encode


def _line_encoder() -> Callable[[dict[str, Any]], str]:
    """:data:`_ENCODE` for a line, without its per-call set-up: CPython's ``JSONEncoder.encode``
    makes its C encoder (``_json.make_encoder``) anew for every value, with a fresh dict of the
    containers met to tell a value that holds itself (``ValueError``); this one is made once,
    with the same arguments but no such dict: a value that holds itself recurses until Python's
    recursion limit (``RecursionError``), and the line is then written value by value, as it
    was. Where the C encoder is missing, :data:`_ENCODE` itself."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODE
    encode = make(
        None, repr, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    join = "".join
    return lambda record: join(encode(record, 0))


_encode_line = _line_encoder()


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
