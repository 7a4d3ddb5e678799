"""What the test suite needs from the machine, and getting it: the part of "one command does all
the set-up" (``python3 -m pip install tox && tox``) that pip cannot do. ``toxfile.py`` calls
:func:`ensure` before tox runs a test env.

System packages (Debian names): ``chromium`` (the status-page browser test), ``redis-server``
(the fleet tests), ``gcc`` (compiles the real engine's SYCL stub, tests/engines/ollama.py),
``cmake`` and ``g++`` (build llama.cpp's ``llama-server`` for the mixed-fleet tests,
tests/engines/llamacpp.py), ``systemd`` (``systemd-analyze``, which checks the shipped unit,
tests/deploy/test_systemd.py), and ``curl`` (the README's own commands, run as written by
tests/e2e/test_readme.py).
Missing ones are installed with ``apt-get`` when this runs as root and apt-get exists; otherwise
the run stops at once with one line naming what to install. Tests are never skipped for them.

In CI (``CI=true``) every interpreter of the matrix (python3.11, 3.12, 3.13) must be on ``PATH``
and run: a missing one is an error, not a skipped env.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "INTERPRETERS",
    "PACKAGES",
    "Machine",
    "Missing",
    "Plan",
    "ensure",
    "missing_interpreters",
    "missing_packages",
    "plan",
]

INTERPRETERS = ("3.11", "3.12", "3.13")


@dataclass(frozen=True)
class Package:
    """A Debian package and how to tell it is there."""

    name: str
    present: Callable[[Mapping[str, str], Callable[[str], str | None]], bool]


def _chromium(env: Mapping[str, str], which: Callable[[str], str | None]) -> bool:
    chosen = env.get("NVPAIR_CHROMIUM")
    if chosen:
        return which(chosen) is not None
    return which("chromium") is not None or which("/usr/bin/chromium") is not None


def _command(name: str) -> Callable[[Mapping[str, str], Callable[[str], str | None]], bool]:
    return lambda env, which: which(name) is not None


def _compiler(env: Mapping[str, str], which: Callable[[str], str | None]) -> bool:
    return which(env.get("CC") or "gcc") is not None


def _cxx_compiler(env: Mapping[str, str], which: Callable[[str], str | None]) -> bool:
    return which(env.get("CXX") or "g++") is not None


PACKAGES = (
    Package("chromium", _chromium),
    Package("redis-server", _command("redis-server")),
    Package("gcc", _compiler),
    Package("cmake", _command("cmake")),
    Package("g++", _cxx_compiler),
    Package("systemd", _command("systemd-analyze")),  # checks docs/deploy/nvpair.service
    Package("curl", _command("curl")),
)


class Missing(Exception):
    """Something the tests need is missing and cannot be installed here; the message is one line."""


@dataclass(frozen=True)
class Machine:
    """The facts the decisions depend on (injectable, so the decisions can be tested)."""

    env: Mapping[str, str]
    which: Callable[[str], str | None]
    is_root: bool
    runs: Callable[[str], bool]  # whether an interpreter on PATH runs (a pyenv shim may not)

    @classmethod
    def this(cls) -> Machine:
        env = dict(os.environ)
        return cls(
            env=env,
            which=lambda name: shutil.which(name, path=env.get("PATH")),
            is_root=os.geteuid() == 0,
            runs=lambda name: _runs(name, env.get("PATH", "")),
        )


def _runs(name: str, path: str) -> bool:
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            try:
                done = subprocess.run([candidate, "-c", ""], capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                return True
    return False


@dataclass(frozen=True)
class Plan:
    """What to run (each a command line) before the tests, in order; empty when all is there."""

    commands: tuple[tuple[str, ...], ...]
    env: Mapping[str, str]


def missing_packages(machine: Machine) -> list[str]:
    return [p.name for p in PACKAGES if not p.present(machine.env, machine.which)]


def missing_interpreters(machine: Machine) -> list[str]:
    return [f"python{v}" for v in INTERPRETERS if not machine.runs(f"python{v}")]


def in_ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").strip().lower() in {"1", "true", "yes"}


def plan(machine: Machine) -> Plan:
    """The decisions: what to install, or :class:`Missing` with the one line to show."""
    if in_ci(machine.env):
        absent = missing_interpreters(machine)
        if absent:
            raise Missing(
                f"CI: {', '.join(absent)} not found on PATH (or not runnable); "
                "the tox matrix needs every interpreter (install with pyenv)"
            )
    packages = missing_packages(machine)
    if not packages:
        return Plan((), machine.env)
    if machine.is_root and machine.which("apt-get") is not None:
        return Plan(
            (("apt-get", "update", "-qq"), ("apt-get", "install", "-y", "-qq", *packages)),
            {**machine.env, "DEBIAN_FRONTEND": "noninteractive"},
        )
    sudo = "" if machine.is_root else "sudo "
    raise Missing(
        f"the tests need {' '.join(packages)}: install them "
        f"(Debian: {sudo}apt-get install -y {' '.join(packages)}) and run tox again"
    )


def ensure(
    machine: Machine | None = None,
    run: Callable[[Sequence[str], Mapping[str, str]], int] | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Install what is missing (or raise :class:`Missing`); afterwards, check it is all there."""
    here = machine or Machine.this()
    decided = plan(here)
    runner = run or _run
    for command in decided.commands:
        say(f"prerequisites: {' '.join(command)}")
        code = runner(command, decided.env)
        if code != 0:
            raise Missing(f"prerequisites: `{' '.join(command)}` exited {code}")
    if decided.commands and machine is None:
        still = missing_packages(Machine.this())
        if still:
            raise Missing(f"prerequisites: still missing after apt-get: {' '.join(still)}")


def _run(command: Sequence[str], env: Mapping[str, str]) -> int:
    return subprocess.run(list(command), env=dict(env), check=False).returncode
