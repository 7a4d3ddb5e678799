"""The documents quote the code's constants (defaults, limits, header names) truly: each row of the
table below names a document, the text that quotes a constant (its value in a capture group), how
that text reads as a value, and the constant itself. A changed default fails here until the
document says the new one."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from nvpair_tw.core import parse_duration
from nvpair_tw.core._headers import TARGET_HEADER
from nvpair_tw.core._resolved import Settings
from nvpair_tw.dialects._usage import END_BYTES, TAIL_CHUNKS, WHOLE_CAP
from nvpair_tw.inbound._cors import EXPOSED_HEADERS
from nvpair_tw.inbound._limits import Limits
from nvpair_tw.ops._control import MAX_LINE_BYTES
from nvpair_tw.ops._maintenance import DRAIN_TIMEOUT
from nvpair_tw.tap import parse_size

DOCS = Path(__file__).resolve().parent.parent / "docs"

KIB = 1 << 10
MIB = 1 << 20


def _default(option: str) -> str:
    """The default column of ``option``'s row in docs/configuration.md's table of options."""
    return rf"(?m)^\| `{re.escape(option)}(?: [^`]*)?` \|[^|]*\| `([^`]+)`"


def _limit(label: str) -> str:
    """The default column of a row of docs/behaviour.md §9's table of connection limits."""
    return rf"(?m)^\| {re.escape(label)} \| ([^|(]+?) (?:\(|\|)"


def _seconds(text: str) -> float:
    return float(text.removesuffix(" s"))


def _kib(text: str) -> int:
    return int(text) * KIB


def _mib(text: str) -> int:
    return int(text) * MIB


def _minutes(text: str) -> float:
    return int(text) * 60.0


def _header(text: str) -> bytes:
    return text.lower().encode()


def _headers(text: str) -> bytes:
    return text.replace("`", "").encode()


SETTINGS = Settings()
LIMITS = Limits()

Row = tuple[str, str, Callable[[str], object], object]

QUOTED: list[Row] = [
    # docs/configuration.md: the options' defaults
    ("configuration.md", _default("--connect-timeout"), parse_duration, SETTINGS.connect_timeout),
    (
        "configuration.md",
        _default("--response-header-timeout"),
        parse_duration,
        SETTINGS.response_header_timeout,
    ),
    ("configuration.md", _default("--busy-max-wait"), parse_duration, SETTINGS.busy_max_wait),
    ("configuration.md", _default("--queue-size"), int, SETTINGS.queue_size),
    ("configuration.md", _default("--queue-timeout"), parse_duration, SETTINGS.queue_timeout),
    ("configuration.md", _default("--max-body-size"), parse_size, SETTINGS.max_body_size),
    (
        "configuration.md",
        _default("--inventory-interval"),
        parse_duration,
        SETTINGS.inventory_interval,
    ),
    (
        "configuration.md",
        _default("--affinity-max-entries"),
        int,
        SETTINGS.affinity_max_entries,
    ),
    ("configuration.md", _default("--affinity-ttl"), parse_duration, SETTINGS.affinity_ttl),
    ("configuration.md", _default("--session-ttl"), parse_duration, SETTINGS.session_ttl),
    ("configuration.md", _default("--billing-block"), str, SETTINGS.billing_block),
    (
        "configuration.md",
        _default("--write-stall-timeout"),
        parse_duration,
        SETTINGS.write_stall_timeout,
    ),
    ("configuration.md", _default("--max-connections"), int, SETTINGS.max_connections),
    (
        "configuration.md",
        _default("--max-connections-per-source"),
        int,
        SETTINGS.max_connections_per_source,
    ),
    ("configuration.md", _default("--max-tunnels"), int, SETTINGS.max_tunnels),
    ("configuration.md", _default("--shutdown-grace"), parse_duration, SETTINGS.shutdown_grace),
    ("configuration.md", _default("--default-slots"), int, SETTINGS.default_slots),
    ("configuration.md", _default("--upstream-client"), str, SETTINGS.upstream_client),
    # docs/behaviour.md §9: the limits on every facade connection
    (
        "behaviour.md",
        _limit("request body"),
        lambda t: _mib(t.removesuffix(" MiB")),
        LIMITS.max_body_size,
    ),
    (
        "behaviour.md",
        _limit("a request's head, from accept and from the end of each response (§14.4)"),
        _seconds,
        LIMITS.header_timeout,
    ),
    (
        "behaviour.md",
        _limit("request line"),
        lambda t: int(t.removesuffix(" bytes")),
        LIMITS.max_request_line,
    ),
    ("behaviour.md", r"(?m)^\| headers \| (\d+), and \d+ bytes in all", int, LIMITS.max_headers),
    (
        "behaviour.md",
        r"(?m)^\| headers \| \d+, and (\d+) bytes in all",
        int,
        LIMITS.max_header_bytes,
    ),
    ("behaviour.md", _limit("open connections per facade"), int, LIMITS.max_connections),
    (
        "behaviour.md",
        _limit("a request body that delivers nothing (§14.4)"),
        _seconds,
        LIMITS.body_timeout,
    ),
    (
        "behaviour.md",
        _limit("no bytes at all while a request or body is received (Twisted's idle timeout)"),
        _seconds,
        LIMITS.idle_timeout,
    ),
    # docs/behaviour.md §12.2: what the usage meter keeps of a stream
    ("behaviour.md", r"keeps the last (\d+) chunks", int, TAIL_CHUNKS),
    ("behaviour.md", r"reads the counts from the last (\d+) KiB", _kib, END_BYTES),
    ("behaviour.md", r"whole answer\s+larger than (\d+) MiB is not parsed", _mib, WHOLE_CAP),
    # docs/behaviour.md §13.1: node/drain's default timeout
    ("behaviour.md", r"default (\d+) minutes\)\. The node stays", _minutes, DRAIN_TIMEOUT),
    # header names
    ("behaviour.md", r"`(X-NVPair-Node)`", _header, TARGET_HEADER),
    ("behaviour.md", r"`Access-Control-Expose-Headers: ([^`]+)`", _headers, EXPOSED_HEADERS),
    # docs/control.md: the longest request line
    ("control.md", r"A line may be at most \*\*(\d+) MiB\*\*", _mib, MAX_LINE_BYTES),
    ("behaviour.md", r"lines up to (\d+) MiB, no batches", _mib, MAX_LINE_BYTES),
]


@pytest.mark.parametrize(
    ("document", "pattern", "read", "constant"),
    QUOTED,
    ids=[f"{row[0]}:{row[1][:48]}" for row in QUOTED],
)
def test_the_document_quotes_the_constant(
    document: str, pattern: str, read: Callable[[str], object], constant: object
) -> None:
    text = (DOCS / document).read_text()
    found = re.search(pattern, text)
    assert found is not None, f"docs/{document} no longer quotes it ({pattern})"
    assert read(found.group(1).strip()) == constant, found.group(0)
