"""tox inline plugin: lets tox find interpreters that pyenv installed but did not make active.

pyenv's shims (``python3.12``) fail unless that version is selected, so tox would skip py312 and
py313 with "could not find python interpreter". Appending each installed CPython 3.11+'s ``bin``
to ``PATH`` (after everything already there, so ``python3`` keeps meaning the same interpreter)
makes ``tox`` run every env of the matrix whose interpreter exists on the machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tox.plugin import impl

__all__ = ["pyenv_bin_directories", "tox_add_core_config"]


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
