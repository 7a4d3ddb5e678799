"""How far the engine installers are (tests/engines/ollama.py, llamacpp.py): a bar on a terminal,
a line every few seconds anywhere else (a CI log, tox, pytest's capture).

:class:`Progress` writes to one stream and picks its :class:`Display` from it. A :class:`Task`
is one long step with an amount (bytes downloaded, percent built) or none (only the time it has
taken). :func:`follow` runs a command and hands each line of its output to a reader (such as
:class:`PipReader` for ``pip download --progress-bar raw`` or :class:`CmakeReader` for
``cmake --build``), waking at least once a second so a quiet command still gets its line.

A bar by hand rather than tqdm or rich: one line rewritten with ``\\r`` is a few lines of code,
and the test extra would otherwise grow a dependency for it; on a terminal, pip draws its own.
"""

from __future__ import annotations

import enum
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

__all__ = [
    "CmakeReader",
    "Display",
    "PipReader",
    "Progress",
    "Quiet",
    "Task",
    "Unit",
    "Watch",
    "follow",
    "human_size",
    "human_time",
    "pip_download_command",
    "pip_reports_bytes",
]

_TERMINAL: TextIO | None = None
"""The controlling terminal, once opened by :meth:`Progress.default`."""
LINE_EVERY = 5.0
"""Seconds between two lines of one task when the stream is not a terminal."""
BAR_EVERY = 0.2
"""Seconds between two redraws of the bar."""


class Display(enum.Enum):
    """How progress is shown on a stream."""

    BAR = "bar"  # a terminal: one line, redrawn in place
    LINES = "lines"  # anything else: a whole line every LINE_EVERY seconds

    @classmethod
    def of(cls, stream: TextIO) -> Display:
        try:
            return cls.BAR if stream.isatty() else cls.LINES
        except (AttributeError, ValueError):  # closed, or not a real file
            return cls.LINES


class Unit(enum.Enum):
    """What a task counts."""

    BYTES = "bytes"
    PERCENT = "percent"
    TIME = "time"  # nothing to count: only how long it has taken


_MAGNITUDES = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def human_size(count: float, like: float | None = None) -> str:
    """Bytes as pip writes them (powers of 1000): ``412.3 MB``; in ``like``'s unit, without it,
    when given (``206.2`` of ``412.3 MB``)."""
    scale = count if like is None else like
    for unit, size in _MAGNITUDES:
        if scale >= size:
            return f"{count / size:.1f}" + ("" if like is not None else f" {unit}")
    return f"{int(count)}" + ("" if like is not None else " bytes")


def human_time(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


@dataclass
class Progress:
    """Where progress goes, and how it is shown there."""

    stream: TextIO
    display: Display
    clock: Callable[[], float] = time.monotonic
    every: float = LINE_EVERY
    _bar: int = 0  # the length of the bar on screen (0: none)

    @classmethod
    def to(cls, stream: TextIO) -> Progress:
        return cls(stream, Display.of(stream))

    @classmethod
    def default(cls) -> Progress:
        """Standard error; but when that is not a terminal and the process has one, that
        terminal (``/dev/tty``): pytest captures standard error, so a first ``tox`` or
        ``pytest`` at a person's terminal would otherwise show nothing of a 650 MB download.
        With no terminal at all (CI), lines on standard error."""
        if Display.of(sys.stderr) is Display.BAR:
            return cls.to(sys.stderr)
        global _TERMINAL
        if _TERMINAL is None:
            try:
                _TERMINAL = open("/dev/tty", "w")  # noqa: SIM115 (kept open for the process)
            except OSError:
                return cls.to(sys.stderr)
        return cls.to(_TERMINAL)

    def say(self, line: str) -> None:
        """One whole line (after the bar, which it ends)."""
        self.end_bar()
        self.stream.write(line + "\n")
        self.stream.flush()

    def task(self, what: str, unit: Unit, total: float | None = None) -> Task:
        """A long step starts (and says so)."""
        return Task(self, what, unit, total)

    def draw(self, text: str) -> None:
        """Rewrite the bar line with ``text`` (cut to the terminal's width)."""
        width = shutil.get_terminal_size((100, 20)).columns - 1
        text = text[:width]
        self.stream.write("\r" + text.ljust(self._bar))
        self.stream.flush()
        self._bar = len(text)

    def end_bar(self) -> None:
        if self._bar:
            self.stream.write("\n")
            self._bar = 0


@dataclass
class Task:
    """One long step: ``update`` it as it goes, ``tick`` it when nothing was heard, ``finish``."""

    progress: Progress
    what: str
    unit: Unit
    total: float | None = None
    done: float | None = None
    detail: str = ""
    started: float = field(init=False)
    _shown: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self._shown = self.progress.clock()
        size = f" ({human_size(self.total)})" if self.unit is Unit.BYTES and self.total else ""
        if self.progress.display is Display.LINES:
            self.progress.say(f"{self.what}{size} ...")
        else:
            self._shown -= BAR_EVERY
            self.tick()

    def update(self, done: float, total: float | None = None, detail: str | None = None) -> None:
        self.done = done
        self.total = total or self.total
        self.detail = self.detail if detail is None else detail
        self.tick()

    def tick(self) -> None:
        """Show where it is, if it is time to."""
        now = self.progress.clock()
        if self.progress.display is Display.BAR:
            if now - self._shown >= BAR_EVERY:
                self._shown = now
                self.progress.draw(self._bar_text(now))
        elif now - self._shown >= self.progress.every:
            self._shown = now
            self.progress.say(f"{self.what}: {self._so_far(now)}")

    def finish(self, outcome: str = "done") -> None:
        now = self.progress.clock()
        if self.progress.display is Display.BAR:
            self.progress.draw(self._bar_text(now))
            self.progress.end_bar()
        amount = human_size(self.done) + " " if self.unit is Unit.BYTES and self.done else ""
        self.progress.say(f"{self.what}: {outcome}, {amount}in {human_time(now - self.started)}")

    def _fraction(self) -> float | None:
        if self.done is None:
            return None
        if self.unit is Unit.PERCENT:
            return min(self.done / 100, 1.0)
        if self.total:
            return min(self.done / self.total, 1.0)
        return None

    def _amount(self, elapsed: float) -> str:
        if self.done is None:
            return ""
        if self.unit is Unit.PERCENT:
            return f"{self.done:.0f}%"
        if self.unit is Unit.BYTES:
            rate = f", {human_size(self.done / elapsed)}/s" if elapsed > 0 else ""
            if self.total:
                whole = f"{human_size(self.done, self.total)} of {human_size(self.total)}"
                return f"{whole} ({100 * self.done / self.total:.0f}%){rate}"
            return f"{human_size(self.done)}{rate}"
        return ""

    def _so_far(self, now: float) -> str:
        elapsed = now - self.started
        parts = [p for p in (self._amount(elapsed), self.detail) if p]
        return ", ".join([*parts, f"{human_time(elapsed)} so far"])

    def _bar_text(self, now: float) -> str:
        fraction = self._fraction()
        bar = "" if fraction is None else "[" + ("#" * int(30 * fraction)).ljust(30, "-") + "] "
        elapsed = now - self.started
        amount = self._amount(elapsed)
        if not amount and self.unit is Unit.BYTES and self.total:
            amount = f"({human_size(self.total)})"
        tail = " ".join(p for p in (amount, self.detail) if p)
        return f"{self.what} {bar}{tail} {human_time(elapsed)}".rstrip()


class Watch:
    """Reads a command's output as it comes (one line at a time) for a task; ``tick`` when a
    second passed without output; ``close`` when the command has ended."""

    def line(self, text: str) -> None:
        """One line of the command's output."""

    def tick(self) -> None:
        """Nothing was heard for a while."""

    def close(self) -> None:
        """The command ended."""


class Quiet(Watch):
    """A command that says nothing useful: its task shows the time it has taken."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def tick(self) -> None:
        self.task.tick()


_PIP_FILE = re.compile(
    r"^(Downloading|Using cached|Resuming download) (\S+)"
    r"(?: \((\d+(?:\.\d+)?) (bytes|kB|MB|GB)(?:/[^)]*)?\))?$"
)
_PIP_BYTES = re.compile(r"^Progress (\d+) of (\d+)$")
_PIP_SAVED = ("Saved ", "File was already downloaded")
_SIZES = {"bytes": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9}


class PipReader(Watch):
    """``pip download``'s output: a task per file it downloads (named, with its size), its bytes
    from ``--progress-bar raw``'s ``Progress N of M`` lines where pip writes them."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Task | None = None

    def line(self, text: str) -> None:
        text = text.strip()
        found = _PIP_FILE.match(text)
        if found:
            self.close()
            name = found.group(2).rsplit("/", 1)[-1]
            size = float(found.group(3)) * _SIZES[found.group(4)] if found.group(3) else None
            if found.group(1) == "Using cached":
                self.progress.say(f"{name}: from pip's cache")
                return
            self.task = self.progress.task(f"downloading {name}", Unit.BYTES, size)
            return
        counted = _PIP_BYTES.match(text)
        if counted and self.task is not None:
            total = int(counted.group(2))
            self.task.update(int(counted.group(1)), total or None)
        elif text.startswith(_PIP_SAVED):
            self.close()

    def tick(self) -> None:
        if self.task is not None:
            self.task.tick()

    def close(self) -> None:
        if self.task is not None:
            self.task.finish("downloaded")
            self.task = None


_MAKE_STEP = re.compile(r"^\[\s*(\d+)%\]\s+(.*)$")
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
_COMPILING = re.compile(r"Building \w+ object \S*?([^/\s]+)\.o\b")
_LINKING = re.compile(r"Linking \w+ [\w ]+? \S*?([^/\s]+)$")


def _step(text: str) -> str:
    """What a build step works on: ``llama-model.cpp``, ``linking llama-server``."""
    compiling = _COMPILING.search(text)
    if compiling:
        return compiling.group(1)
    linking = _LINKING.search(text)
    return f"linking {linking.group(1)}" if linking else ""


class CmakeReader(Watch):
    """``cmake --build``'s output (make's ``[ 45%] Building ...`` or ninja's ``[12/345] ...``),
    summarised as the percentage done and the file being built."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def line(self, text: str) -> None:
        make = _MAKE_STEP.match(text.strip())
        if make:
            self.task.update(float(make.group(1)), detail=_step(make.group(2)) or None)
            return
        ninja = _NINJA_STEP.match(text.strip())
        if ninja and int(ninja.group(2)):
            done = 100 * int(ninja.group(1)) / int(ninja.group(2))
            self.task.update(done, detail=_step(ninja.group(3)) or None)

    def tick(self) -> None:
        self.task.tick()


def follow(
    command: Sequence[str],
    watch: Watch,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, str]:
    """Run ``command`` (standard error into standard output), each output line to ``watch`` as
    it comes, a tick at least every second; its exit status and the last of its output.
    :class:`subprocess.TimeoutExpired` (the command killed) after ``timeout`` seconds."""
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    tail: deque[str] = deque(maxlen=60)
    pending = b""
    deadline = clock() + timeout
    with process, selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            if clock() > deadline:
                process.kill()
                raise subprocess.TimeoutExpired(list(command), timeout)
            if selector.select(timeout=1.0):
                chunk = os.read(process.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                *lines, pending = re.split(rb"\r\n|\r|\n", pending + chunk)
                for raw in lines:
                    text = raw.decode(errors="replace")
                    tail.append(text)
                    watch.line(text)
            watch.tick()
        if pending:
            tail.append(pending.decode(errors="replace"))
            watch.line(tail[-1])
        code = process.wait()
    watch.close()
    return code, "\n".join(tail)


def pip_reports_bytes(pip: Sequence[str]) -> bool:
    """Whether this pip writes ``Progress N of M`` lines (``--progress-bar raw``, pip 24.1)."""
    try:
        done = subprocess.run(
            [*pip, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return False
    found = re.match(r"pip (\d+)\.(\d+)", done.stdout)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (24, 1)


def pip_download_command(
    pip: Sequence[str], arguments: Sequence[str], progress: Progress
) -> tuple[list[str], Watch | None]:
    """``pip download ARGUMENTS`` with its progress shown: on a terminal pip draws its own bar
    (the command writes to the terminal: no watch); elsewhere it writes ``Progress N of M`` lines
    (or, before pip 24.1, none) for a :class:`PipReader` to follow."""
    if progress.display is Display.BAR:
        return [*pip, "download", "--progress-bar", "on", *arguments], None
    bar = "raw" if pip_reports_bytes(pip) else "off"
    return [*pip, "download", "--progress-bar", bar, *arguments], PipReader(progress)
