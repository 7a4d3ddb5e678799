"""The dynamic half of "the repository stands on its own" (issue 21; the static half is
tests/test_self_contained.py): an audit hook (``sys.addaudithook``) records every ``open`` of a
path under the repository's parent directory but outside the repository, and the session fails
at the end, listing them, if there was any.

Not counted: the Python installation and ``sys.path`` (a venv beside the clone is fine), the
temporary directory, the real engine's install directory (the user cache, or
``NVPAIR_REAL_OLLAMA_DIR``), and, when the parent directory is ``$HOME``, the user's dot-files
(``~/.netrc``, ``~/.cache``). tests/conftest.py installs the hook and imports the two pytest hooks.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import pytest

from tests.engines import ollama

__all__ = ["OutsideReads", "install", "pytest_sessionfinish", "pytest_terminal_summary"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OutsideReads:
    """Records opens of paths in ``parent`` (the repository's parent) but not in ``repo``."""

    def __init__(self, repo: str, allowed: list[str], home: str | None = None) -> None:
        self.repo = os.path.normpath(repo)
        self.parent = os.path.dirname(self.repo)
        # An allowed directory that holds the parent (or is it) would allow everything: dropped.
        self.allowed = tuple(
            os.path.normpath(a) + os.sep
            for a in allowed
            if a and os.path.isabs(a) and not _within(self.parent, os.path.normpath(a))
        )
        self.home = os.path.normpath(home) if home else None
        self.seen: dict[str, str] = {}  # path -> the first mode it was opened with

    def check(self, path: Any, mode: Any = "r") -> None:
        if isinstance(path, int):
            return
        try:
            name = os.fsdecode(path)
        except TypeError:
            return
        full = os.path.normpath(name if os.path.isabs(name) else os.path.join(os.getcwd(), name))
        if not full.startswith(self.parent + os.sep) or _within(full, self.repo):
            return
        if full.startswith(self.allowed):
            return
        if self.home == self.parent and full[len(self.parent) + 1 :].startswith("."):
            return
        self.seen.setdefault(full, str(mode))

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args:
            self.check(args[0], args[1] if len(args) > 1 else "r")


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _allowed() -> list[str]:
    return [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        tempfile.gettempdir(),
        str(ollama.cache_root()),
        str(ollama.install_dir()),
        *(p for p in sys.path if p and os.path.isdir(p)),
    ]


_RECORDER: OutsideReads | None = None


def install() -> OutsideReads | None:
    """Install the audit hook once per process (audit hooks cannot be removed), in a checkout only:
    the copies tools/mutation.py runs the tests in (``.mutation/<module>/mutants``, no ``.git``)
    sit inside the repository, whose files are their parent's."""
    global _RECORDER
    if _RECORDER is None and os.path.exists(os.path.join(REPO, ".git")):
        _RECORDER = OutsideReads(REPO, _allowed(), os.environ.get("HOME"))
        sys.addaudithook(_RECORDER.audit)
    return _RECORDER


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _RECORDER is not None and _RECORDER.seen and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _RECORDER is None or not _RECORDER.seen:
        return
    terminalreporter.section("files read outside the repository", red=True)
    terminalreporter.line(
        f"the tests opened files under {_RECORDER.parent} but outside {_RECORDER.repo} "
        "(the repository must stand on its own; see tests/outside_reads.py):",
        red=True,
    )
    for path, mode in sorted(_RECORDER.seen.items()):
        terminalreporter.line(f"  {path} (mode {mode})", red=True)
