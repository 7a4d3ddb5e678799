"""tox inline plugin: the machine set-up that ``python3 -m pip install tox && tox`` needs beyond pip.

Before a run that includes a test env (``py3*``): the system packages the tests use are installed
when possible, or the run stops with one line naming them; in CI a missing interpreter of the
matrix is an error, not a skipped env (``tools/prerequisites.py``).

Interpreters: tox should find those pyenv installed but did not make active.

pyenv's shims (``python3.12``) fail unless that version is selected, so tox would skip py312 and
py313 with "could not find python interpreter". Appending each installed CPython 3.11+'s ``bin``
to ``PATH`` (after everything already there, so ``python3`` keeps meaning the same interpreter)
makes ``tox`` run every env of the matrix whose interpreter exists on the machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from tox.plugin import impl

_ROOT = Path(__file__).resolve().parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tools import prerequisites  # noqa: E402  (after the repository is importable)

__all__ = ["pyenv_bin_directories", "runs_tests", "tox_add_core_config"]

RUN_COMMANDS = {"legacy", "run", "r", "run-parallel", "p", "exec", "e"}


def pyenv_bin_directories() -> list[str]:
    """The ``bin`` directory of each CPython 3.11 or later that pyenv installed."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = []
    for version in sorted((root / "versions").glob("3.*")):
        parts = version.name.split(".")
        minor = parts[1] if len(parts) >= 2 else ""
        if minor.isdigit() and int(minor) >= 11 and (version / "bin").is_dir():
            found.append(str(version / "bin"))
    return found


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    path = os.environ.get("PATH", "").split(os.pathsep)
    extra = [d for d in pyenv_bin_directories() if d not in path]
    if extra:
        os.environ["PATH"] = os.pathsep.join([*path, *extra])
    options = state.conf.options
    if not runs_tests(getattr(options, "command", "legacy"), getattr(options, "env", None)):
        return
    if prerequisites.in_ci(os.environ):
        options.skip_missing_interpreters = "false"
    try:
        prerequisites.ensure(say=lambda line: print(line, file=sys.stderr, flush=True))
    except prerequisites.Missing as missing:
        print(f"tox: {missing}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def runs_tests(command: str, envs: Any) -> bool:
    """Whether this tox invocation runs a test env (``py3*``, which the default env list holds)."""
    if command not in RUN_COMMANDS:
        return False
    if envs is None or getattr(envs, "is_default_list", True) or getattr(envs, "is_all", False):
        return True
    return any(str(name).startswith("py3") for name in envs)
